"""``slurm-bt train <verb>``: ``truss train``'s verbs and flags, with truss train's meaning, on Slurm.

A Baseten user replaces the word ``truss`` by ``slurm-bt`` and keeps their commands: ``push``
(with its overrides and their warnings), ``recreate``, ``logs`` (``--tail`` *follows*, as
upstream), ``view``, ``stop`` (``--all``, and the same confirmations), ``metrics``, ``checkpoints
list``, ``get_checkpoint_urls``, ``download`` (the job's source snapshot), ``init``, ``update``
(``--priority`` through ``scontrol``) and ``isession`` (slurm_bt/cli/isession_cmd.py). Where
``slurm-bt``'s own verbs mean something else (``logs --tail N``), those stay as they are; the
mapping is in docs/cli.md ("slurm-bt train").

The job verbs reuse ``slurm-bt``'s own commands (``logs``, ``stop``, ``metrics``) through
:meth:`click.Context.invoke`, so their polling discipline and privacy rules (docs/cli.md) hold
here too; what this module adds is truss train's way of choosing the job and asking first.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.train_jobs import (
    ACTIVE,
    QUEUED,
    artifact_stem,
    check_remote,
    confirm,
    forward_remote,
    job_statuses,
    note,
    pick_job,
    project_option,
    project_records,
    remote_host,
    render,
)
from slurm_bt.errors import Problem, UserError

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject
    from slurm_bt.records import SubmissionRecord

__all__ = ["train_group"]

F = TypeVar("F", bound=Callable[..., Any])

_PROG = "slurm-bt"
_TRIGGERS = ("on_startup", "on_failure", "on_demand")


def _common(func: F) -> F:
    """truss's common options (``--remote``, ``--log``, ``--non-interactive``) plus ``--debug``."""
    func = click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")(func)
    func = click.option("--non-interactive", is_flag=True,
                        help="Never prompt (a confirmation then counts as 'no' unless --yes).")(func)
    func = click.option("--log", "log_level", type=click.Choice(["humanfriendly", "debug", "info", "warning",
                                                                 "error", "critical"], case_sensitive=False),
                        default=None, help="Accepted for truss compatibility; 'debug' shows tracebacks.")(func)
    func = click.option("--remote", default=None, metavar="NAME",
                        help="Accepted for truss compatibility: this cluster only (docs/cli.md).")(func)
    return func


def _debug(debug: bool, log_level: str | None) -> bool:
    return debug or (log_level or "").lower() == "debug"


class TrainGroup(click.Group):
    """The ``train`` group; ``isession`` (slurm_bt/cli/isession_cmd.py) and ``cache summarize``
    (slurm_bt/cli/cache_cmd.py, upstream's flags already) are imported on first use."""

    _LAZY = {"isession": "slurm_bt.cli.isession_cmd", "cache": "slurm_bt.cli.cache_cmd"}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *self._LAZY]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in self._LAZY:
            return found
        try:
            module = importlib.import_module(self._LAZY[cmd_name])
        except ImportError:
            return None
        for attr in (f"{cmd_name}_command", f"{cmd_name}_group", cmd_name):
            command = getattr(module, attr, None)
            if isinstance(command, click.Command):
                return command
        return None


@click.group(name="train", cls=TrainGroup, context_settings={"help_option_names": ["-h", "--help"]})
def train_group() -> None:
    """truss train's verbs and flags, with their meaning (docs/cli.md, "slurm-bt train")."""


# -- push ---------------------------------------------------------------------------------------


def apply_overrides(project: TrainingProject, *, job_name: str | None, interactive: str | None,
                    interactive_timeout_minutes: int | None, accelerator: str | None, node_count: int | None,
                    entrypoint: str | None, priority: int | None, spot: bool) -> None:
    """truss train push's flag overrides, each warning (``⚠ Warning: ...``) when it replaces a config value.

    The one implementation of upstream's ``create_training_job``/``_apply_cli_overrides``
    (slurm_bt/compat/overrides.py), shared with the import shim's ``truss_train.deployment``.
    ``--team`` is not applied here: it becomes ``--account`` (teams are Slurm accounts).
    """
    from slurm_bt.compat.overrides import apply_cli_overrides, apply_job_name_and_team

    apply_job_name_and_team(project, job_name, None)
    apply_cli_overrides(project, interactive, interactive_timeout_minutes, accelerator, node_count, entrypoint,
                        priority, spot)


