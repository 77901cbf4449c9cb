"""End the processes a job left behind on its host (epilog, root), and know which users still have jobs here.

Why: with ``ProctrackType=proctrack/linuxproc`` (or ``pgid``) Slurm finds a job's processes through
their parent chain, so anything started with ``setsid``/``nohup``/a double fork whose parent then
exits is re-parented to init and *survives the job*, holding memory, GPUs and files. With
``proctrack/cgroup`` Slurm ends them itself (``slurm-bt admin doctor`` says which applies); this
sweep then finds nothing to do.

The rule is the usual site practice: when a job ends and its user has **no other job on this host**,
the user's leftover processes on the host are ended. Decided from facts root wrote, never from
anything a user controls, and never with a Slurm command (hooks must not call them):

* **Other jobs.** The prolog writes ``owner`` (the job's uid) into the job's notes
  ``<state root>/<node>/jobs/<job id>/`` right after creating them, for *every* job, and the epilog
  removes the notes last. The sweep reads the notes of **every node directory under the state
  root**: ``/run`` is per host, so this covers every slurmd on the host (the dev cluster runs n1 and
  n2 on one host: a job of the same user on the other dev node keeps the user's processes alive).
  The same job id on another node is this job, and a job whose epilog has started
  (:data:`ENDING_NOTE`) is ending too. Recent notes without an ``owner`` are waited for briefly (a
  prolog between its two writes) and otherwise counted as "maybe this user": leaving a process is
  better than killing a running job's; ownerless notes older than two minutes are debris.
* **Which processes.** Those whose real, effective, saved and filesystem uids all equal the job's
  uid (a setuid program the user started runs partly as root and is never signalled), and the job
  uid must be at least :data:`MIN_USER_UID` (root and system users are never swept). Processes
  that belong to a *login session* rather than a job are left alone: a process is a leftover only if
  no ancestor between it and init is a process of another real uid other than ``slurmd`` /
  ``slurmstepd`` (an sshd, ``runuser``, ``sudo``, cron session: the dev cluster's host is also its
  login node). A user cannot forge that: a root ancestor is something root started.
* **How.** List the processes, *then* re-read the notes (a job's processes exist only after its
  notes do, so a process listed before a note was found absent cannot be that job's). SIGTERM to
  each, wait up to :data:`TERM_GRACE_S`, then rounds of SIGSTOP (nothing stopped can fork) and
  SIGKILL until none is left or the budget ends. Each signal goes through a pidfd opened after the
  pid's start time, uids and parent were checked again, so a recycled pid is never signalled
  (without pidfd support, ``kill`` right after the same check). No shell, no Slurm command;
  bounded by the caller's deadline and :data:`MAX_PROCESSES` per round.

What is left after the budget is logged. Sites that let users start login-side daemons on compute
nodes (ssh without ``pam_slurm_adopt``, cron) keep them: they have a root ancestor.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_bt.posix.job_notes import STATE_ROOT
from slurm_bt.trusted_files import read_trusted_file

__all__ = [
    "ENDING_NOTE",
    "MIN_USER_UID",
    "OWNER_NOTE",
    "ProcInfo",
    "SweepReport",
    "end_leftover_processes",
    "leftover_candidates",
    "mark_job_ending",
    "other_jobs_of_user",
    "read_proc",
    "recorded_job_owner",
    "summary",
    "write_job_owner",
]

OWNER_NOTE = "owner"
"""``<notes>/owner``: the job's uid (decimal), written by the prolog for every job."""
ENDING_NOTE = "epilog-started"
"""``<notes>/epilog-started``: the job's epilog has begun; the job no longer keeps its user's processes."""
MIN_USER_UID = 1000
"""Jobs of uids below this (root, system accounts) never have their user's processes swept."""
TERM_GRACE_S = 3.0
KILL_ROUNDS = 6
MAX_PROCESSES = 4096
_OWNER_WAIT_S = 1.0
_OWNERLESS_MAX_AGE_S = 120.0
"""Notes without an owner older than this are not a prolog between two writes but debris (a prolog
that crashed there, or notes from a version without owners): they protect nobody."""
_JOBS_SCANNED_MAX = 10000
_JOB_SIDE_EXES = frozenset({"slurmstepd", "slurmd"})


