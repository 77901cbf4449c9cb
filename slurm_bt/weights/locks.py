"""A weak, single-flight lock for cache writers that stays correct where ``flock`` does nothing.

Locks in the weights caches only *save bandwidth*: every writer still publishes through a unique temp
name, verifies the sha256 and renames. So the lock is
allowed to be weak (two holders in a rare race only cost a duplicate download), but it must never
hang a prolog and never raise on release.

Two layers, both optional:

1. ``flock`` on a sidecar ``<name>.flock`` file: cheap and released by the kernel when the holder
   dies, but on Lustre (``localflock``), GPFS and some NFS mounts it silently succeeds for everyone
   (huggingface_hub ``file_download.py``), so it is never the only layer.
2. A lock *file* ``<name>.lock`` created atomically with ``link(2)`` from a fully written temp file
   (so its content is never torn; ``link`` is atomic on NFS too). It records the host, boot id, pid,
   the pid's start time (``/proc/<pid>/stat`` field 22, which defeats pid reuse) and is kept fresh by
   a heartbeat thread that bumps its mtime. A waiter treats it as stale when the holder is on this
   host (same boot) and its pid is gone or has another start time, or, for another host, when the
   heartbeat is older than ``stale_after_s``. Stale locks are broken by renaming them away and
   checking that the inode we moved is the one we judged.

Waiting is bounded by ``timeout_s`` (→ :class:`~slurm_bt.errors.CacheLockTimeout`) and logs a
"still waiting" line every ``log_every_s``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from slurm_bt.errors import CacheLockTimeout

__all__ = ["LockOptions", "LockOwner", "WeakLock", "optional_lock", "process_start_time", "read_lock_owner",
           "weak_lock", "writer_is_dead"]

_log = logging.getLogger("slurm_bt.weights.locks")


@dataclass(frozen=True)
class LockOptions:
    """How a cache lock behaves.

    Attributes:
        use_flock: take ``flock`` on a sidecar file first. ``False`` simulates Lustre/NFS, where
            flock silently succeeds for everyone.
        use_lockfile: take the ``O_EXCL``-style lock file. ``False`` together with
            ``use_flock=False`` disables locking entirely (tests prove correctness without locks).
        timeout_s: hard limit on waiting; then :class:`CacheLockTimeout`.
        stale_after_s: a lock file from another host whose heartbeat is older than this is stale.
        heartbeat_s: how often the holder refreshes the lock file's mtime.
        poll_s: initial wait between attempts (doubles up to 0.5 s).
        log_every_s: interval between "still waiting" log lines.
    """

    use_flock: bool = True
    use_lockfile: bool = True
    timeout_s: float = 600.0
    stale_after_s: float = 120.0
    heartbeat_s: float = 10.0
    poll_s: float = 0.01
    log_every_s: float = 10.0


@dataclass(frozen=True)
class LockOwner:
    """What a lock file says about its holder."""

    host: str
    boot_id: str
    pid: int
    start_time: int
    mtime: float

    def describe(self) -> str:
        """``host pid=N`` for messages."""
        return f"{self.host} pid={self.pid}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or None when there is no such process.

    Field 22 of ``/proc/<pid>/stat``; the command name (field 2) may contain spaces and parentheses,
    so fields are counted after its closing parenthesis.
    """
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])  # fields 3.. → index 0 is field 3, so field 22 is index 19
    except (IndexError, ValueError):
        return None


def _boot_time() -> float | None:
    """Epoch seconds of this boot (``btime`` in ``/proc/stat``), or None."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def writer_is_dead(host: str, pid: int, start_time: int | None, last_sign_of_life: float, *,
                   stale_after_s: float, now: float | None = None) -> bool:
    """Whether the writer a temp name or lock file describes is provably gone.

    On this host: its pid no longer exists, or the pid now belongs to a process with another
    start time (pid reuse). Names that carry no start time (older writers) use the clock instead:
    a process that started *after* the temp file was last written cannot be the one that wrote it.
    On another host pids mean nothing here, so the only proof is a heartbeat (``last_sign_of_life``,
    an mtime the writer keeps bumping) older than ``stale_after_s``, as for lock files.
    """
    now = time.time() if now is None else now
    if host != socket.gethostname():
        return now - last_sign_of_life > stale_after_s
    if pid <= 0:
        return now - last_sign_of_life > stale_after_s
    current = process_start_time(pid)
    if current is None:
        return True
    if start_time is not None:
        return current != start_time
    boot = _boot_time()
    if boot is None:
        return False
    started = boot + current / os.sysconf("SC_CLK_TCK")
    return started > last_sign_of_life + 2.0  # 2 s: btime and tick rounding


def read_lock_owner(lock_path: Path) -> LockOwner | None:
    """Parse a lock file; None when it is gone. Unreadable content yields an owner with pid 0."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        d = json.loads(raw)
        return LockOwner(str(d["host"]), str(d["boot_id"]), int(d["pid"]), int(d["start_time"]), st.st_mtime)
    except (ValueError, KeyError, TypeError):
        return LockOwner("?", "", 0, 0, st.st_mtime)


