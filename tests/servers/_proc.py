"""Start and stop server subprocesses by process group; find free ports on the address the servers use."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def _cluster_addr(key: str) -> str | None:
    """An address cluster.json names (``head_addr``, ``head_alt_addr``) when the dev cluster runs its isolated
    layout and this host can listen on it; None otherwise (see _head_addr)."""
    state = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))
    try:
        info = json.loads((state / "cluster.json").read_text())
    except (OSError, ValueError):
        return None
    addr = info.get(key) if isinstance(info, dict) and info.get("layout") == "isolated" else None
    if not isinstance(addr, str):
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
    except OSError:
        return None
    return addr


def _head_addr() -> str:
    """The address the test servers listen on: where the dev cluster's nodes reach this host.

    127.0.0.1, except when the dev cluster runs its isolated layout (devcluster/README.md, "Nodes"): each
    node then has a network of its own, where 127.0.0.1 is the node's own loopback, and reaches this host
    at the bridge address cluster.json names (``head_addr``), which this host can use too. A stale
    cluster.json (the bridge is gone) falls back to loopback.
    """
    return _cluster_addr("head_addr") or "127.0.0.1"


#: Where every test server listens and what its URLs name (see _head_addr).
HOST = _head_addr()
#: A second origin on this host, for servers that redirect elsewhere (the fake Hub's CDN): ``localhost``
#: beside 127.0.0.1, or the bridge's second address beside the head's in the isolated layout.
ALT_HOST = "localhost" if HOST == "127.0.0.1" else (_cluster_addr("head_alt_addr") or HOST)


def free_port() -> int:
    """A TCP port free on HOST right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, log: Path) -> None:
    """Wait until HOST:port accepts connections; fail with the server's log otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
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
