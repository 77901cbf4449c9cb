"""Run a function in a forked child with a hard time bound, optionally as the job's user.

Why a fork and not ``seteuid`` in place: a root hook must never act on a user-named path with root's
credentials (CVE-2023-41914, CVE-2016-10030), and a temporary
``seteuid`` keeps the saved uid 0, so anything the user can influence inside that window could take
it back. The child drops for good, in the order CERT POS36-C requires, then verifies:

1. ``initgroups(user, gid)`` (supplementary groups first: CVE-2009-2084),
2. ``setresgid(gid, gid, gid)``, then ``setresuid(uid, uid, uid)``,
3. verify: real/effective/saved ids are the job's, groups are exactly ``getgrouplist(user, gid)``,
   ``setuid(0)`` and ``setgid(0)`` fail, no effective capabilities,
4. ``PR_SET_NO_NEW_PRIVS`` (nothing it executes can gain privileges), empty environment apart from
   ``PATH``/``HOME``/``USER``/``LOGNAME``/``LANG``, umask 077, cwd ``/``, no core dumps,
5. stdin/stdout/stderr on ``/dev/null`` and no other inherited descriptor: a child holding slurmd's
   output pipe would keep the prolog "running" until it exits, and leaked
   root fds are runc CVE-2024-21626.
6. resource limits (:class:`ChildLimits`): address space (``RLIMIT_AS``), CPU seconds
   (``RLIMIT_CPU``, soft and hard, so ``SIGXCPU`` then ``SIGKILL``) and open files, set after the
   drop so the user cannot raise them again. A privilege-dropped child always gets them
   (:data:`DEFAULT_LIMITS` unless the caller passes its own): it reads files the job controls, and
   a job that swapped one for ``/dev/zero`` once made a root-started sweep read 16.7 GB. The wall
   clock is the caller's ``timeout_s``: on expiry the child's whole process group is SIGKILLed.

The result travels back over a pipe as JSON (bounded size). The parent treats it as untrusted data:
the child runs as the user and its output is whatever the user's files made it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import pwd
import resource
import select
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_bt.posix.hook_env import SlurmHookEnv

__all__ = [
    "DEFAULT_LIMITS",
    "ChildError",
    "ChildLimits",
    "ChildTimeout",
    "FileOpener",
    "NotRegularFile",
    "PrivilegeDropError",
    "run_as_job_user",
    "run_as_uid",
    "run_in_child",
    "spawn_detached",
]

_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_DEFAULT_MAX_RESULT = 4 * 1024 * 1024


@dataclass(frozen=True)
class ChildLimits:
    """Resource limits of a forked child (module docstring, step 6).

    Attributes:
        memory_bytes: ``RLIMIT_AS`` (virtual address space); allocations beyond it fail
            (``MemoryError`` in Python), so a runaway read ends the child, not the node.
        cpu_s: ``RLIMIT_CPU`` in seconds of CPU time (all threads); ``None``: twice the wall-clock
            bound (plus 10 s), so a busy loop ends even between two wall-clock checks.
        max_files: ``RLIMIT_NOFILE``.
    """

    memory_bytes: int = 4 * 1024**3
    cpu_s: int | None = None
    max_files: int = 4096


DEFAULT_LIMITS = ChildLimits()
"""What every privilege-dropped child runs under unless its caller chooses other limits."""


class ChildError(RuntimeError):
    """The child raised, crashed or returned something unreadable.

    Attributes:
        kind: ``exception`` (the function raised), ``crashed`` (killed by a signal or no result),
            ``drop`` (the privilege drop or its verification failed) or ``result`` (output too big
            or not JSON).
        exc_type: the exception's class name in the child (``PermissionError``), if any.
        errno: its ``errno`` when it was an ``OSError``.
    """

    def __init__(self, kind: str, message: str, *, exc_type: str = "", err: int | None = None) -> None:
        self.kind = kind
        self.exc_type = exc_type
        self.errno = err
        super().__init__(message)


class ChildTimeout(ChildError, TimeoutError):
    """The child did not finish within its time bound and was killed (SIGKILL to its group)."""


class PrivilegeDropError(ChildError):
    """Becoming the job user failed or could not be verified; nothing was run."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _no_new_privs() -> None:
    libc = _libc()
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1:
        raise OSError(errno.EPERM, "no_new_privs did not stick")


