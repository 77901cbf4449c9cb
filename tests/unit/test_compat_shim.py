"""The truss import shim: every import path configs use, and nothing left behind afterwards."""

from __future__ import annotations

import importlib
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.compat import _truss_train, definitions, public_api, truss_config
from slurm_bt.compat.shim import SHIMMED_MODULES, truss_modules

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
        "truss", "truss.base", "truss.base.truss_config", "truss_train", "truss_train.definitions",
        "truss_train.public_api",
    }  # fmt: skip


def test_other_truss_modules_fail_cleanly() -> None:
    with truss_modules():
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("truss.base.constants")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("truss_train.deployment")
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


def test_push_forwards_lazily_to_slurm_bt_push(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []

    def fake_push(config: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((config, kwargs))
        return {"id": "1", "training_project": {"id": "p"}}

    fake_module = types.ModuleType("slurm_bt.push")
    fake_module.push = fake_push  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slurm_bt.push", fake_module)
    import slurm_bt

    monkeypatch.setattr(slurm_bt, "push", fake_module, raising=False)
    result = public_api.push(tmp_path / "config.py", remote="dev")
    assert result["id"] == "1"
    assert calls == [(tmp_path / "config.py", {"remote": "dev", "source_dir": None, "team_id": None})]
    monkeypatch.setattr(slurm_bt, "push", fake_push, raising=False)
    public_api.push(tmp_path / "c.py")
    assert len(calls) == 2


def test_config_can_call_push_from_truss_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    fake_module = types.ModuleType("slurm_bt.push")

    def fake_push(config: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append(config)
        return {}

    fake_module.push = fake_push  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "slurm_bt.push", fake_module)
    import slurm_bt

    monkeypatch.setattr(slurm_bt, "push", fake_module, raising=False)
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
    assert seen == [Path("x/config.py")]
