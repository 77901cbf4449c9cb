"""Every config shown in the seed documents loads *and* translates to a valid script."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from slurm_bt.compat.truss_config import Accelerator
from slurm_bt.errors import ConfigError
from slurm_bt.render.batch_script import render_batch_script, render_node_entry
from slurm_bt.site.settings import AcceleratorMapping, SiteSettings
from tests.spec_helpers import spec_for

SEEDS = Path(__file__).resolve().parent.parent / "seed_configs"
EVERY_GPU = SiteSettings(accelerators={a.value: AcceleratorMapping(gres_type=a.value.lower()) for a in Accelerator})


#: Seeds that hold no TrainingProject (Baseten's deploy_checkpoints configs).
NOT_TRAINING_CONFIGS = {"seed004_deploy_checkpoints"}


def _seed_files() -> list[Path]:
    return sorted(p for p in SEEDS.glob("*.py") if not p.name.startswith("_"))


def test_there_are_seed_configs() -> None:
    assert len(_seed_files()) >= 10


@pytest.mark.parametrize("path", _seed_files(), ids=lambda p: p.stem)
@pytest.mark.parametrize("runtime", ["none", "pyxis", "apptainer"])
def test_seed_config_translates(path: Path, runtime: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a config that reads a file beside itself finds it via its own path
    site = EVERY_GPU.model_copy(update={"container_runtime": runtime})
    if path.stem == "seed004_dynamic_runtime_config":  # reads runtime_config.json beside itself
        shutil.copy(path, tmp_path / "config.py")
        (tmp_path / "runtime_config.json").write_text('{"model_id": "m", "dataset_id": "d"}')
        path = tmp_path / "config.py"
    try:
        spec = spec_for(path, site)
    except ConfigError as exc:
        # A seed that is not a training config (a deploy_checkpoints config) must be refused with
        # truss's message, not translated.
        assert path.stem in NOT_TRAINING_CONFIGS, exc
        assert "TrainingProject" in str(exc) and "No" in str(exc), exc
        return
    assert path.stem not in NOT_TRAINING_CONFIGS
    for text in (render_batch_script(spec), render_node_entry(spec)):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    if spec.gpus_per_node:
        assert f"--gres=gpu:{spec.gres_type}:{spec.gpus_per_node}" in render_batch_script(spec)
