"""``slurm-bt status JOB...``: truss lifecycle + Slurm state, from one batched sacct call."""

from __future__ import annotations

import json
import sys

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.slurm.states import TrainingJobStatus

__all__ = ["status_command"]


def _line(st: object) -> str:
    from slurm_bt.status import JobStatus

    assert isinstance(st, JobStatus)
    return f"{st.job_id:<10} {st.lifecycle.status.value:<28} {st.lifecycle.detail}"


@click.command(name="status")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--wait", is_flag=True, help="Wait until every job has finished.")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
              help="With --wait: give up after this many seconds.")
@click.option("--check", is_flag=True, help="Exit 1 unless every job COMPLETED.")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
def status_command(job_ids: tuple[str, ...], as_json: bool, wait: bool, timeout_s: float, check: bool,
                   debug: bool) -> None:
    """Show the lifecycle state of JOB_IDS (TRAINING_JOB_* plus Slurm's state and reason)."""
    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.slurm.runner import SubprocessRunner
    from slurm_bt.status import job_statuses, wait_for_jobs

    with handle_errors("slurm-bt", debug=debug):
        client = SlurmClient(SubprocessRunner())
        if wait:
            def show(st: object) -> None:
                if not as_json:
                    click.echo(_line(st))
                    sys.stdout.flush()

            statuses = wait_for_jobs(client, list(job_ids), timeout_s=timeout_s, on_change=show)
        else:
            statuses = job_statuses(client, list(job_ids))
            if not as_json:
                for st in statuses:
                    click.echo(_line(st))
        for warning in client.last_warnings:
            click.echo(f"slurm-bt: warning: {warning}", err=True)
    if as_json:
        click.echo(json.dumps([st.as_dict() for st in statuses], indent=2))
    if check and any(st.lifecycle.status is not TrainingJobStatus.COMPLETED for st in statuses):
        raise SystemExit(1)