def _created(job_id: str) -> None:
    """truss train's after-push lines, with the slurm-bt commands."""
    click.echo(f"✨ Training job successfully created! (Slurm job {job_id})")
    click.echo(f"🪵 View logs for your job via 'slurm-bt train logs --job-id {job_id} --tail'")
    click.echo(f"🔍 View metrics for your job via 'slurm-bt train metrics --job-id {job_id}'")
    click.echo(f"📋 Check its status via 'slurm-bt train view --job-id {job_id}'")


def _follow(ctx: click.Context, job_id: str, debug: bool) -> None:
    from slurm_bt.cli.logs_cmd import logs_command

    ctx.invoke(logs_command, job_id=job_id, follow=True, tail=None, node_rank=None, as_json=False, host=None,
               accept_new_host_key=False, debug=debug)


def _push_remote(ctx: click.Context, host: str, config: Path, sbatch_args: list[str], tail: bool, debug: bool) -> None:
    """``push --remote HOST``: the folder is uploaded and submitted there (``bt-sbatch --host``'s path)."""
    import sys

    from slurm_bt.remote.commands import submit_remote

    with handle_errors(_PROG, debug=debug):
        outcome = submit_remote(config, host, sbatch_args=sbatch_args)
    if outcome.stderr:
        sys.stderr.write(outcome.stderr)
    data = outcome.json()
    if outcome.returncode != 0 or not isinstance(data, dict) or not data.get("job_id"):
        raise SystemExit(outcome.returncode or 1)
    job_id = str(data["job_id"])
    _created(job_id)
    if tail:
        from slurm_bt.cli.logs_cmd import logs_command

        ctx.invoke(logs_command, job_id=job_id, follow=True, tail=None, node_rank=None, as_json=False, host=host,
                   accept_new_host_key=False, debug=debug)


def _load_bounded(config: Path) -> TrainingProject:
    """The config, loaded under the site's ``[submit]`` bounds as ``bt-sbatch`` loads it (compat/bounded.py)."""
    from slurm_bt.compat.bounded import load_training_project_bounded
    from slurm_bt.site.settings import load_site_settings

    bounds = load_site_settings().submit
    return load_training_project_bounded(config, timeout_s=bounds.config_load_timeout_s,
                                         memory_bytes=bounds.config_load_memory_bytes)


def _submit(project: TrainingProject, config: Path, source: str, sbatch_args: list[str], dry_run: bool) -> Any:
    from slurm_bt.submit import submit_project

    result = submit_project(project, config_path=config.resolve(), source=source, sbatch_args=sbatch_args,
                            dry_run=dry_run)
    for warning in result.warnings:
        click.echo(f"{_PROG}: warning: {warning}", err=True)
    return result


@train_group.command(name="push")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--tail", is_flag=True, help="Follow status + logs after push.")
@click.option("--job-name", default=None, help="Name of the training job (overrides the config).")
@click.option("--team", default=None, help="Team = Slurm account: submitted with --account=TEAM.")
@click.option("--interactive", type=click.Choice(_TRIGGERS, case_sensitive=False), default=None,
              help="Interactive session trigger mode.")
