"""``slurm-bt stop JOB...``: ``scancel`` as the caller, then confirm the state change.

Slurm decides who may cancel what (the caller's own jobs; operators and root more), so nothing
here widens it. Confirmation asks slurmctld (``squeue --states=all``, one call per poll, 0.5 s
doubling to 4 s) because sacct lags the controller by seconds; a job that slurmctld no longer
holds is confirmed from sacct. A job still running after ``--timeout`` is a runtime failure (exit 1).
"""

from __future__ import annotations

import time
from typing import Any

import click

from slurm_bt.cli import options
from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.options import host_options, load_records, print_json, remote_json
from slurm_bt.display import visible

__all__ = ["stop_command"]

_CONFIRMED = {"CANCELLED", "COMPLETING", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
              "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def _stop_local(job_ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
    from slurm_bt.errors import RuntimeFailure
    from slurm_bt.jobs.lifecycle import query_statuses
    from slurm_bt.jobs.poll import Backoff
    from slurm_bt.slurm.states import lifecycle

    client = options.make_client()
    records = load_records(job_ids)
    before = {st.job_id: st for st in query_statuses(client, job_ids, records=records).statuses}
    to_cancel = [j for j in job_ids if not before[j].terminal]
    for jid in to_cancel:
        client.cancel(jid)
    backoff = Backoff(initial_s=0.5, max_s=4.0)
    deadline = time.monotonic() + timeout_s
    pending = set(to_cancel)
    while pending:
        live = {str(r.job_id): r for r in client.live(sorted(pending)) if not r.is_step}
        for jid in list(pending):
            row = live.get(jid)
            if row is None or row.state in _CONFIRMED:
                pending.discard(jid)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(backoff.next())
    after = {st.job_id: st for st in query_statuses(client, job_ids, records=records).statuses}
    out = []
    for jid in job_ids:
        d = after[jid].as_dict()
        if jid in to_cancel and after[jid].lifecycle is not None and not after[jid].terminal:
            # sacct has not caught up with slurmctld yet; report what the controller confirmed.
            lc = lifecycle("CANCELLED")
            d.update(current_status=lc.status.value, slurm_state=lc.slurm_state, detail=lc.detail)
        d["stopped"] = jid in to_cancel and jid not in pending
        d["already_finished"] = jid not in to_cancel
        out.append(d)
    if pending:
        raise RuntimeFailure(f"scancel was sent, but job(s) {', '.join(sorted(pending))} still run after "
                             f"{timeout_s:g} s; check `squeue -j {','.join(sorted(pending))}`")
    return out


@click.command(name="stop")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds to wait for Slurm to confirm the cancellation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@host_options
def stop_command(job_ids: tuple[str, ...], timeout_s: float, as_json: bool, host: str | None,
                 accept_new_host_key: bool, debug: bool) -> None:
    """Stop (scancel) JOB_IDS and wait until Slurm confirms: TRAINING_JOB_STOPPED."""
    from slurm_bt.jobs.lifecycle import check_job_ids

    with handle_errors("slurm-bt", debug=debug):
        job_ids = tuple(check_job_ids(list(job_ids)))
        if host is not None:
            rows = remote_json(host, ["stop", *job_ids, "--timeout", str(timeout_s)], accept_new_host_key) or []
        else:
            rows = _stop_local(list(job_ids), timeout_s)
    if as_json:
        print_json(rows)
    else:
        for d in rows:
            verb = "already finished" if d.get("already_finished") else "stopped"
            click.echo(visible(f"Job {d['id']} {verb}: {d.get('current_status')} ({d.get('detail')})"))
    code = click.get_current_context().meta.get("remote_exit")
    if code:
        raise SystemExit(code)
