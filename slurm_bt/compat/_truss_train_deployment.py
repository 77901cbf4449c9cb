"""``truss_train.deployment`` as scripts see it (the parts that mean something on Slurm).

Upstream's module uploads to Baseten's API. Kept with upstream's behaviour: the CLI overrides
(``_apply_cli_overrides``, from :mod:`slurm_bt.compat.overrides`) and ``create_training_job``, which
applies them and submits the project as a Slurm job (through ``truss_train.push``). The Baseten-API
helpers (``prepare_push``, ``S3Artifact``...) raise ``AttributeError`` saying why (:data:`NOT_PROVIDED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_bt.compat import public_api
from slurm_bt.compat.definitions import TrainingProject
from slurm_bt.compat.overrides import apply_cli_overrides, apply_job_name_and_team

__all__ = ["MAX_ARCHIVE_SIZE_BYTES", "NOT_PROVIDED", "create_training_job"]

MAX_ARCHIVE_SIZE_BYTES = 5 * 1024 * 1024 * 1024

_apply_cli_overrides = apply_cli_overrides

_BASETEN_API = "it talks to Baseten's API (uploads, project upserts); on Slurm use truss_train.push"
NOT_PROVIDED: dict[str, str] = {
    name: _BASETEN_API
    for name in ("prepare_push", "_upsert_project_and_create_job", "S3Artifact", "PreparedTrainingJob",
                 "_gather_training_dir")
}
"""Upstream names this module deliberately lacks, with the reason :func:`__getattr__` gives."""


def create_training_job(
    remote_provider: object,
    config: Path,
    training_project: TrainingProject,
    job_name_from_cli: str | None = None,
    team_name: str | None = None,
    team_id: str | None = None,
    interactive_trigger: str | None = None,
    interactive_timeout_minutes: int | None = None,
    accelerator: str | None = None,
    node_count: int | None = None,
    entrypoint: str | None = None,
    priority: int | None = None,
    spot: bool = False,
) -> dict[str, Any]:
    """Apply the overrides to ``training_project`` and submit it with ``config``'s folder as source.

    ``remote_provider`` is upstream's ``BasetenRemote``; here a string names the remote as
    ``push(remote=...)`` does and anything else means this machine.
    """
    apply_job_name_and_team(training_project, job_name_from_cli, team_name)
    apply_cli_overrides(
        training_project,
        interactive_trigger=interactive_trigger,
        interactive_timeout_minutes=interactive_timeout_minutes,
        accelerator=accelerator,
        node_count=node_count,
        entrypoint=entrypoint,
        priority=priority,
        spot=spot,
    )
    remote = remote_provider if isinstance(remote_provider, str) else None
    job_resp = public_api.push(
        training_project, remote=remote, source_dir=Path(config).absolute().parent, team_id=team_id
    )
    job_resp["job_object"] = training_project.job
    return job_resp


def __getattr__(name: str) -> object:
    reason = NOT_PROVIDED.get(name)
    if reason is not None:
        raise AttributeError(f"truss_train.deployment.{name} is not available in slurm-bt: {reason}")
    raise AttributeError(f"module 'truss_train.deployment' has no attribute {name!r}")
