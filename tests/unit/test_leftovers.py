"""Leftover processes, the runtime directory and squat records (slurm_bt.jobhost.leftovers/runtime/squats).

Processes run as a uid no account uses (:data:`UID`), so the sweep can never touch anything but what
the test started; the notes root is a temporary directory. The runtime root is a throwaway sticky
directory standing in for ``/dev/shm``; btu1 is the victim and btu2 the squatter.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.unit.test_hooks_prolog as hooks_tests
from slurm_bt.cli.admin_cmd import _proctrack_check, _squats_check
from slurm_bt.jobhost import leftovers
from slurm_bt.jobhost.leftovers import (
    ENDING_NOTE,
    OWNER_NOTE,
    ProcInfo,
    end_leftover_processes,
    leftover_candidates,
    other_jobs_of_user,
    read_proc,
)
from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.posix.squat_records import read_squats, record_squat
from tests.unit.test_hooks_env import hook_environ

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids, root-owned notes)")

UID = 61_237  # no account: nothing else on the host runs as it
site = hooks_tests.site
fake_flush = hooks_tests.fake_flush
Site = hooks_tests.Site


# -- helpers --------------------------------------------------------------------------------------

def _become(uid: int, euid: int | None = None) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid if euid is None else euid, uid if euid is None else euid)


def spawn_detached(argv: list[str], *, uid: int = UID, ignore_term: bool = False) -> int:
    """Start ``argv`` as ``uid`` the way ``setsid nohup cmd &`` does after its shell exits (parent: init)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setsid()
            _become(uid)
            grandchild = os.fork()
            if grandchild == 0:
                if ignore_term:
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                devnull = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                os.execv(argv[0], argv)
            os.write(w, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return int(f.read())


def spawn_under_root_parent(argv: list[str], *, uid: int = UID) -> tuple[int, int]:
    """A login-side process: ``argv`` as ``uid`` under a root parent that stays (like runuser, sshd)."""
    r, w = os.pipe()
    parent = os.fork()
    if parent == 0:
        try:
            os.close(r)
            child = os.fork()
            if child == 0:
                _become(uid)
                os.execv(argv[0], argv)
            os.write(w, str(child).encode())
            os.close(w)
            os.waitpid(child, 0)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        return parent, int(f.read())


def alive(pid: int) -> bool:
    info = read_proc(pid)
    return info is not None and info.state not in ("Z", "X")


def wait_dead(pid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture()
def state() -> Iterator[str]:
    base = tempfile.mkdtemp(prefix="bt-left-", dir="/tmp")
    os.chmod(base, 0o755)
    yield f"{base}/run"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def procs() -> Iterator[list[int]]:
    """Pids to SIGKILL at the end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:  # our own forks: reap them (the detached ones belong to init)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def note(state: str, node: str, job: str, *, owner: int | None, ending: bool = False) -> None:
    d = Path(state, node, "jobs", job)
    d.mkdir(parents=True, exist_ok=True)
    for p in (Path(state), Path(state, node), Path(state, node, "jobs"), d):
        os.chmod(p, 0o755)
    if owner is not None:
        (d / OWNER_NOTE).write_text(f"{owner}\n")
        os.chmod(d / OWNER_NOTE, 0o640)
    if ending:
        (d / ENDING_NOTE).write_text("")


# -- processes ------------------------------------------------------------------------------------

def test_read_proc_handles_odd_command_names(procs: list[int], tmp_path: Path) -> None:
    odd = tmp_path / "we) ird ("
    shutil.copy("/bin/sleep", odd)
    os.chmod(tmp_path, 0o755)
    p = subprocess.Popen([str(odd), "30"])
    procs.append(p.pid)
    info = read_proc(p.pid)
    assert info is not None and info.ppid == os.getpid() and info.uids == (0, 0, 0, 0) and info.start > 0
    assert read_proc(2**22 + 12345) is None


def test_detached_and_term_ignoring_leftovers_are_ended(state: str, procs: list[int]) -> None:
    plain = spawn_detached(["/bin/sleep", "300"])
    stubborn = spawn_detached(["/bin/sleep", "301"], ignore_term=True)
    procs += [plain, stubborn]
    assert {plain, stubborn} <= {p.pid for p in leftover_candidates(UID)}
    t0 = time.monotonic()
    report = end_leftover_processes(UID, "7", deadline=time.monotonic() + 20, state_root=state)
    assert wait_dead(plain, 2) and wait_dead(stubborn, 2)
    assert not report.skipped and report.terminated >= 1 and report.killed >= 1 and not report.left
    assert time.monotonic() - t0 < leftovers.TERM_GRACE_S + 5


def test_login_side_processes_and_mixed_uid_processes_are_left_alone(state: str, procs: list[int]) -> None:
    parent, login_side = spawn_under_root_parent(["/bin/sleep", "300"])
    procs += [parent, login_side]
    r, w = os.pipe()
    setuid_like = os.fork()
    if setuid_like == 0:  # ruid UID, euid root: a setuid program the user started
        os.setsid()
        _become(UID, euid=0)
        os.close(r)
        os.write(w, b"x")
        time.sleep(300)
        os._exit(0)
    procs.append(setuid_like)
    os.read(r, 1)
    detached = spawn_detached(["/bin/sleep", "302"])
    procs.append(detached)
    report = end_leftover_processes(UID, "8", deadline=time.monotonic() + 20, state_root=state)
    assert wait_dead(detached, 2) and report.terminated == 1
    assert alive(login_side) and alive(setuid_like) and alive(parent)


def test_another_job_of_the_user_on_any_node_keeps_processes(state: str, procs: list[int]) -> None:
    pid = spawn_detached(["/bin/sleep", "303"])
    procs.append(pid)
    note(state, "n1", "10", owner=UID)  # the ending job itself
    note(state, "n2", "10", owner=UID)  # the same job on the other node: not "another job"
    note(state, "n1", "11", owner=UID + 1)  # someone else's job
    note(state, "n2", "12", owner=UID, ending=True)  # another job of the user, ending too
    assert other_jobs_of_user(state, UID, "10") == []
    assert end_leftover_processes(UID, "10", deadline=time.monotonic() + 20, state_root=state).terminated == 1
    assert wait_dead(pid, 2)

    pid = spawn_detached(["/bin/sleep", "304"])
    procs.append(pid)
    note(state, "n2", "13", owner=UID)  # running on the other dev node (same host)
    report = end_leftover_processes(UID, "10", deadline=time.monotonic() + 20, state_root=state)
    assert report.other_jobs == ["n2/13"] and "another job" in report.skipped
    time.sleep(0.3)
    assert alive(pid)


def test_notes_without_owner_count_as_this_users(state: str, procs: list[int]) -> None:
    note(state, "n1", "20", owner=None)
    t0 = time.monotonic()
    assert other_jobs_of_user(state, UID, "21") == ["n1/20 (owner unknown)"]
    assert time.monotonic() - t0 >= 0.9  # waited for a prolog between its two writes
    (Path(state, "n1", "jobs", "20") / OWNER_NOTE).write_text("5\n")  # a user cannot write here, root can
    os.chmod(Path(state, "n1", "jobs", "20", OWNER_NOTE), 0o640)
    assert other_jobs_of_user(state, UID, "21") == []
    os.chown(Path(state, "n1", "jobs", "20", OWNER_NOTE), UID, -1)  # not root's: not trusted
    assert other_jobs_of_user(state, UID, "21") == ["n1/20 (owner unknown)"]


def test_root_and_system_users_are_never_swept(state: str) -> None:
    for uid in (0, 1, 999):
        report = end_leftover_processes(uid, "1", deadline=time.monotonic() + 5, state_root=state)
        assert "below" in report.skipped and report.terminated == report.killed == 0


def test_a_recycled_pid_is_never_signalled(procs: list[int]) -> None:
    pid = spawn_detached(["/bin/sleep", "305"])
    procs.append(pid)
    real = read_proc(pid)
    assert real is not None
    stale = ProcInfo(pid=pid, ppid=real.ppid, start=real.start - 1, state="S", uids=real.uids)
    assert leftovers._signal(stale, signal.SIGKILL, "/proc") is False
    time.sleep(0.2)
    assert alive(pid)
    assert leftovers._signal(real, signal.SIGKILL, "/proc") is True and wait_dead(pid, 2)


def test_epilog_sweeps_only_as_slurmds_epilog_on_the_hosts_notes(site: Site) -> None:
    env = hook_environ("btu1", "30", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    assert hooks_tests.run(site, "epilog", env) == 0  # a test notes root: must not touch btu1's processes
    log = (site.base / "log" / "hooks.log").read_text()
    assert "processes: not swept" in log


# -- runtime directory ----------------------------------------------------------------------------

def _runtime(site: Site, user: str = "btu1") -> Path:
    return site.base / "shm" / f"slurm-bt-{pwd.getpwnam(user).pw_uid}"


def test_prolog_creates_the_runtime_dir_root_side_and_records_the_owner(site: Site) -> None:
    work = hooks_tests.write_job(site, "btu1")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "40", work)) == 0
    st = _runtime(site).lstat()
    pw = pwd.getpwnam("btu1")
    assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (pw.pw_uid, pw.pw_gid,
                                                                                              0o700)
    assert read_hook_state("n1", "40", site.state).record["runtime"] == str(_runtime(site))  # type: ignore[index]
    owner = Path(site.state, "n1", "jobs", "40", OWNER_NOTE)
    assert owner.read_text() == f"{pw.pw_uid}\n" and owner.stat().st_uid == 0
    # every job gets an owner note, slurm-bt or not
    assert hooks_tests.run(site, "prolog", hook_environ("btu2", "41")) == 0
    assert Path(site.state, "n1", "jobs", "41", OWNER_NOTE).read_text() == f"{pwd.getpwnam('btu2').pw_uid}\n"


@pytest.mark.parametrize("shape", ["directory", "symlink", "file", "fifo"])
def test_squatted_runtime_dir_is_moved_aside_removed_and_recorded(site: Site, shape: str) -> None:
    squat = _runtime(site)
    btu2 = pwd.getpwnam("btu2")
    if shape == "directory":
        squat.mkdir(mode=0o777)
        (squat / "planted").write_text("x")
        os.chown(squat / "planted", btu2.pw_uid, btu2.pw_gid)
    elif shape == "symlink":
        squat.symlink_to("/etc")
    elif shape == "file":
        squat.write_text("x")
    else:
        os.mkfifo(squat)
    os.chown(squat, btu2.pw_uid, btu2.pw_gid, follow_symlinks=False)
    work = hooks_tests.write_job(site, "btu1")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "42", work)) == 0
    assert read_hook_state("n1", "42", site.state).error is None
    st = squat.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == pwd.getpwnam("btu1").pw_uid and not any(squat.iterdir())
    assert Path("/etc/passwd").exists()
    assert [p.name for p in (site.base / "shm").iterdir()] == [squat.name]  # the aside copy is gone too
    log = (site.base / "log" / "hooks.log").read_text()
    assert f"squatted runtime directory {squat}" in log and f"owned by uid {btu2.pw_uid}" in log
    (sq,) = read_squats("n1", site.state)
    assert (sq.path, sq.owner_uid, sq.victim_uid, sq.job_id) == (str(squat), btu2.pw_uid,
                                                                 pwd.getpwnam("btu1").pw_uid, "42")
    assert sq.kind == {"fifo": "fifo"}.get(shape, shape)
    check = _squats_check("n1", site.state)
    assert not check.ok and check.warn and str(squat) in check.problem and "rm " in check.fix


def test_a_squatter_who_keeps_winning_fails_the_job_not_the_node(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_bt.jobhost import runtime_dirs as runtime

    squat = _runtime(site)
    real = runtime._sidestep

    def sidestep_then_lose_the_race(ctx: object, root_fd: int, root: str, name: str) -> None:
        real(ctx, root_fd, root, name)  # type: ignore[arg-type]
        os.mkdir(name, dir_fd=root_fd)
        os.chown(name, pwd.getpwnam("btu2").pw_uid, -1, dir_fd=root_fd)

    monkeypatch.setattr(runtime, "_sidestep", sidestep_then_lose_the_race)
    squat.mkdir()
    os.chown(squat, pwd.getpwnam("btu2").pw_uid, -1)
    work = hooks_tests.write_job(site, "btu1")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "43", work)) == 0
    err = read_hook_state("n1", "43", site.state).error
    assert err is not None and "keeps re-creating" in err and str(squat) in err
    assert read_squats("n1", site.state)[0].count == 3


def test_untrusted_runtime_root_is_left_to_step1(site: Site) -> None:
    os.chown(site.base / "shm", pwd.getpwnam("btu2").pw_uid, -1)
    work = hooks_tests.write_job(site, "btu1")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "44", work)) == 0
    assert read_hook_state("n1", "44", site.state).error is None
    assert not _runtime(site).exists()
    assert "runtime root is not safe" in (site.base / "log" / "hooks.log").read_text()


def test_epilog_removes_the_job_runtime_dir_without_following_links(site: Site) -> None:
    work = hooks_tests.write_job(site, "btu1")
    env = hooks_tests.job_env(site, "btu1", "45", work)
    assert hooks_tests.run(site, "prolog", env) == 0
    pw = pwd.getpwnam("btu1")
    job_dir = _runtime(site) / "45"
    job_dir.mkdir(mode=0o700)
    (job_dir / "node-0.env").write_bytes(b"SECRET=canary\0")
    (job_dir / "etc").symlink_to("/etc")
    for p in (job_dir, job_dir / "node-0.env"):
        os.chown(p, pw.pw_uid, pw.pw_gid)
    other = _runtime(site) / "46"  # another job's, still running on the host
    other.mkdir()
    note(site.state, "n2", "46", owner=pw.pw_uid)
    assert hooks_tests.run(site, "epilog", env) == 0
    assert not job_dir.exists() and other.is_dir() and Path("/etc/passwd").exists()
    shutil.rmtree(Path(site.state, "n2", "jobs", "46"))
    other.rmdir()
    assert hooks_tests.run(site, "epilog", env) == 0  # idempotent; and no other job: the user's dir goes
    assert not _runtime(site).exists()


def test_epilog_does_not_follow_a_runtime_dir_swapped_for_a_symlink(site: Site) -> None:
    victim = site.base / "victim"
    (victim / "52").mkdir(parents=True)
    (victim / "52" / "keep").write_text("x")
    os.chown(victim, pwd.getpwnam("btu2").pw_uid, -1)
    _runtime(site).symlink_to(victim)  # the user renamed their dir away and put a link in its place
    os.chown(_runtime(site), pwd.getpwnam("btu1").pw_uid, -1, follow_symlinks=False)
    assert hooks_tests.run(site, "epilog", hooks_tests.job_env(site, "btu1", "52", site.base)) == 0
    assert (victim / "52" / "keep").read_text() == "x" and _runtime(site).is_symlink()
    assert "is a symlink or not a directory; left for the next prolog" in (site.base / "log" / "hooks.log").read_text()


def test_epilog_does_not_enter_a_squatted_runtime_dir(site: Site) -> None:
    squat = _runtime(site)
    squat.mkdir()
    (squat / "47").mkdir()
    os.chown(squat, pwd.getpwnam("btu2").pw_uid, -1)
    env = hooks_tests.job_env(site, "btu1", "47", site.base)
    assert hooks_tests.run(site, "epilog", env) == 0
    assert (squat / "47").is_dir()  # not btu1's to remove: the next prolog of btu1 sidesteps it


# -- records and doctor -----------------------------------------------------------------------------

def test_squat_records_count_and_are_bounded(state: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for job in ("1", "2"):
        record_squat("n1", path="/dev/shm/slurm-bt-5", owner_uid=6, kind="directory", victim_uid=5, job_id=job,
                     action="moved aside and removed", state_root=state)
    (sq,) = read_squats("n1", state)
    assert (sq.count, sq.job_id) == (2, "2")
    monkeypatch.setattr("slurm_bt.posix.squat_records.MAX_RECORDS", 2)
    for i in range(5):
        record_squat("n1", path=f"/x/{i}", owner_uid=6, kind="file", victim_uid=5, job_id="3", action="a",
                     state_root=state)
    assert len(read_squats("n1", state)) == 2
    rec = next(Path(state, "n1", "squats").iterdir())
    os.chown(rec, UID, -1)  # a record root did not write is ignored
    assert len(read_squats("n1", state)) == 1
    assert json.loads(rec.read_text())["owner_uid"] == 6
    assert _squats_check("n9", state).ok


def test_doctor_says_who_ends_leftover_processes() -> None:
    assert "Slurm ends" in _proctrack_check("proctrack/cgroup").problem
    linux = _proctrack_check("proctrack/linuxproc")
    assert linux.ok and "slurm-bt epilog" in linux.problem and "no other job on this host" in linux.problem


def test_without_the_prolog_step1_names_the_squat_and_who_can_fix_it(site: Site) -> None:
    from slurm_bt.errors import StorageError
    from slurm_bt.steps.prepare import prepare_node

    os.chmod(site.scratch("x").parent, 0o1777)  # the no-prolog layout (docs/admin.md §Without the prolog)
    work = hooks_tests.write_job(site, "btu1", cache=False)
    squat = _runtime(site)
    squat.mkdir(mode=0o777)
    os.chown(squat, pwd.getpwnam("btu2").pw_uid, -1)

    def step1() -> str:
        try:
            prepare_node(work / "job.json", {"SLURM_JOB_ID": "48", "SLURMD_NODENAME": "n1"}, state_root=site.state)
        except StorageError as exc:
            return str(exc)
        return "prepared"

    message = hooks_tests.as_user("btu1", step1)
    assert isinstance(message, str) and message.startswith(f"{squat}: is owned by uid {pwd.getpwnam('btu2').pw_uid}")
    assert "an admin must remove it" in message and "prolog" in message
    squat.rmdir()
    assert hooks_tests.as_user("btu1", step1) == "prepared"  # the fallback itself still works
    assert (squat / "48" / "node-0.env").stat().st_uid == pwd.getpwnam("btu1").pw_uid


def test_prolog_removes_runtime_dirs_whose_epilog_never_ran(site: Site) -> None:
    work = hooks_tests.write_job(site, "btu1")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "50", work)) == 0
    pw = pwd.getpwnam("btu1")
    old = time.time() - 7200
    for job in ("97", "98", "99"):
        d = _runtime(site) / job
        d.mkdir()
        (d / "node-0.env").write_bytes(b"SECRET=stale\0")
        os.chown(d, pw.pw_uid, pw.pw_gid)
        if job != "99":
            os.utime(d, (old, old))
    note(site.state, "n2", "98", owner=pw.pw_uid)  # still running on the other node of the host
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "51", work)) == 0
    left = sorted(p.name for p in _runtime(site).iterdir())
    assert left == ["98", "99"]  # 97: stale; 98: active on n2; 99: too recent
    assert "stale runtime directory" in (site.base / "log" / "hooks.log").read_text()


def test_old_ownerless_notes_are_debris_not_a_job(state: str) -> None:
    note(state, "n1", "60", owner=None)
    old = time.time() - 3600
    os.utime(Path(state, "n1", "jobs", "60"), (old, old))
    t0 = time.monotonic()
    assert other_jobs_of_user(state, UID, "61") == []
    assert time.monotonic() - t0 < 0.5


RESPAWNER = """
import os, signal, time
def again(*_):
    if os.fork() == 0:
        return  # the child carries on as a new process, handler and all
    os._exit(0)
signal.signal(signal.SIGTERM, again)
while True:
    time.sleep(0.05)
"""


def test_a_process_that_respawns_on_sigterm_is_stopped_and_killed(state: str, procs: list[int]) -> None:
    procs.append(spawn_detached(["/usr/bin/python3", "-c", RESPAWNER]))
    time.sleep(0.3)
    report = end_leftover_processes(UID, "62", deadline=time.monotonic() + 20, state_root=state)
    time.sleep(0.3)
    assert leftover_candidates(UID) == [] and report.killed >= 1 and not report.left


def _fake_proc(root: Path, pid: int, ppid: int, start: int, uid: int, exe: str = "/usr/bin/sleep") -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_text(f"{pid} (x) S {ppid} " + "0 " * 17 + f"{start} 0 0\n")
    (d / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "exe").symlink_to(exe)


def test_deep_process_trees_cost_one_walk_and_cannot_hide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1000-deep chains, deeper than the walk limit: detached and under slurmstepd (all leftovers), under
    sshd (a session, none). "One walk": the /proc files read grow linearly with the processes (a walk
    per process up its chain would read ~1000 times more), counted rather than timed so a loaded
    machine cannot fail it."""
    proc = tmp_path / "proc"
    proc.mkdir()
    _fake_proc(proc, 1, 0, 1, 0, "/sbin/init")
    _fake_proc(proc, 10, 1, 5, 0, "/usr/sbin/slurmstepd")
    _fake_proc(proc, 20, 1, 5, 0, "/usr/sbin/sshd")
    for top, base in ((1, 1000), (10, 4000), (20, 7000)):
        for i in range(1000):
            _fake_proc(proc, base + i, top if i == 0 else base + i - 1, 100 + i, UID)
    reads: list[str] = []
    real_read = leftovers._read_small

    def counting_read(path: str, limit: int) -> bytes | None:
        reads.append(path)
        return real_read(path, limit)

    monkeypatch.setattr(leftovers, "_read_small", counting_read)
    # The scan skips the caller's own pid; the fake tree's pids are not real, so neither may be ours
    # (a whole-suite run once had pytest at pid 4438, inside the fake 4000-4999 chain).
    monkeypatch.setattr(leftovers.os, "getpid", lambda: 2)
    found = {p.pid for p in leftover_candidates(UID, str(proc))}
    assert found == set(range(1000, 2000)) | set(range(4000, 5000))
    assert len(reads) <= 4 * 3003, len(reads)


def _host_job_with_checkpoint_path(site: Site, user: str, checkpoint_path: str, name: str) -> Path:
    """Like test_hooks_prolog.write_job, for a host job that names its checkpoint directory itself."""
    import json as _json

    from slurm_bt.compat import definitions as d
    from slurm_bt.job_spec import SubmitContext, build_job_spec
    from slurm_bt.site.settings import load_site_settings

    work = hooks_tests.write_job(site, user, cache=False, job_dir_name=name)
    pw = pwd.getpwnam(user)
    ctx = SubmitContext(config_path=str(work / "config.py"), source="config.py", submit_id="s1", user=user,
                        uid=pw.pw_uid, home=pw.pw_dir, job_dir=str(work), python="/usr/bin/python3", version="0")
    proj = d.TrainingProject(name="proj-a", job=d.TrainingJob(
        image=d.Image(base_image="python:3.11"),
        runtime=d.Runtime(checkpointing_config=d.CheckpointingConfig(enabled=True,
                                                                     checkpoint_path=checkpoint_path))))
    spec = build_job_spec(proj, load_site_settings(site.site, environ={}), ctx)
    (work / "job.json").write_text(_json.dumps(_json.loads(spec.model_dump_json())))
    os.chown(work / "job.json", pw.pw_uid, pw.pw_gid)
    return work


@pytest.mark.parametrize("shape", ["directory", "symlink", "parent"])
def test_a_squatted_checkpoint_path_of_a_host_job_is_refused(site: Site, shape: str) -> None:
    from slurm_bt.errors import StorageError
    from slurm_bt.steps.prepare import prepare_node

    tmp = site.base / "tmp"
    tmp.mkdir(mode=0o1777)
    os.chmod(tmp, 0o1777)
    btu2 = pwd.getpwnam("btu2")
    target = tmp / "ckpts"
    if shape == "directory":
        target.mkdir(mode=0o777)
    elif shape == "symlink":
        (tmp / "theirs").mkdir(mode=0o777)
        os.chown(tmp / "theirs", btu2.pw_uid, -1)
        target.symlink_to(tmp / "theirs")
    else:
        (tmp / "theirs").mkdir(mode=0o777)
        os.chmod(tmp / "theirs", 0o777)
        target = tmp / "theirs" / "ckpts"
        os.chown(tmp / "theirs", btu2.pw_uid, -1)
    if target.parent == tmp:
        os.chown(target, btu2.pw_uid, -1, follow_symlinks=False)
    work = _host_job_with_checkpoint_path(site, "btu1", str(target), "squatted")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "70", work)) == 0

    def step1() -> str:
        try:
            prepare_node(work / "job.json", {"SLURM_JOB_ID": "70", "SLURMD_NODENAME": "n1"}, state_root=site.state)
        except StorageError as exc:
            return str(exc)
        return "prepared"

    message = hooks_tests.as_user("btu1", step1)
    assert isinstance(message, str) and message.startswith(str(target)), message
    expected = {"directory": "belongs to uid", "symlink": "is a symlink", "parent": "which belongs to uid"}[shape]
    assert expected in message
    fresh = _host_job_with_checkpoint_path(site, "btu1", str(tmp / "mine"), "fresh")
    assert hooks_tests.run(site, "prolog", hooks_tests.job_env(site, "btu1", "71", fresh)) == 0

    def step1_fresh() -> str:
        prepare_node(fresh / "job.json", {"SLURM_JOB_ID": "71", "SLURMD_NODENAME": "n1"}, state_root=site.state)
        return "prepared"

    assert hooks_tests.as_user("btu1", step1_fresh) == "prepared"
    assert (tmp / "mine").stat().st_uid == pwd.getpwnam("btu1").pw_uid