@click.option("--interactive-timeout-minutes", type=int, default=None, help="Interactive session timeout in minutes.")
@click.option("--accelerator", default=None, help="Accelerator type and count (e.g. H100:4).")
@click.option("--node-count", type=click.IntRange(min=1), default=None, help="Number of compute nodes.")
@click.option("--entrypoint", default=None, help="Entrypoint command (replaces start_commands).")
@click.option("--priority", type=int, default=None, help="Job priority (recorded in the job; see docs/cli.md).")
@click.option("--spot", is_flag=True, help="Spot capacity: availability_model=spot (requeued after preemption).")
@click.option("--dry-run", is_flag=True, help="slurm-bt: print the batch script, submit nothing.")
@_common
@click.pass_context
def push_command(ctx: click.Context, config: Path, sbatch_args: tuple[str, ...], tail: bool, job_name: str | None,
                 team: str | None, interactive: str | None, interactive_timeout_minutes: int | None,
                 accelerator: str | None, node_count: int | None, entrypoint: str | None, priority: int | None,
                 spot: bool, dry_run: bool, remote: str | None, log_level: str | None, non_interactive: bool,
                 debug: bool) -> None:
    """Run a training job: CONFIG is a truss_train config.py; arguments after `--` go to sbatch."""
    debug = _debug(debug, log_level)
    host = remote_host(remote)
    if host is not None:
        overrides = [flag for flag, value in (
            ("--job-name", job_name), ("--interactive", interactive), ("--accelerator", accelerator),
            ("--interactive-timeout-minutes", interactive_timeout_minutes), ("--node-count", node_count),
            ("--entrypoint", entrypoint), ("--priority", priority), ("--spot", spot or None),
            ("--dry-run", dry_run or None)) if value is not None]
        if overrides:
            raise click.UsageError(f"with --remote, push submits the config as written (its folder is uploaded); "
                                   f"put {', '.join(overrides)} into the config")
        _push_remote(ctx, host, config, [*sbatch_args, *([f"--account={team}"] if team else [])], tail, debug)
        return
    with handle_errors(_PROG, debug=debug):
        project = _load_bounded(config)
        try:
            apply_overrides(project, job_name=job_name, interactive=interactive,
                            interactive_timeout_minutes=interactive_timeout_minutes, accelerator=accelerator,
                            node_count=node_count, entrypoint=entrypoint, priority=priority, spot=spot)
        except ValueError as exc:  # pydantic's ValidationError too: a flag's value the model refuses
            errors = getattr(exc, "errors", None)
            detail = errors()[0].get("msg", str(exc)) if callable(errors) and errors() else str(exc)
            raise UserError(os.fspath(config), [Problem("", f"command-line override refused: {detail}")]) from None
        extra = list(sbatch_args)
        if team:
            # Teams are Slurm accounts here (slurm_bt/api.py): Slurm decides whether the user may use it.
            extra.append(f"--account={team}")
        result = _submit(project, config, os.fspath(config), extra, dry_run)
    if dry_run:
        click.echo(result.script, nl=False)
        return
    _created(str(result.job_id))
    if tail:
        _follow(ctx, str(result.job_id), debug)


# -- recreate -----------------------------------------------------------------------------------


def snapshot_config(src: Path, config_path: str) -> Path:
    """Where the config file sits in a job's snapshot (``<job_dir>/src``).

    The snapshot root is the config's folder or its ``workspace_root`` (slurm_bt/snapshot.py), so the
    config is at some tail of its original path below ``src``; the longest tail that exists as a
    regular file is it (a shorter one could be a different file of the same name higher up).
    """
    parts = Path(config_path).parts[1:]
    for k in range(len(parts), 0, -1):
        candidate = src.joinpath(*parts[-k:])
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    raise click.ClickException(f"the job's snapshot {src} holds no {Path(config_path).name}")


def own_record(job_id: str) -> SubmissionRecord:
    """The caller's record of ``job_id`` (truss train: "No training job found with ID")."""
    from slurm_bt.cli.options import workspace
    from slurm_bt.records import read_record

    record = read_record(workspace(), job_id)
    if record is None:
        raise click.UsageError(f"No training job found with ID: {job_id} (only jobs you submitted with "
                               "slurm-bt from this account have a record)")
    return record


@train_group.command(name="recreate")
@click.option("--job-id", default=None, help="Job ID of Training Job to recreate (default: your most recent job).")
@click.option("--tail", is_flag=True, help="Follow status + logs after recreation.")
@click.option("-y", "--yes", is_flag=True, help="slurm-bt: answer the confirmation with yes.")
@_common
@click.pass_context
def recreate_command(ctx: click.Context, job_id: str | None, tail: bool, yes: bool, remote: str | None,
                     log_level: str | None, non_interactive: bool, debug: bool) -> None:
    """Recreate an existing training job: submit its source snapshot again, as it was pushed."""
    debug = _debug(debug, log_level)
    forward_remote(ctx, remote, ["recreate"], debug=debug)
    with handle_errors(_PROG, debug=debug):
        from slurm_bt.jobs.lifecycle import check_job_ids

        if job_id is None:
            records = project_records(None)
            if not records:
                raise click.ClickException("No training jobs found. Please start a job first.")
            job_id = records[0].job_id
            if not confirm(f"Recreate training job from most recent job {job_id}?", yes=yes,
                           non_interactive=non_interactive):
                raise click.UsageError("Training job not recreated.")
        [job_id] = check_job_ids([job_id])
        record = own_record(job_id)
        click.echo("Recreating training job...")
        config = snapshot_config(Path(record.job_dir) / "src", record.config_path)
        project = _load_bounded(config)
        workspace = project.job.workspace
        if workspace is not None and workspace.external_dirs:
            # Copied into the snapshot's top level when it was pushed (slurm_bt/snapshot.py): recreate
            # runs those copies, not the directories as they are today (nor a second copy of them).
            workspace.external_dirs = []
        result = _submit(project, config, os.fspath(config), [], False)
    _created(str(result.job_id))
    if tail:
        _follow(ctx, str(result.job_id), debug)


