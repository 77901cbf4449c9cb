"""run_as_job_user: the child is the job user for good, bounded in time, with a clean process."""

from __future__ import annotations

import fcntl
import os
import pwd
import time

import pytest

from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.privdrop import ChildError, ChildTimeout, run_as_job_user, run_in_child
from tests.unit.test_hooks_env import ensure_test_users, hook_environ


@pytest.fixture(scope="module")
def env() -> SlurmHookEnv:
    ensure_test_users()
    return SlurmHookEnv.from_environ(hook_environ("btu1"))


def _probe() -> dict[str, object]:
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    try:
        os.setuid(0)
        regained = True
    except PermissionError:
        regained = False
    names = os.listdir("/proc/self/fd")
    fds = {}
    for name in names:
        fd = int(name)
        try:
            fds[fd] = bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
        except OSError:
            pass  # the listdir descriptor itself, already closed
    old = os.umask(0)
    return {"resuid": os.getresuid(), "resgid": os.getresgid(), "groups": sorted(os.getgroups()),
            "regained": regained, "nnp": status["NoNewPrivs"].strip(), "capeff": status["CapEff"].strip(),
            "fds": {str(k): v for k, v in fds.items()}, "env": sorted(os.environ), "umask": old, "cwd": os.getcwd(),
            "targets": [os.readlink(f"/proc/self/fd/{i}") for i in (0, 1, 2)]}


def test_child_is_the_job_user_and_cannot_regain_root(env: SlurmHookEnv) -> None:
    os.environ["LD_PRELOAD_TEST_CANARY"] = "1"
    os.environ["PYTHONPATH_TEST_CANARY"] = "1"
    try:
        out = run_as_job_user(_probe, env, timeout_s=10)
    finally:
        del os.environ["LD_PRELOAD_TEST_CANARY"], os.environ["PYTHONPATH_TEST_CANARY"]
    pw = pwd.getpwnam("btu1")
    assert out["resuid"] == [pw.pw_uid] * 3 and out["resgid"] == [pw.pw_gid] * 3
    assert out["groups"] == sorted(set(os.getgrouplist("btu1", pw.pw_gid)))
    assert len(out["groups"]) >= 2, "btu1 is in btextra too: supplementary groups must come from initgroups"
    assert out["regained"] is False
    assert out["nnp"] == "1" and int(out["capeff"], 16) == 0
    # Nothing above fd 2 survives except non-inheritable ones (our result pipe, Python's own).
    assert all(cloexec for fd, cloexec in out["fds"].items() if int(fd) > 2), out["fds"]
    assert out["targets"] == ["/dev/null"] * 3
    assert out["env"] == ["HOME", "LANG", "LOGNAME", "PATH", "USER"]
    assert out["umask"] == 0o077 and out["cwd"] == "/"


def test_child_reads_as_the_user(env: SlurmHookEnv) -> None:
    with pytest.raises(ChildError) as info:
        run_as_job_user(lambda: open("/etc/shadow").read(), env, timeout_s=10)
    assert info.value.kind == "exception" and info.value.exc_type == "PermissionError"


def test_hang_is_killed_within_the_bound(env: SlurmHookEnv) -> None:
    start = time.monotonic()
    with pytest.raises(ChildTimeout):
        run_as_job_user(lambda: time.sleep(30), env, timeout_s=1.0)
    assert time.monotonic() - start < 5


def test_result_size_is_bounded() -> None:
    with pytest.raises(ChildError, match="exceeds"):
        run_in_child(lambda: "x" * 100000, timeout_s=10, max_result_bytes=1000)


def test_crash_is_reported() -> None:
    with pytest.raises(ChildError) as info:
        run_in_child(lambda: os._exit(3), timeout_s=10)
    assert info.value.kind == "crashed"
