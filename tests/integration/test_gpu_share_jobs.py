"""Issue 10 items 1 and 6 on the dev cluster: GPU jobs sized by their GPUs' share, warnings printed.

A cookbook-shaped config (GPUs named, ``cpu_count``/``memory`` left at truss's defaults) must get
its GPUs' share of the node: on a dev node (2 CPUs, 8000 MB, 4 GPUs) 4 GPUs are the whole node,
2 GPUs half of it. Before, Slurm allocated ``cpu=1,mem=2048M`` whatever the GPUs (checked here in
``sacct``'s AllocTRES, what Slurm really gave the job).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.hostile.harness import as_user, submit, wait, write_job
from tests.unit.test_hooks_env import ensure_test_users

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
USER = "btu1"

COOKBOOK = """\
from truss_train import definitions
from truss.base.truss_config import AcceleratorSpec

project = definitions.TrainingProject(
    name="gpu-share-{gpus}",
    team_name="research",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=definitions.Compute(accelerator=AcceleratorSpec(accelerator="H100", count={gpus})),
        runtime=definitions.Runtime(start_commands=["true"]),
    ),
)
"""


@pytest.fixture(scope="module")
def tenants(dev_cluster: dict[str, object]) -> dict[str, object]:
    """btu1 exists and has a Slurm association (as tests/integration/hostile/conftest.py's fixture)."""
    ensure_test_users()
    subprocess.run(["sacctmgr", "-i", "add", "user", USER, "account=default"], capture_output=True, check=False)
    return dev_cluster


def _alloc_tres(job_id: str) -> dict[str, str]:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "--format=AllocTRES"], capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()
    assert out, f"sacct has no row for {job_id}"
    return dict(kv.split("=", 1) for kv in out[-1].split(",") if "=" in kv)


def test_cookbook_configs_get_their_gpus_share(tenants: dict[str, object]) -> None:
    whole = write_job(USER, COOKBOOK.format(gpus=4))
    half = write_job(USER, COOKBOOK.format(gpus=2))
    # Both at once: the whole-node job and the half-node one are scheduled side by side (2 nodes).
    whole_id, half_id = submit(USER, whole), submit(USER, half)
    for job_id in (whole_id, half_id):
        record, logs = wait(USER, job_id, timeout_s=240)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    tres = _alloc_tres(whole_id)
    assert (tres.get("cpu"), tres.get("mem"), tres.get("gres/gpu")) == ("2", "8000M", "4"), tres
    tres = _alloc_tres(half_id)
    assert (tres.get("cpu"), tres.get("mem"), tres.get("gres/gpu")) == ("1", "4000M", "2"), tres


def test_dry_run_says_where_each_number_came_from_and_warns(tenants: dict[str, object]) -> None:
    config = write_job(USER, COOKBOOK.format(gpus=4))
    dry = as_user(USER, [str(BIN / "bt-sbatch"), "--dry-run", str(config)], cwd=config.parent)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --cpus-per-task=2" in dry.stdout and "#SBATCH --mem=8000M" in dry.stdout
    assert "# --cpus-per-task=2 is the GPUs' share, 4 of n1's 4 h100 GPUs: 2 of its 2 CPUs" in dry.stdout
    assert "# --mem=8000M is the GPUs' share, 4 of n1's 4 h100 GPUs: 8000 of its 8000 MiB" in dry.stdout
    # the accepted-but-ignored fields of this config, one warning each
    assert dry.stderr.count("warning: team_name='research' is ignored") == 1, dry.stderr
    assert dry.stderr.count("warning: job.image.base_image=") == 1, dry.stderr

    # The cookbook's 8 GPUs do not fit a dev node: said, not silently sized at 1 CPU / 2 GiB.
    eight = write_job(USER, COOKBOOK.format(gpus=8))
    dry = as_user(USER, [str(BIN / "bt-sbatch"), "--dry-run", str(eight)], cwd=eight.parent)
    assert dry.returncode == 0, dry.stderr
    assert "no node of partition gpu has 8 h100 GPUs" in dry.stderr, dry.stderr
