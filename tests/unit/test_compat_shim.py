"""The truss import shim: every import path configs use, and nothing left behind afterwards."""

from __future__ import annotations

import importlib
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.compat import (
    _base,
    _truss_train,
    _truss_train_deployment,
    _truss_train_loader,
    definitions,
    public_api,
    truss_config,
    truss_constants,
)
from slurm_bt.compat.shim import SHIMMED_MODULES, install_truss_modules, truss_modules

UPSTREAM_ALL = [
    "push", "AvailabilityModel", "Compute", "Runtime", "SecretReference", "TrainingJob", "TrainingProject",
    "FullCheckpoint", "LoRACheckpoint", "ModelWeightsFormat", "CheckpointList", "DeployCheckpointsRuntime",
    "DeployCheckpointsConfig", "LoRADetails", "CheckpointingConfig", "CacheConfig", "AWSIAMDockerAuth",
    "GCPServiceAccountJSONDockerAuth", "RegistrySecretDockerAuth", "LoadCheckpointConfig",
    "BasetenCheckpoint", "LoopsCheckpoint", "DockerAuth", "Image", "WeightsSource", "Workspace",
]  # fmt: skip


def _truss_entries() -> dict[str, Any]:
    return {n: m for n, m in sys.modules.items() if n.split(".")[0] in ("truss", "truss_train")}


def test_import_paths_resolve_to_our_modules() -> None:
    with truss_modules():
        import truss.base.truss_config  # type: ignore[import-not-found]
        import truss_train  # type: ignore[import-not-found]
        import truss_train.definitions  # type: ignore[import-not-found]
        from truss.base import truss_config as tc
        from truss.base.truss_config import AcceleratorSpec
        from truss_train import (
            TrainingProject,
            WeightsSource,
            push,
        )
        from truss_train import (
            definitions as defs,
        )
        from truss_train.public_api import push as push2  # type: ignore[import-not-found]

        assert truss_train.definitions is definitions
        assert defs is definitions and tc is truss_config
        assert truss.base.truss_config is truss_config
        assert AcceleratorSpec is truss_config.AcceleratorSpec
        assert TrainingProject is definitions.TrainingProject
        assert WeightsSource is truss_config.WeightsSource
        assert push is push2 is public_api.push
        assert defs.truss_config is truss_config
        assert defs.InteractiveSession is definitions.InteractiveSession
        assert importlib.import_module("truss_train.public_api").push is push
    assert "truss_train" not in sys.modules
    assert "truss" not in sys.modules


def test_truss_train_all_matches_upstream() -> None:
    assert _truss_train.__all__ == UPSTREAM_ALL
    for name in UPSTREAM_ALL:
        assert hasattr(_truss_train, name)
    # Upstream does not re-export InteractiveSession from the package.
    assert not hasattr(_truss_train, "InteractiveSession")
    assert set(SHIMMED_MODULES) == {
        "truss", "truss.base", "truss.base.truss_config", "truss.base.constants", "truss.base.custom_types",
        "truss_train", "truss_train.definitions", "truss_train.public_api", "truss_train.loader",
        "truss_train.deployment",
    }  # fmt: skip
    # upstream's public_api imports loader and deployment: attributes of the package after import
    assert _truss_train.loader is _truss_train_loader and _truss_train.deployment is _truss_train_deployment


def test_other_truss_modules_fail_cleanly() -> None:
    with truss_modules():
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("truss.cli")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("truss_train.restore_from_checkpoint")
        with pytest.raises(ImportError):
            exec("from truss_train import InteractiveSession", {})


