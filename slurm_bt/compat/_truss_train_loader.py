"""``truss_train.loader`` as scripts see it (mirror of upstream ``truss_train/loader.py``).

Upstream semantics on purpose: the module runs as is (no extra checks, exceptions propagate), the
file must exist, exactly one instance of the target type must be defined. slurm-bt's own loader with
one-line problem reports is :func:`slurm_bt.compat.loader.load_training_project`; ``push()`` applies
slurm-bt's checks to whatever this returns.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
from collections.abc import Iterator
from typing import TypeVar

from slurm_bt.compat import definitions

__all__ = ["import_deploy_checkpoints_config", "import_target", "import_training_project"]

T = TypeVar("T")


@contextlib.contextmanager
def import_training_project(module_path: pathlib.Path) -> Iterator[definitions.TrainingProject]:
    """The one ``TrainingProject`` defined by the module at ``module_path``."""
    with import_target(module_path, definitions.TrainingProject) as project:
        yield project


@contextlib.contextmanager
def import_deploy_checkpoints_config(module_path: pathlib.Path) -> Iterator[definitions.DeployCheckpointsConfig]:
    """The one ``DeployCheckpointsConfig`` defined by the module at ``module_path``."""
    with import_target(module_path, definitions.DeployCheckpointsConfig) as config:
        yield config


@contextlib.contextmanager
def import_target(module_path: pathlib.Path, target_type: type[T]) -> Iterator[T]:
    """Execute the module (not registered in ``sys.modules``) and yield its one ``target_type``.

    Raises:
        ImportError: not a file, or not importable.
        ValueError: no, or more than one, instance of ``target_type``.
    """
    module_name = module_path.stem
    if not os.path.isfile(module_path):
        raise ImportError(
            f"`{module_path}` is not a file. You must point to a python file where "
            f"the training configuration is defined."
        )
    spec = importlib.util.spec_from_file_location(module_name, module_path)
    if not spec or not spec.loader:
        raise ImportError(f"Could not import `{module_path}`. Check path.")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module_vars = (getattr(module, name) for name in dir(module))
    target = [sym for sym in module_vars if isinstance(sym, target_type)]
    # Upstream prints the class repr; ours lives elsewhere, so the text is pinned to upstream's.
    shown = f"<class 'truss_train.definitions.{target_type.__name__}'>"
    if len(target) == 0:
        raise ValueError(f"No `{shown}` was found.")
    if len(target) > 1:
        raise ValueError(f"Multiple `{shown}`s were found.")
    yield target[0]
