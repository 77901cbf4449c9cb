"""Job status for users: Slurm's accounting mapped onto truss's lifecycle (login node, as the user).

Slurm is the source of truth; submission records only add what Slurm does not know (project, truss
job name, the staging job). Every call asks **one** batched question:

* ``sacct -D`` for all asked jobs *and* their staging jobs at once (``-D`` so a requeued job shows
  "requeued n times"; :func:`~slurm_bt.slurm.sacct.latest_runs` folds the earlier runs), plus
  one ``squeue`` only for ids slurmdbd has not recorded yet (a job submitted a moment ago) and for
  pending jobs sacct gives no reason (a requeued job on 24.11 and 26.05; the reason comes from squeue);
* if sacct fails (slurmdbd down or unreachable), the answer degrades instead of vanishing:
  ``squeue --states=all`` still knows pending, running and recently finished jobs (``MinJobAge``),
  the report carries the sacct error, and the CLI prints it (naming slurmdbd) and exits 1.

Privacy: sacct and squeue run *as the caller*, so the caller sees exactly what Slurm shows them
(``PrivateData`` applies); nothing here reads another user's files. The one file read beyond the
records, the weights delivery status (:func:`slurm_bt.weights.delivery_report.weights_status`, which the
status command adds), comes from the job dir named in the caller's own record, only when that record
says the job declared weights, and only from a folder the caller owns.

Array jobs asked for by their master id (``123``) and het jobs (``123`` with ``123+0``, ``123+1``)
are folded into one status: the least advanced member while any is still active, otherwise the
worst outcome, with per-state counts in the detail.

Restarts (docs/long-runs.md): the earlier runs ``sacct -D`` lists become :attr:`JobStatus.runs`, each
with its cause: the batch script's restart log (:mod:`slurm_bt.jobs.restarts`, in the caller's own
job dir, read only when the job has earlier runs) tells a time-limit requeue from a retried failure;
without it the run's sacct state says (``PREEMPTED``, ``NODE_FAIL``). The detail lists the causes
(``RUNNING; requeued 2 times (time limit, preempted)``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from slurm_bt.errors import Problem, SlurmCommandError, UserError
from slurm_bt.jobs.restarts import cause_of_run, read_log
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.job_ids import JobId, parse_job_id, try_parse_job_id
from slurm_bt.slurm.sacct import JobRow, latest_runs
from slurm_bt.slurm.states import Lifecycle, TrainingJobStatus, lifecycle

if TYPE_CHECKING:
    from slurm_bt.records import SubmissionRecord

__all__ = [
    "SETTLE_GRACE_S",
    "JobStatus",
    "RunInfo",
    "Settling",
    "StatusReport",
    "check_job_ids",
    "job_statuses",
    "query_statuses",
    "wait_for_jobs",
]

# Order used to fold array tasks / het components: while any member is active, show the least
# advanced (the job as a whole is not further than that); once all ended, show the worst ending.
_PROGRESS = [
    TrainingJobStatus.QUEUED,
    TrainingJobStatus.PENDING,
    TrainingJobStatus.CREATED,
    TrainingJobStatus.DEPLOYING,
    TrainingJobStatus.RUNNING,
]
_SEVERITY = [
    TrainingJobStatus.COMPLETED,
    TrainingJobStatus.STOPPED,
    TrainingJobStatus.FAILED,
    TrainingJobStatus.DEPLOY_FAILED,
]


@dataclass(frozen=True)
class RunInfo:
    """One earlier run of a requeued job (a ``sacct -D`` row before the current one).

    Attributes:
        run: 0 for the first run.
        state: Slurm's state of that run (``REQUEUED``, ``PREEMPTED``, ``NODE_FAIL``...).
        cause: why it ended: ``time limit``, ``preempted``, ``node failure``, ``failed`` (or
            ``requeued`` when neither the restart log nor the state says more).
        row: the sacct row.
    """

    run: int
    state: str
    cause: str
    row: JobRow

    def as_dict(self) -> dict[str, Any]:
        """JSON shape for ``--json``."""
        return {"run": self.run, "state": self.state, "cause": self.cause, "nodes": self.row.node_list or None,
                "started_at": _iso(self.row.start), "ended_at": _iso(self.row.end),
                "elapsed_s": self.row.elapsed_s}


@dataclass(frozen=True)
class JobStatus:
    """One job's status: the truss lifecycle plus the Slurm facts behind it.

    Attributes:
        job_id: the id as asked.
        lifecycle: truss status and a detail naming Slurm's state; ``None`` when nobody can say
            (slurmdbd unreachable and slurmctld no longer holds the job).
        row: the Slurm row behind it (the representative member for arrays and het jobs).
        record: the caller's submission record, when the job was submitted with slurm-bt.
        staging_row: the staging job's row, when the record names one and Slurm knows it.
        members: how many array tasks / het components were folded into this status.
        runs: the earlier runs of a requeued job, oldest first, each with its cause.
    """

    job_id: str
    lifecycle: Lifecycle | None
    row: JobRow | None
    record: SubmissionRecord | None = None
    staging_row: JobRow | None = None
    members: int = 1
    runs: tuple[RunInfo, ...] = ()

    @property
    def status(self) -> str:
        """``TRAINING_JOB_*``, or ``"UNKNOWN"`` when :attr:`lifecycle` is ``None``."""
        return self.lifecycle.status.value if self.lifecycle is not None else "UNKNOWN"

    @property
    def terminal(self) -> bool:
        """True when the job will not change any more (unknown counts as not terminal)."""
        return self.lifecycle is not None and self.lifecycle.terminal

    def as_dict(self) -> dict[str, Any]:
        """JSON shape for ``--json``: truss-like ``current_status`` plus the Slurm detail."""
        row, rec = self.row, self.record
        return {
            "id": self.job_id,
            "current_status": self.lifecycle.status.value if self.lifecycle else None,
            "slurm_state": self.lifecycle.slurm_state if self.lifecycle else None,
            "detail": self.lifecycle.detail if self.lifecycle else "unknown",
            "reason": row.reason if row else None,
            "name": rec.job_name if rec and rec.job_name else (row.name if row else None),
            "slurm_job_name": row.name if row else None,
            "training_project": {"id": rec.project_id, "name": rec.project_name} if rec else None,
            "user": row.user if row and row.user else (rec.user if rec else None),
            "partition": row.partition if row else None,
            "nodes": row.node_list if row else None,
            "node_count": row.nnodes if row else None,
            "gpus": row.gpus if row else 0,
            "exit_code": list(row.exit_code) if row and row.exit_code else None,
            "submitted_at": _iso(row.submit) if row else (rec.submitted_at if rec else None),
            "started_at": _iso(row.start) if row else None,
            "ended_at": _iso(row.end) if row else None,
            "elapsed_s": row.elapsed_s if row else None,
            "restarts": row.restarts if row else 0,
            "runs": [r.as_dict() for r in self.runs],
            "staging_job_id": rec.staging_job_id if rec else None,
            "staging_state": self.staging_row.state if self.staging_row else None,
            "members": self.members,
            "source": row.source if row else None,
        }


@dataclass
class StatusReport:
    """The answer to one status question.

    Attributes:
        statuses: one per asked id, in the order asked.
        warnings: things the user should know (skipped rows, retried calls).
        error: the sacct failure when accounting was unreachable; the statuses then come from
            slurmctld alone and the CLI exits 1 after printing them.
    """

    statuses: list[JobStatus]
    warnings: list[str] = field(default_factory=list)
    error: SlurmCommandError | None = None


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def check_job_ids(job_ids: Sequence[str], source: str = "slurm-bt") -> list[str]:
    """The one validator of job ids a user typed: each as Slurm spells it (``parse_job_id``, the one
    parser), or every bad one refused at once, one line each (exit 2):
    ``slurm-bt: job id '../365': not a Slurm job id``.

    Every verb that takes a job id calls it first and uses what it returns, so the records, the
    checkpoint store and Slurm all see the same canonical id (`` 0123`` is ``123``), and a path
    such as ``../365`` is never looked up anywhere.
    """
    parsed = [(j, try_parse_job_id(j)) for j in job_ids]
    bad = [j for j, p in parsed if p is None]
    if bad:
        raise UserError(source, [Problem("", f"job id {b!r}: not a Slurm job id") for b in bad])
    return [str(p) for _, p in parsed]


def _covers(asked: JobId, got: JobId) -> bool:
    if got.is_step or asked.base != got.base:
        return False
    if asked.array_task is not None and asked.array_task != got.array_task:
        return False
    return asked.het_offset is None or asked.het_offset == got.het_offset


def _lifecycle_of(row: JobRow, staging: JobRow | None, restart_causes: Sequence[str] = ()) -> Lifecycle:
    return lifecycle(
        row.state,
        reason=row.reason,
        exit_code=row.exit_code,
        restarts=row.restarts,
        cancelled_by=row.cancelled_by,
        staging_state=staging.state if staging is not None else None,
        started=row.start is not None,
        restart_causes=restart_causes,
    )


def _fold(asked: JobId, rows: Sequence[JobRow], staging: JobRow | None) -> tuple[Lifecycle, JobRow, int]:
    """One status for an array master id or a het job: see the module docstring."""
    exact = [r for r in rows if r.job_id == asked]
    if exact:
        return _lifecycle_of(exact[-1], staging), exact[-1], 1
    members = [(r, _lifecycle_of(r, staging)) for r in rows]
    if len(members) == 1:
        return members[0][1], members[0][0], 1
    active = [(r, lc) for r, lc in members if not lc.terminal]
    if active:
        row, lc = min(active, key=lambda m: _PROGRESS.index(m[1].status) if m[1].status in _PROGRESS else 0)
    else:
        row, lc = max(members, key=lambda m: _SEVERITY.index(m[1].status) if m[1].status in _SEVERITY else 0)
    counts = Counter(r.state or "UNKNOWN" for r, _ in members)
    kind = "array tasks" if any(r.job_id.is_array for r, _ in members) else "components"
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return replace(lc, detail=f"{lc.detail}; {len(members)} {kind}: {summary}"), row, len(members)


def query_statuses(
    client: SlurmClient,
    job_ids: Sequence[str],
    *,
    records: Mapping[str, SubmissionRecord] | None = None,
    retries: int = 1,
    retry_delay_s: float = 1.0,
) -> StatusReport:
    """The status of every job in ``job_ids`` (and their staging jobs) from one batched query.

    Args:
        client: runs the Slurm commands (as the caller).
        job_ids: ids as the user typed them; validated first (exit 2 on a bad one).
        records: the caller's submission records by job id (project, name, staging job).
        retries: extra sacct attempts before degrading to slurmctld-only answers.
        retry_delay_s: first delay between sacct attempts.
    """
    check_job_ids(job_ids)
    records = records or {}
    asked = [(jid, parse_job_id(jid)) for jid in job_ids]
    staging_ids: dict[str, JobId] = {}
    for jid in job_ids:
        rec = records.get(jid)
        sid = try_parse_job_id(rec.staging_job_id) if rec is not None and rec.staging_job_id else None
        if sid is not None:
            staging_ids[jid] = sid
    wanted = list(dict.fromkeys([str(j) for _, j in asked] + [str(s) for s in staging_ids.values()]))
    report = StatusReport(statuses=[])
    try:
        rows = client.query(wanted, duplicates=True, retries=retries, retry_delay_s=retry_delay_s)
    except SlurmCommandError as exc:
        if exc.returncode == 127:  # sacct is not installed: nothing to degrade to
            raise
        report.error = exc
        rows = client.live(wanted)
    report.warnings.extend(client.last_warnings)
    history: dict[JobId, list[JobRow]] = {}  # every run of each job, oldest first (sacct -D)
    for r in rows:
        if not r.is_step:
            history.setdefault(r.job_id, []).append(r)
    rows = latest_runs(r for r in rows if not r.is_step)
    by_base: dict[int, list[JobRow]] = {}  # index: 1000 jobs x 1000 rows must not be 1M comparisons
    for r in rows:
        by_base.setdefault(r.job_id.base, []).append(r)

    def matching(asked_id: JobId) -> list[JobRow]:
        return [r for r in by_base.get(asked_id.base, ()) if _covers(asked_id, r.job_id)]

    def staging_row(jid: str) -> JobRow | None:
        sid = staging_ids.get(jid)
        found = matching(sid) if sid is not None else []
        return found[-1] if found else None

    for jid, job_id in asked:
        members = matching(job_id)
        staging = staging_row(jid)
        rec = records.get(jid)
        if not members:
            # Not in sacct nor squeue: submitted a moment ago (QUEUED), unless we could not ask.
            lc = None if report.error is not None else lifecycle(
                None, staging_state=staging.state if staging else None
            )
            report.statuses.append(JobStatus(jid, lc, None, rec, staging))
            continue
        lc, row, n = _fold(job_id, members, staging)
        runs = _earlier_runs(history.get(row.job_id, [])[:-1], rec, str(row.job_id)) if n == 1 else ()
        if runs:
            # The causes go with the requeue count they explain ("requeued 2 times (failed, failed);
            # staging job COMPLETED"): appended to the end of the detail they read as the staging
            # job's, one "failed" per run of a staging job that ran once (issue 31, item 6).
            lc = _lifecycle_of(row, staging, tuple(r.cause for r in runs))
        report.statuses.append(JobStatus(jid, lc, row, rec, staging, n, runs))
    return report


def _earlier_runs(earlier: Sequence[JobRow], record: SubmissionRecord | None, job_id: str) -> tuple[RunInfo, ...]:
    """The earlier runs with their causes (the restart log is read only when there are some)."""
    if not earlier:
        return ()
    log = read_log(record.job_dir, job_id) if record is not None and record.job_dir else []
    return tuple(RunInfo(i, r.state, cause_of_run(i, r.state, log), r) for i, r in enumerate(earlier))


def job_statuses(client: SlurmClient, job_ids: Sequence[str]) -> list[JobStatus]:
    """The status of every job in ``job_ids``; raises if accounting is unreachable."""
    report = query_statuses(client, job_ids)
    if report.error is not None:
        raise report.error
    return report.statuses


#: How long a record Slurm calls finished while truss reads it as waiting must stay so before a watch
#: ends on it. The one such state is PREEMPTED (slurm/states.py): with PreemptMode=REQUEUE the job's new
#: run replaces that record within seconds; a record that stays PREEMPTED (PreemptMode=CANCEL) will
#: never change, and a watcher that waited for a truss-terminal status would wait for ever.
SETTLE_GRACE_S = 60.0


class Settling:
    """When a watched job will not change any more: every watcher (``status --wait``, ``logs --follow``,
    ``metrics --watch``, :func:`wait_for_jobs`) asks this instead of :attr:`JobStatus.terminal` alone."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, grace_s: float = SETTLE_GRACE_S) -> None:
        self._clock = clock
        self._grace_s = grace_s
        self._since: dict[str, float] = {}

    def done(self, st: JobStatus) -> bool:
        """True for a truss-terminal job, or one whose Slurm-terminal record (PREEMPTED, not requeued)
        was seen continuously for the grace period."""
        if st.terminal:
            return True
        if st.lifecycle is None or not st.lifecycle.slurm_terminal:
            self._since.pop(st.job_id, None)
            return False
        first = self._since.setdefault(st.job_id, self._clock())
        return self._clock() - first >= self._grace_s


