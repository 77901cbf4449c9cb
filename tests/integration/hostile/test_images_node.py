"""Hostile container jobs against the node side of images (site container_runtime = "charliecloud").

The prolog reads ``<job dir>/image/manifest.json`` (the user's file) and stages that entry to the node
tier; the runtime starts the node's copy. Each job here is submitted held, its image files are
forged as the user, then it is released. Every scenario must fail only that job (nothing of it runs),
leave the nodes up and nothing behind:

* the manifest swapped for a FIFO, or for a symlink to a valid manifest (never followed);
* btu2 (btteam2) pins btteam1's image entry: not in btu2's team tier, refused;
* btu1 pins an entry whose squashfs a teammate rewrote in the team tier after publishing it: the node
  copy re-hashes and refuses it (the node stager fails, step 1 fails the job).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.site.settings import SiteSettings, expand_path
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.manifest import Manifest, ManifestFile
from slurm_bt.weights.plan import team_slug
from tests.integration.cluster_nodes import mirror_toml, registry_host
from tests.integration.hostile.harness import (
    admin_path,
    aftermath,
    as_user,
    attack,
    cancel_on_error,
    submit,
    wait,
    write_job,
)
from tests.unit.test_cache_support import DirFetcher, allow

pytestmark = pytest.mark.slurm

JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-image-{user}", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11-slim"),
        compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["echo SHOULD-NOT-RUN"]),
    ))
"""
WARM_JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="image-warm-{user}", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11-slim"),
        compute=definitions.Compute(node_count=1, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["echo warm"]),
    ))
"""


def _resolved() -> str:
    """The forged image's name as pinned: on the dev registry, where the nodes reach it."""
    return f"{registry_host()}/library/forged"


@pytest.fixture(scope="module")
def ch_site() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="bt-images-hostile-", dir="/tmp"))
    os.chmod(folder, 0o755)
    path = folder / "site.toml"
    path.write_text('container_runtime = "charliecloud"\n' + mirror_toml())
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def btu1_image_cached(tenants: dict[str, object], ch_site: Path) -> None:
    """python:3.11-slim complete in btteam1's tier, so bt-sbatch finds it cached at submit.

    Why a job of its own: on a fresh cluster nothing before this module mirrors that image for btteam1
    (a run on a machine whose cache an earlier run had filled hid it); one real job does, through
    its staging job, as a user's first job would.
    """
    job_id = submit("btu1", write_job("btu1", WARM_JOB.format(user="btu1")), site=ch_site)
    record, logs = wait("btu1", job_id, timeout_s=300)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    aftermath(job_id, "btu1")


@contextlib.contextmanager
def _submit_held(user: str, site: Path) -> Iterator[tuple[str, Path]]:
    """Submit ``JOB`` held; (job id, work dir), the job cancelled if the block fails (cancel_on_error)."""
    job_id = submit(user, write_job(user, JOB.format(user=user)), "--hold", site=site)
    with cancel_on_error(job_id):
        show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        work = re.search(r"WorkDir=(\S+)", show)
        assert work, show
        yield job_id, Path(work.group(1))


def _published_entry(team: str, sqfs: bytes) -> Manifest:
    """An image entry published in ``team``'s cluster tier (as its staging job would), unique per test."""
    digest = "sha256:" + hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    m = Manifest(kind="oci", source=f"oci://{_resolved()}@{digest}", revision=digest,
                 files=(ManifestFile(path="image.sqfs", size=len(sqfs), sha256=hashlib.sha256(sqfs).hexdigest()),))
    origin = Path(tempfile.mkdtemp(prefix="bt-img-origin-"))
    try:
        (origin / "image.sqfs").write_bytes(sqfs)
        # published as an admin would (root may be squashed on the shared storage: harness.admin_path)
        base = admin_path(expand_path(SiteSettings().storage.cluster_cache, user="root", uid=0, home="/root"))
        ClusterCache.for_team(base, team_slug(team)).ensure(m, DirFetcher(origin), authorize=allow)
    finally:
        shutil.rmtree(origin)
    return m