# -- logs, metrics ------------------------------------------------------------------------------


@train_group.command(name="logs")
@click.option("--project-id", default=None, help="Project ID.")
@click.option("--project", default=None, help="Project name or project id.")
@click.option("--job-id", default=None, help="Job ID (default: the most recent job).")
@click.option("--tail", is_flag=True, help="Follow the logs until the job ends (truss's meaning).")
@_common
@click.pass_context
def logs_command(ctx: click.Context, project_id: str | None, project: str | None, job_id: str | None, tail: bool,
                 remote: str | None, log_level: str | None, non_interactive: bool, debug: bool) -> None:
    """Fetch logs for a training job (every node's output, tagged)."""
    from slurm_bt.cli.logs_cmd import logs_command as slurm_bt_logs

    debug = _debug(debug, log_level)
    forward_remote(ctx, remote, ["logs"], debug=debug)
    with handle_errors(_PROG, debug=debug):
        jid = pick_job(job_id, project_option(project, project_id))
    ctx.invoke(slurm_bt_logs, job_id=jid, follow=tail, tail=None, node_rank=None, as_json=False, host=None,
               accept_new_host_key=False, debug=debug)


@train_group.command(name="metrics")
@click.option("--project-id", default=None, help="Project ID.")
@click.option("--project", default=None, help="Project name or project id.")
@click.option("--job-id", default=None, help="Job ID (default: the most recent job).")
@click.option("--interval", "interval_s", type=click.FloatRange(min=5.0), default=30.0, show_default=True,
              help="slurm-bt: seconds between samples while the job runs.")
@_common
@click.pass_context
def metrics_command(ctx: click.Context, project_id: str | None, project: str | None, job_id: str | None,
                    interval_s: float, remote: str | None, log_level: str | None, non_interactive: bool,
                    debug: bool) -> None:
    """Get metrics for a training job: watched until it ends, as truss train does."""
    from slurm_bt.cli.metrics_cmd import metrics_command as slurm_bt_metrics

    debug = _debug(debug, log_level)
    forward_remote(ctx, remote, ["metrics"], debug=debug)
    with handle_errors(_PROG, debug=debug):
        jid = pick_job(job_id, project_option(project, project_id))
    ctx.invoke(slurm_bt_metrics, job_id=jid, as_json=False, watch=True, interval_s=interval_s, count=None,
               host=None, accept_new_host_key=False, debug=debug)


# -- view ---------------------------------------------------------------------------------------


def _view_projects() -> None:
    """No filter: every project with its latest job, then the queued and the active jobs."""
    from slurm_bt.cli.status_cmd import render_table
    from slurm_bt.cli.train_jobs import MAX_RECORDS_ASKED

    records = project_records(None)
    if not records:
        click.echo("No training projects yet (push one with `slurm-bt train push config.py`).")
        return
    asked = records[:MAX_RECORDS_ASKED]
    if len(records) > len(asked):
        note(f"showing the status of your {len(asked)} most recent jobs of {len(records)}")
    statuses = {st.job_id: st for st in job_statuses(asked)}
    projects: dict[str, list[SubmissionRecord]] = {}
    for rec in records:  # newest first
        projects.setdefault(rec.project_id, []).append(rec)
    rows = []
    for pid, recs in projects.items():
        latest = recs[0]
        st = statuses.get(latest.job_id)
        rows.append((pid, latest.project_name, recs[-1].submitted_at[:19], latest.submitted_at[:19],
                     latest.job_id, st.status if st else "-", str(len(recs))))
    render(("PROJECT ID", "NAME", "CREATED", "LAST MODIFIED", "LATEST JOB ID", "LATEST JOB STATUS", "JOBS"),
           rows[::-1], title="Training Projects")  # most recent at the bottom of the terminal, as upstream
    queued = [st.as_dict() for st in statuses.values() if st.status in QUEUED]
    active = [st.as_dict() for st in statuses.values() if st.status in ACTIVE]
    for title, group in (("Queued Training Jobs", queued), ("Active Training Jobs", active)):
        if group:
            click.echo("")
            click.echo(title)
            for line in render_table(group):
                click.echo(line)
    if not queued and not active:
        click.echo("No queued or active training jobs.")


