"""``slurm-bt metrics JOB``: CPU, memory and GPU usage from sacct/sstat as a readable summary.

One status query (sacct), one step-usage query (sacct) and, while the job runs, one ``sstat``
per sample. ``--watch`` samples every ``--interval`` seconds (default 30, as truss's metrics) and
draws sparklines over the samples; it stops when the job ends or after ``--count`` samples.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from slurm_bt.cli import options
from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.options import host_options, load_records, print_json, remote_json

if TYPE_CHECKING:
    from slurm_bt.jobs.lifecycle import Settling

__all__ = ["metrics_command"]


def _from_dict(d: dict[str, Any]) -> Any:
    from slurm_bt.jobs.metrics import Metrics

    m = Metrics(job_id=str(d.get("id")), state=str(d.get("slurm_state") or ""), elapsed_s=d.get("elapsed_s"),
                nnodes=d.get("nodes"), alloc_cpus=d.get("cpus"), alloc_mem_bytes=d.get("memory_bytes"),
                alloc_gpus=int(d.get("gpus") or 0), cpu_used_s=d.get("cpu_used_s"),
                peak_rss_bytes=d.get("peak_rss_bytes"), peak_rss_node=str(d.get("peak_rss_node") or ""),
                gpu_util_pct=d.get("gpu_util_pct"), gpu_mem_bytes=d.get("gpu_memory_bytes"),
                live=bool(d.get("live")))
    return m


def _sample(job_id: str, settling: Settling) -> tuple[Any, bool]:
    from slurm_bt.errors import SlurmCommandError
    from slurm_bt.jobs.lifecycle import query_statuses
    from slurm_bt.jobs.metrics import collect_metrics

    client = options.make_client()
    report = query_statuses(client, [job_id], records=load_records([job_id]))
    if report.error is not None:
        raise report.error
    st = report.statuses[0]
    if st.row is None:
        raise SlurmCommandError(["sacct"], 1, f"job {job_id} is not known to Slurm (yet)",
                                "check the id; a job submitted a moment ago appears within seconds")
    return collect_metrics(client, job_id, st.row), settling.done(st)


def _to_stderr(raw: str) -> None:
    sys.stderr.write(raw)
    sys.stderr.flush()


def _show(m: Any, history: list[Any], as_json: bool) -> None:
    from slurm_bt.jobs.metrics import render_metrics

    if as_json:
        click.echo(json.dumps(m.as_dict()))
    else:
        for line in render_metrics(m, history):
            click.echo(line)
    sys.stdout.flush()


@click.command(name="metrics")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object per sample with --watch).")
@click.option("--watch", is_flag=True, help="Sample repeatedly and draw sparklines, until the job ends.")
@click.option("--interval", "interval_s", type=click.FloatRange(min=5.0), default=30.0, show_default=True,
              help="With --watch: seconds between samples (at least 5: each sample asks slurmctld).")
@click.option("--count", type=click.IntRange(min=1), default=None, help="With --watch: stop after N samples.")
@host_options
def metrics_command(job_id: str, as_json: bool, watch: bool, interval_s: float, count: int | None,
                    host: str | None, accept_new_host_key: bool, debug: bool) -> None:
    """CPU, memory and GPU usage of JOB_ID (sacct for finished steps, sstat for running ones)."""
    from slurm_bt.jobs.lifecycle import Settling, check_job_ids

    with handle_errors("slurm-bt", debug=debug):
        [job_id] = check_job_ids([job_id])
        if host is not None and not watch:
            d = remote_json(host, ["metrics", job_id], accept_new_host_key)
            if as_json:
                print_json(d)
            elif isinstance(d, dict):
                _show(_from_dict(d), [], False)
            return
        if host is not None:
            from slurm_bt.remote.commands import run_remote

            history_r: list[Any] = []

            def on_line(raw: str) -> None:
                try:
                    m = _from_dict(json.loads(raw))
                except (ValueError, TypeError, AttributeError):
                    return
                history_r.append(m)
                _show(m, history_r, as_json)

            argv = ["metrics", job_id, "--json", "--watch", "--interval", str(interval_s)]
            if count is not None:
                argv += ["--count", str(count)]
            outcome = run_remote(host, argv, accept_new_host_key=accept_new_host_key, on_stdout=on_line,
                                 on_stderr=_to_stderr)
            if outcome.returncode:
                raise SystemExit(outcome.returncode)
            return
        settling = Settling()
        m, terminal = _sample(job_id, settling)
        if not watch:
            if as_json:
                print_json(m.as_dict())
            else:
                _show(m, [], False)
            return
        history = [m]
        _show(m, history, as_json)
        while not terminal and (count is None or len(history) < count):
            time.sleep(interval_s)
            m, terminal = _sample(job_id, settling)
            history.append(m)
            if not as_json:
                click.echo("")
            _show(m, history, as_json)
