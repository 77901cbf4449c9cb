"""Weak cache locks: exclusive with or without flock, stale owners broken, hard timeout, quiet release."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_bt.errors import CacheLockTimeout
from slurm_bt.weights.locks import LockOptions, process_start_time, read_lock_owner, weak_lock

FAST = LockOptions(timeout_s=5.0, poll_s=0.005, heartbeat_s=0.05, log_every_s=0.1)


def _critical(lock: str, log: str, use_flock: bool) -> None:
    opts = LockOptions(use_flock=use_flock, timeout_s=20.0, poll_s=0.002)
    for _ in range(5):
        with weak_lock(Path(lock), opts):
            with open(log, "a") as f:
                f.write(f"in {os.getpid()}\n")
            time.sleep(0.002)
            with open(log, "a") as f:
                f.write(f"out {os.getpid()}\n")


@pytest.mark.parametrize("use_flock", [True, False])
def test_mutual_exclusion_across_processes(tmp_path: Path, use_flock: bool) -> None:
    lock, log = tmp_path / "x.lock", tmp_path / "log"
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_critical, args=(str(lock), str(log), use_flock)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    lines = [ln.split() for ln in log.read_text().splitlines()]
    assert len(lines) == 60
    # every "in" is immediately followed by the same process's "out": no overlap
    for enter, leave in zip(lines[0::2], lines[1::2], strict=True):
        assert enter[0] == "in" and leave[0] == "out" and enter[1] == leave[1]
    assert not lock.exists()


def test_lock_file_records_owner_and_release_removes_it(tmp_path: Path) -> None:
    lock = tmp_path / "a.lock"
    with weak_lock(lock, FAST):
        owner = read_lock_owner(lock)
        assert owner is not None
        assert owner.pid == os.getpid() and owner.host == socket.gethostname()
        assert owner.start_time == process_start_time(os.getpid())
    assert not lock.exists()


def test_heartbeat_refreshes_mtime(tmp_path: Path) -> None:
    lock = tmp_path / "hb.lock"
    with weak_lock(lock, FAST):
        os.utime(lock, (0, 0))
        time.sleep(0.3)
        assert time.time() - lock.stat().st_mtime < 5


def test_dead_pid_on_this_host_is_stale(tmp_path: Path) -> None:
    lock = tmp_path / "dead.lock"
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(p.stdout)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    lock.write_text(json.dumps({"host": socket.gethostname(), "boot_id": boot, "pid": dead_pid,
                                "start_time": 12345}))
    t = time.monotonic()
    with weak_lock(lock, FAST):
        assert read_lock_owner(lock).pid == os.getpid()  # type: ignore[union-attr]
    assert time.monotonic() - t < 2


def test_reused_pid_with_other_start_time_is_stale(tmp_path: Path) -> None:
    lock = tmp_path / "reuse.lock"
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    lock.write_text(json.dumps({"host": socket.gethostname(), "boot_id": boot, "pid": 1, "start_time": 999999999}))
    with weak_lock(lock, FAST):
        pass


def test_other_host_stale_only_after_heartbeat_timeout(tmp_path: Path) -> None:
    lock = tmp_path / "remote.lock"
    lock.write_text(json.dumps({"host": "node-elsewhere", "boot_id": "x", "pid": 1, "start_time": 1}))
    with pytest.raises(CacheLockTimeout):  # fresh heartbeat: respected
        with weak_lock(lock, LockOptions(timeout_s=0.3, stale_after_s=60, poll_s=0.01)):
            pass
    old = time.time() - 120
    os.utime(lock, (old, old))
    with weak_lock(lock, LockOptions(timeout_s=2, stale_after_s=60, poll_s=0.01)):
        pass


def test_hard_timeout_names_holder_and_logs_still_waiting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    lock = tmp_path / "busy.lock"
    caplog.set_level(logging.WARNING, logger="slurm_bt.weights.locks")
    with weak_lock(lock, FAST):
        t = time.monotonic()
        with pytest.raises(CacheLockTimeout) as ei:
            with weak_lock(lock, LockOptions(use_flock=False, timeout_s=0.5, poll_s=0.01, log_every_s=0.1)):
                pass
        assert 0.4 < time.monotonic() - t < 3
    assert isinstance(ei.value, TimeoutError)
    assert f"pid={os.getpid()}" in str(ei.value) and ei.value.waited_s >= 0.5
    assert any("still waiting" in r.message for r in caplog.records)


def test_release_never_raises_when_lock_vanished(tmp_path: Path) -> None:
    lock = tmp_path / "gone.lock"
    with weak_lock(lock, FAST):
        lock.unlink()
        (tmp_path).chmod(0o755)
    with weak_lock(lock, FAST):  # and it can be taken again
        pass


def test_release_does_not_remove_someone_elses_lock(tmp_path: Path) -> None:
    lock = tmp_path / "stolen.lock"
    with weak_lock(lock, FAST):
        lock.unlink()
        lock.write_text(json.dumps({"host": "other", "boot_id": "", "pid": 7, "start_time": 1}))
    assert lock.exists()
