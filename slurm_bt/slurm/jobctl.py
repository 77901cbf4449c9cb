"""A job controlling itself from its batch script: ``scontrol show job``, ``requeue``, step signals.

Used by :mod:`slurm_bt.steps.restart` (docs/long-runs.md), as the job's user, on the batch host. Every
call is one short Slurm command through the client's runner (scrubbed environment, timeout).

What 22.05 does, observed on the dev cluster:

* ``scontrol requeue <own id>`` from the batch script answers 0, then slurmctld ends the run at once
  (every step and the batch shell get SIGTERM, SIGKILL after ``KillWait``); the run's sacct ``-D`` row
  reads ``REQUEUED`` and the job waits about two minutes (``BeginTime``) before it can start again.
* A preempted job (``PreemptMode=REQUEUE`` with a ``GraceTime``) shows ``PreemptTime=<time>`` and its
  ``EndTime`` moves to the end of the grace time; every step (not the batch shell) gets SIGTERM at
  once unless ``PreemptParameters=send_user_signal`` sends the job's ``--signal`` instead.
* ``scancel --signal=SIG <job>.<step>`` signals every process of that step on every node, and only
  that step (the checkpoint uploader's step keeps running).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from slurm_bt.errors import SlurmCommandError
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.job_ids import job_id_args
from slurm_bt.slurm.release import requeue_option, slurm_release
from slurm_bt.slurm.runner import CommandResult, scrubbed_env
from slurm_bt.slurm.scontrol import parse_key_values

__all__ = ["JobFacts", "expedite_args", "job_facts", "requeue_job", "set_requeueable", "signal_steps"]

_SIGNAL = re.compile(r"[A-Z0-9]{1,8}")


class JobFacts:
    """What a running job knows about itself from slurmctld (``scontrol show job -o``).

    Attributes:
        end: when Slurm will end the run (time limit, or the end of a preemption's grace time).
        start: when this run started.
        preempted: the run is being preempted (``PreemptTime`` is set).
        restarts: Slurm's count of earlier runs (``Restarts``).
    """

    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields
        self.end = _epoch(fields.get("EndTime", ""))
        self.start = _epoch(fields.get("StartTime", ""))
        self.preempted = fields.get("PreemptTime", "None") not in {"None", "Unknown", "", "0"}
        self.restarts = int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0

    def grace_s(self, wanted: int) -> float:
        """``wanted`` seconds of warning, but at most a third of the run's length (at least 10 s):
        a 1-minute run with the default 120 s would otherwise be stopped as soon as it starts."""
        if self.end is None or self.start is None:
            return float(wanted)
        return float(min(wanted, max(10.0, (self.end - self.start) / 3)))

    def remaining_s(self, now: float) -> float | None:
        """Seconds until Slurm ends the run; ``None`` without a limit."""
        return None if self.end is None else self.end - now


def _epoch(value: str) -> float | None:
    if value.isdigit():
        return float(value)
    try:
        return datetime.fromisoformat(value).timestamp()  # a local time without SLURM_TIME_FORMAT
    except ValueError:
        return None  # "Unknown", "None": no end time


def _run(client: SlurmClient, argv: list[str], hint: str, *, epoch: bool = False) -> CommandResult:
    env = scrubbed_env(client.environ, overrides={"SLURM_TIME_FORMAT": "%s"} if epoch else None)
    result = client.runner.run(argv, env=env, timeout_s=client.timeout_s)
    if not result.ok:
        raise SlurmCommandError(argv, result.returncode, result.stderr, hint)
    return result


def job_facts(client: SlurmClient, job_id: str) -> JobFacts:
    """``scontrol show job -o ID`` as :class:`JobFacts` (times as epoch seconds).

    Raises:
        SlurmCommandError: scontrol failed (controller down, unknown job).
        ValueError: ``job_id`` is malformed.
    """
    argv = ["scontrol", "show", "job", "-o", *job_id_args([job_id])]
    result = _run(client, argv, "is slurmctld up?", epoch=True)
    return JobFacts(parse_key_values(result.stdout.strip().splitlines()[0] if result.stdout.strip() else ""))


def requeue_job(client: SlurmClient, job_id: str) -> None:
    """``scontrol requeue ID``: called on its own job, this ends the current run.

    Raises:
        SlurmCommandError: Slurm refused (job not requeueable, MaxBatchRequeue reached).
    """
    _run(client, ["scontrol", "requeue", *job_id_args([job_id])], "is the job requeueable (--requeue)?")


def set_requeueable(client: SlurmClient, job_id: str, requeue: bool) -> None:
    """``scontrol update JobId=ID Requeue=0|1`` (0: a preemption cancels it, a node failure fails it).

    Raises:
        SlurmCommandError: Slurm refused.
    """
    [jid] = job_id_args([job_id])
    _run(client, ["scontrol", "update", f"JobId={jid}", f"Requeue={int(requeue)}"], "do you own this job?")


def signal_steps(client: SlurmClient, job_id: str, step_name: str, signal: str) -> list[str]:
    """Send ``signal`` to every running step of ``job_id`` named ``step_name``; the step ids signalled.

    Raises:
        SlurmCommandError: squeue or scancel failed.
        ValueError: ``signal`` is not a signal name.
    """
    if not _SIGNAL.fullmatch(signal):
        raise ValueError(f"invalid signal name: {signal!r}")
    [jid] = job_id_args([job_id])
    listing = _run(client, ["squeue", "--noheader", "--steps", f"--jobs={jid}", "--format=%i %j"],
                   "is slurmctld up?")
    steps = [parts[0] for parts in (line.split() for line in listing.stdout.splitlines())
             if len(parts) == 2 and parts[1] == step_name and parts[0].startswith(f"{jid}.")]
    for step in steps:
        _run(client, ["scancel", f"--signal={signal}", step], "do you own this job?")
    return steps


def expedite_args(client: SlurmClient, requeue: bool, sbatch_args: Sequence[str] = ()) -> list[str]:
    """``["--requeue=expedite"]`` for a requeueable job where Slurm offers it (>= 25.11 with
    ``SlurmctldParameters=enable_expedited_requeue``), else ``[]``.

    Why: a requeued run then starts again at once with top priority instead of waiting out
    ``cred_expire`` (BeginTime) behind newer jobs (docs/long-runs.md). Asked at submission, on the
    command line (it overrides the script's ``--requeue``); a user's own ``--requeue``/``--no-requeue``
    after ``--`` wins. Costs ``scontrol show config`` only on a release that has the option.
    """
    if not requeue or any(a.split("=", 1)[0] in {"--requeue", "--no-requeue"} for a in sbatch_args):
        return []
    release = slurm_release(client)
    if release is None or not release.at_least(25, 11):
        return []
    try:
        option = requeue_option(release, client.config())
    except SlurmCommandError:
        return []
    return [option] if option != "--requeue" else []
