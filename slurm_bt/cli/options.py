"""Options and helpers shared by the ``slurm-bt`` job verbs (status/view, list, logs, stop, metrics).

Every verb works locally or, with ``--host``, on a login node over SSH: the remote side runs the
same verb with ``--json`` and this side renders it, so output and exit codes are the same either
way (:mod:`slurm_bt.remote.commands`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from slurm_bt.records import SubmissionRecord
    from slurm_bt.slurm.client import SlurmClient

__all__ = ["host_options", "load_records", "make_client", "own_records", "print_json", "remote_json", "warn",
           "workspace"]

F = TypeVar("F", bound=Callable[..., Any])


def host_options(func: F) -> F:
    """``--host`` and ``--accept-new-host-key`` (plus ``--debug``) for a verb."""
    func = click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")(func)
    func = click.option("--accept-new-host-key", is_flag=True,
                        help="With --host: add an unknown host key to ~/.ssh/known_hosts instead of refusing.")(func)
    func = click.option("--host", default=None, metavar="HOST",
                        help="Run on this login node over SSH (ssh config alias, user@host[:port]).")(func)
    return func


def warn(message: str) -> None:
    """One warning line on stderr."""
    click.echo(f"slurm-bt: warning: {message}", err=True)


def make_client() -> SlurmClient:
    """A client that runs Slurm commands on this machine, as the caller."""
    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.slurm.runner import SubprocessRunner

    return SlurmClient(SubprocessRunner())


def workspace() -> Path:
    """The caller's workspace (records, job dirs): the one site setting the job verbs need (no pydantic)."""
    from slurm_bt.site.site_file import storage_root, user_path

    return Path(user_path(storage_root("workspace")))


def load_records(
    job_ids: Sequence[str] = (), project: str | None = None, *, everything: bool = False
) -> dict[str, SubmissionRecord]:
    """The caller's own submission records: of ``job_ids``, all of ``project``, or all (newest first)."""
    from slurm_bt.records import select_records

    return select_records(workspace(), job_ids, project, everything=everything)


def own_records(job_ids: Sequence[str], what: str) -> dict[str, SubmissionRecord]:
    """The caller's records of ``job_ids`` (validated ids, :func:`~slurm_bt.jobs.lifecycle.check_job_ids`),
    or every id without one refused at once (exit 2): the one privacy rule of the job verbs that
    read or show a job (docs/cli.md, "Privacy"). ``what`` names what is shown (``logs``, ``statuses``).

    Why refuse rather than ask Slurm anyway: under ``PrivateData`` another user's running job is
    simply absent from sacct and squeue, which reads as "submitted a moment ago" (QUEUED), and
    without it the job would be shown with none of what slurm-bt knows (project, staging job).
    """
    from slurm_bt.errors import Problem, UserError

    records = load_records(job_ids)
    missing = [j for j in job_ids if j not in records]
    if missing:
        raise UserError("slurm-bt", [Problem("JOB_ID", f"job {j} was not submitted with slurm-bt from this account "
                                             f"(no submission record): {what} are only shown for your own jobs")
                                     for j in missing])
    return records


def remote_json(host: str, argv: Sequence[str], accept_new: bool) -> Any:
    """Run ``slurm-bt argv... --json`` on ``host``; pass its stderr on; exit with its code if not 0.

    A remote exit 1 that still printed JSON (degraded status) returns the JSON and leaves the
    exit to the caller via :func:`click.get_current_context`'s ``meta["remote_exit"]``.
    """
    from slurm_bt.remote.commands import run_remote

    outcome = run_remote(host, [*argv, "--json"], accept_new_host_key=accept_new)
    if outcome.stderr:
        sys.stderr.write(outcome.stderr)
    data = outcome.json()
    if outcome.returncode != 0:
        if data is None:
            raise SystemExit(outcome.returncode)
        click.get_current_context().meta["remote_exit"] = outcome.returncode
    return data


def print_json(data: Any) -> None:
    """JSON on stdout: indented for a terminal, compact for a pipe (C encoder: 1000 jobs in ms, not 0.2 s)."""
    click.echo(json.dumps(data, indent=2) if sys.stdout.isatty() else json.dumps(data))