# -- the notes ------------------------------------------------------------------------------------

def _job_notes_fd(state_root: str, node: str, job_id: str) -> int | None:
    """The job's notes directory if it exists (never created here)."""
    from slurm_bt.posix.job_notes import open_node_state
    from slurm_bt.posix.safefs import open_dir_at

    nfd = open_node_state(node, state_root)
    try:
        jfd = open_dir_at(nfd, "jobs")
    except FileNotFoundError:
        return None
    finally:
        os.close(nfd)
    try:
        return open_dir_at(jfd, job_id)
    except FileNotFoundError:
        return None
    finally:
        os.close(jfd)


def _write_note(state_root: str, node: str, job_id: str, gid: int, name: str, data: bytes) -> bool:
    from slurm_bt.posix.safefs import write_file_at

    fd = _job_notes_fd(state_root, node, job_id)
    if fd is None:
        return False
    try:
        write_file_at(fd, name, data, uid=0, gid=gid, mode=0o640)
    finally:
        os.close(fd)
    return True


def write_job_owner(state_root: str, node: str, job_id: str, uid: int, gid: int) -> None:
    """Prolog: record who owns the job in its (just created) notes."""
    _write_note(state_root, node, job_id, gid, OWNER_NOTE, f"{uid}\n".encode())


def recorded_job_owner(state_root: str, node: str, job_id: str) -> tuple[int, int] | None:
    """``(uid, gid)`` the prolog recorded for this job on this node, or None if there is no such note.

    The uid is the note's content and the gid its group (both written by root in a root-owned tree,
    from the prolog's own trusted ``SLURM_JOB_UID``/``SLURM_JOB_GID``), so this is as trustworthy as
    the prolog's environment. The epilog needs it when slurmd itself has forgotten the job's owner
    (:func:`slurm_bt.hooks.runner.run_hook`).
    """
    from slurm_bt.trusted_files import owned_by_root

    gids: list[int] = []

    def root_note(st: os.stat_result) -> bool:
        gids.append(st.st_gid)
        return owned_by_root(st)

    raw = read_trusted_file(f"{state_root}/{node}/jobs/{job_id}/{OWNER_NOTE}", max_bytes=32, owner_ok=root_note)
    if raw is None or not gids:
        return None
    text = raw.decode("ascii", "replace").strip()
    return (int(text), gids[-1]) if text.isdigit() else None


def mark_job_ending(state_root: str, node: str, job_id: str, gid: int) -> None:
    """Epilog: tell concurrent epilogs that this job no longer protects its user's processes."""
    _write_note(state_root, node, job_id, gid, ENDING_NOTE, b"")


def _read_owner(job_dir: str) -> int | None:
    raw = read_trusted_file(f"{job_dir}/{OWNER_NOTE}", max_bytes=32)
    if raw is None:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def _young(job_dir: str) -> bool:
    """Notes created less than :data:`_OWNERLESS_MAX_AGE_S` ago (only root writes there, so mtime is root's)."""
    try:
        return time.time() - os.lstat(job_dir).st_mtime < _OWNERLESS_MAX_AGE_S
    except OSError:
        return False


def other_jobs_of_user(state_root: str, uid: int, job_id: str) -> list[str]:
    """``<node>/<job id>`` of every other live job of ``uid`` on this host (see the module docstring).

    Recent notes without an owner count as this user's after a short wait (conservative).
    """
    try:
        nodes = sorted(os.listdir(state_root))
    except OSError:
        return []
    unknown: list[tuple[str, str]] = []
    found: list[str] = []
    scanned = 0
    for node in nodes:
        jobs = f"{state_root}/{node}/jobs"
        try:
            names = os.listdir(jobs)
        except OSError:
            continue
        for name in names:
            scanned += 1
            if scanned > _JOBS_SCANNED_MAX:
                return [*found, "(too many notes to scan)"]
            if name == job_id or not name.isdigit():
                continue
            job_dir = f"{jobs}/{name}"
            if os.path.lexists(f"{job_dir}/{ENDING_NOTE}"):
                continue
            owner = _read_owner(job_dir)
            if owner is None:
                if _young(job_dir):
                    unknown.append((node, name))
            elif owner == uid:
                found.append(f"{node}/{name}")
    if unknown and not found:
        time.sleep(_OWNER_WAIT_S)  # a prolog between creating the notes and writing the owner
        for node, name in unknown:
            job_dir = f"{state_root}/{node}/jobs/{name}"
            if not os.path.isdir(job_dir) or os.path.lexists(f"{job_dir}/{ENDING_NOTE}"):
                continue
            owner = _read_owner(job_dir)
            if owner is None or owner == uid:
                found.append(f"{node}/{name}" + ("" if owner is not None else " (owner unknown)"))
    return found


