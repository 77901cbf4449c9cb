"""The batch script's helper for long runs: stop before the end, then requeue by cause (docs/long-runs.md).

Runs as the job's user on the batch host (the leader), from the batch script, one short call each:

``begin JOB_JSON``
    at the start of every run: enforce the restart cap (a run past it fails at once: Slurm requeued
    it after a preemption or node failure) and, at the cap, make the job non-requeueable so the next
    preemption cancels it instead of requeueing it again.
``watch JOB_JSON PID``
    in the background: send SIGUSR2 to the batch shell ``PID`` ``stop_grace_s`` before the run's
    ``EndTime``. Slurm's own ``--signal=B:USR2@<grace>`` is only a fallback: on 22.05 it arrives up to
    a minute early (observed 51 s before a 1-minute limit with ``@40``), which would stop a short run
    before it has done anything.
``stop JOB_JSON``
    on SIGUSR2 (ours, or Slurm's, or Slurm's at preemption with ``PreemptParameters=send_user_signal``):
    when the run really ends within the grace time (or is being preempted), send the stop signal to
    the start commands' step on every node (``scancel --signal``; srun itself would turn a SIGTERM
    into SIGKILL) and exit 0; exit 3 when the warning came early (the watcher will send it again).
``prepare-failed JOB_JSON RC``
    step 1 (prepare) failed. On a first run that is the job's own problem and it fails. On a restart
    it is the node's: Slurm 22.05 sometimes skips the prolog of a job requeued onto a node that
    still caches the job's credential (observed on the dev cluster: "reissued job credential" in
    slurmd's log, no prolog line, and prepare finds no scratch directory), so the run is requeued
    again, counted as a node failure against ``max_restarts``.
``after JOB_JSON RC STOPPED``
    once the start commands have ended (and the checkpoint uploader has shipped what they saved):
    decide (:func:`slurm_bt.jobs.restarts.decide`), log the cause, and either exit with the job's
    status or ``scontrol requeue`` the job (which ends this run; the next one has
    ``SLURM_RESTART_COUNT`` one higher and finds its checkpoint in ``$BT_LOAD_CHECKPOINT_DIR``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from slurm_bt.errors import BtError
from slurm_bt.job_spec import JobSpec, read_job_spec
from slurm_bt.jobs.restarts import RestartEntry, append_entry, decide, read_log
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.jobctl import job_facts, requeue_job, set_requeueable, signal_steps
from slurm_bt.slurm.release import slurm_release
from slurm_bt.slurm.runner import SubprocessRunner

__all__ = ["TRAIN_STEP", "main"]

TRAIN_STEP = "bt-train"
_EARLY = 3  # exit status of `stop` for a warning that came too early
_SLACK_S = 5  # a warning this much before the grace time still counts (the watcher polls every >= 5 s)


def _log(message: str) -> None:
    print(f"slurm-bt: {message}", file=sys.stderr, flush=True)


def _spec(path: str) -> JobSpec:
    return read_job_spec(Path(path))


def _restart_count() -> int:
    raw = os.environ.get("SLURM_RESTART_COUNT", "0")  # unset on the first run
    return int(raw) if raw.isdigit() else 0


def _failures(spec: JobSpec, job_id: str) -> int:
    return sum(1 for e in read_log(spec.context.job_dir, job_id) if e.cause == "failed")


def _begin(spec: JobSpec, client: SlurmClient, job_id: str) -> int:
    policy = spec.restarts
    runs = _restart_count()
    used = runs - _failures(spec, job_id)
    if runs:
        _log(f"run {runs + 1} of job {job_id} (restarted {runs} time(s); `slurm-bt status {job_id}` "
             "says why)")
    if used > policy.max_restarts:
        _log(f"Slurm requeued the job again, but it has used its {policy.max_restarts} restart(s): failing it")
        _no_requeue_on_failure(client, job_id)
        return 1
    if used >= policy.max_restarts and _failures(spec, job_id) >= policy.retry_on_failure:
        try:  # no restart left: a preemption now cancels the job, a node failure fails it
            set_requeueable(client, job_id, False)
        except BtError as exc:
            _log(f"could not make the job non-requeueable ({exc}); a further requeue fails at its start")
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists (another user's process would only appear after PID reuse)
    return True


def _nap(seconds: float, batch_pid: int) -> bool:
    """Sleep up to ``seconds``; False as soon as the batch shell is gone.

    The watcher runs in the background of the batch shell; when Slurm kills that shell (time limit,
    scancel) the watcher may be left behind (proctrack/linuxproc loses reparented processes), so it
    checks every few seconds that there is still a run to watch instead of polling Slurm for ever.
    """
    end = time.monotonic() + seconds
    while True:
        if not _alive(batch_pid):
            return False
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, 5.0))


def _watch(spec: JobSpec, client: SlurmClient, job_id: str, batch_pid: int) -> int:
    while _alive(batch_pid):
        try:
            facts = job_facts(client, job_id)
        except BtError as exc:
            _log(f"restart watcher: {exc}; retrying")
            if not _nap(30, batch_pid):
                break
            continue
        grace = facts.grace_s(spec.restarts.stop_grace_s)
        left = facts.remaining_s(time.time())
        if left is None:
            # No time limit now; one may be set later (scontrol update TimeLimit).
            if not _nap(300, batch_pid):
                break
            continue
        if left <= grace:
            try:
                os.kill(batch_pid, signal.SIGUSR2)
            except OSError:
                return 0  # the batch shell is gone
            return 0
        # Poll less often while the end is far; never more than once every 5 s.
        if not _nap(min(max((left - grace) / 2, 5.0), 60.0), batch_pid):
            break
    return 0


def _stop(spec: JobSpec, client: SlurmClient, job_id: str) -> int:
    policy = spec.restarts
    try:
        facts = job_facts(client, job_id)
    except BtError as exc:
        _log(f"stop requested; cannot ask slurmctld why ({exc}): stopping anyway")
        facts = None
    grace = int(facts.grace_s(policy.stop_grace_s)) if facts is not None else policy.stop_grace_s
    if facts is not None and not facts.preempted:
        left = facts.remaining_s(time.time())
        if left is not None and left > grace + _SLACK_S:
            _log(f"early time-limit warning from Slurm ({int(left)} s left): the start commands are "
                 f"stopped {grace} s before the limit")
            return _EARLY
    why = "preempted" if facts is not None and facts.preempted else "time limit"
    _log(f"{why}: sending SIG{policy.stop_signal} to the start commands on every node; they have "
         f"{grace} s to save a checkpoint into $BT_CHECKPOINT_DIR and exit")
    # The warning can come while step 2 is being launched (its srun runs in the background): give
    # slurmctld a few seconds to list it.
    for _ in range(10):
        try:
            if signal_steps(client, job_id, TRAIN_STEP, policy.stop_signal):
                return 0
        except (BtError, ValueError) as exc:
            _log(f"could not signal the start commands: {exc}")
            return 1
        time.sleep(1)
    _log("the start commands are not running: nothing to stop")
    return 0


def _prepare_failed(spec: JobSpec, client: SlurmClient, job_id: str, rc: int) -> int:
    runs = _restart_count()
    used = runs - _failures(spec, job_id)
    if runs == 0 or used >= spec.restarts.max_restarts:
        _no_requeue_on_failure(client, job_id)
        return rc or 1
    _log(f"step 1 failed on this restarted run (exit {rc}); the nodes, not the job, are the likely cause "
         "(Slurm can skip the prolog of a job requeued onto a node that still caches its credential): "
         f"requeued again (restart {used + 1} of {spec.restarts.max_restarts})")
    try:
        append_entry(spec.context.job_dir, job_id,
                     RestartEntry(run=runs, cause="node failure", exit=rc, at=round(time.time())))
    except OSError as exc:
        _log(f"cannot record the restart cause ({exc})")
    try:
        requeue_job(client, job_id)
    except BtError as exc:
        _log(f"requeue failed ({exc}): the job ends here")
        _no_requeue_on_failure(client, job_id)
        return rc or 1
    time.sleep(600)  # slurmctld ends this run now
    return 0


def _no_requeue_on_failure(client: SlurmClient, job_id: str) -> None:
    """Before the batch script exits non-zero for good: make the job non-requeueable where Slurm
    would otherwise hold it.

    A job submitted with ``--requeue=expedite`` (slurm-bt asks for it from 25.11, docs/long-runs.md)
    that exits non-zero while every epilog succeeds is requeued in ``REQUEUE_HOLD`` by Slurm (26.05:
    "batch_requeue_fini: holding expedited requeue JobId=N as no epilogs failed"): a failed training
    job would never end FAILED. ``Requeue=0`` before the exit keeps it FAILED (seen on the 26.05 dev
    cluster; docs/slurm-releases.md). Older releases have no expedited requeue: nothing to do there.
    """
    release = slurm_release(client)
    if release is not None and not release.at_least(25, 11):
        return
    try:
        set_requeueable(client, job_id, False)
    except BtError as exc:
        _log(f"could not make the job non-requeueable ({exc}); Slurm may hold it (JobHeldUser) instead of "
             "ending it FAILED: `scancel` it")


def _after(spec: JobSpec, client: SlurmClient, job_id: str, rc: int, stopped: bool) -> int:
    policy = spec.restarts
    try:
        preempted = job_facts(client, job_id).preempted
    except BtError as exc:
        _log(f"cannot ask slurmctld whether the job is being preempted ({exc}); assuming not")
        preempted = False
    runs = _restart_count()
    resumable = spec.checkpointing.enabled or any(k == "BT_MAX_RESTARTS" for k, _ in spec.env)
    decision = decide(rc=rc, stopped=stopped, preempted=preempted, restarts=runs,
                      failures=_failures(spec, job_id), max_restarts=policy.max_restarts,
                      retry_on_failure=policy.retry_on_failure, resumable=resumable)
    _log(decision.message)
    if decision.action == "complete":
        return 0
    if decision.cause is not None:
        try:
            append_entry(spec.context.job_dir, job_id,
                         RestartEntry(run=runs, cause=decision.cause, exit=rc, at=round(time.time())))
        except OSError as exc:
            _log(f"cannot record the restart cause ({exc}); `slurm-bt status` shows Slurm's state instead")
    if decision.action == "fail":
        _no_requeue_on_failure(client, job_id)
    if decision.wait_for_slurm:
        # Slurm ends the run within the grace time (the time limit, or the preemption's GraceTime):
        # its state then reads TIMEOUT / PREEMPTED, which is what happened, instead of FAILED.
        _log("waiting for Slurm to end the run")
        time.sleep(policy.stop_grace_s + 120)
    if decision.action == "fail":
        return decision.exit
    try:
        if decision.cause == "failed":  # `begin` may have turned requeueing off at the restart cap
            set_requeueable(client, job_id, True)
        requeue_job(client, job_id)
    except BtError as exc:
        _log(f"requeue failed ({exc}): the job ends here")
        _no_requeue_on_failure(client, job_id)
        return decision.exit or 1
    # slurmctld ends this run now (SIGTERM, then SIGKILL after KillWait): wait for it rather than let
    # the batch script exit first, which Slurm would record as this run's own ending.
    time.sleep(600)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -I -m slurm_bt.steps.restart begin|watch|stop|after JOB_JSON ...``."""
    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m slurm_bt.steps.restart {begin|stop} JOB_JSON | watch JOB_JSON PID | "
             "prepare-failed JOB_JSON RC | after JOB_JSON RC STOPPED")
    if len(args) < 2:
        print(usage, file=sys.stderr)
        return 2
    verb, spec_path, rest = args[0], args[1], args[2:]
    job_id = os.environ.get("SLURM_JOB_ID", "")
    try:
        spec = _spec(spec_path)
    except (OSError, ValueError) as exc:
        # Step 1 reads the same file and fails the run with the reason that matters (a prolog refusal,
        # or the same unreadable job.json), so the helper steps aside instead of ending the run first.
        _log(f"restart helper: cannot read {spec_path}: {exc}; this run is not requeued")
        if verb in ("begin", "watch"):
            return 0
        if verb in ("prepare-failed", "after") and rest and rest[0].isdigit():
            if int(rest[0]) != 0 and job_id:
                _no_requeue_on_failure(SlurmClient(SubprocessRunner(), timeout_s=30), job_id)
            return int(rest[0])
        return 1
    client = SlurmClient(SubprocessRunner(), timeout_s=30)
    if verb == "begin" and not rest:
        return _begin(spec, client, job_id)
    if verb == "watch" and len(rest) == 1 and rest[0].isdigit():
        return _watch(spec, client, job_id, int(rest[0]))
    if verb == "stop" and not rest:
        return _stop(spec, client, job_id)
    if verb == "prepare-failed" and len(rest) == 1 and rest[0].isdigit():
        return _prepare_failed(spec, client, job_id, int(rest[0]))
    if verb == "after" and len(rest) == 2 and rest[0].isdigit():
        return _after(spec, client, job_id, int(rest[0]), rest[1] == "1")
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
