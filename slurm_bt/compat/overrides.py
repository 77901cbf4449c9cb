"""``truss train push``'s command-line overrides, applied to a loaded project as upstream does.

Upstream (``truss_train/deployment.py``: ``create_training_job`` and ``_apply_cli_overrides``) changes
the project in place and prints one warning per value of the config file that a flag replaces. Both
``truss_train.deployment`` (the import shim's mirror) and ``slurm-bt train push`` use this one
implementation, so the flags mean the same and warn with the same words.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from slurm_bt.compat import truss_config
from slurm_bt.compat.definitions import (
    DEFAULT_INTERACTIVE_SESSION_TIMEOUT_MINUTES,
    AvailabilityModel,
    InteractiveSession,
    InteractiveSessionTrigger,
    TrainingProject,
)

__all__ = ["apply_cli_overrides", "apply_job_name_and_team", "stderr_warning"]

Warn = Callable[[str], None]


def stderr_warning(message: str) -> None:
    """Upstream prints ``⚠ Warning: ...`` on its console; here it goes to stderr, one line."""
    print(f"⚠ Warning: {message}", file=sys.stderr)


def apply_job_name_and_team(
    project: TrainingProject,
    job_name_from_cli: str | None = None,
    team_name: str | None = None,
    *,
    warn: Warn = stderr_warning,
) -> None:
    """``--job-name`` replaces ``job.name`` (warning when the config set one); ``--team`` sets team_name."""
    if job_name_from_cli:
        if project.job.name:
            warn(
                f"name '{project.job.name}' provided in config file will be ignored. Using job name "
                f"'{job_name_from_cli}' provided via --job-name flag."
            )
        project.job.name = job_name_from_cli
    if team_name:
        project.team_name = team_name


def apply_cli_overrides(
    project: TrainingProject,
    interactive_trigger: str | None = None,
    interactive_timeout_minutes: int | None = None,
    accelerator: str | None = None,
    node_count: int | None = None,
    entrypoint: str | None = None,
    priority: int | None = None,
    spot: bool = False,
    *,
    warn: Warn = stderr_warning,
) -> None:
    """Apply the flags to ``project`` in place, warning where a config value is replaced.

    Raises:
        pydantic.ValidationError: a value the model rejects (assignment is validated, as upstream).
        ValueError: ``interactive_trigger`` is not a trigger name.
    """
    job = project.job
    if interactive_trigger is not None or interactive_timeout_minutes is not None:
        if job.interactive_session is None:
            job.interactive_session = InteractiveSession()
        session = job.interactive_session
        if interactive_trigger is not None:
            trigger = InteractiveSessionTrigger(interactive_trigger.lower())
            if session.trigger != InteractiveSessionTrigger.ON_DEMAND:
                warn(
                    f"interactive trigger '{session.trigger.value}' provided in config file will be ignored. "
                    f"Using '{interactive_trigger}' provided via --interactive flag."
                )
            session.trigger = trigger
        if interactive_timeout_minutes is not None:
            if session.timeout_minutes != DEFAULT_INTERACTIVE_SESSION_TIMEOUT_MINUTES:
                warn(
                    f"interactive timeout '{session.timeout_minutes}' minutes provided in config file will be "
                    f"ignored. Using '{interactive_timeout_minutes}' minutes provided via "
                    "--interactive-timeout-minutes flag."
                )
            session.timeout_minutes = interactive_timeout_minutes
    if accelerator is not None:
        if job.compute.accelerator is not None:
            warn(
                f"accelerator '{job.compute.accelerator}' provided in config file will be ignored. "
                f"Using '{accelerator}' provided via --accelerator flag."
            )
        job.compute.accelerator = truss_config.AcceleratorSpec.model_validate(accelerator)
    if node_count is not None:
        if job.compute.node_count != 1:
            warn(
                f"node_count '{job.compute.node_count}' provided in config file will be ignored. "
                f"Using '{node_count}' provided via --node-count flag."
            )
        job.compute.node_count = node_count
    if entrypoint is not None:
        if job.runtime.start_commands:
            warn(
                f"start_commands {job.runtime.start_commands} provided in config file will be ignored. "
                f"Using '{entrypoint}' provided via --entrypoint flag."
            )
        job.runtime.start_commands = [entrypoint]
    if priority is not None:
        if job.priority is not None:
            warn(
                f"priority '{job.priority}' provided in config file will be ignored. "
                f"Using '{priority}' provided via --priority flag."
            )
        job.priority = priority
    if spot:
        # The flag always wins without a warning: the default (dedicated) cannot be told from an
        # explicit one, so a warning would fire on the common path (upstream's reasoning).
        job.compute.availability_model = AvailabilityModel.SPOT