def _checkpoint_names(record: SubmissionRecord) -> str:
    from slurm_bt.checkpoints.resolve import find_job, open_user_store
    from slurm_bt.errors import BtError
    from slurm_bt.site.settings import load_site_settings, user_path

    try:
        site = load_site_settings()
        store = open_user_store(site.storage.model_dump())
        try:
            found = find_job(store, record.job_id, project_id=record.project_id,
                             workspace=user_path(site.storage.workspace))
        finally:
            store.close()
    except (BtError, OSError) as exc:
        return f"(not readable: {exc})"
    if found is None:
        return "-"
    return ", ".join(c.name for c in found.index.checkpoints) or "-"


def _view_job(job_id: str) -> None:
    from slurm_bt.cli import options
    from slurm_bt.jobs.lifecycle import check_job_ids, query_statuses

    [job_id] = check_job_ids([job_id])
    # Refused like recreate/download/logs: another user's job has no record here, and asking Slurm
    # anyway showed it (hidden by PrivateData) as QUEUED/UNKNOWN and exited 0 (issue 31, item 6).
    record = own_record(job_id)
    report = query_statuses(options.make_client(), [job_id], records={job_id: record})
    if report.error is not None:
        raise report.error
    d = report.statuses[0].as_dict()
    project = d.get("training_project") or {}
    fields = [
        ("Job Name", d.get("name")), ("Job ID", job_id), ("Project ID", project.get("id")),
        ("Project Name", project.get("name")), ("Status", d.get("current_status")),
        ("Slurm", d.get("detail")), ("Nodes", d.get("nodes")), ("Partition", d.get("partition")),
        ("Created By", d.get("user")), ("Created", d.get("submitted_at")), ("Started", d.get("started_at")),
        ("Ended", d.get("ended_at")), ("Restarts", d.get("restarts")),
    ]
    fields += [("Job Dir", record.job_dir), ("Checkpoints", _checkpoint_names(record))]
    render(("FIELD", "VALUE"), [(k, "-" if v is None else str(v)) for k, v in fields],
           title=f"Training Job: {job_id}")


@train_group.command(name="view")
@click.option("--project-id", default=None, help="View training jobs for a project.")
@click.option("--project", default=None, help="Project name or project id.")
@click.option("--job-id", default=None, help="View a specific training job.")
@_common
@click.pass_context
def view_command(ctx: click.Context, project_id: str | None, project: str | None, job_id: str | None,
                 remote: str | None, log_level: str | None, non_interactive: bool, debug: bool) -> None:
    """List training projects (no argument), a project's jobs, or one job's details."""
    from slurm_bt.cli.status_cmd import render_table

    forward_remote(ctx, remote, ["view"], debug=_debug(debug, log_level))
    with handle_errors(_PROG, debug=_debug(debug, log_level)):
        name = project_option(project, project_id)
        if job_id is not None:
            _view_job(job_id)
        elif name is not None:
            records = project_records(name)
            if not records:
                raise click.UsageError("No training jobs found")
            rows = [st.as_dict() for st in job_statuses(records[::-1])]  # oldest first, as upstream
            if len(rows) == 1:
                _view_job(rows[0]["id"])
            else:
                for line in render_table(rows):
                    click.echo(line)
        else:
            _view_projects()


# -- stop ---------------------------------------------------------------------------------------


@train_group.command(name="stop")
@click.option("--project-id", default=None, help="Project ID.")
@click.option("--project", default=None, help="Project name or project id.")
@click.option("--job-id", default=None, help="Job ID.")
@click.option("--all", "stop_all", is_flag=True, help="Stop all running jobs (of --project, else all yours).")
@click.option("-y", "--yes", is_flag=True, help="slurm-bt: answer the confirmation with yes.")
@_common
@click.pass_context
def stop_command(ctx: click.Context, project_id: str | None, project: str | None, job_id: str | None,
                 stop_all: bool, yes: bool, remote: str | None, log_level: str | None, non_interactive: bool,
                 debug: bool) -> None:
    """Stop a training job (scancel as you, confirmed by Slurm)."""
    from slurm_bt.cli.status_cmd import render_table
    from slurm_bt.cli.stop_cmd import stop_command as slurm_bt_stop

    debug = _debug(debug, log_level)
    forward_remote(ctx, remote, ["stop"], debug=debug)
    with handle_errors(_PROG, debug=debug):
        name = project_option(project, project_id)
        to_stop: list[str] = []
        if job_id is not None and not stop_all:
            to_stop = [pick_job(job_id, None)]
        else:
            # truss train: the queued and running jobs (of the project), asked from Slurm now.
            live = [st for st in job_statuses(project_records(name)) if st.status in QUEUED + ACTIVE]
            if stop_all:
                if not live:
                    click.echo("No queued or active jobs found.")
                    return
                if not confirm(f"Are you sure you want to stop {len(live)} active jobs?", yes=yes,
                               non_interactive=non_interactive):
                    raise click.UsageError("Training jobs not stopped.")
            else:
                if not live:
                    raise click.UsageError("No queued or running jobs found.")
                if len(live) > 1:
                    click.echo("Active Training Jobs")
                    for line in render_table([st.as_dict() for st in live]):
                        click.echo(line)
                    raise click.UsageError("Multiple active jobs found. Please specify a job id.")
                user = live[0].as_dict().get("user")
                by = f" (created by {user})" if user else ""
                if not confirm(f"Are you sure you want to stop training job {live[0].job_id}{by}?", yes=yes,
                               non_interactive=non_interactive):
                    raise click.UsageError("Training job not stopped.")
            to_stop = [st.job_id for st in live]
    ctx.invoke(slurm_bt_stop, job_ids=tuple(to_stop), timeout_s=30.0, as_json=False, host=None,
               accept_new_host_key=False, debug=debug)
    click.echo("Training jobs stopped successfully." if len(to_stop) > 1 else "Training job stopped successfully.")


# -- update -------------------------------------------------------------------------------------


@train_group.command(name="update")
@click.option("--job-id", required=True, help="Job ID of the training job.")
@click.option("--priority", type=click.IntRange(max=2**32 - 2), default=None,
              help="New queue priority (Slurm's: higher runs first). Only PENDING jobs.")
@_common
@click.pass_context
def update_command(ctx: click.Context, job_id: str, priority: int | None, remote: str | None, log_level: str | None,
                   non_interactive: bool, debug: bool) -> None:
    """Update a training job: set a pending job's priority (scontrol update, as you)."""
    from slurm_bt.cli import options
    from slurm_bt.jobs.lifecycle import check_job_ids

    if priority is None:
        raise click.UsageError("At least one field to update must be provided.")
    forward_remote(ctx, remote, ["update"], debug=_debug(debug, log_level))
    with handle_errors(_PROG, debug=_debug(debug, log_level)):
        [job_id] = check_job_ids([job_id])
        if priority < 1:
            raise click.UsageError("--priority must be at least 1 (Slurm reads priority 0 as 'held')")
        client = options.make_client()
        # slurmctld (squeue), not sacct: sacct lags by seconds, and a job that has just started must
        # be refused, as upstream refuses anything not PENDING.
        live = [r for r in client.live([job_id]) if not r.is_step]
        if not live:
            raise click.UsageError(f"Failed to update training job: job {job_id} is not queued (finished, "
                                   "or not a job of this cluster): only PENDING jobs can have their priority changed")
        if live[0].state != "PENDING":
            raise click.UsageError(f"Failed to update training job: only PENDING jobs can have their priority "
                                   f"changed; job {job_id} is {live[0].state}")
        kept = client.set_priority(job_id, priority)
        if kept is not None:
            # Slurm applied it (a user lowering their own job) but its priority plugin may recompute it.
            options.warn(f"Slurm: {kept}")
    click.echo(f"Training job {job_id} updated.")


# -- download -----------------------------------------------------------------------------------


