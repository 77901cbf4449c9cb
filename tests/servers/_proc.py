"""Start and stop server subprocesses by process group; find free loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Wait until 127.0.0.1:port accepts connections; fail with the server's log otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not open port {port} in {timeout_s}s:\n{log.read_text(errors='replace')[-3000:]}")


def start(argv: Sequence[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (process group) with output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True, stdin=subprocess.DEVNULL)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM the process group, then SIGKILL it (SeaweedFS may ignore SIGTERM for > 15 s)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass
