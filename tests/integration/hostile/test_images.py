"""Images against hostile registries and interrupted stagers, on the real dev cluster (issue 13).

* **a corrupted layer** in the registry (same size, other bytes): skopeo refuses it in the staging
  job; the job is DEPLOY_FAILED, nothing is published in the team tier, no node drained;
* **kill -9 of the staging job mid-mirror**: nothing partial is visible (no blob, entry or pin), and
  the next submission completes and removes the dead writer's debris;
* **two concurrent submitters** of one cold image: one pull (the registry's access log shows each
  blob of the image fetched once), both jobs run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster_nodes import node_pid
from tests.integration.hostile.harness import admin_path, aftermath, attack, submit, wait, write_job
from tests.integration.hostile.weights_jobs import readable_site
from tests.servers.oci_registry import OciRegistries

pytestmark = pytest.mark.slurm

# seen as an admin (root may be squashed on the shared storage: harness.admin_path)
TEAM = admin_path("/var/lib/slurm-bt-dev/shared/weights/teams/btteam1")
CONFIG = """
from truss_train import definitions
project = definitions.TrainingProject(name="himg-{name}", job=definitions.TrainingJob(
    image=definitions.Image(base_image={image!r}),
    runtime=definitions.Runtime(start_commands=["test -f /opt/payload.bin && echo image-ok"])))
"""


@pytest.fixture(scope="module")
def site(tenants: dict[str, Any], oci_registries: OciRegistries) -> Iterator[Path]:
    with readable_site("bt-himg-site-", 'container_runtime = "charliecloud"\n' + oci_registries.site_toml()) as p:
        yield p


def _job(image: str) -> Path:
    return write_job("btu1", CONFIG.format(name=uuid.uuid4().hex[:8], image=image))


def _layers(regs: OciRegistries, digest: str) -> list[str]:
    manifest = json.loads(regs.public.blob_path(digest.split(":")[1]).read_bytes())
    return [str(layer["digest"]).split(":")[1] for layer in manifest["layers"]]


def _named_by_manifests() -> set[str]:
    """Every sha256 the team tier's published manifests name."""
    named: set[str] = set()
    for path in (TEAM / "manifests").glob("*"):
        try:
            named.update(re.findall(r"[0-9a-f]{64}", path.read_text(errors="replace")))
        except OSError:
            continue
    return named


def _published(digest: str) -> bool:
    return (TEAM / "pins" / f"oci-{digest.split(':')[1]}.json").exists()


def test_corrupted_layer_is_refused_and_nothing_is_published(site: Path, oci_registries: OciRegistries) -> None:
    with attack("image: corrupted layer blob in the registry"):
        tag = uuid.uuid4().hex[:8]
        digest = oci_registries.push(f"library/hcorrupt-{tag}", "v1", {"opt/payload.bin": os.urandom(300_000)})
        layer = oci_registries.public.blob_path(_layers(oci_registries, digest)[-1])
        data = bytearray(layer.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the digest check can tell
        layer.write_bytes(bytes(data))
        blobs_before = set(os.listdir(TEAM / "blobs")) if (TEAM / "blobs").is_dir() else set()
        job_id = submit("btu1", _job(f"hcorrupt-{tag}:v1"))
        record, logs = wait("btu1", job_id)
        assert record["current_status"] == "TRAINING_JOB_DEPLOY_FAILED", (record, logs)
        assert not _published(digest)
        assert record["image"]["in_cluster_cache"] is False
        # Other tests' images and weights may be published meanwhile (the suite runs in parallel): a new
        # blob that a published manifest names is theirs; one that none names was left by this pull.
        # (A blob is published before its manifest: another writer's may be named a moment later.)
        deadline = time.monotonic() + 15
        while (new := set(os.listdir(TEAM / "blobs")) - blobs_before - _named_by_manifests()) and \
                time.monotonic() < deadline:
            time.sleep(1)
        assert not new, f"published after a refused pull: {new}"
        aftermath(job_id, "btu1")


def _staging_pid(job_dir_marker: str, timeout_s: float = 60) -> int:
    """The staging step's python (``-m slurm_bt.steps.stage_weights <job_dir>``) once it mirrors."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"slurm_bt.steps.stage_weights" in argv and any(job_dir_marker.encode() in a for a in argv):
                # wait until it is inside the mirror: a writer dir of this pid exists in the tier
                # (named with the stager's PID on its node: cluster_nodes.node_pid)
                prefix = f"writer.{node_pid(int(entry.name))}_"
                if any(p.name.startswith(prefix) for p in (TEAM / ".tmp").glob("writer.*")):
                    return int(entry.name)
        time.sleep(0.05)
    raise AssertionError("the staging job never started mirroring")


def test_kill_9_mid_mirror_leaves_nothing_and_the_rerun_completes(site: Path, oci_registries: OciRegistries) -> None:
    with attack("image: kill -9 of the staging job mid-mirror"):
        tag = uuid.uuid4().hex[:8]
        digest = oci_registries.push(f"library/hkill-{tag}", "v1", {"opt/payload.bin": b"x"},
                                     big_random_bytes=96 << 20)
        cfg = _job(f"hkill-{tag}:v1")
        job_id = submit("btu1", cfg)
        pid = _staging_pid(_submit_id(job_id))
        inner = node_pid(pid)
        os.kill(pid, signal.SIGKILL)
        record, logs = wait("btu1", job_id)
        assert record["current_status"] == "TRAINING_JOB_DEPLOY_FAILED", (record, logs)
        assert not _published(digest)
        debris = list((TEAM / ".tmp").glob(f"writer.{inner}_*"))
        assert debris, "the killed stager left no writer dir: it was not killed mid-mirror"
        aftermath(job_id, "btu1")
        # the rerun mirrors it, and its collector removes the dead writer's directory
        again = submit("btu1", cfg)
        record, logs = wait("btu1", again)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
        assert "image-ok" in logs and _published(digest)
        assert not [p for p in debris if p.exists()], f"dead writer's debris left: {debris}"
        aftermath(again, "btu1")


def _submit_id(job_id: str) -> str:
    for rec in Path("/home/btu1/.slurm-bt/records").glob(f"{job_id}.json"):
        return str(json.loads(rec.read_text())["submit_id"])
    raise AssertionError(f"no record of job {job_id}")


def test_two_concurrent_submitters_pull_once(site: Path, oci_registries: OciRegistries) -> None:
    with attack("image: two submitters of one cold image"):
        tag = uuid.uuid4().hex[:8]
        digest = oci_registries.push(f"library/htwice-{tag}", "v1", {"opt/payload.bin": os.urandom(4 << 20)})
        big = _layers(oci_registries, digest)[-1]
        before = oci_registries.public.blob_gets(big)
        first = submit("btu1", _job(f"htwice-{tag}:v1"))
        second = submit("btu1", _job(f"htwice-{tag}:v1"))
        for job_id in (first, second):
            record, logs = wait("btu1", job_id)
            assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
            assert "image-ok" in logs
        assert oci_registries.public.blob_gets(big) - before == 1
        aftermath(second, "btu1")
