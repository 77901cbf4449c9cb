"""Run a function as another user in a forked child with a hard time limit (root hooks only).

Why here and not only in ``slurm_bt.hooks``: the flush and the hand-off resumer must read the
user's checkpoint files and the user's store credentials *as the user* (threats-and-faults.md R1,
E05, §4), and must be killable at a deadline without hurting the epilog. When the hooks package
provides ``run_as_job_user`` the epilog may use it instead; this is the same recipe:
``initgroups`` → ``setresgid`` → ``setresuid``, verified, ``PR_SET_NO_NEW_PRIVS``, no inherited
fds above 2, and a clean environment.

The child reports back one JSON line over a pipe; ``kill -9`` at the deadline is safe because every
upload is resumable.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ChildTimeout", "run_as_user"]

_PR_SET_NO_NEW_PRIVS = 38


class ChildTimeout(Exception):
    """The child did not finish before its deadline and was killed."""


def _drop(uid: int, gid: int) -> None:
    name = pwd.getpwuid(uid).pw_name
    os.initgroups(name, gid)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise PermissionError("privilege drop did not take")
    try:
        os.setuid(0)
    except PermissionError:
        pass
    else:
        raise PermissionError("could regain root after dropping privileges")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def run_as_user(fn: Callable[[], dict[str, Any]], *, uid: int | None, gid: int | None,
                timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``fn`` in a child (as ``uid``/``gid`` when given and we are root); return its dict result.

    Raises:
        ChildTimeout: the child ran past ``timeout_s`` and was killed (SIGKILL to its group).
        RuntimeError: the child failed; the message is its last error line.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            if uid is not None and gid is not None and os.geteuid() == 0 and uid != 0:
                _drop(uid, gid)
            os.closerange(3, write_fd)
            os.closerange(write_fd + 1, 65536)
            # sys.stderr may have been a higher fd (captured output); speak on fd 2 from now on.
            sys.stdout = open(1, "w", closefd=False)
            sys.stderr = open(2, "w", closefd=False)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
            result = fn()
            os.write(write_fd, json.dumps({"ok": True, "result": result}).encode() + b"\n")
            code = 0
        except BaseException as exc:  # report any failure to the parent, one line
            import traceback

            where = traceback.extract_tb(exc.__traceback__)[-1]
            error = f"{type(exc).__name__}: {exc} (at {where.filename}:{where.lineno})"
            try:
                os.write(write_fd, json.dumps({"ok": False, "error": error}).encode() + b"\n")
            except OSError:
                pass
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + max(timeout_s, 0.0)
    buf = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChildTimeout(f"child {pid} still running after {timeout_s:.0f} s")
            ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(read_fd, 65536)
                if not chunk:
                    break
                buf += chunk
    except ChildTimeout:
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os.waitpid(pid, 0)
        os.close(read_fd)
        raise
    os.close(read_fd)
    os.waitpid(pid, 0)
    lines = [ln for ln in buf.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError("child exited without a result")
    msg = json.loads(lines[-1])
    if not msg.get("ok"):
        raise RuntimeError(str(msg.get("error", "child failed")))
    result = msg.get("result")
    return result if isinstance(result, dict) else {}
