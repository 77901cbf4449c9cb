"""The Python API, shaped like truss_train's ``push``.

``push(Path("config.py"))`` loads and submits a config file; ``push(project)`` submits a
TrainingProject built in code, snapshotting ``source_dir`` (default: the current directory). The
returned dict has the keys callers of truss_train rely on (``id``, ``training_project.id``/``name``,
``current_status``, ...), with ``id`` being the Slurm job id.

``remote``: upstream names a remote from ``~/.trussrc``; here a non-local ``remote`` names an SSH
login node: an alias from ``~/.ssh/config`` (``push(path, remote="hpc-login")``), ``user@host``,
``host:port`` or ``ssh://user@host:port``. The snapshot is built locally and submitted there
(:mod:`slurm_bt.remote.commands`); the returned dict has the same shape as a local push.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.compat import public_api as _truss_public_api
from slurm_bt.errors import Problem, UserError

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject
    from slurm_bt.submit import SubmitResult

__all__ = ["push", "training_job_dict"]

_LOCAL_REMOTES = {None, "baseten", "local"}


def push(
    config: Path | TrainingProject,
    *,
    remote: str | None = None,
    source_dir: Path | None = None,
    team_id: str | None = None,
) -> dict[str, Any]:
    """Submit a training project to Slurm and return a truss_train-shaped job dict.

    A project object gets every check a config file gets (:func:`slurm_bt.compat.loader.check_project`,
    run by :func:`slurm_bt.submit.submit_project`): ``node_count=0`` or a mount under ``/etc`` fail
    the same way under ``bt-sbatch``, ``push(Path)`` and ``push(project)``.

    Args:
        config: a ``pathlib.Path`` to a config.py, or a TrainingProject object (as upstream, a plain
            ``str`` is treated as neither and rejected).
        remote: ``None``/"baseten"/"local" submit on this machine; anything else is an SSH login
            node (ssh config alias, ``user@host[:port]`` or ``ssh://user@host:port``). Remote
            submission takes a config *path* (the folder is uploaded).
        source_dir: the folder to snapshot when ``config`` is an object (default: cwd).
        team_id: accepted for compatibility; teams are Slurm accounts here (pass ``--account``).
    """
    from slurm_bt.compat.definitions import TrainingProject
    from slurm_bt.compat.loader import load_training_project
    from slurm_bt.submit import submit_project

    if remote not in _LOCAL_REMOTES:
        return _push_remote(config, str(remote))
    job_object = None
    if isinstance(config, Path):
        source = os.fspath(config)
        project = load_training_project(config)
        config_path = config.resolve()
        job_object = project.job
    elif isinstance(config, TrainingProject):
        project = config
        source = "push"
        config_path = (source_dir or Path.cwd()).resolve() / "config.py"
    else:
        raise UserError("push", [Problem("config", f"expected a pathlib.Path or a TrainingProject, "
                                         f"got {type(config).__name__}")])
    result = submit_project(project, config_path=config_path, source=source)
    out = training_job_dict(result)
    if job_object is not None:
        out["job_object"] = job_object
    return out


# ``truss_train.push`` inside configs and scripts is this function (compat/public_api.py says why
# it is registered rather than imported there).
_truss_public_api.register_push(push)


def training_job_dict(result: SubmitResult) -> dict[str, Any]:
    """The truss_train-shaped job dict of a submission (``bt-sbatch --json`` embeds it)."""
    spec = result.spec
    now = _dt.datetime.now(_dt.timezone.utc).isoformat()
    instance = f"{spec.nodes}x{spec.accelerator}:{spec.gpus_per_node}" if spec.accelerator else f"{spec.nodes}xCPU"
    out: dict[str, Any] = {
        "id": result.job_id,
        "name": spec.job_name or None,
        "training_project": {"id": spec.project_id, "name": spec.project_name},
        "current_status": "TRAINING_JOB_PENDING",
        "instance_type": {"name": instance, "gpu_type": spec.accelerator, "gpu_count": spec.gpus_per_node,
                          "cpu_count": spec.cpus_per_task, "memory_mib": spec.mem_mib},
        "created_at": now,
        "updated_at": now,
        "priority": spec.priority,
        "availability_model": spec.availability_model,
        "user": {"email": spec.context.user},
        "error_message": None,
        "job_dir": spec.context.job_dir,
    }
    return out


def _push_remote(config: Path | TrainingProject, remote: str) -> dict[str, Any]:
    from slurm_bt.compat.loader import load_training_project
    from slurm_bt.errors import RemoteError
    from slurm_bt.remote.commands import submit_remote

    if not isinstance(config, Path):
        raise UserError("push", [Problem("config", "remote push needs a pathlib.Path to a config.py "
                                         "(its folder is uploaded), not a TrainingProject object")])
    outcome = submit_remote(config, remote)
    data = outcome.json()
    if outcome.returncode != 0 or not isinstance(data, dict) or not isinstance(data.get("training_job"), dict):
        detail = outcome.stderr.strip().splitlines()[-1] if outcome.stderr.strip() else "no JSON answer"
        raise RemoteError(remote, f"bt-sbatch failed on the login node (exit {outcome.returncode}): {detail}")
    out: dict[str, Any] = dict(data["training_job"])
    out["job_object"] = load_training_project(config).job
    return out
