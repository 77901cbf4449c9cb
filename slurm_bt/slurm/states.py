"""Slurm job states as data, and their mapping onto the truss training-job lifecycle.

Slurm states are the 24 codes of squeue(1) 22.05 §JOB STATE CODES (:class:`SlurmState`), with the
explicit sets :data:`TERMINAL_STATES`, :data:`PENDING_STATES` and :data:`ACTIVE_STATES` rather
than rules hidden in ``if`` chains (ReFrame keeps its completed set the same way).

:func:`lifecycle` maps a Slurm state (+ reason, exit code, restarts, staging job) to a truss
``TRAINING_JOB_*`` status and a human ``detail`` that always names the Slurm state, e.g.
``"PENDING (Resources)"``, ``"TIMEOUT"``, ``"CANCELLED by 1001"``, ``"PENDING (BeginTime);
requeued 2 times"``. The decisions, in order of precedence:

=============================================  =====================  ==================================
Slurm (training job)                           truss status           why
=============================================  =====================  ==================================
state unknown (``None``/``""``)                QUEUED                 sbatch accepted it but neither
                                                                      squeue nor sacct lists it yet;
                                                                      truss's CLI poller starts here
staging job failed, training job never ran     DEPLOY_FAILED          truss: "failed during deployment"
(PENDING, or CANCELLED ``Dependency*``, or
CANCELLED by no user / by root)
PENDING/CANCELLED with a launch-failure        DEPLOY_FAILED          the node Prolog failed: Slurm
reason (``launch failed requeued held``,                              requeues the job *held* (it would
``JobLaunchFailure``, ``Prolog ...``)                                 wait for an admin forever)
BOOT_FAIL                                      DEPLOY_FAILED          "terminated due to launch
                                                                      failure" (squeue(1)): deployment,
                                                                      not training, failed
PENDING, staging job running or done           CREATED                Baseten mirrors weights while
                                                                      CREATED, before compute is held
PENDING / REQUEUED / REQUEUE_HOLD /            PENDING                waiting for GPUs; the detail says
REQUEUE_FED / SPECIAL_EXIT / RESV_DEL_HOLD /                          why (reason, restarts)
PREEMPTED / REVOKED
CONFIGURING / RESIZING                         DEPLOYING              nodes allocated, booting or
                                                                      PrologSlurmctld running
RUNNING with reason ``Prolog`` (squeue)        DEPLOYING              the node Prolog (our staging hook)
                                                                      still runs; seen on the dev
                                                                      cluster with PrologFlags=Alloc
RUNNING / COMPLETING / SIGNALING / STAGE_OUT   RUNNING                the allocation exists; COMPLETING
/ SUSPENDED / STOPPED                                                 and STAGE_OUT still run epilogs
COMPLETED                                      COMPLETED
CANCELLED                                      STOPPED                "stopped by user" (or by an admin:
                                                                      the detail names the uid)
FAILED / TIMEOUT / OUT_OF_MEMORY / NODE_FAIL   FAILED
/ DEADLINE
anything else                                  FAILED if terminal     never raise on a state from a
                                               else PENDING           newer Slurm
=============================================  =====================  ==================================

Choices worth knowing:

* ``PREEMPTED`` maps to PENDING because slurm-bt jobs are submitted requeueable and Slurm puts a
  preempted requeueable job back in the queue; ``sacct`` without ``-D`` then shows the new run
  (``PENDING``). A sacct record that *stays* ``PREEMPTED`` (``PreemptMode=CANCEL``) is terminal in
  Slurm (:data:`TERMINAL_STATES`) while truss sees PENDING; watchers should compare
  :attr:`Lifecycle.slurm_terminal` and give up after a grace period.
* QUEUED is not used for dependency waits: truss documents QUEUED only as the CLI poller's start
  state, so we use it for "submitted, not yet visible", and CREATED for "waiting on staging".
* ``BOOT_FAIL`` goes to DEPLOY_FAILED, not FAILED: the training command never started.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ACTIVE_STATES",
    "PENDING_STATES",
    "STATE_CODES",
    "TERMINAL_STATES",
    "TRUSS_TERMINAL",
    "Lifecycle",
    "SlurmState",
    "TrainingJobStatus",
    "base_state",
    "lifecycle",
]


class SlurmState(str, enum.Enum):
    """Every job state of squeue(1) 22.05 §JOB STATE CODES; the value is the long name Slurm prints."""

    BOOT_FAIL = "BOOT_FAIL"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    CONFIGURING = "CONFIGURING"
    COMPLETING = "COMPLETING"
    DEADLINE = "DEADLINE"
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PENDING = "PENDING"
    PREEMPTED = "PREEMPTED"
    RUNNING = "RUNNING"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"
    TIMEOUT = "TIMEOUT"

    @classmethod
    def from_text(cls, text: str) -> SlurmState | None:
        """The state named by ``text`` (long name or short code, any case, trailing ``by N``/``+``).

        Returns ``None`` for a state this version does not know, so callers can degrade instead
        of crashing on a newer Slurm.
        """
        name = base_state(text)
        if name in cls.__members__:
            return cls[name]
        return _BY_CODE.get(name)


#: Short codes as ``squeue -o %t`` prints them.
STATE_CODES: dict[str, SlurmState] = {
    "BF": SlurmState.BOOT_FAIL,
    "CA": SlurmState.CANCELLED,
    "CD": SlurmState.COMPLETED,
    "CF": SlurmState.CONFIGURING,
    "CG": SlurmState.COMPLETING,
    "DL": SlurmState.DEADLINE,
    "F": SlurmState.FAILED,
    "NF": SlurmState.NODE_FAIL,
    "OOM": SlurmState.OUT_OF_MEMORY,
    "PD": SlurmState.PENDING,
    "PR": SlurmState.PREEMPTED,
    "R": SlurmState.RUNNING,
    "RD": SlurmState.RESV_DEL_HOLD,
    "RF": SlurmState.REQUEUE_FED,
    "RH": SlurmState.REQUEUE_HOLD,
    "RQ": SlurmState.REQUEUED,
    "RS": SlurmState.RESIZING,
    "RV": SlurmState.REVOKED,
    "SI": SlurmState.SIGNALING,
    "SE": SlurmState.SPECIAL_EXIT,
    "SO": SlurmState.STAGE_OUT,
    "ST": SlurmState.STOPPED,
    "S": SlurmState.SUSPENDED,
    "TO": SlurmState.TIMEOUT,
}
_BY_CODE = STATE_CODES

#: States after which this run of the job will not change again (Slurm's IS_JOB_FINISHED bases).
TERMINAL_STATES: frozenset[SlurmState] = frozenset(
    {
        SlurmState.BOOT_FAIL,
        SlurmState.CANCELLED,
        SlurmState.COMPLETED,
        SlurmState.DEADLINE,
        SlurmState.FAILED,
        SlurmState.NODE_FAIL,
        SlurmState.OUT_OF_MEMORY,
        SlurmState.PREEMPTED,
        SlurmState.REVOKED,
        SlurmState.TIMEOUT,
    }
)

#: States in which the job holds no allocation and waits to (re)start.
PENDING_STATES: frozenset[SlurmState] = frozenset(
    {
        SlurmState.PENDING,
        SlurmState.REQUEUED,
        SlurmState.REQUEUE_FED,
        SlurmState.REQUEUE_HOLD,
        SlurmState.RESV_DEL_HOLD,
        SlurmState.SPECIAL_EXIT,
    }
)

#: States in which the job holds (or is setting up, or releasing) an allocation.
ACTIVE_STATES: frozenset[SlurmState] = frozenset(
    {
        SlurmState.CONFIGURING,
        SlurmState.COMPLETING,
        SlurmState.RESIZING,
        SlurmState.RUNNING,
        SlurmState.SIGNALING,
        SlurmState.STAGE_OUT,
        SlurmState.STOPPED,
        SlurmState.SUSPENDED,
    }
)


class TrainingJobStatus(str, enum.Enum):
    """truss ``training_job.current_status`` values (the truss training API's job statuses)."""

    PENDING = "TRAINING_JOB_PENDING"
    QUEUED = "TRAINING_JOB_QUEUED"
    CREATED = "TRAINING_JOB_CREATED"
    DEPLOYING = "TRAINING_JOB_DEPLOYING"
    RUNNING = "TRAINING_JOB_RUNNING"
    COMPLETED = "TRAINING_JOB_COMPLETED"
    FAILED = "TRAINING_JOB_FAILED"
    STOPPED = "TRAINING_JOB_STOPPED"
    DEPLOY_FAILED = "TRAINING_JOB_DEPLOY_FAILED"


#: truss statuses after which the CLI stops polling.
TRUSS_TERMINAL: frozenset[TrainingJobStatus] = frozenset(
    {
        TrainingJobStatus.COMPLETED,
        TrainingJobStatus.FAILED,
        TrainingJobStatus.STOPPED,
        TrainingJobStatus.DEPLOY_FAILED,
    }
)


@dataclass(frozen=True)
class Lifecycle:
    """Where a training job is, in truss's vocabulary, and why.

    Attributes:
        status: the truss status.
        detail: one human line that always names the Slurm state, e.g. ``"PENDING (Resources)"``.
        slurm_state: the Slurm base state as given (upper-cased), ``""`` when unknown.
    """

    status: TrainingJobStatus
    detail: str
    slurm_state: str

    @property
    def terminal(self) -> bool:
        """True when truss would stop polling (COMPLETED, FAILED, STOPPED, DEPLOY_FAILED)."""
        return self.status in TRUSS_TERMINAL

    @property
    def slurm_terminal(self) -> bool:
        """True when Slurm considers this run finished (may differ for PREEMPTED)."""
        state = SlurmState.from_text(self.slurm_state)
        return state in TERMINAL_STATES if state is not None else False


def base_state(text: str) -> str:
    """Reduce a printed state to its base name: ``"CANCELLED by 0"`` → ``"CANCELLED"``.

    Also drops the ``+`` suffix scontrol/squeue add for flags (``"COMPLETING+"``) and upper-cases.
    """
    words = text.strip().split()
    return words[0].rstrip("+").upper() if words else ""


# Narrow on purpose: reason "Prolog" alone is the normal wait for PrologSlurmctld (WAIT_PROLOG).
_LAUNCH_FAILURE_MARKERS = ("launch failed", "joblaunchfailure", "prolog error", "prolog fail")
_DEPENDENCY_MARKERS = ("dependency",)
_NO_REASON = frozenset({"", "none", "(null)"})


def lifecycle(
    slurm_state: str | None,
    *,
    reason: str | None = None,
    exit_code: tuple[int, int] | None = None,
    staging_state: str | None = None,
    restarts: int = 0,
    cancelled_by: int | None = None,
    started: bool | None = None,
    restart_causes: Sequence[str] = (),
) -> Lifecycle:
    """Map one Slurm job's status onto the truss lifecycle (table in the module docstring).

    Never raises: an unknown state from a newer Slurm degrades to PENDING or FAILED.

    Args:
        slurm_state: the training job's state as printed (``"CANCELLED by 0"`` is fine), or
            ``None`` when neither squeue nor sacct knows the job yet.
        reason: Slurm's reason (``Resources``, ``Dependency``, ``launch failed requeued held``).
        exit_code: ``(code, signal)`` of the job, shown for failures.
        staging_state: the state of the separate staging job this job depends on, if any.
        restarts: how many times the job was requeued (from ``sacct -D`` or scontrol ``Restarts``).
        cancelled_by: uid that cancelled the job, when the state text said ``CANCELLED by N``.
        started: whether the job ever started (sacct ``Start`` is a time, not ``None``); ``None`` when
            unknown. A CANCELLED job that never started never ran: 22.05 says why in its reason
            (``DependencyNeverSatisfied``), 24.11 and 26.05 keep no reason for it (``Reason=None``,
            ``Start=None``; docs/slurm-releases.md).
        restart_causes: why each earlier run ended, oldest first (``time limit``, ``failed``...):
            shown with the requeue count they explain, ``requeued 2 times (failed, failed)``, never
            after the staging job's state, which would read as the staging job's history.
    """
    raw = (slurm_state or "").strip()
    name = base_state(raw)
    if cancelled_by is None:
        cancelled_by = _parse_cancelled_by(raw)
    state = SlurmState.from_text(raw) if name else None
    why = (reason or "").strip()
    has_reason = why.lower() not in _NO_REASON
    why_l = why.lower()
    staging = SlurmState.from_text(staging_state) if staging_state else None

    parts = [name or "UNKNOWN"]
    if state is SlurmState.CANCELLED and cancelled_by is not None:
        parts[0] += f" by {cancelled_by}"
    # sacct keeps the *last* blocking reason on finished rows ("COMPLETED", Reason=BeginTime), so
    # a reason is only news while the job waits, or when it explains a cancellation/launch failure.
    explains = state is SlurmState.CANCELLED and any(
        m in why_l for m in _DEPENDENCY_MARKERS + _LAUNCH_FAILURE_MARKERS
    )
    prolog_running = state is SlurmState.RUNNING and why_l == "prolog"
    if has_reason and (state is None or state in PENDING_STATES or explains or prolog_running):
        parts[0] += f" ({why})"
    if exit_code is not None and exit_code != (0, 0) and state in TERMINAL_STATES:
        parts.append(f"exit code {exit_code[0]}:{exit_code[1]}")
    restarts = max(restarts, len(restart_causes))
    if restarts > 0:
        causes = f" ({', '.join(restart_causes)})" if restart_causes else ""
        parts.append(f"requeued {restarts} time{'s' if restarts != 1 else ''}{causes}")
    if staging is not None:
        parts.append(f"staging job {staging.value}")
    elif staging_state:
        parts.append(f"staging job {base_state(staging_state)}")
    detail = "; ".join(parts)

    def result(status: TrainingJobStatus) -> Lifecycle:
        return Lifecycle(status, detail, name)

    if not name:
        return result(TrainingJobStatus.QUEUED)

    staging_failed = (
        staging is not None and staging in TERMINAL_STATES and staging is not SlurmState.COMPLETED
    )
    # A job waits for its staging job (afterok), so with the staging job failed a CANCELLED job
    # that no user cancelled (no "by <uid>", or by root: slurmctld's dependency kill) never ran,
    # even when its row does not say so yet: on 22.05 the first answer after the kill can read
    # plain "CANCELLED" with no reason and Start = End set (seen in the hostile image test).
    never_ran = state in PENDING_STATES or (
        state is SlurmState.CANCELLED
        and (any(m in why_l for m in _DEPENDENCY_MARKERS) or started is False
             or (staging_failed and cancelled_by in (None, 0)))
    )
    if staging_failed and never_ran:
        return result(TrainingJobStatus.DEPLOY_FAILED)
    if state in PENDING_STATES | {SlurmState.CANCELLED} and any(m in why_l for m in _LAUNCH_FAILURE_MARKERS):
        return result(TrainingJobStatus.DEPLOY_FAILED)
    if state is SlurmState.BOOT_FAIL:
        return result(TrainingJobStatus.DEPLOY_FAILED)
    if prolog_running:
        return result(TrainingJobStatus.DEPLOYING)
    if (
        state is SlurmState.PENDING
        and staging is not None
        and (staging in ACTIVE_STATES or staging is SlurmState.COMPLETED)
    ):
        return result(TrainingJobStatus.CREATED)
    if state is None:
        # A state newer than 22.05's list: guess from the words Slurm uses for endings.
        ended = any(w in name for w in ("FAIL", "TIMEOUT", "KILL", "ERROR", "DEADLINE"))
        return result(TrainingJobStatus.FAILED if ended else TrainingJobStatus.PENDING)
    return result(_DIRECT[state])


def _parse_cancelled_by(text: str) -> int | None:
    words = text.split()
    if len(words) == 3 and words[1] == "by" and words[2].isascii() and words[2].isdigit():
        return int(words[2])
    return None


_DIRECT: dict[SlurmState, TrainingJobStatus] = {
    SlurmState.PENDING: TrainingJobStatus.PENDING,
    SlurmState.REQUEUED: TrainingJobStatus.PENDING,
    SlurmState.REQUEUE_HOLD: TrainingJobStatus.PENDING,
    SlurmState.REQUEUE_FED: TrainingJobStatus.PENDING,
    SlurmState.SPECIAL_EXIT: TrainingJobStatus.PENDING,
    SlurmState.RESV_DEL_HOLD: TrainingJobStatus.PENDING,
    SlurmState.PREEMPTED: TrainingJobStatus.PENDING,
    SlurmState.REVOKED: TrainingJobStatus.PENDING,
    SlurmState.CONFIGURING: TrainingJobStatus.DEPLOYING,
    SlurmState.RESIZING: TrainingJobStatus.DEPLOYING,
    SlurmState.RUNNING: TrainingJobStatus.RUNNING,
    SlurmState.COMPLETING: TrainingJobStatus.RUNNING,
    SlurmState.SIGNALING: TrainingJobStatus.RUNNING,
    SlurmState.STAGE_OUT: TrainingJobStatus.RUNNING,
    SlurmState.SUSPENDED: TrainingJobStatus.RUNNING,
    SlurmState.STOPPED: TrainingJobStatus.RUNNING,
    SlurmState.COMPLETED: TrainingJobStatus.COMPLETED,
    SlurmState.CANCELLED: TrainingJobStatus.STOPPED,
    SlurmState.FAILED: TrainingJobStatus.FAILED,
    SlurmState.TIMEOUT: TrainingJobStatus.FAILED,
    SlurmState.OUT_OF_MEMORY: TrainingJobStatus.FAILED,
    SlurmState.NODE_FAIL: TrainingJobStatus.FAILED,
    SlurmState.DEADLINE: TrainingJobStatus.FAILED,
    SlurmState.BOOT_FAIL: TrainingJobStatus.DEPLOY_FAILED,
}
