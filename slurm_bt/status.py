"""Job status for users: Slurm's accounting mapped onto truss's lifecycle (login node, as the user).

One batched query per call (sacct, with squeue for jobs slurmdbd has not recorded yet), through
:class:`~slurm_bt.slurm.client.SlurmClient`; waiting polls with back-off so a waiting user never
hammers the controller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_bt.errors import Problem, UserError
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.job_ids import try_parse_job_id
from slurm_bt.slurm.sacct import SacctRow
from slurm_bt.slurm.states import Lifecycle, TrainingJobStatus, lifecycle

__all__ = ["JobStatus", "job_statuses", "wait_for_jobs"]


@dataclass(frozen=True)
class JobStatus:
    """One job's status: the truss lifecycle plus the Slurm facts behind it."""

    job_id: str
    lifecycle: Lifecycle
    row: SacctRow | None

    def as_dict(self) -> dict[str, Any]:
        """JSON shape for ``--json`` (truss-like ``current_status`` plus Slurm detail)."""
        row = self.row
        return {
            "id": self.job_id,
            "current_status": self.lifecycle.status.value,
            "slurm_state": self.lifecycle.slurm_state,
            "detail": self.lifecycle.detail,
            "name": row.name if row else None,
            "nodes": row.node_list if row else None,
            "exit_code": list(row.exit_code) if row and row.exit_code else None,
            "elapsed_s": row.elapsed_s if row else None,
            "restarts": row.restarts if row else 0,
            "gpus": row.gpus if row else 0,
        }


def _check_ids(job_ids: Sequence[str]) -> None:
    bad = [j for j in job_ids if try_parse_job_id(j) is None]
    if bad:
        raise UserError("slurm-bt", [Problem("JOB_ID", f"not a Slurm job id: {b!r}") for b in bad])


def job_statuses(client: SlurmClient, job_ids: Sequence[str]) -> list[JobStatus]:
    """The status of every job in ``job_ids`` with one batched query."""
    _check_ids(job_ids)
    rows = {str(r.job_id): r for r in client.query(job_ids) if not r.is_step}
    out = []
    for jid in job_ids:
        row = rows.get(jid)
        if row is None:
            out.append(JobStatus(jid, lifecycle(None), None))
            continue
        out.append(JobStatus(jid, lifecycle(row.state, reason=row.reason, exit_code=row.exit_code,
                                            restarts=row.restarts, cancelled_by=row.cancelled_by), row))
    return out


def wait_for_jobs(
    client: SlurmClient,
    job_ids: Sequence[str],
    *,
    timeout_s: float,
    on_change: Callable[[JobStatus], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[JobStatus]:
    """Poll until every job is terminal (or ``timeout_s`` passes); 1 s, doubling up to 15 s."""
    deadline = clock() + timeout_s
    delay = 1.0
    seen: dict[str, TrainingJobStatus] = {}
    while True:
        statuses = job_statuses(client, job_ids)
        for st in statuses:
            if on_change is not None and seen.get(st.job_id) != st.lifecycle.status:
                on_change(st)
            seen[st.job_id] = st.lifecycle.status
        if all(st.lifecycle.terminal for st in statuses) or clock() >= deadline:
            return statuses
        sleep(min(delay, max(0.0, deadline - clock())))
        delay = min(delay * 2, 15.0)