class WeakLock:
    """One acquisition of a named cache lock; use :func:`weak_lock` as a context manager."""

    def __init__(self, lock_path: Path, options: LockOptions) -> None:
        self.lock_path = lock_path
        self.options = options
        self._flock_fd: int | None = None
        self._flock_held = False
        self._ino: int | None = None
        self._token = ""
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._host = socket.gethostname()
        self._boot = _boot_id()

    # -- acquisition ------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Block until both enabled layers are held.

        Raises:
            CacheLockTimeout: the hard timeout expired while a live owner held the lock.
        """
        opts = self.options
        start = time.monotonic()
        deadline = start + opts.timeout_s
        next_log = start + opts.log_every_s
        delay = opts.poll_s
        if opts.use_flock:
            self._flock_fd = self._open_flock()
        try:
            while True:
                if self._try_once():
                    break
                now = time.monotonic()
                owner = read_lock_owner(self.lock_path) if opts.use_lockfile else None
                holder = owner.describe() if owner else "a flock holder"
                if now >= deadline:
                    raise CacheLockTimeout(str(self.lock_path), now - start, holder)
                if now >= next_log:
                    _log.warning("still waiting for %s (held by %s, %.0f s so far)",
                                 self.lock_path, holder, now - start)
                    next_log = now + opts.log_every_s
                time.sleep(min(delay, max(deadline - now, 0.0)))
                delay = min(delay * 2, 0.5)
        except BaseException:
            self._close_flock()
            raise
        if opts.use_lockfile:
            self._heartbeat = threading.Thread(target=self._beat, name="cache-lock-heartbeat", daemon=True)
            self._heartbeat.start()

    def _open_flock(self) -> int:
        flock_path = self.lock_path.with_name(self.lock_path.name + ".flock")
        return os.open(flock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o664)

    def _try_once(self) -> bool:
        if self._flock_fd is not None and not self._flock_held:
            try:
                fcntl.flock(self._flock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            self._flock_held = True
        if not self.options.use_lockfile:
            return True
        if self._create_lockfile():
            return True
        owner = read_lock_owner(self.lock_path)
        if owner is None:  # released between our link and our read: try again at once
            return self._create_lockfile()
        if self._is_stale(owner):
            self._break(owner)
            return self._create_lockfile()
        return False

    def _create_lockfile(self) -> bool:
        """Write our identity to a temp file, then ``link`` it to the lock name (atomic, no tearing)."""
        pid = os.getpid()
        self._token = secrets.token_hex(8)
        body = json.dumps({"host": self._host, "boot_id": self._boot, "pid": pid,
                           "start_time": process_start_time(pid) or 0, "token": self._token}).encode()
        tmp = self.lock_path.with_name(f".{self.lock_path.name}.tmp-{pid}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, body)
            self._ino = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        try:
            os.link(tmp, self.lock_path)
            return True
        except FileExistsError:
            self._ino = None
            return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def _is_stale(self, owner: LockOwner) -> bool:
        age = time.time() - owner.mtime
        if owner.host == self._host and owner.boot_id == self._boot and owner.pid > 0:
            return process_start_time(owner.pid) != owner.start_time
        return age > self.options.stale_after_s

    def _break(self, owner: LockOwner) -> None:
        """Move a stale lock aside; if what we moved was not the lock we judged, put it back."""
        try:
            judged = os.lstat(self.lock_path).st_ino
        except OSError:
            return
        aside = self.lock_path.with_name(f".{self.lock_path.name}.stale-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.rename(self.lock_path, aside)
        except OSError:
            return
        try:
            if os.lstat(aside).st_ino != judged:  # a new holder slipped in: give its lock back
                with contextlib.suppress(OSError):
                    os.link(aside, self.lock_path)
            else:
                _log.warning("broke stale lock %s held by %s", self.lock_path, owner.describe())
        finally:
            with contextlib.suppress(OSError):
                os.unlink(aside)

    def _beat(self) -> None:
        while not self._stop.wait(self.options.heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(self.lock_path)

    # -- release ----------------------------------------------------------------------------------

    def release(self) -> None:
        """Drop both layers. Never raises: a failed release only delays the next waiter."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=1.0)
            self._heartbeat = None
        try:
            if self._ino is not None and self._still_ours():
                os.unlink(self.lock_path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                _log.warning("could not release lock %s: %s", self.lock_path, exc)
        self._ino = None
        self._close_flock()

    def _still_ours(self) -> bool:
        """Same inode *and* our random token: inode numbers are reused after an unlink."""
        if os.lstat(self.lock_path).st_ino != self._ino:
            return False
        try:
            return bool(json.loads(self.lock_path.read_bytes()).get("token") == self._token)
        except (OSError, ValueError, AttributeError):
            return False

    def _close_flock(self) -> None:
        if self._flock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._flock_fd)  # closing the only fd drops the flock
            self._flock_fd = None
            self._flock_held = False


@contextlib.contextmanager
def weak_lock(lock_path: Path, options: LockOptions | None = None) -> Iterator[WeakLock]:
    """Hold the named lock for the ``with`` block.

    Args:
        lock_path: the lock file (``<cache>/.locks/<name>.lock``); its directory must exist.
        options: behaviour; defaults to :class:`LockOptions()`.

    Raises:
        CacheLockTimeout: not obtained within ``options.timeout_s``.
    """
    lock = WeakLock(lock_path, options or LockOptions())
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


@contextlib.contextmanager
def optional_lock(lock_path: Path, options: LockOptions) -> Iterator[None]:
    """:func:`weak_lock`, or no lock at all when ``options`` turn both mechanisms off.

    Locks only save duplicate work (correctness never depends on them), so a cache can run without
    any; the tests use that to prove it.
    """
    if not (options.use_flock or options.use_lockfile):
        yield
        return
    with weak_lock(lock_path, options):
        yield