def _forge(user: str, work: Path, m: Manifest) -> None:
    """As ``user``: pin the job to ``m``'s image and put ``m`` in the job's image/manifest.json."""
    pin = {"reference": "forged:latest", "resolved": f"{_resolved()}@{m.revision}", "digest": m.revision,
           "private": False}
    code = ("import json, os, sys; d = json.load(open('job.json')); d['image_pin'] = json.loads(sys.argv[1]); "
            "open('job.json', 'w').write(json.dumps(d)); os.makedirs('image', exist_ok=True); "
            "open('image/manifest.json', 'wb').write(sys.argv[2].encode())")
    as_user(user, ["python3", "-c", code, json.dumps(pin), m.canonical_json().decode()], cwd=work).check_returncode()


def _release_and_fail(user: str, job_id: str, *, refused_by_prolog: bool) -> str:
    t0 = time.monotonic()
    subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
    record, logs = wait(user, job_id)
    assert record["current_status"] in ("TRAINING_JOB_FAILED", "TRAINING_JOB_DEPLOY_FAILED"), (record, logs)
    assert "SHOULD-NOT-RUN" not in logs
    if refused_by_prolog:
        assert "the slurm-bt prolog refused this job on node" in logs, logs
    assert time.monotonic() - t0 < 120
    aftermath(job_id, user)
    return logs


SWAPS = {
    "FIFO": "import os; os.unlink('image/manifest.json'); os.mkfifo('image/manifest.json')",
    "symlink to a copy": ("import os; os.rename('image/manifest.json', 'image/copy.json'); "
                          "os.symlink(os.path.abspath('image/copy.json'), 'image/manifest.json')"),
}


@pytest.mark.parametrize("name", sorted(SWAPS))
def test_swapped_image_manifest_fails_only_that_job(tenants: dict[str, object], ch_site: Path,
                                                    btu1_image_cached: None, name: str) -> None:
    with attack(f"image manifest -> {name}"), _submit_held("btu1", ch_site) as (job_id, work):
        assert (work / "image" / "manifest.json").is_file(), "the image is cached: bt-sbatch wrote the manifest"
        as_user("btu1", ["python3", "-c", SWAPS[name]], cwd=work).check_returncode()
        logs = _release_and_fail("btu1", job_id, refused_by_prolog=True)
        assert "manifest.json" in logs, logs


def test_another_teams_image_entry_is_refused(tenants: dict[str, object], ch_site: Path) -> None:
    with attack("image pinned to another team's entry"):
        m = _published_entry("btteam1", os.urandom(64 << 10))
        with _submit_held("btu2", ch_site) as (job_id, work):
            _forge("btu2", work, m)
            logs = _release_and_fail("btu2", job_id, refused_by_prolog=True)
        assert "not complete in the cluster cache of team 'btteam2'" in logs, logs


def test_teammate_swapped_squashfs_is_never_run(tenants: dict[str, object], ch_site: Path) -> None:
    with attack("teammate rewrote a published image squashfs"):
        sqfs = os.urandom(256 << 10)
        m = _published_entry("btteam1", sqfs)
        base = admin_path(expand_path(SiteSettings().storage.cluster_cache, user="root", uid=0, home="/root"))
        tier = ClusterCache.for_team(base, team_slug("btteam1")).root
        blobs = [p for p in tier.rglob(m.files[0].sha256) if p.is_file()]
        assert blobs
        for blob in blobs:  # the publisher owns the blob: same size, other bytes
            os.chmod(blob, 0o644)
            blob.write_bytes(os.urandom(len(sqfs)))
        with _submit_held("btu1", ch_site) as (job_id, work):
            _forge("btu1", work, m)
            logs = _release_and_fail("btu1", job_id, refused_by_prolog=False)
        assert "content mismatch: expected sha256" in logs, logs
