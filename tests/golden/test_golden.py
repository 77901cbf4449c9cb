"""Golden batch and entry scripts: the exact text each kind of job renders to.

Re-record after an intended change with ``SLURM_BT_UPDATE_GOLDEN=1 pytest tests/golden`` and review
the diff like code.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest

from slurm_bt.job_spec import ImagePin, JobSpec
from slurm_bt.render.batch_script import render_batch_script, render_node_entry
from slurm_bt.site.settings import AcceleratorMapping, SiteSettings
from tests.spec_helpers import GOLDEN
from tests.spec_helpers import spec_for as _spec_for

CONFIGS = GOLDEN / "configs"
PYXIS = SiteSettings(container_runtime="pyxis", storage={"scratch": "/local/scratch", "node_cache": "/local/weights"})
APPTAINER = SiteSettings(container_runtime="apptainer",
                         storage={"scratch": "/local/scratch", "node_cache": "/local/weights"})
# charliecloud (and apptainer) start on the node, so node-local roots may use %n (the dev cluster's).
CHARLIECLOUD = SiteSettings(container_runtime="charliecloud",
                            storage={"scratch": "/local/%n/scratch", "node_cache": "/local/%n/weights"})
DIGEST = "sha256:" + "ab" * 32


def spec_for(config: Path, site: SiteSettings | None = None) -> JobSpec:
    """The job as bt-sbatch submits it: a container runtime's image pinned at submit (slurm_bt/images/)."""
    spec = _spec_for(config, site or SiteSettings())
    if spec.container_runtime == "none":
        return spec
    pin = ImagePin(reference=spec.image, resolved=f"registry.example.com/team/train@{DIGEST}", digest=DIGEST)
    return spec.model_copy(update={"image_pin": pin})


BIG_SITE = SiteSettings(
    accelerators={"H100": AcceleratorMapping(gres_type="h100", partition="hopper")},
    cpus_per_gpu=8,
    mem_per_gpu="64Gi",
    container_runtime="pyxis",
    storage={"scratch": "/local/scratch", "node_cache": "/local/weights"},
)

CASES = {
    "single_gpu": ("single_gpu.py", SiteSettings()),
    "multi_node": ("multi_node.py", BIG_SITE),
    "secrets": ("secrets.py", SiteSettings()),
    "host_runtime": ("containers.py", SiteSettings()),
    "pyxis": ("containers.py", PYXIS),
    "apptainer": ("containers.py", APPTAINER),
    "charliecloud": ("containers.py", CHARLIECLOUD),
    "weights": ("weights.py", PYXIS),
}


def _check(name: str, suffix: str, text: str) -> None:
    path = GOLDEN / f"{name}{suffix}"
    if os.environ.get("SLURM_BT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    if not path.exists():
        pytest.fail(f"{path} missing: record it with SLURM_BT_UPDATE_GOLDEN=1")
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
        pytest.fail(f"{path} differs (re-record with SLURM_BT_UPDATE_GOLDEN=1 if intended):\n{diff}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_batch_script(name: str) -> None:
    config, site = CASES[name]
    _check(name, ".sbatch", render_batch_script(spec_for(CONFIGS / config, site)))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_node_entry(name: str) -> None:
    config, site = CASES[name]
    _check(name, ".entry.sh", render_node_entry(spec_for(CONFIGS / config, site)))


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("which", [".sbatch", ".entry.sh"])
def test_golden_scripts_are_valid_bash(name: str, which: str) -> None:
    """Every golden script parses (bash -n), so a quoting mistake cannot hide in a golden file."""
    proc = subprocess.run(["bash", "-n", str(GOLDEN / f"{name}{which}")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_multi_node_requests() -> None:
    spec = spec_for(CONFIGS / "multi_node.py", BIG_SITE)
    script = render_batch_script(spec)
    directives = {line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")}
    assert {"--nodes=2", "--ntasks-per-node=1", "--gres=gpu:h100:4", "--partition=hopper",
            "--cpus-per-task=16", "--export=NONE"} <= directives
    # 200G (decimal) = 190735 MiB, rounded up
    assert "--mem=190735M" in directives


def test_pyxis_secret_values_and_image_ref() -> None:
    """A job.json from before pinning (no image_pin): pyxis pulls the registry image with the job's
    registry credentials; a pinned job runs the node's squashfs and needs no credentials on the nodes."""
    spec = _spec_for(CONFIGS / "containers.py", PYXIS)
    script = render_batch_script(spec)
    assert "--container-image='ghcr.io#acme/trainer:1.2'" in script
    assert "ENROOT_CONFIG_PATH" in script
    assert "/app/models/qwen:ro" in script
    pinned = render_batch_script(spec_for(CONFIGS / "containers.py", PYXIS))
    assert '--container-image=/local/weights/jobs/"${SLURM_JOB_ID}"/img/image.sqfs' in pinned
    assert "ENROOT_CONFIG_PATH" not in pinned


def test_charliecloud_binds_expand_node_on_the_node() -> None:
    """charliecloud starts in node_entry.sh, so %n node-local roots become $SLURMD_NODENAME there
    (pyxis refuses them: its mounts are on the batch script's srun line)."""
    entry = render_node_entry(spec_for(CONFIGS / "containers.py", CHARLIECLOUD))
    assert "%n" not in entry
    assert 'bt_img=/local/"${SLURMD_NODENAME}"/weights/jobs/"${SLURM_JOB_ID}"/img/image.sqfs' in entry
    assert '-b /local/"${SLURMD_NODENAME}"/weights/jobs/"${SLURM_JOB_ID}"/w0:/app/models/qwen' in entry
    with pytest.raises(ValueError, match="pyxis cannot expand"):
        SiteSettings(container_runtime="pyxis", storage={"scratch": "/local/%n/scratch"})


def test_cpu_jobs_request_no_gpu() -> None:
    spec = spec_for(CONFIGS / "secrets.py")
    assert "--gres" not in render_batch_script(spec)
    assert spec.gpus_per_node == 0


def test_golden_files_have_no_stray_cases() -> None:
    recorded = {p.name.split(".")[0] for p in GOLDEN.glob("*.sbatch")}
    assert recorded == set(CASES), f"unreferenced golden files: {recorded - set(CASES)}"


def test_paths(tmp_path: Path) -> None:
    assert CONFIGS.is_dir() and (CONFIGS / "single_gpu.py").exists()
