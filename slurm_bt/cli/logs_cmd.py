"""``slurm-bt logs JOB``: the batch output and every node's output, each line tagged by its node.

``--follow`` prints lines as they are written until the job ends: files are read every 0.5 s from
the shared filesystem (free for the controller) and the job state is asked with one sacct call per
poll on a 2 s → 30 s back-off, tolerating a few failed polls (:mod:`slurm_bt.jobs.poll`).
Logs are read only through the caller's own submission record (:mod:`slurm_bt.jobs.logs`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from slurm_bt.cli import options
from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.options import host_options, own_records, warn

__all__ = ["logs_command"]


def _print(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()  # a follower is read through a pipe as lines come


def _to_stderr(raw: str) -> None:
    sys.stderr.write(raw)
    sys.stderr.flush()


def _render_json_line(raw: str) -> None:
    try:
        d: Any = json.loads(raw)
        _print(f"[{d['tag']}] {d['line']}")
    except (ValueError, KeyError, TypeError):
        _print(raw.rstrip("\n"))


def _remote(host: str, job_id: str, follow: bool, tail: int | None, node: int | None, as_json: bool,
            accept_new: bool) -> None:
    from slurm_bt.remote.commands import run_remote

    argv = ["logs", job_id, "--json"]
    if follow:
        argv.append("--follow")
    if tail is not None:
        argv += ["--tail", str(tail)]
    if node is not None:
        argv += ["--node", str(node)]
    outcome = run_remote(
        host, argv, accept_new_host_key=accept_new,
        on_stdout=(lambda raw: _print(raw.rstrip("\n"))) if as_json else _render_json_line,
        on_stderr=_to_stderr,
    )
    if outcome.returncode != 0:
        raise SystemExit(outcome.returncode)


@click.command(name="logs")
@click.argument("job_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the job ends.")
@click.option("--tail", type=click.IntRange(min=0), default=None, metavar="N",
              help="Start with the last N lines of each node's output.")
@click.option("--node", "node_rank", type=click.IntRange(min=0), default=None, metavar="RANK",
              help="Only this node rank's output.")
@click.option("--json", "as_json", is_flag=True, help="JSON Lines: {\"tag\", \"node\", \"line\"} per line.")
@host_options
def logs_command(job_id: str, follow: bool, tail: int | None, node_rank: int | None, as_json: bool,
                 host: str | None, accept_new_host_key: bool, debug: bool) -> None:
    """Print JOB_ID's output: the batch step, then each node, every line tagged ([node 0] ...)."""
    from slurm_bt.jobs.lifecycle import Settling, check_job_ids, query_statuses
    from slurm_bt.jobs.logs import LogLine, LogReader, follow_logs

    with handle_errors("slurm-bt", debug=debug):
        [job_id] = check_job_ids([job_id])
        if host is not None:
            _remote(host, job_id, follow, tail, node_rank, as_json, accept_new_host_key)
            return
        records = own_records([job_id], "logs")
        record = records[job_id]
        reader = LogReader(Path(record.job_dir), job_id, node=node_rank, tail=tail)

        def emit(line: LogLine) -> None:
            if as_json:
                _print(json.dumps({"tag": line.tag, "node": line.node, "line": line.text}))
            else:
                _print(line.render())

        if not follow:
            for line in reader.read() + reader.flush():
                emit(line)
            for warning in reader.warnings:
                warn(warning)
            return
        client = options.make_client()
        settling = Settling()

        def poll() -> tuple[bool, str | None, str]:
            report = query_statuses(client, [job_id], records=records, retries=0)
            if report.error is not None:
                return False, str(report.error), ""
            st = report.statuses[0]
            return settling.done(st), None, st.status + (st.lifecycle.detail if st.lifecycle else "")

        follow_logs(reader, poll, emit=emit, on_warning=warn)
