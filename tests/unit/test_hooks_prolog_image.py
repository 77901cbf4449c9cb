"""The prolog's image step in-process, as root, for real non-root job users (btu1/btu2).

A container job's pinned image is a one-file weights entry (docs/containers.md): the prolog reads
``<job dir>/image/manifest.json`` as the user, stages the entry to the node tier and links
``<node_cache>/jobs/<id>/img``. Covers: cluster-hit then node-hit, the link and the root record, the
epilog releasing the lease; and the hostile inputs: a manifest that is not the pinned image, another
team's entry, a teammate's swapped squashfs (the node copy re-hashes), a symlinked or FIFO manifest.
Each fails the job with a reason; none drains the node.
"""

from __future__ import annotations

import grp
import hashlib
import io
import json
import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from slurm_bt.errors import WeightsJobError
from slurm_bt.job_spec import JobSpec
from slurm_bt.node.job_paths import IMAGE_FILE
from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.manifest import Manifest, ManifestFile
from slurm_bt.weights.node_stage import prepare_job_image, read_node_image_record
from tests.unit import test_hooks_prolog as _hooks_tests
from tests.unit.test_cache_support import DirFetcher, allow, random_bytes, write_origin
from tests.unit.test_hooks_prolog import Site, as_user, job_env, run, write_job
from tests.unit.test_hooks_prolog_weights import _weights_site

site = _hooks_tests.site
fake_flush = _hooks_tests.fake_flush

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")

RESOLVED = "127.0.0.1:5443/library/python"


def _digest(seed: int) -> str:
    return "sha256:" + hashlib.sha256(str(seed).encode()).hexdigest()


def _image_entry(site: Site, team: str, seed: int) -> tuple[Manifest, bytes]:
    """A published image entry in ``team``'s cluster tier (what I1's staging job leaves)."""
    sqfs = random_bytes(1 << 20, seed)
    origin = site.base / f"origin-img-{seed}"
    write_origin(origin, {IMAGE_FILE: sqfs})
    digest = _digest(seed)
    m = Manifest(kind="oci", source=f"oci://{RESOLVED}@{digest}", revision=digest,
                 files=(ManifestFile(path=IMAGE_FILE, size=len(sqfs), sha256=hashlib.sha256(sqfs).hexdigest()),))
    (site.base / "shared" / "weights" / "teams").mkdir(parents=True, exist_ok=True)
    tier = ClusterCache.for_team(site.base / "shared" / "weights", team)
    tier.ensure(m, DirFetcher(origin), authorize=allow)
    os.chown(tier.root, 0, grp.getgrnam(team).gr_gid)
    os.chmod(tier.root, 0o3770)
    return m, sqfs