def _cap_eff() -> int:
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return -1


def _drop_to(env: SlurmHookEnv) -> None:
    """Become ``env``'s user for good, then prove it (raises on any mismatch)."""
    expected_groups = sorted(set(os.getgrouplist(env.user, env.gid)))
    os.initgroups(env.user, env.gid)
    os.setresgid(env.gid, env.gid, env.gid)
    os.setresuid(env.uid, env.uid, env.uid)
    if os.getresuid() != (env.uid,) * 3 or os.getresgid() != (env.gid,) * 3:
        raise OSError(errno.EPERM, f"ids after drop are {os.getresuid()}/{os.getresgid()}")
    if sorted(set(os.getgroups())) != expected_groups:
        raise OSError(errno.EPERM, f"groups after drop are {os.getgroups()}, expected {expected_groups}")
    if env.uid != 0:
        for regain in (os.setuid, os.setgid, os.seteuid):
            try:
                regain(0)
            except PermissionError:
                continue
            raise OSError(errno.EPERM, f"{regain.__name__}(0) succeeded after the drop")
        if _cap_eff() != 0:
            raise OSError(errno.EPERM, "effective capabilities remain after the drop")


def _sanitize_process(env: SlurmHookEnv | None, extra_env: Mapping[str, str] | None = None) -> None:
    """Clean env, umask, cwd, rlimits and signals for a child that runs foreign-influenced code.

    ``extra_env`` (chosen by the caller, never by the user) is added after the safe defaults.
    """
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGPIPE):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update({"PATH": _SAFE_PATH, "LANG": "C.UTF-8"})
    if env is not None:
        os.environ.update({"HOME": env.home, "USER": env.user, "LOGNAME": env.user})
    if extra_env:
        os.environ.update(extra_env)
    os.umask(0o077)
    os.chdir("/")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _lower_limit(which: int, value: int, grace: int = 0) -> None:
    """Set soft ``which`` to ``value`` and hard to ``value + grace``, never raising a lower limit."""
    _soft, hard = resource.getrlimit(which)
    top = value + grace if hard == resource.RLIM_INFINITY else min(value + grace, hard)
    resource.setrlimit(which, (min(value, top), top))


def _apply_limits(limits: ChildLimits, timeout_s: float) -> None:
    """Apply ``limits`` to this process (after the drop: an unprivileged process cannot raise them)."""
    _lower_limit(resource.RLIMIT_AS, limits.memory_bytes)
    cpu = limits.cpu_s if limits.cpu_s is not None else int(2 * timeout_s) + 10
    _lower_limit(resource.RLIMIT_CPU, cpu, grace=5)  # SIGXCPU at the soft limit, SIGKILL 5 s later
    _lower_limit(resource.RLIMIT_NOFILE, limits.max_files)


def _redirect_stdio_and_close(keep: int) -> None:
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd, inheritable=True)
    if null > 2:
        os.close(null)
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = soft if soft != resource.RLIM_INFINITY else 65536
    os.closerange(3, keep)
    os.closerange(keep + 1, max(top, keep + 2))


def _child_main(fn: Callable[[], Any], env: SlurmHookEnv | None, w: int,
                extra_env: Mapping[str, str] | None = None, limits: ChildLimits | None = None,
                timeout_s: float = 0.0) -> None:
    """Never returns: writes one JSON document to ``w`` and ``_exit``s."""
    out: dict[str, Any]
    try:
        os.setpgid(0, 0)
        _redirect_stdio_and_close(w)
        try:
            if env is not None:
                _drop_to(env)
            _sanitize_process(env, extra_env)
            if env is not None:
                _no_new_privs()
            if limits is not None:
                _apply_limits(limits, timeout_s)
        except OSError as exc:
            out = {"ok": False, "kind": "drop", "type": type(exc).__name__, "errno": exc.errno,
                   "message": f"privilege drop failed: {exc.strerror or exc}"}
        else:
            try:
                out = {"ok": True, "value": fn()}
            except BaseException as exc:
                out = {"ok": False, "kind": "exception", "type": type(exc).__name__,
                       "errno": getattr(exc, "errno", None), "message": str(exc)[:4000]}
        try:
            data = json.dumps(out).encode()
        except (TypeError, ValueError) as exc:
            data = json.dumps({"ok": False, "kind": "result", "type": type(exc).__name__,
                               "message": f"result is not JSON-serialisable: {exc}"}).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    finally:
        os._exit(0)


