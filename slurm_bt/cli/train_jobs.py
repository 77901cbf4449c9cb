"""Job selection and tables shared by the ``slurm-bt train`` verbs (truss train's rules, Slurm's facts).

truss train picks a job the same way in every verb: ``--job-id`` when given, else the most recent
job (of ``--project`` when given), saying so when there was a choice. Here "the jobs" are the
caller's own submission records (:mod:`slurm_bt.records`, newest first): the same privacy rule as
``slurm-bt logs``/``list`` (docs/cli.md), and one ``sacct`` call for all the statuses asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from slurm_bt.cli import options
from slurm_bt.display import visible

if TYPE_CHECKING:
    from slurm_bt.jobs.lifecycle import JobStatus
    from slurm_bt.records import SubmissionRecord

__all__ = [
    "ACTIVE",
    "QUEUED",
    "artifact_stem",
    "check_remote",
    "confirm",
    "forward_remote",
    "job_statuses",
    "note",
    "pick_job",
    "project_option",
    "project_records",
    "remote_host",
    "render",
]

# truss train's QUEUED_JOB_STATUSES and ACTIVE_JOB_STATUSES (truss/cli/train/core.py); QUEUED is
# slurm-bt's "submitted a moment ago, not in sacct yet" and is just as stoppable.
QUEUED = ("TRAINING_JOB_PENDING", "TRAINING_JOB_QUEUED")
ACTIVE = ("TRAINING_JOB_RUNNING", "TRAINING_JOB_CREATED", "TRAINING_JOB_DEPLOYING")

#: ``view`` without arguments asks Slurm about at most this many of the newest records (one sacct).
MAX_RECORDS_ASKED = 1000


#: upstream's ``--remote`` names a ~/.trussrc remote; these mean "this cluster" (as slurm_bt.api.push).
_LOCAL_REMOTES = (None, "baseten", "local")


def remote_host(remote: str | None) -> str | None:
    """The SSH login node ``--remote`` names, or None for this cluster.

    Upstream's ``--remote`` names a ~/.trussrc remote; as in ``slurm_bt.push(remote=...)``, the
    names ``baseten``/``local`` (and none) mean this cluster and any other names an SSH login node
    (ssh config alias, ``user@host[:port]``, ``ssh://...``; docs/cli.md, Remote use over SSH).
    """
    return None if remote in _LOCAL_REMOTES else remote


def check_remote(remote: str | None, verb: str) -> None:
    """Refuse ``--remote HOST`` for a verb that writes files here from the cluster's storage."""
    if remote_host(remote) is not None:
        raise click.UsageError(f"--remote {remote!r}: `slurm-bt train {verb}` writes files on this machine from "
                               "the cluster's storage, so it runs on the cluster only: run it on the login node")


def params_argv(ctx: click.Context) -> list[str]:
    """The command line of ``ctx``'s verb rebuilt from its parsed values (``--remote`` left out).

    ``--non-interactive`` is always added: a remote run has no terminal to ask on, so a confirmation
    there needs ``--yes`` here.
    """
    argv: list[str] = []
    positional: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in ("remote", "non_interactive") or value is None:
            continue
        if isinstance(param, click.Argument):
            positional += [str(v) for v in value] if isinstance(value, (tuple, list)) else [str(value)]
            continue
        if not isinstance(param, click.Option) or value == param.default:
            continue
        name = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        if param.is_flag:
            if value:
                argv.append(name)
        else:
            argv += [name, str(value)]
    if any(p.name == "non_interactive" for p in ctx.command.params):
        argv.append("--non-interactive")
    return argv + (["--", *positional] if positional else [])


def forward_remote(ctx: click.Context, remote: str | None, verb: Sequence[str], *, debug: bool = False) -> None:
    """With ``--remote HOST``: run this same ``train`` verb on the login node, stream it, exit with its status."""
    host = remote_host(remote)
    if host is None:
        return
    import sys

    from slurm_bt.cli.errors import handle_errors
    from slurm_bt.remote.commands import run_remote

    def out(raw: str) -> None:
        sys.stdout.write(raw)
        sys.stdout.flush()

    def err(raw: str) -> None:
        sys.stderr.write(raw)
        sys.stderr.flush()

    with handle_errors("slurm-bt", debug=debug):
        outcome = run_remote(host, ["train", *verb, *params_argv(ctx)], on_stdout=out, on_stderr=err)
    raise SystemExit(outcome.returncode)


def project_option(project: str | None, project_id: str | None) -> str | None:
    """truss's ``--project`` (name or id) and ``--project-id``: ``--project`` wins, with its message."""
    if project and project_id:
        note("Both `project-id` and `project` provided. Using `project`.")
    return project or project_id


def artifact_stem(project_name: str, job_id: str) -> str:
    """truss train's ``<project>_<job>`` file name, kept to one short, plain path component.

    The project name comes from a config (or a checkpoint index): anything but letters, digits,
    ``.``, ``_`` and ``-`` becomes ``-`` (upstream replaces spaces), no leading dot, at most 100
    characters, so the name can never climb out of the target directory or be refused as too long.
    """
    plain = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in project_name)
    return f"{plain.lstrip('.')[:100] or 'project'}_{job_id}"


def note(message: str) -> None:
    """An informational line on stderr (stdout stays the verb's output: csv and json stay parseable)."""
    click.echo(message, err=True)


def project_records(project: str | None) -> list[SubmissionRecord]:
    """The caller's records, newest first; only ``project``'s (name or id) when given."""
    from slurm_bt.records import list_records

    return list_records(options.workspace(), project)


def pick_job(job_id: str | None, project: str | None) -> str:
    """``job_id`` (validated), or the newest job of ``project`` / of the caller, as truss train does.

    Raises:
        click.UsageError: no job recorded (truss train: "No jobs found.").
    """
    from slurm_bt.jobs.lifecycle import check_job_ids

    if job_id is not None:
        return check_job_ids([job_id])[0]
    records = project_records(project)
    if not records:
        where = f" for project {project!r}" if project else ""
        raise click.UsageError(f"No jobs found{where}.")
    if len(records) > 1:
        note(f"Multiple jobs found. Showing the most recently created job: {records[0].job_id}")
    return records[0].job_id


def job_statuses(records: Sequence[SubmissionRecord]) -> list[JobStatus]:
    """The status of every record's job, one sacct call; exit 1 when slurmdbd does not answer."""
    from slurm_bt.jobs.lifecycle import query_statuses

    if not records:
        return []
    by_id = {r.job_id: r for r in records}
    report = query_statuses(options.make_client(), list(by_id), records=by_id)
    for warning in report.warnings:
        options.warn(warning)
    if report.error is not None:
        raise report.error
    return report.statuses


def confirm(message: str, *, yes: bool, non_interactive: bool) -> bool:
    """truss train's confirmation (default No); ``--yes`` answers it, ``--non-interactive`` refuses to ask."""
    if yes:
        return True
    if non_interactive:
        note(f"{message} [y/N]: not asked (--non-interactive); pass --yes to confirm")
        return False
    return click.confirm(message, default=False, err=True)


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> None:
    """An aligned text table on stdout (a title line first when given), every cell made
    :func:`~slurm_bt.display.visible` (names come from configs and checkpoint indexes)."""
    if title:
        click.echo(visible(title))
    cells = [[visible(v) for v in headers], *[[visible(v) for v in r] for r in rows]]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    for c in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())


def status_rows(statuses: Sequence[JobStatus]) -> list[dict[str, Any]]:
    """``JobStatus.as_dict`` rows (what ``slurm-bt status --json`` prints)."""
    return [st.as_dict() for st in statuses]
