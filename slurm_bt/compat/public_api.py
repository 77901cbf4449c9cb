"""``truss_train.public_api``: the ``push`` that configs and scripts import.

``push`` forwards to the submitter an entry point registered with :func:`register_push`:
:mod:`slurm_bt.api` registers ``slurm_bt.api.push`` when it is imported, and every entry point that
runs config or script code (``bt-sbatch``, ``slurm-bt run``, ``slurm_bt.push``) imports it first.
Registration, not an import: this module is in the integrations layer and the submitter is an entry
point; importing it from here would be an upward import (and the loader -> public_api -> api ->
submit -> loader cycle) that lint-imports rejects.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from slurm_bt.errors import Problem, UserError

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject

__all__ = ["Submitter", "push", "register_push"]

Submitter = Callable[..., dict[str, Any]]
_submitter: Submitter | None = None


def register_push(submitter: Submitter) -> None:
    """Make ``truss_train.push`` call ``submitter`` (same arguments, same return value)."""
    global _submitter
    _submitter = submitter


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
        The job description dict of ``slurm_bt.push`` (``result["id"]``,
        ``result["training_project"]["id"]``...).

    Raises:
        UserError: nothing registered a submitter (the code was not started by slurm-bt).
    """
    if _submitter is None:
        raise UserError("push", [Problem("", "truss_train.push() submits through slurm-bt: run the script "
                                             "with `slurm-bt run SCRIPT`, or call slurm_bt.push")])
    return _submitter(config, remote=remote, source_dir=source_dir, team_id=team_id)