def wait_for_jobs(
    client: SlurmClient,
    job_ids: Sequence[str],
    *,
    timeout_s: float,
    records: Mapping[str, SubmissionRecord] | None = None,
    on_change: Callable[[JobStatus], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> StatusReport:
    """Poll until every job is terminal (or settled: :class:`Settling`) or ``timeout_s`` passes, with
    back-off and failure tolerance.

    The delay starts at 1 s and doubles up to 15 s (:class:`~slurm_bt.jobs.poll.Backoff`); each poll is
    one batched query. Up to :data:`~slurm_bt.jobs.poll.MAX_CONSECUTIVE_FAILURES` consecutive sacct
    failures are tolerated with a warning (slurmdbd restarts); after that the degraded report is
    returned with its error.
    """
    from slurm_bt.jobs.poll import Backoff, FailureBudget

    deadline = clock() + timeout_s
    backoff = Backoff(initial_s=1.0, max_s=15.0)
    budget = FailureBudget()
    seen: dict[str, str] = {}
    settling = Settling(clock)
    while True:
        report = query_statuses(client, job_ids, records=records, retries=0)
        if report.error is not None:
            if not budget.failed(str(report.error)):
                return report
            if on_warning is not None:
                on_warning(budget.warning())
        else:
            budget.succeeded()
        for st in report.statuses:
            if on_change is not None and seen.get(st.job_id) != st.status:
                on_change(st)
            seen[st.job_id] = st.status
        settled = [settling.done(st) for st in report.statuses]  # every job, for its grace clock
        done = report.error is None and all(settled)
        if done or clock() >= deadline:
            return report
        sleep(min(backoff.next(), max(0.0, deadline - clock())))
