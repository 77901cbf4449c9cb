"""Restarts by cause (docs/long-runs.md): the policy's decision, and the per-job log of causes.

A run of a job ends in one of these ways, and the batch script (``slurm_bt.steps.restart``) decides
what follows:

=================  ===========================================  ===========================================
cause              how the batch script knows                   what follows
=================  ===========================================  ===========================================
completed          the start commands exited 0, no stop asked   the job completes
time limit         it sent the stop signal before the limit     requeue while restarts < ``max_restarts``
preempted          slurmctld says ``PreemptTime``               requeue while restarts < ``max_restarts``
node failure       (the run never returns: Slurm requeues it,   the next run counts it against
                   ``--requeue``; sacct says ``NODE_FAIL``)     ``max_restarts``
failed             the start commands exited non-zero           requeue while failures < ``retry_on_failure``
=================  ===========================================  ===========================================

The log, ``<job_dir>/restarts.<job id>.jsonl``, holds one JSON line per run the batch script ended
itself (``{"run": 0, "cause": "time limit", "exit": 0, "at": 1764091000}``). It is written and read as
the job's user in their own workspace: ``slurm-bt status`` reads it (capped, no symlinks) to name the
cause of a ``REQUEUED`` run, which sacct alone cannot tell apart (a time-limit requeue and a
retried failure both read ``REQUEUED``). Runs Slurm ended itself are not in the log; their sacct
state says why (``PREEMPTED``, ``NODE_FAIL``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from slurm_bt.posix.user_files import read_user_file

__all__ = [
    "CAUSE_OF_STATE",
    "Decision",
    "RestartEntry",
    "append_entry",
    "cause_of_run",
    "decide",
    "log_path",
    "read_log",
]

Cause = Literal["time limit", "preempted", "node failure", "failed"]

#: The cause of an earlier run that is not in the log, from its sacct ``-D`` state.
CAUSE_OF_STATE: dict[str, str] = {
    "PREEMPTED": "preempted",
    "NODE_FAIL": "node failure",
    "TIMEOUT": "time limit",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "node failure",
    "REQUEUED": "requeued",
}

_MAX_LOG_BYTES = 256 * 1024  # ~2000 runs; a bigger file is not ours (or not worth reading)


@dataclass(frozen=True)
class RestartEntry:
    """One run the batch script ended itself."""

    run: int
    cause: str
    exit: int | None = None
    at: float | None = None


@dataclass(frozen=True)
class Decision:
    """What the batch script does once the start commands have ended.

    Attributes:
        action: ``complete`` (exit 0), ``requeue`` (``scontrol requeue``) or ``fail`` (exit ``exit``).
        cause: why the run ended, ``None`` when it completed.
        exit: the batch script's exit status for ``complete`` and ``fail``.
        message: one line for the job's log.
    """

    action: Literal["complete", "requeue", "fail"]
    cause: Cause | None
    exit: int
    message: str

    @property
    def wait_for_slurm(self) -> bool:
        """A run that ends for a time limit or a preemption without a requeue is left for Slurm to end,
        so its state says so (``TIMEOUT``, ``PREEMPTED``) rather than ``FAILED``."""
        return self.action == "fail" and self.cause in {"time limit", "preempted"}


def log_path(job_dir: str | os.PathLike[str], job_id: str) -> Path:
    """Where a job's restart log lives (the user's own workspace)."""
    return Path(job_dir) / f"restarts.{job_id}.jsonl"


def read_log(job_dir: str | os.PathLike[str], job_id: str) -> list[RestartEntry]:
    """The log's entries; ``[]`` when it is missing, unsafe (symlink, FIFO...), too big or unreadable.

    Lines that are not an entry are skipped: the file is the user's, and a status must not fail on it.
    """
    try:
        raw = read_user_file(log_path(job_dir, job_id), _MAX_LOG_BYTES)
    except OSError:
        return []
    out: list[RestartEntry] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("run"), int) and isinstance(data.get("cause"), str):
            code = data.get("exit")
            at = data.get("at")
            out.append(RestartEntry(run=data["run"], cause=data["cause"][:40],
                                    exit=code if isinstance(code, int) else None,
                                    at=float(at) if isinstance(at, int | float) else None))
    return out


def append_entry(job_dir: str | os.PathLike[str], job_id: str, entry: RestartEntry) -> None:
    """Append one entry (one ``write`` of one line, ``O_APPEND``: lines never interleave).

    Raises:
        OSError: the workspace is not writable.
    """
    line = json.dumps({"run": entry.run, "cause": entry.cause, "exit": entry.exit, "at": entry.at}) + "\n"
    fd = os.open(log_path(job_dir, job_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def cause_of_run(run: int, state: str, log: Sequence[RestartEntry]) -> str:
    """Why earlier run ``run`` ended: the log's word for it, else what its sacct state says.

    Slurm's ``NODE_FAIL`` wins over a logged ``failed``: when a node goes down, the batch script on a
    surviving batch host can see the start commands' step fail and log "failed" before Slurm requeues
    the run for the node failure (seen on the 24.11 dev cluster, tests/integration/test_long_runs.py).
    """
    if state == "NODE_FAIL" and any(e.run == run and e.cause == "failed" for e in log):
        return "node failure"
    for entry in log:
        if entry.run == run:
            return entry.cause
    return CAUSE_OF_STATE.get(state, state.lower() or "unknown")


def decide(*, rc: int, stopped: bool, preempted: bool, restarts: int, failures: int,
           max_restarts: int, retry_on_failure: int, resumable: bool = True) -> Decision:
    """The restart policy (see the module docstring); pure.

    Args:
        rc: exit status of the start commands' step (the worst node's).
        stopped: the batch script sent the stop signal before the time limit.
        preempted: slurmctld says this run is being preempted.
        restarts: earlier runs of this job (``SLURM_RESTART_COUNT``).
        failures: earlier runs that ended as ``failed`` and were retried (from the log).
        max_restarts: cap on requeues for time limit, preemption and node failure.
        retry_on_failure: cap on requeues after an application error.
        resumable: the job checkpoints (or its config set ``BT_MAX_RESTARTS`` itself). A time limit
            does not requeue a job that cannot resume: the next run would start over and meet the
            same limit at the same place. A preemption still does: the next run may finish.
    """
    if preempted or stopped:
        cause: Cause = "preempted" if preempted else "time limit"
        used = restarts - failures
        if cause == "time limit" and not resumable:
            return Decision("fail", cause, rc or 1,
                            "time limit: not requeued: the job saves no checkpoints (checkpointing_config is "
                            "off), so a new run would start over; set BT_MAX_RESTARTS to requeue it anyway")
        if used < max_restarts:
            return Decision("requeue", cause, 0, f"{cause}: requeued (restart {used + 1} of {max_restarts}); "
                                                 "the next run resumes from the newest checkpoint")
        return Decision("fail", cause, rc or 1,
                        f"{cause}: not requeued, the job has used its {max_restarts} restart(s) "
                        "(BT_MAX_RESTARTS in the config, [restarts] max_restarts in the site file)")
    if rc == 0:
        return Decision("complete", None, 0, "the start commands completed")
    if failures < retry_on_failure:
        return Decision("requeue", "failed", rc, f"the start commands failed (exit {rc}): retried "
                                                 f"({failures + 1} of {retry_on_failure}, BT_RETRY_ON_FAILURE)")
    extra = (f"; it was retried {failures} time(s), the most BT_RETRY_ON_FAILURE allows" if retry_on_failure
             else "; an application error is not retried unless the config sets BT_RETRY_ON_FAILURE")
    return Decision("fail", "failed", rc, f"the start commands failed (exit {rc}){extra}")
