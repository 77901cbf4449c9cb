"""``slurm-bt status|view`` and ``slurm-bt list``: truss lifecycle + Slurm state, one batched query.

``status JOB...`` (or ``view``, truss's name) shows given jobs; ``--project NAME`` every job of a
project from the caller's submission records; ``list`` the caller's most recent jobs. Output is a
table, or ``--json``. When slurmdbd is unreachable the live jobs slurmctld still knows are shown,
then the error naming slurmdbd, and the exit status is 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from slurm_bt.cli import options
from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.options import host_options, load_records, own_records, print_json, remote_json, warn
from slurm_bt.display import visible
from slurm_bt.errors import RuntimeFailure

__all__ = ["list_command", "render_table", "status_command"]

_COLUMNS = ("JOB ID", "PROJECT", "NAME", "STATUS", "SLURM", "NODES", "ELAPSED")


def _elapsed(seconds: Any) -> str:
    if not isinstance(seconds, int):
        return "-"
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def render_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Status dicts (``JobStatus.as_dict``) as an aligned text table, header first.

    A job with a ``weights`` entry gets one indented line per declared source under its row (tier
    per node, size, seconds), so the table shows where each start read its weights from; a requeued
    job one line per earlier run with its cause (``run 1: time limit (REQUEUED on n[1-2], 0:00:44)``).
    Every cell and line goes through :func:`~slurm_bt.display.visible`: names come from configs.
    """
    cells: list[tuple[str, ...]] = [_COLUMNS]
    for d in rows:
        project = (d.get("training_project") or {}).get("name") or "-"
        cells.append(tuple(visible(v) for v in (
            d.get("id"),
            project,
            d.get("name") or "-",
            d.get("current_status") or "UNKNOWN",
            d.get("detail") or "-",
            d.get("nodes") or "-",
            _elapsed(d.get("elapsed_s")),
        )))
    widths = [max(len(c[i]) for c in cells) for i in range(len(_COLUMNS) - 1)]
    out = []
    for i, c in enumerate(cells):
        out.append("  ".join(v.ljust(w) for v, w in zip(c[:-1], widths, strict=True)) + "  " + c[-1])
        weights = rows[i - 1].get("weights") if i else None
        if isinstance(weights, dict):
            from slurm_bt.weights.delivery_report import summary_lines

            out += [f"    {visible(line)}" for line in summary_lines(weights)]
        runs = rows[i - 1].get("runs") if i else None
        if isinstance(runs, list):  # earlier runs of a requeued job, each with its cause (docs/long-runs.md)
            for run in runs:
                if isinstance(run, dict):
                    line = (f"    run {int(run.get('run', 0)) + 1}: {run.get('cause')} ({run.get('state')} on "
                            f"{run.get('nodes') or '-'}, {_elapsed(run.get('elapsed_s'))})")
                    out.append(visible(line))
    return [line.rstrip() for line in out]


def _emit(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(rows)
    else:
        for line in render_table(rows):
            click.echo(line)


def _degraded_exit(error: Exception | None) -> None:
    """After the rows are shown: exit 1 (through handle_errors) when slurmdbd did not answer."""
    if error is not None:
        raise RuntimeFailure(f"slurmdbd unreachable, showing only jobs slurmctld still holds: {error}")


def _local_status(job_ids: list[str], project: str | None, wait: bool, timeout_s: float, as_json: bool,
                  limit: int | None = None) -> list[dict[str, Any]]:
    from slurm_bt.jobs.lifecycle import query_statuses, wait_for_jobs
    from slurm_bt.weights.delivery_report import weights_status, with_node_copy_state

    if project is None and limit is None:
        # Only the caller's own jobs, as `logs` and the train verbs: without this, another user's
        # running job (hidden by PrivateData) read as QUEUED and exited 0 (issue 31, item 6).
        records = own_records(job_ids, "statuses")
    else:
        records = load_records(job_ids, project, everything=limit is not None)
    if project is not None or limit is not None:
        job_ids = list(records)[: limit if limit is not None else None]
        if not job_ids:
            what = f"project {project!r}" if project is not None else "this account"
            click.echo(f"slurm-bt: no jobs recorded for {what}", err=True)
            return []
    client = options.make_client()
    if wait:
        def show(st: Any) -> None:
            if not as_json:
                detail = st.lifecycle.detail if st.lifecycle else "unknown"
                click.echo(visible(f"{st.job_id:<10} {st.status:<28} {detail}"))
                sys.stdout.flush()

        report = wait_for_jobs(client, job_ids, timeout_s=timeout_s, records=records, on_change=show, on_warning=warn)
    else:
        report = query_statuses(client, job_ids, records=records)
    for warning in report.warnings:
        warn(warning)
    from slurm_bt.images.status import image_status

    rows = [with_node_copy_state({**st.as_dict(), "weights": weights_status(st.record),
                                  "image": image_status(st.record)}) for st in report.statuses]
    if as_json or not wait:
        _emit(rows, as_json)
    _degraded_exit(report.error)
    return rows


def _remote_status(host: str, argv: list[str], accept_new_host_key: bool, as_json: bool) -> list[dict[str, Any]]:
    """Run the verb on ``host``, show its rows as a local run would, and pass on its exit status."""
    rows: list[dict[str, Any]] = remote_json(host, argv, accept_new_host_key) or []
    _emit(rows, as_json)
    code = click.get_current_context().meta.get("remote_exit")
    if code:
        raise SystemExit(code)
    return rows


@click.command(name="status")
@click.argument("job_ids", nargs=-1)
@click.option("--project", default=None, metavar="NAME", help="Every job of this project (name or id).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--wait", is_flag=True, help="Wait until every job has finished.")
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True,
              help="With --wait: give up after this many seconds.")
@click.option("--check", is_flag=True, help="Exit 1 unless every job COMPLETED.")
@host_options
def status_command(job_ids: tuple[str, ...], project: str | None, as_json: bool, wait: bool, timeout_s: float,
                   check: bool, host: str | None, accept_new_host_key: bool, debug: bool) -> None:
    """Show JOB_IDS (or every job of --project): TRAINING_JOB_* status with Slurm's state and reason."""
    if not job_ids and project is None:
        raise click.UsageError("give one or more JOB_IDS or --project NAME")
    from slurm_bt.jobs.lifecycle import check_job_ids

    with handle_errors("slurm-bt", debug=debug):
        job_ids = tuple(check_job_ids(job_ids))
        if host is not None:
            argv = ["status", *job_ids, *(["--project", project] if project else [])]
            if wait:
                argv += ["--wait", "--timeout", str(timeout_s)]
            rows = _remote_status(host, argv, accept_new_host_key, as_json)
        else:
            rows = _local_status(list(job_ids), project, wait, timeout_s, as_json)
    if check and any(r.get("current_status") != "TRAINING_JOB_COMPLETED" for r in rows):
        raise SystemExit(1)


@click.command(name="list")
@click.option("--project", default=None, metavar="NAME", help="Only this project's jobs.")
@click.option("--limit", type=click.IntRange(1, 10000), default=20, show_default=True, help="How many recent jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@host_options
def list_command(project: str | None, limit: int, as_json: bool, host: str | None, accept_new_host_key: bool,
                 debug: bool) -> None:
    """Your most recent jobs (from your submission records), newest first, with their status."""
    with handle_errors("slurm-bt", debug=debug):
        if host is not None:
            argv = ["list", "--limit", str(limit), *(["--project", project] if project else [])]
            _remote_status(host, argv, accept_new_host_key, as_json)
        else:
            _local_status([], project, False, 0.0, as_json, limit=limit)