def download_snapshot(record: SubmissionRecord, target: Path, *, unzip: bool) -> Path:
    """Copy the job's source snapshot to ``target``: a ``.tgz``, or unpacked into a new directory.

    The snapshot (``<job_dir>/src``, slurm_bt/snapshot.py) holds only regular files and
    directories; anything else found there now is skipped (never followed), and the result is
    published with one rename, so an interrupted download leaves no half-written artifact.
    """
    import shutil
    import stat
    import tarfile
    import tempfile

    from slurm_bt.atomic import fsync_dir

    src = Path(record.job_dir) / "src"
    st = os.lstat(src)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise click.ClickException(f"{src} is not your job's snapshot directory")
    target.mkdir(parents=True, exist_ok=True)
    base = artifact_stem(record.project_name, record.job_id)
    final = target / (base if unzip else f"{base}.tgz")
    if os.path.lexists(final):
        raise click.ClickException(f"'{final}' already exists. Please remove it or specify a different "
                                   "target directory.")

    def regular_only(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return info if info.isfile() or info.isdir() else None

    tmp = Path(tempfile.mkdtemp(prefix=f".{base}.", dir=target))
    try:
        if unzip:
            def ignore(folder: str, names: list[str]) -> set[str]:
                return {n for n in names if not (stat.S_ISREG(os.lstat(os.path.join(folder, n)).st_mode)
                                                 or stat.S_ISDIR(os.lstat(os.path.join(folder, n)).st_mode))}

            shutil.copytree(src, tmp / "out", symlinks=True, ignore=ignore)
        else:
            with tarfile.open(tmp / "out", "w:gz") as tar:
                tar.add(src, arcname=".", recursive=True, filter=regular_only)
        os.rename(tmp / "out", final)
        fsync_dir(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@train_group.command(name="download")
@click.option("--job-id", required=True, help="Job ID.")
@click.option("--target-directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory where the file should be downloaded. Defaults to current directory.")
@click.option("--no-unzip", is_flag=True, help="Keep the .tgz instead of unpacking it.")
@_common
def download_command(job_id: str, target_directory: Path | None, no_unzip: bool, remote: str | None,
                     log_level: str | None, non_interactive: bool, debug: bool) -> None:
    """Download a training job's source: the snapshot slurm-bt took when it was pushed."""
    from slurm_bt.jobs.lifecycle import check_job_ids

    check_remote(remote, "download")
    with handle_errors(_PROG, debug=_debug(debug, log_level)):
        [job_id] = check_job_ids([job_id])
        record = own_record(job_id)
        path = download_snapshot(record, (target_directory or Path.cwd()).absolute(), unzip=not no_unzip)
    click.echo(f"✨ Training job data downloaded to {path}")


# -- init ---------------------------------------------------------------------------------------


@train_group.command(name="init")
@click.option("--list-examples", is_flag=True, help="List the examples (truss: from ml-cookbook; see docs/cli.md).")
@click.option("--target-directory", default=None, help="Where to create the project (default: truss-train-init).")
@click.option("--examples", default=None, help="truss: download ml-cookbook examples (not offered here).")
@_common
def init_command(list_examples: bool, target_directory: str | None, examples: str | None, remote: str | None,
                 log_level: str | None, non_interactive: bool, debug: bool) -> None:
    """Create a starter training project (config.py + run.sh) that runs on this cluster."""
    from slurm_bt.cli.train_init import write_starter

    if list_examples or examples:
        raise click.ClickException(
            "examples come from github.com/basetenlabs/ml-cookbook; slurm-bt does not download them. Clone "
            "that repository and push an example's config.py with `slurm-bt train push` (docs/cli.md).")
    with handle_errors(_PROG, debug=_debug(debug, log_level)):
        target = Path(target_directory or "truss-train-init")
        click.echo(f"Initializing empty training project at {target}")
        try:
            write_starter(target)
        except FileExistsError:
            raise click.ClickException(f"Failed to initialize training artifacts: {target} already exists") from None
    click.echo(f"✨ Empty training project initialized at {target}")
    click.echo(f"   Run it with: slurm-bt train push {target / 'config.py'} --tail")


# -- checkpoints, get_checkpoint_urls (slurm_bt/cli/train_checkpoints.py) ---------------------------


def _register_checkpoint_verbs() -> None:
    from slurm_bt.cli.train_checkpoints import checkpoints_group, get_checkpoint_urls_command

    train_group.add_command(checkpoints_group)
    train_group.add_command(get_checkpoint_urls_command)


_register_checkpoint_verbs()