def _image_job(site: Site, user: str, m: Manifest | None, name: str, *, runtime: str = "charliecloud",
               manifest_bytes: bytes | None = None) -> Path:
    """A container job whose image is pinned to ``m``'s digest, with ``image/manifest.json`` in its job dir."""
    work = write_job(site, user, job_dir_name=name)
    pw = pwd.getpwnam(user)
    data = json.loads((work / "job.json").read_text())
    digest = m.revision if m is not None else _digest(999)
    data["container_runtime"] = runtime
    data["image_pin"] = {"reference": "python:3.11-slim", "resolved": f"{RESOLVED}@{digest}", "digest": digest,
                         "private": False}
    (work / "job.json").write_text(json.dumps(data))
    body = manifest_bytes if manifest_bytes is not None else (m.canonical_json() if m is not None else None)
    if body is not None:
        (work / "image").mkdir(mode=0o700)
        (work / "image" / "manifest.json").write_bytes(body)
        for p in (work / "image", work / "image" / "manifest.json"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    return work


def _error(site: Site, job: str) -> str:
    err = read_hook_state("n1", job, site.state).error
    assert err is not None, f"job {job} was not failed"
    return err


def test_image_staged_to_node_tier_then_hit_and_released(site: Site) -> None:
    node_root = _weights_site(site)
    m, sqfs = _image_entry(site, "btteam1", 1)
    work = _image_job(site, "btu1", m, "i1")
    assert run(site, "prolog", job_env(site, "btu1", "41", work)) == 0
    rec = read_hook_state("n1", "41", site.state).record
    assert rec is not None and rec["image"]["tier"] == "cluster-hit", rec
    assert rec["image"]["source"].startswith("python:3.11-slim@sha256:")
    link = node_root / "jobs" / "41" / "img"
    # A team-tier image goes to the team's private subtree: a squashfs a teammate built is not everyone's.
    assert "/private/" in os.path.realpath(link)
    assert (link / IMAGE_FILE).read_bytes() == sqfs
    st = (link / IMAGE_FILE).stat()
    assert st.st_uid == 0 and not st.st_mode & 0o222
    # the runtime opens it as the job user, through the root-owned link
    assert as_user("btu1", lambda: len((link / IMAGE_FILE).read_bytes())) == len(sqfs)
    seen = as_user("btu1", lambda: read_node_image_record(str(node_root), "41"))
    assert isinstance(seen, dict) and seen["kind"] == "image" and seen["link"] == "img"

    work2 = _image_job(site, "btu1", m, "i2")
    assert run(site, "prolog", job_env(site, "btu1", "42", work2)) == 0
    rec2 = read_hook_state("n1", "42", site.state).record
    assert rec2 is not None and rec2["image"]["tier"] == "node-hit"

    for job, w in (("41", work), ("42", work2)):
        assert run(site, "epilog", job_env(site, "btu1", job, w, SLURM_SCRIPT_CONTEXT="epilog_slurmd")) == 0
    assert not (node_root / "jobs" / "41").exists()
    leases = [p for p in node_root.rglob(f"leases/{m.manifest_id}") if p.is_dir()]
    assert leases and all(os.listdir(p) == [] for p in leases)


def test_host_jobs_do_not_stage_the_image(site: Site) -> None:
    node_root = _weights_site(site)
    m, _ = _image_entry(site, "btteam1", 2)
    work = _image_job(site, "btu1", m, "i3", runtime="none")
    assert run(site, "prolog", job_env(site, "btu1", "43", work)) == 0
    rec = read_hook_state("n1", "43", site.state).record
    assert rec is not None and "image" not in rec
    assert not (node_root / "jobs" / "43").exists()


def test_manifest_for_another_image_is_refused(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    _weights_site(site)
    m, _ = _image_entry(site, "btteam1", 3)
    other, _ = _image_entry(site, "btteam1", 4)
    # job.json pins m's digest, the job dir's manifest names another (published) image
    work = _image_job(site, "btu1", m, "i4", manifest_bytes=other.canonical_json())
    assert run(site, "prolog", job_env(site, "btu1", "44", work)) == 0
    assert "not the pinned" in _error(site, "44")
    assert "DRAIN" not in capfd.readouterr().err


def test_another_teams_image_is_refused(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    node_root = _weights_site(site)
    m, _ = _image_entry(site, "btteam1", 5)
    work = _image_job(site, "btu2", m, "i5")  # btu2 is in btteam2 only
    assert run(site, "prolog", job_env(site, "btu2", "45", work)) == 0
    assert "not complete in the cluster cache of team 'btteam2'" in _error(site, "45")
    assert not (node_root / "jobs" / "45" / "img").exists()
    assert "DRAIN" not in capfd.readouterr().err


def test_swapped_team_tier_squashfs_is_never_served(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    """A teammate owns the blobs they published and can rewrite them: the node copy re-hashes."""
    node_root = _weights_site(site)
    m, sqfs = _image_entry(site, "btteam1", 6)
    tier = ClusterCache.for_team(site.base / "shared" / "weights", "btteam1")
    blobs = [p for p in tier.root.rglob("*") if p.is_file() and p.name == m.files[0].sha256]
    assert blobs, "the published blob is where the cluster tier keeps it"
    for blob in blobs:
        os.chmod(blob, 0o644)
        blob.write_bytes(random_bytes(len(sqfs), 66))  # same size, other bytes
    work = _image_job(site, "btu1", m, "i6")
    assert run(site, "prolog", job_env(site, "btu1", "46", work)) == 0
    rec = read_hook_state("n1", "46", site.state).record
    assert rec is not None and rec["image"]["tier"] in ("node-staging", "cluster-hit"), rec
    # The copy runs in the node stager, outside the prolog's clock (docs/weights-cache.md §3.1): it must
    # refuse the blob, and step 1 fails the job (prepare_job_image -> wait_for_node_copies).
    entry = read_node_image_record(str(node_root), "46")
    assert entry is not None and entry.get("tier") == "node-staging", entry
    from slurm_bt.weights.node_stager import read_progress

    deadline = time.monotonic() + 60
    progress = read_progress(str(node_root), str(entry["stager"]))
    while time.monotonic() < deadline and (progress is None or progress.get("state") not in ("failed", "done")):
        time.sleep(0.2)
        progress = read_progress(str(node_root), str(entry["stager"]))
    assert progress is not None and progress.get("state") == "failed", progress
    assert "sha256" in str(progress.get("message")) or "verif" in str(progress.get("message")), progress
    assert not (node_root / "jobs" / "46" / "img" / IMAGE_FILE).exists()
    spec = JobSpec.model_validate_json((work / "job.json").read_text())

    def step1() -> str:
        try:
            prepare_job_image(spec, {"SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "46"}, out=io.StringIO())
        except WeightsJobError as exc:
            return str(exc)
        return "ran"

    assert "stopped" in str(as_user("btu1", step1))  # step 1 fails the job: the image is never run
    assert "DRAIN" not in capfd.readouterr().err


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_symlinked_or_fifo_manifest_is_refused(site: Site, kind: str, capfd: pytest.CaptureFixture[str]) -> None:
    _weights_site(site)
    m, _ = _image_entry(site, "btteam1", 7)
    work = _image_job(site, "btu1", m, f"i7{kind}")
    target = work / "image" / "manifest.json"
    real = work / "image" / "real.json"
    os.rename(target, real)
    if kind == "symlink":
        os.symlink(real, target)
    else:
        os.mkfifo(target, 0o600)
    os.lchown(target, pwd.getpwnam("btu1").pw_uid, pwd.getpwnam("btu1").pw_gid)
    start = time.monotonic()
    job = "47" if kind == "symlink" else "48"
    assert run(site, "prolog", job_env(site, "btu1", job, work)) == 0
    assert time.monotonic() - start < 20  # a FIFO does not hang the prolog
    err = _error(site, job)
    assert "manifest.json" in err, err
    assert "DRAIN" not in capfd.readouterr().err
    assert stat.S_ISLNK(os.lstat(target).st_mode) or stat.S_ISFIFO(os.lstat(target).st_mode)


def test_node_copy_false_starts_a_shared_tier_image_in_place(site: Site) -> None:
    """``[containers] node_copy = false``: an image in the root-owned shared tier is linked, not copied;
    one in a team tier is still copied (its blobs are a teammate's)."""
    node_root = _weights_site(site)
    site.site.write_text(site.site.read_text() + "\n[containers]\nnode_copy = false\n")
    sqfs = random_bytes(1 << 20, 11)
    origin = site.base / "origin-shared-img"
    write_origin(origin, {IMAGE_FILE: sqfs})
    digest = _digest(11)
    m = Manifest(kind="oci", source=f"oci://{RESOLVED}@{digest}", revision=digest,
                 files=(ManifestFile(path=IMAGE_FILE, size=len(sqfs), sha256=hashlib.sha256(sqfs).hexdigest()),))
    (site.base / "shared" / "weights").mkdir(parents=True, exist_ok=True)
    shared = ClusterCache.shared(site.base / "shared" / "weights")
    shared.ensure(m, DirFetcher(origin), authorize=allow)
    work = _image_job(site, "btu1", m, "i9")
    assert run(site, "prolog", job_env(site, "btu1", "49", work)) == 0
    rec = read_hook_state("n1", "49", site.state).record
    assert rec is not None and rec["image"]["tier"] == "shared-direct", rec
    link = node_root / "jobs" / "49" / "img"
    assert Path(os.path.realpath(link)) == shared.snapshot_path(m)
    assert not any(node_root.rglob(m.files[0].sha256)), "no node copy was made"
    assert as_user("btu1", lambda: (link / IMAGE_FILE).read_bytes() == sqfs) is True

    team_m, _ = _image_entry(site, "btteam1", 12)
    work2 = _image_job(site, "btu1", team_m, "i10")
    assert run(site, "prolog", job_env(site, "btu1", "50", work2)) == 0
    rec2 = read_hook_state("n1", "50", site.state).record
    assert rec2 is not None and rec2["image"]["tier"] in ("cluster-hit", "node-staging"), rec2
