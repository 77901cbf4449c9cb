"""A fake Slurm cluster at the process seam: a :class:`CommandRunner` you inject, never a patch.

``FakeSlurm`` answers ``sbatch``, ``sacct``, ``squeue``, ``scancel``, ``scontrol`` (``show node``,
``show hostnames``, ``show config``, ``release``, ``requeue``) and ``sacctmgr show user`` with text
shaped like Slurm 22.05's (compare ``tests/data/sacct/2205_*``), keeps a tiny job state machine,
and records every call (argv, stdin, env) so tests can assert on exactly what would have run::

    slurm = FakeSlurm()
    client = SlurmClient(slurm, sleep=lambda s: None)
    job = client.submit("#!/bin/sh\\n#SBATCH -J train\\necho hi\\n", ["--nodes=2"])
    slurm.set_state(job, "RUNNING")
    slurm.finish(job, exit_code=3)              # FAILED 3:0
    assert client.query([job])[0].state == "FAILED"
    assert slurm.calls[0].stdin.startswith("#!/bin/sh")

Knobs for failure tests: :meth:`fail_next` (a command exits non-zero N times),
:attr:`sacct_lag` (ids slurmdbd has not recorded yet, so only squeue knows them),
:meth:`requeue` (adds a ``REQUEUED`` history row, visible with ``sacct -D``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_bt.slurm.runner import CommandResult

__all__ = ["FakeJob", "FakeSlurm", "RecordedCall"]

_EPOCH0 = 1_795_314_000  # the dev cluster's clock when tests/data/sacct was recorded
_TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


@dataclass(frozen=True)
class RecordedCall:
    """One command the code under test ran."""

    argv: tuple[str, ...]
    stdin: str | None
    env: dict[str, str] | None

    @property
    def program(self) -> str:
        """``"sbatch"``, ``"sacct"``... (basename of argv[0])."""
        return self.argv[0].rsplit("/", 1)[-1] if self.argv else ""


@dataclass
class FakeJob:
    """One fake job (one run; earlier runs are in :attr:`history`)."""

    job_id: int
    name: str
    user: str = "alice"
    uid: int = 1000
    partition: str = "gpu"
    nodes: int = 1
    gpus_per_node: int = 0
    comment: str = ""
    work_dir: str = "/home/alice"
    state: str = "PENDING"
    reason: str = "Priority"
    exit_code: tuple[int, int] = (0, 0)
    cancelled_by: int | None = None
    submit: int = _EPOCH0
    start: int | None = None
    end: int | None = None
    node_list: str = ""
    timelimit_min: int | None = None
    script: str = ""
    argv: tuple[str, ...] = ()
    history: list[FakeJob] = field(default_factory=list)


class FakeSlurm:
    """In-memory Slurm implementing ``CommandRunner.run``.

    Args:
        first_job_id: id of the first submitted job.
        cluster: if set, ``sbatch --parsable`` prints ``ID;cluster`` like a federation.
        user, uid: who "submits" and cancels.
        node_addrs: ``NodeAddr`` per node name for ``scontrol show node``.
        config: ``scontrol show config`` values (``Prolog``, ``PrologFlags``...).
        default_accounts: ``sacctmgr show user`` default account per user (default: ``default``).
    """

    def __init__(
        self,
        *,
        first_job_id: int = 100,
        cluster: str | None = None,
        user: str = "alice",
        uid: int = 1000,
        node_addrs: Mapping[str, str] | None = None,
        config: Mapping[str, str] | None = None,
        default_accounts: Mapping[str, str] | None = None,
    ) -> None:
        self.jobs: dict[int, FakeJob] = {}
        #: ids released with ``scontrol release`` (held weights-staging jobs).
        self.released: list[int] = []
        self.calls: list[RecordedCall] = []
        self.next_id = first_job_id
        self.cluster = cluster
        self.user = user
        self.uid = uid
        self.node_addrs = dict(node_addrs or {"n1": "10.0.0.1", "n2": "10.0.0.2"})
        self.config = dict(config or {"ClusterName": "fake", "PrologFlags": "Alloc,Contain,DeferBatch"})
        self.default_accounts = dict(default_accounts or {user: "default"})
        self.clock = _EPOCH0
        #: Job ids slurmdbd "has not recorded yet": sacct omits them, squeue still shows them.
        self.sacct_lag: set[int] = set()
        self._failures: dict[str, list[CommandResult]] = {}
        self._handlers: dict[str, Callable[[RecordedCall], CommandResult]] = {}

    # ------------------------------------------------------------------ test controls

    def calls_to(self, program: str) -> list[RecordedCall]:
        """Recorded calls of one program, in order."""
        return [c for c in self.calls if c.program == program]

    def fail_next(self, program: str, *, times: int = 1, stderr: str = "", returncode: int = 1) -> None:
        """Make the next ``times`` calls of ``program`` exit ``returncode`` with ``stderr``."""
        msg = stderr or f"{program}: error: Problem talking to the database: Connection refused\n"
        self._failures.setdefault(program, []).extend(
            CommandResult((program,), returncode, "", msg) for _ in range(times)
        )

    def handle(self, program: str, handler: Callable[[RecordedCall], CommandResult]) -> None:
        """Answer ``program`` with ``handler`` instead of the built-in behaviour."""
        self._handlers[program] = handler

    def job(self, job_id: str | int) -> FakeJob:
        """The job with this id (``"123"`` or ``123``)."""
        return self.jobs[int(str(job_id).split("_")[0].split(";")[0])]

    def set_state(
        self,
        job_id: str | int,
        state: str,
        *,
        reason: str | None = None,
        exit_code: tuple[int, int] | None = None,
    ) -> FakeJob:
        """Force a state; RUNNING assigns nodes and a start time, terminal states an end time."""
        job = self.job(job_id)
        self.clock += 1
        job.state = state
        if reason is not None:
            job.reason = reason
        elif state != "PENDING":
            job.reason = "None"
        if exit_code is not None:
            job.exit_code = exit_code
        if state in {"RUNNING", "CONFIGURING", "COMPLETING"} or state in _TERMINAL:
            if job.start is None and state != "CANCELLED":
                job.start = self.clock
                job.node_list = _node_list(job.nodes)
        if state in _TERMINAL:
            job.end = self.clock
        return job

    def finish(self, job_id: str | int, *, exit_code: int = 0, signal: int = 0) -> FakeJob:
        """End a job like Slurm: ``COMPLETED 0:0``, ``FAILED 3:0`` or ``FAILED 0:9``."""
        job = self.job(job_id)
        if job.start is None:
            self.set_state(job_id, "RUNNING")
        state = "COMPLETED" if (exit_code, signal) == (0, 0) else "FAILED"
        return self.set_state(job_id, state, exit_code=(exit_code, signal))

    def requeue(self, job_id: str | int) -> FakeJob:
        """``scontrol requeue``: archive this run as ``REQUEUED`` and pend again (``BeginTime``)."""
        job = self.job(job_id)
        self.clock += 1
        old = FakeJob(**{**job.__dict__, "history": []})
        old.state, old.end = "REQUEUED", self.clock
        job.history.append(old)
        job.state, job.reason, job.start, job.end, job.node_list = "PENDING", "BeginTime", None, None, ""
        job.submit = self.clock
        return job

    # ------------------------------------------------------------------ CommandRunner

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60,
    ) -> CommandResult:
        """Answer one command (see the module docstring)."""
        call = RecordedCall(tuple(argv), input, dict(env) if env is not None else None)
        self.calls.append(call)
        program = call.program
        if self._failures.get(program):
            failure = self._failures[program].pop(0)
            return CommandResult(call.argv, failure.returncode, "", failure.stderr)
        if program in self._handlers:
            return self._handlers[program](call)
        handler = {
            "sbatch": self._sbatch,
            "sacct": self._sacct,
            "squeue": self._squeue,
            "scancel": self._scancel,
            "scontrol": self._scontrol,
            "sacctmgr": self._sacctmgr,
        }.get(program)
        if handler is None:
            return CommandResult(call.argv, 127, "", f"{program}: command not found\n")
        return handler(call)

    # ------------------------------------------------------------------ sbatch

    def _sbatch(self, call: RecordedCall) -> CommandResult:
        args = list(call.argv[1:])
        script = call.stdin or ""
        for line in script.splitlines():
            if line.startswith("#SBATCH"):
                args[:0] = shlex.split(line[len("#SBATCH") :], comments=False)
        if not script.startswith("#!"):
            return CommandResult(
                call.argv,
                1,
                "",
                "sbatch: error: This does not look like a batch script.  "
                "The first line must start with #! followed by the path to an interpreter.\n",
            )
        opts = _options(args)
        if opts.get("partition", "gpu") not in {"gpu", "staging"}:
            return CommandResult(
                call.argv,
                1,
                "",
                "sbatch: error: invalid partition specified: "
                f"{opts['partition']}\nsbatch: error: Batch job submission failed: "
                "Invalid partition name specified\n",
            )
        job = FakeJob(
            job_id=self.next_id,
            name=opts.get("job-name", "sbatch"),
            user=self.user,
            uid=self.uid,
            partition=opts.get("partition", "gpu"),
            nodes=int(opts.get("nodes", "1").split("-")[0] or 1),
            comment=opts.get("comment", ""),
            work_dir=opts.get("chdir", "/home/" + self.user),
            submit=self.clock,
            script=script,
            argv=call.argv,
        )
        gres = re.search(
            r"gpu(?::[A-Za-z0-9]+)?:([0-9]+)", opts.get("gres", "") + " " + opts.get("gpus-per-node", "")
        )
        job.gpus_per_node = int(gres.group(1)) if gres else 0
        if "time" in opts and opts["time"].isdigit():
            job.timelimit_min = int(opts["time"])
        if "dependency" in opts:
            job.reason = "Dependency"
        self.jobs[job.job_id] = job
        self.next_id += 1
        out = f"{job.job_id};{self.cluster}\n" if self.cluster else f"{job.job_id}\n"
        return CommandResult(call.argv, 0, out, "")

    # ------------------------------------------------------------------ sacct

    def _sacct(self, call: RecordedCall) -> CommandResult:
        opts = _options(call.argv[1:])
        if "json" in opts:
            return CommandResult(call.argv, 1, "", "FakeSlurm: sacct --json is not faked; use tests/data\n")
        fields = [f.lower() for f in opts.get("format", "JobID,JobName,State,ExitCode").split(",")]
        sep = opts.get("delimiter", "|")
        epoch = (call.env or {}).get("SLURM_TIME_FORMAT") == "%s"
        wanted = _wanted_ids(opts.get("jobs", ""))
        lines: list[str] = []
        for job in self.jobs.values():
            if job.job_id in self.sacct_lag or (wanted is not None and job.job_id not in wanted):
                continue
            runs = [*job.history, job] if "duplicates" in opts else [job]
            for run in runs:
                lines.append(sep.join(_sacct_value(run, f, epoch, step=None) for f in fields))
                if "allocations" not in opts and run.start is not None:
                    for step in ("batch", "extern"):
                        lines.append(sep.join(_sacct_value(run, f, epoch, step=step) for f in fields))
        return CommandResult(call.argv, 0, "".join(ln + "\n" for ln in lines), "")

    # ------------------------------------------------------------------ squeue

    def _squeue(self, call: RecordedCall) -> CommandResult:
        opts = _options(call.argv[1:])
        fmt = opts.get("format", "%i|%T|%r|%N|%k")
        wanted = _wanted_ids(opts.get("jobs", ""))
        # Like 22.05: finished jobs stay visible to ``--states=all`` until MinJobAge (here: forever).
        live = [j for j in self.jobs.values() if opts.get("states") == "all" or j.state not in _TERMINAL]
        if wanted is not None:
            known = [j for j in live if j.job_id in wanted]
            if not known and len(wanted) == 1:
                return CommandResult(call.argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
            live = known
        epoch = (call.env or {}).get("SLURM_TIME_FORMAT") == "%s"
        out = "".join(_squeue_line(j, fmt, epoch) + "\n" for j in live)
        return CommandResult(call.argv, 0, out, "")

    # ------------------------------------------------------------------ scancel / scontrol

    def _scancel(self, call: RecordedCall) -> CommandResult:
        ids = [a for a in call.argv[1:] if not a.startswith("-")]
        for raw in ids:
            job = self.jobs.get(int(raw.split("_")[0])) if raw.split("_")[0].isdigit() else None
            # Like 22.05: unknown or finished jobs are not an error (exit 0, message only with -v).
            if job is not None and job.state not in _TERMINAL:
                self.set_state(job.job_id, "CANCELLED")
                job.cancelled_by = self.uid
        return CommandResult(call.argv, 0, "", "")

    def _scontrol(self, call: RecordedCall) -> CommandResult:
        words = [a for a in call.argv[1:] if a not in {"-o", "--oneliner"}]
        if words[:2] == ["show", "node"] and len(words) == 3:
            name = words[2]
            if name not in self.node_addrs:
                return CommandResult(call.argv, 1, f"Node {name} not found\n", "")
            return CommandResult(call.argv, 0, self._node_line(name), "")
        if words == ["show", "node"]:
            return CommandResult(call.argv, 0, "".join(self._node_line(n) for n in self.node_addrs), "")
        if words[:2] == ["show", "hostnames"] and len(words) == 3:
            # Enough of the hostlist grammar for tests: ``n[1-3]``, ``a,b``.
            names: list[str] = []
            for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", words[2]):
                m = re.fullmatch(r"(.*)\[([0-9]+)-([0-9]+)\]", part)
                names += [f"{m.group(1)}{i}" for i in range(int(m.group(2)), int(m.group(3)) + 1)] if m else [part]
            return CommandResult(call.argv, 0, "".join(n + "\n" for n in names), "")
        if words == ["show", "config"]:
            lines = "".join(f"{k:<23} = {v}\n" for k, v in self.config.items())
            return CommandResult(call.argv, 0, f"Configuration data as of 2026-11-22T02:20:00\n{lines}", "")
        if words[:1] == ["requeue"] and len(words) == 2 and words[1].isdigit() and int(words[1]) in self.jobs:
            self.requeue(words[1])
            return CommandResult(call.argv, 0, "", "")
        if words[:1] == ["release"] and len(words) == 2 and words[1].isdigit() and int(words[1]) in self.jobs:
            self.released.append(int(words[1]))
            return CommandResult(call.argv, 0, "", "")
        return CommandResult(
            call.argv, 1, "", f"scontrol: error: FakeSlurm does not fake {' '.join(words)}\n"
        )

    def _node_line(self, name: str) -> str:
        return (
            f"NodeName={name} Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUTot=2 Gres=gpu:h100:4 "
            f"NodeAddr={self.node_addrs[name]} NodeHostName={name} Port=6818 Version=22.05.8 "
            "OS=Linux 6.1.0 #1 SMP State=IDLE Partitions=gpu,staging\n"
        )

    def _sacctmgr(self, call: RecordedCall) -> CommandResult:
        words = [a for a in call.argv[1:] if not a.startswith("-")]
        if words[:2] == ["show", "user"] and len(words) == 4 and words[3] == "format=DefaultAccount":
            account = self.default_accounts.get(words[2])
            return CommandResult(call.argv, 0, f"{account}\n" if account else "", "")
        return CommandResult(call.argv, 1, "", f"sacctmgr: error: FakeSlurm does not fake {' '.join(words)}\n")


# ---------------------------------------------------------------------- formatting helpers


def _options(args: Sequence[str]) -> dict[str, str]:
    """Long/short sbatch-style options to a dict (``--x=y``, ``--x y``, ``-J y``, ``-X``)."""
    short = {
        "J": "job-name",
        "N": "nodes",
        "p": "partition",
        "t": "time",
        "j": "jobs",
        "o": "format",
        "D": "duplicates",
        "X": "allocations",
        "P": "parsable2",
        "n": "noheader",
        "h": "noheader",
        "d": "dependency",
        "a": "allusers",
    }
    flags = {
        "duplicates",
        "allocations",
        "parsable2",
        "parsable",
        "noheader",
        "noconvert",
        "json",
        "allusers",
        "oneliner",
    }
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if not eq and key not in flags and i < len(args):
                value, i = args[i], i + 1
            out[key] = value
        elif arg.startswith("-") and len(arg) >= 2:
            key = short.get(arg[1], arg[1])
            if key in flags:
                out[key] = ""
            elif len(arg) > 2:
                out[key] = arg[2:]
            elif i < len(args):
                out[key], i = args[i], i + 1
    return out


def _wanted_ids(jobs: str) -> set[int] | None:
    if not jobs:
        return None
    return {int(re.match(r"[0-9]+", j).group(0)) for j in jobs.split(",") if re.match(r"[0-9]+", j)}  # type: ignore[union-attr]


def _node_list(n: int) -> str:
    return "n1" if n == 1 else f"n[1-{n}]"


def _time(value: int | None, epoch: bool) -> str:
    if value is None:
        return "Unknown"
    if epoch:
        return str(value)
    from datetime import datetime, timezone

    return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _elapsed(job: FakeJob) -> int:
    if job.start is None:
        return 0
    return (job.end if job.end is not None else job.start) - job.start


def _tres(job: FakeJob, step: str | None) -> str:
    if job.start is None:
        return ""
    n = 1 if step == "batch" else job.nodes
    parts = [f"billing={n}"] if step != "batch" else []
    parts.append(f"cpu={n}")
    if job.gpus_per_node:
        parts.append(f"gres/gpu={job.gpus_per_node * n}")
    parts += [f"mem={2000 * n}M", f"node={n}"]
    return ",".join(parts)


def _sacct_value(job: FakeJob, f: str, epoch: bool, *, step: str | None) -> str:
    state = job.state
    if step is None and state == "CANCELLED" and job.cancelled_by is not None:
        state = f"CANCELLED by {job.cancelled_by}"
    if step == "extern":
        state = "COMPLETED" if job.state in _TERMINAL else job.state
    elif step == "batch" and job.state == "CANCELLED":
        state = "CANCELLED"
    jid = f"{job.job_id}.{step}" if step else str(job.job_id)
    elapsed = _elapsed(job)
    values = {
        "jobid": jid,
        "jobidraw": jid,
        "jobname": step or job.name,
        "user": "" if step else job.user,
        "uid": "" if step else str(job.uid),
        "account": "default",
        "partition": "" if step else job.partition,
        "state": state,
        "exitcode": "0:0" if step == "extern" else f"{job.exit_code[0]}:{job.exit_code[1]}",
        "derivedexitcode": "" if step else "0:0",
        "reason": "" if step else job.reason,
        "submit": _time(job.submit, epoch),
        "eligible": _time(job.submit if job.reason != "Dependency" else None, epoch),
        "start": _time(job.start, epoch),
        "end": _time(job.end, epoch),
        "elapsed": f"{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}",
        "elapsedraw": str(elapsed),
        "timelimitraw": (
            ""
            if step
            else str(job.timelimit_min)
            if job.timelimit_min
            else "Partition_Limit"
            if job.state == "PENDING"
            else "UNLIMITED"
        ),
        "nodelist": job.node_list or "None assigned",
        "nnodes": str(1 if step == "batch" else job.nodes),
        "alloctres": _tres(job, step),
        "workdir": "" if step else job.work_dir,
        "comment": "" if step else job.comment,
    }
    return values.get(f, "")


def _squeue_line(job: FakeJob, fmt: str, epoch: bool) -> str:
    codes = {
        "i": str(job.job_id),
        "A": str(job.job_id),
        "T": job.state,
        "r": job.reason,
        "N": job.node_list,
        "k": job.comment or "(null)",
        "j": job.name,
        "u": job.user,
        "U": str(job.uid),
        "D": str(job.nodes),
        "P": job.partition,
        "Z": job.work_dir,
        "V": _time(job.submit, epoch),
        "M": "0:00",
    }
    return re.sub(r"%\.?[0-9]*([A-Za-z])", lambda m: codes.get(m.group(1), ""), fmt)