def test_real_truss_install_is_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulate a machine with truss installed: a fake ``truss``/``truss_train`` on sys.path."""
    (tmp_path / "truss" / "base").mkdir(parents=True)
    (tmp_path / "truss" / "__init__.py").write_text("REAL = True\n")
    (tmp_path / "truss" / "base" / "__init__.py").write_text("")
    (tmp_path / "truss" / "base" / "truss_config.py").write_text("REAL = True\nclass AcceleratorSpec: pass\n")
    (tmp_path / "truss_train").mkdir()
    (tmp_path / "truss_train" / "__init__.py").write_text("REAL = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in list(_truss_entries()):
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    import truss.base.truss_config as real_tc
    import truss_train as real_tt

    before = _truss_entries()
    assert real_tc.REAL and real_tt.REAL
    with truss_modules():
        import truss_train as shim_tt
        from truss.base.truss_config import AcceleratorSpec

        assert shim_tt is _truss_train and AcceleratorSpec is truss_config.AcceleratorSpec
        assert not hasattr(sys.modules["truss"], "REAL")
    assert _truss_entries() == before
    import truss.base.truss_config as again
    import truss_train as again_tt

    assert again is real_tc and again_tt is real_tt
    assert not hasattr(real_tc, "WeightsSource") and not hasattr(sys.modules["truss.base"], "definitions")
    for name in before:  # plain del: monkeypatch.delitem would put them back on teardown
        del sys.modules[name]


def test_restored_after_an_exception() -> None:
    sentinel = types.ModuleType("truss_train")
    sys.modules["truss_train"] = sentinel
    try:
        with pytest.raises(RuntimeError), truss_modules():
            raise RuntimeError("boom")
        assert sys.modules["truss_train"] is sentinel
        assert "truss" not in sys.modules
    finally:
        del sys.modules["truss_train"]


def test_nested_use_restores_outer_aliases() -> None:
    with truss_modules():
        with truss_modules():
            assert sys.modules["truss_train"] is _truss_train
        assert sys.modules["truss_train"] is _truss_train
    assert "truss_train" not in sys.modules


def test_upstream_surface_modules_resolve() -> None:
    with truss_modules():
        from truss.base import constants, custom_types  # type: ignore[import-not-found]
        from truss.base.truss_config import (  # type: ignore[import-not-found]
            DEFAULT_CPU,
            DEFAULT_MEMORY,
            CheckpointList,
            Resources,
            TrainingArtifactReference,
        )
        from truss_train import deployment, loader  # type: ignore[import-not-found]
        from truss_train.loader import import_training_project  # type: ignore[import-not-found]

        assert constants is truss_constants and custom_types is _base
        assert loader is _truss_train_loader and deployment is _truss_train_deployment
        assert import_training_project is _truss_train_loader.import_training_project
        assert (DEFAULT_CPU, DEFAULT_MEMORY) == ("1", "2Gi")
        assert Resources is truss_config.Resources and CheckpointList is truss_config.CheckpointList
        assert TrainingArtifactReference is truss_config.TrainingArtifactReference
        assert constants.DEFAULT_TRAINING_CHECKPOINT_FOLDER == "/tmp/loaded_checkpoints"
        assert definitions.constants is truss_constants and definitions.custom_types is _base


def test_install_for_the_process_and_loads_inside_restore_it() -> None:
    try:
        install_truss_modules()
        assert sys.modules["truss_train"] is _truss_train
        with truss_modules():
            assert sys.modules["truss_train"] is _truss_train
        assert sys.modules["truss_train"] is _truss_train and "truss.base.constants" in sys.modules
    finally:
        for name in list(_truss_entries()):
            del sys.modules[name]


@pytest.fixture()
def fake_submitter(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, dict[str, Any]]]:
    calls: list[tuple[Any, dict[str, Any]]] = []

    def fake_push(config: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((config, kwargs))
        return {"id": "1", "training_project": {"id": "p"}}

    monkeypatch.setattr(public_api, "_submitter", None)
    public_api.register_push(fake_push)
    return calls


def test_push_forwards_to_the_registered_submitter(fake_submitter: list[Any], tmp_path: Path) -> None:
    result = public_api.push(tmp_path / "config.py", remote="dev")
    assert result["id"] == "1"
    assert fake_submitter == [(tmp_path / "config.py", {"remote": "dev", "source_dir": None, "team_id": None})]


def test_push_without_a_registered_submitter_says_how_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_bt.errors import UserError

    monkeypatch.setattr(public_api, "_submitter", None)
    with pytest.raises(UserError, match="slurm-bt run SCRIPT"):
        public_api.push(Path("config.py"))


def test_importing_the_api_registers_slurm_bt_push_without_import_strings() -> None:
    import subprocess

    code = ("import slurm_bt.api, slurm_bt.compat.public_api as p; "
            "assert p._submitter is slurm_bt.api.push; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ok"
    source = Path(public_api.__file__).read_text()
    assert "importlib" not in source and "import_module" not in source


def test_config_can_call_push_from_truss_train(tmp_path: Path, fake_submitter: list[Any]) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            """
            from pathlib import Path
            from truss_train.public_api import push
            result = push(config=Path("x/config.py"))
            """
        )
    )
    with truss_modules():
        exec(compile(script.read_text(), str(script), "exec"), {})
    assert [c for c, _ in fake_submitter] == [Path("x/config.py")]