def _read_bounded(r: int, deadline: float, max_bytes: int) -> tuple[bytes, bool]:
    """Read until EOF or the deadline; returns (data, finished)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), False
        ready, _, _ = select.select([r], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(r, 65536)
        if not chunk:
            return b"".join(chunks), True
        size += len(chunk)
        if size > max_bytes:
            raise ChildError("result", f"child result exceeds {max_bytes} bytes")
        chunks.append(chunk)


def _kill_and_reap(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _death(status: int | None) -> str:
    """How a child without a result ended (``killed by SIGXCPU`` names the CPU limit)."""
    if status is None:
        return "exited without a result"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (CPU time limit)" if sig == signal.SIGXCPU else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {os.waitstatus_to_exitcode(status)} without a result"


def run_in_child(
    fn: Callable[[], Any],
    *,
    timeout_s: float,
    drop_to: SlurmHookEnv | None = None,
    max_result_bytes: int = _DEFAULT_MAX_RESULT,
    extra_env: Mapping[str, str] | None = None,
    limits: ChildLimits | None = None,
) -> Any:
    """Run ``fn()`` in a forked child and return its JSON-decoded result.

    Args:
        fn: called in the child; must return a JSON-serialisable value.
        timeout_s: hard bound; on expiry the child's process group is SIGKILLed.
        drop_to: become this job's user first (see the module docstring); ``None`` keeps root
            (used to bound the time of root work such as the checkpoint flush).
        max_result_bytes: the largest result accepted from the child.
        extra_env: variables for the child's otherwise clean environment (e.g. the site file path).
        limits: resource limits of the child; ``None`` means :data:`DEFAULT_LIMITS` when
            ``drop_to`` is given, none otherwise (root work bounded by ``timeout_s`` alone).

    Raises:
        ChildTimeout: the bound expired.
        PrivilegeDropError: the drop or its verification failed (nothing ran).
        ChildError: ``fn`` raised (``kind == "exception"``, with the child's exception type and
            errno), the child died, or its result was too large or not JSON.
    """
    if limits is None and drop_to is not None:
        limits = DEFAULT_LIMITS
    r, w = os.pipe()
    deadline = time.monotonic() + timeout_s
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe
        os.close(r)
        _child_main(fn, drop_to, w, extra_env, limits, timeout_s)
    os.close(w)
    try:
        try:
            data, finished = _read_bounded(r, deadline, max_result_bytes)
        except BaseException:  # also the hook's own deadline (SIGALRM): never leave the child behind
            _kill_and_reap(pid)
            raise
        if not finished:
            _kill_and_reap(pid)
            raise ChildTimeout("timeout", f"child did not finish within {timeout_s:.0f} s and was killed")
    finally:
        os.close(r)
    status: int | None = None
    while True:
        try:  # WNOWAIT: the exited child stays a zombie, so its pid (= its group id) cannot be reused yet
            exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if exited is not None or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    # Whatever the child started in its process group (a user's helper process) ends with it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        status = os.waitpid(pid, 0)[1]
    try:
        out = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise ChildError("crashed", f"child {_death(status)}") from None
    if not isinstance(out, dict):
        raise ChildError("result", "child result is not a JSON object")
    if out.get("ok") is True:
        return out.get("value")
    kind = str(out.get("kind", "exception"))
    err = out.get("errno")
    cls = PrivilegeDropError if kind == "drop" else ChildError
    raise cls(kind, str(out.get("message", "child failed")), exc_type=str(out.get("type", "")),
              err=err if isinstance(err, int) else None)


def run_as_job_user(fn: Callable[[], Any], env: SlurmHookEnv, *, timeout_s: float = 15.0,
                    max_result_bytes: int = _DEFAULT_MAX_RESULT, limits: ChildLimits | None = None) -> Any:
    """Run ``fn()`` as the job's user (groups, gid, uid dropped and verified) within ``timeout_s``.

    The caller must treat the result as untrusted user data: re-validate it.
    See :func:`run_in_child` for the errors.
    """
    try:
        pwd.getpwuid(env.uid)
    except KeyError:
        raise PrivilegeDropError("drop", f"uid {env.uid} has no passwd entry") from None
    return run_in_child(fn, timeout_s=timeout_s, drop_to=env, max_result_bytes=max_result_bytes, limits=limits)


def run_as_uid(fn: Callable[[], Any], *, uid: int, gid: int, timeout_s: float,
               extra_env: Mapping[str, str] | None = None,
               max_result_bytes: int = _DEFAULT_MAX_RESULT, limits: ChildLimits | None = None) -> Any:
    """Run ``fn()`` as ``uid``/``gid`` (with the user's groups) when root, else as ourselves.

    For root work outside a hook invocation (the checkpoint flush and hand-off resume), where the
    identity comes from a root-owned record instead of the Slurm environment. Same guarantees and
    errors as :func:`run_in_child`.
    """
    drop_to = None
    if os.geteuid() == 0 and uid != 0:
        try:
            drop_to = SlurmHookEnv.for_uid(uid, gid)
        except KeyError:
            raise PrivilegeDropError("drop", f"uid {uid} has no passwd entry") from None
    return run_in_child(fn, timeout_s=timeout_s, drop_to=drop_to, max_result_bytes=max_result_bytes,
                        extra_env=extra_env, limits=limits if limits is not None else DEFAULT_LIMITS)


class NotRegularFile(OSError):
    """What a :class:`FileOpener` found at a name is not a regular file (a FIFO, device, directory or
    symlink); nothing was opened."""


_OPENER_READY = b"R"
_OPENER_FD = b"K"
_OPENER_ERR = b"E"
_OPENER_NOT_REGULAR = b"N"
_OPENER_LIMITS = ChildLimits(memory_bytes=512 * 1024**2, cpu_s=3600, max_files=64)
"""The opener only opens and fstats: little memory, few descriptors; CPU seconds bound its whole life."""


class FileOpener:
    """Opens files as another user in a long-lived, privilege-dropped child and hands back descriptors.

    Why: on a shared filesystem that squashes root (NFS ``root_squash``, Lustre nodemaps, GlusterFS
    ``server.root-squash``) root on a node acts as ``nobody`` and cannot open a team's ``2770``
    directory; and even where it could, root should not open paths inside a directory tenants
    write. The child becomes the job user (the drop of :func:`run_in_child`, verified, with
    ``no_new_privs`` and resource limits), opens each requested path there with
    ``O_NOFOLLOW|O_NONBLOCK`` (a symlink or FIFO planted at the name is never followed or waited on),
    refuses anything but a regular file, and passes the open descriptor back over a
    ``SOCK_SEQPACKET`` socket (``SCM_RIGHTS``). Reads on that descriptor then run with the opener's
    credentials (an NFS client and GlusterFS's FUSE client both check access at open). So root
    reads exactly what the job user could read, and nothing else; the bytes are untrusted and
    callers verify them (the node tier hashes every blob it writes).

    A request that takes longer than ``request_timeout_s`` (a hung filesystem) kills the child and
    fails with ``ETIMEDOUT``; later requests start a new child. Thread-safe (one request at a time).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, env: SlurmHookEnv, *, request_timeout_s: float = 60.0,
                 limits: ChildLimits = _OPENER_LIMITS) -> None:
        self.env = env
        self.request_timeout_s = request_timeout_s
        self.limits = limits
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._pid = 0

    def __enter__(self) -> FileOpener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> FileOpener:
        """Start the child now (before the caller starts threads: a fork is safest without them).

        Raises:
            PrivilegeDropError: the child could not become the user.
        """
        with self._lock:
            if self._sock is None:
                self._start()
        return self

    def close(self) -> None:
        """End the child (its whole process group) and close the socket."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._pid:
            _kill_and_reap(self._pid)
            self._pid = 0

    def _start(self) -> socket.socket:
        try:
            pwd.getpwuid(self.env.uid)
        except KeyError:
            raise PrivilegeDropError("drop", f"uid {self.env.uid} has no passwd entry") from None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            parent.close()
            self._serve(child)
        child.close()
        self._pid, self._sock = pid, parent
        parent.settimeout(self.request_timeout_s)
        try:
            ready = parent.recv(4096)
        except (TimeoutError, OSError):
            ready = b""
        if ready != _OPENER_READY:
            self._stop()
            raise PrivilegeDropError("drop", f"cannot open files as {self.env.user} (uid {self.env.uid}): "
                                             + (ready[1:].decode(errors="replace") or "the opener did not start"))
        return parent

    def _serve(self, sock: socket.socket) -> None:  # pragma: no cover - runs in the child
        code = 0
        try:
            os.setpgid(0, 0)
            _redirect_stdio_and_close(sock.fileno())
            try:
                _drop_to(self.env)
                _sanitize_process(self.env)
                _no_new_privs()
                _apply_limits(self.limits, self.request_timeout_s)
            except OSError as exc:
                sock.send(_OPENER_ERR + f"privilege drop failed: {exc.strerror or exc}".encode())
                return
            sock.send(_OPENER_READY)
            while True:
                path = sock.recv(8192)
                if not path:  # the parent closed its end (or died): done
                    return
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                except OSError as exc:
                    sock.send(_OPENER_ERR + str(exc.errno or errno.EIO).encode())
                    continue
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        socket.send_fds(sock, [_OPENER_FD], [fd])
                    else:
                        sock.send(_OPENER_NOT_REGULAR)
                finally:
                    os.close(fd)
        except BaseException:
            code = 1
        finally:
            os._exit(code)

    def open_regular(self, path: str | os.PathLike[str]) -> int:
        """A read descriptor (blocking, close-on-exec) on the regular file at ``path``, opened as the user.

        Raises:
            FileNotFoundError: nothing there (or a component is missing).
            NotRegularFile: a symlink, FIFO, device or directory is there.
            OSError: the user may not open it (``EACCES``), the request timed out (``ETIMEDOUT``), or
                another error of the open.
            PrivilegeDropError: the child could not become the user.
        """
        name = os.fsencode(path)
        with self._lock:
            sock = self._sock if self._sock is not None else self._start()
            try:
                sock.send(name)
                msg, fds, _flags, _addr = socket.recv_fds(sock, 64, 1)
            except (TimeoutError, OSError) as exc:
                self._stop()
                timed_out = isinstance(exc, TimeoutError)
                err = errno.ETIMEDOUT if timed_out else (exc.errno or errno.EIO)
                raise OSError(err, "opening it as the job user did not finish in time" if timed_out
                              else f"the opener failed: {exc}", os.fsdecode(name)) from None
        if msg == _OPENER_FD and len(fds) == 1:
            fd = fds[0]
            os.set_inheritable(fd, False)
            # the child is the user's: check again what it sent (a regular file, nothing else)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise NotRegularFile(errno.EINVAL, "is not a regular file", os.fsdecode(name))
            os.set_blocking(fd, True)
            return fd
        for extra in fds:
            os.close(extra)
        if msg == _OPENER_NOT_REGULAR:
            raise NotRegularFile(errno.EINVAL, "is not a regular file", os.fsdecode(name))
        if msg.startswith(_OPENER_ERR) and msg[1:].isdigit():
            err = int(msg[1:])
            raise OSError(err, os.strerror(err), os.fsdecode(name))
        with self._lock:
            self._stop()
        raise OSError(errno.EIO, "the opener sent an unexpected reply", os.fsdecode(name))


def spawn_detached(argv: list[str], env: Mapping[str, str], log_path: str | None) -> subprocess.Popen[bytes]:
    """Start a root helper that outlives the hook that starts it, and return at once.

    A new session (the hook's process group may be killed when the hook ends), no inherited
    descriptors (slurmd reads the hook's output until EOF), ``cwd`` ``/``; output appended to
    ``log_path`` (the root-owned hook log, never through a symlink), else discarded. Callers: the
    epilog's hand-off sweep and the prolog's node stager.

    Raises:
        OSError: the program could not be started.
    """
    out: int = subprocess.DEVNULL
    if log_path is not None:
        with contextlib.suppress(OSError):  # no log: still start the helper
            out = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=dict(env),
                                start_new_session=True, close_fds=True, cwd="/")
    finally:
        if out != subprocess.DEVNULL:
            os.close(out)