# -- processes ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcInfo:
    """What the sweep needs of one process, read from ``/proc/<pid>``.

    Attributes:
        pid, ppid: ids.
        start: start time in clock ticks since boot (``stat`` field 22): with the pid, it names one
            process for ever (a recycled pid has a later start time).
        state: ``stat`` field 3 (``Z`` zombie, ``X`` dead).
        uids: real, effective, saved and filesystem uid.
    """

    pid: int
    ppid: int
    start: int
    state: str
    uids: tuple[int, int, int, int]


def _read_small(path: str, limit: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_proc(pid: int, proc: str = "/proc") -> ProcInfo | None:
    """The process ``pid`` (None if gone or unreadable)."""
    raw = _read_small(f"{proc}/{pid}/stat", 4096)
    status = _read_small(f"{proc}/{pid}/status", 16384)
    if not raw or not status:
        return None
    # comm (field 2) is in parentheses and may itself contain ")" and spaces: split after the last one.
    _, sep, rest = raw.decode("ascii", "replace").rpartition(")")
    fields = rest.split()
    if not sep or len(fields) < 20:
        return None
    uids: tuple[int, ...] = ()
    for line in status.decode("ascii", "replace").splitlines():
        if line.startswith("Uid:"):
            uids = tuple(int(v) for v in line.split()[1:5] if v.isdigit())
            break
    if len(uids) != 4:
        return None
    try:
        return ProcInfo(pid=pid, ppid=int(fields[1]), start=int(fields[19]), state=fields[0],
                        uids=(uids[0], uids[1], uids[2], uids[3]))
    except ValueError:
        return None


def _snapshot(proc: str) -> dict[int, ProcInfo]:
    out: dict[int, ProcInfo] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            info = read_proc(int(name), proc)
            if info is not None:
                out[info.pid] = info
    return out


def _exe_name(pid: int, proc: str) -> str:
    try:
        return os.path.basename(os.readlink(f"{proc}/{pid}/exe")).removesuffix(" (deleted)")
    except OSError:
        return ""


def _is_login_side(p: ProcInfo, procs: dict[int, ProcInfo], uid: int, proc: str, memo: dict[int, bool]) -> bool:
    """True if an ancestor is a process of another real uid that is not slurmd/slurmstepd (see module doc).

    ``memo`` keeps the verdict of every process on the walked chain, so a snapshot costs one walk per
    process however deep or wide the user's process tree is.
    """
    chain: list[int] = []
    on_chain: set[int] = set()
    cur = p
    verdict = True  # absurdly deep: leave it alone
    for _ in range(512):
        if cur.pid in memo:
            verdict = memo[cur.pid]
            break
        chain.append(cur.pid)
        on_chain.add(cur.pid)
        parent = procs.get(cur.ppid)
        if parent is None or parent.pid <= 1 or parent.pid in on_chain:
            verdict = False
            break
        if parent.uids[0] != uid and _exe_name(parent.pid, proc) not in _JOB_SIDE_EXES:
            verdict = True
            break
        cur = parent
    for pid in chain:
        memo[pid] = verdict
    return verdict


def leftover_candidates(uid: int, proc: str = "/proc") -> list[ProcInfo]:
    """Live processes wholly of ``uid`` that are not part of a login session (module docstring)."""
    procs = _snapshot(proc)
    me = os.getpid()
    memo: dict[int, bool] = {}
    # Oldest first: a process's parent (or the subreaper it was handed to) started before it, so each
    # walk stops at a verdict already in ``memo`` and no chain depth can reach the walk's limit.
    found = [p for p in sorted(procs.values(), key=lambda p: (p.start, p.pid))
             if p.pid != me and p.state not in ("Z", "X") and all(u == uid for u in p.uids)
             and not _is_login_side(p, procs, uid, proc, memo)]
    return found[:MAX_PROCESSES]


def _same(p: ProcInfo, proc: str) -> bool:
    now = read_proc(p.pid, proc)
    return now is not None and now.start == p.start and now.uids == p.uids and now.state not in ("Z", "X")


def _signal(p: ProcInfo, sig: int, proc: str) -> bool:
    """Send ``sig`` to exactly the process ``p`` describes (never to a recycled pid)."""
    pidfd = -1
    try:
        if hasattr(os, "pidfd_open"):
            try:
                pidfd = os.pidfd_open(p.pid)
            except ProcessLookupError:
                return False
            except OSError:
                pidfd = -1  # old kernel: fall back to kill() right after the check below
        if not _same(p, proc):
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(p.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _alive(ps: list[ProcInfo], proc: str) -> list[ProcInfo]:
    return [p for p in ps if _same(p, proc)]


def _wait_gone(ps: list[ProcInfo], until: float, proc: str) -> list[ProcInfo]:
    left = _alive(ps, proc)
    while left and time.monotonic() < until:
        time.sleep(0.05)
        left = _alive(left, proc)
    return left


@dataclass
class SweepReport:
    """What :func:`end_leftover_processes` did.

    Attributes:
        skipped: why nothing was signalled (``""`` when the sweep ran).
        terminated: processes that ended after SIGTERM.
        killed: processes sent SIGKILL.
        left: ``pid`` of processes still alive when the budget ended.
        other_jobs: the other jobs of the user that kept its processes alive.
    """

    skipped: str = ""
    terminated: int = 0
    killed: int = 0
    left: list[int] = field(default_factory=list)
    other_jobs: list[str] = field(default_factory=list)


def end_leftover_processes(uid: int, job_id: str, *, deadline: float, state_root: str = STATE_ROOT,
                           proc: str = "/proc", min_uid: int = MIN_USER_UID,
                           log: Callable[[str], None] = lambda _m: None) -> SweepReport:
    """End ``uid``'s leftover processes on this host unless the user has another job here.

    Args:
        uid: the job's uid (trusted: ``SLURM_JOB_UID``).
        job_id: the ending job (its notes on any node do not count as another job).
        deadline: ``time.monotonic()`` value by which this returns.
        state_root, proc, min_uid: overridable for tests.
        log: one line per notable event.
    """
    report = SweepReport()
    if uid < min_uid:
        report.skipped = f"uid {uid} is below {min_uid} (root or a system account)"
        return report
    term_sent: list[ProcInfo] = []
    for rnd in range(KILL_ROUNDS + 1):
        if time.monotonic() >= deadline:
            break
        procs = leftover_candidates(uid, proc)  # listed first, then the notes: see the module docstring
        if not procs:
            break
        others = other_jobs_of_user(state_root, uid, job_id)
        if others:
            report.other_jobs = others
            report.skipped = "the user has another job on this host: " + ", ".join(others[:5])
            return report
        if rnd == 0:
            term_sent = [p for p in procs if _signal(p, signal.SIGTERM, proc)]
            left = _wait_gone(term_sent, min(deadline, time.monotonic() + TERM_GRACE_S), proc)
            report.terminated = len(term_sent) - len(left)
            continue
        # Freeze first (a stopped process cannot fork), then kill what was frozen.
        stopped = [p for p in procs if _signal(p, signal.SIGSTOP, proc)]
        for p in stopped:
            if _signal(p, signal.SIGKILL, proc):
                report.killed += 1
        _wait_gone(stopped, min(deadline, time.monotonic() + 1.0), proc)
    still = leftover_candidates(uid, proc)
    if still and not report.skipped:
        report.left = [p.pid for p in still]
        log(f"{len(still)} process(es) of uid {uid} still alive after the sweep: "
            + " ".join(str(p) for p in report.left[:20]))
    return report


def summary(report: SweepReport) -> str:
    """One-line summary for the hook log."""
    if report.skipped:
        return f"processes: {report.skipped}"
    return f"processes terminated={report.terminated} killed={report.killed} left={len(report.left)}"
