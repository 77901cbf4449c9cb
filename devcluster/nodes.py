#!/usr/bin/python3
"""Isolated dev nodes: each slurmd in a "machine" of its own on this host (devcluster/README.md, "Nodes").

A machine is a set of namespaces held open by a small init process:
- network: a namespace named ``btdev-<node>`` (``ip netns``) with one veth on the host's bridge ``btdev0``,
  its own address in 198.51.100.0/24 (TEST-NET-2, RFC 5737: documentation addresses, never routed; the
  host's own network may use TEST-NET-1, so the dev cluster does not) and its own loopback. The head
  (this host: slurmctld, slurmdbd, the registries, the test's object servers) is 198.51.100.1 on the bridge.
- mount: a slave copy of the host's mounts (the shared storage mounted later on the host, such as the
  GlusterFS volume, propagates in), with the node's own ``/tmp``, ``/dev/shm`` and ``/run/slurm-bt``
  (tmpfs), its own node-local disk bound at one path that is the same on every node, its own ``/proc``
  and ``/etc/hosts``.
- UTS (the node's hostname), IPC and PID: processes of one node cannot see or signal another's.

The init is PID 1 of its namespace: it reaps orphans (daemonised slurmd and slurmstepd end up its
children) and, when stopped, ends every process of its machine, as a node that powers off. slurmd is
started inside with ``nsenter``, so restarting slurmd leaves the machine and its jobs running, as on a
real node. Standard library only; run as root.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NET = "198.51.100"
PREFIX = 24
HEAD_ADDR = f"{NET}.1"
# A second address of the head: "another origin" for tests whose servers redirect elsewhere (a CDN), where
# the host layout uses the name localhost beside 127.0.0.1.
HEAD_ALT_ADDR = f"{NET}.2"
BRIDGE = "btdev0"
NETNS_DIR = Path("/run/netns")
RUN_NOTES = "/run/slurm-bt"
HERE = Path(__file__).resolve()


def node_addr(index: int) -> str:
    """Node n<index> (1-based) is 198.51.100.<10 + index>."""
    return f"{NET}.{10 + index}"


def netns(node: str) -> str:
    return f"btdev-{node}"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cp = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and cp.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {(cp.stderr or cp.stdout).strip()}")
    return cp


def _has_addr(args: list[str], addr: str) -> bool:
    return f"inet {addr}/{PREFIX} " in _ip(*args, check=False).stdout


def ensure_bridge() -> None:
    """The head's side of the nodes' network: bridge btdev0 with 198.51.100.1 and .2 (idempotent)."""
    if _ip("link", "show", BRIDGE, check=False).returncode != 0:
        _ip("link", "add", BRIDGE, "type", "bridge")
    for addr in (HEAD_ADDR, HEAD_ALT_ADDR):
        if not _has_addr(["-4", "addr", "show", "dev", BRIDGE], addr):
            _ip("addr", "add", f"{addr}/{PREFIX}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")


def ensure_node_net(node: str, addr: str) -> None:
    """The node's network namespace, its veth on the bridge and its address (idempotent)."""
    ns = netns(node)
    if not (NETNS_DIR / ns).exists():
        _ip("netns", "add", ns)
    host_if = ns[:15]  # interface names have at most 15 characters
    if _ip("link", "show", host_if, check=False).returncode != 0:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("link", "set", host_if, "master", BRIDGE, "up")
    if not _has_addr(["-n", ns, "-4", "addr", "show", "dev", "eth0"], addr):
        _ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")
    _ip("-n", ns, "link", "set", "lo", "up")


def remove_node_net(node: str) -> None:
    ns = netns(node)
    _ip("link", "del", ns[:15], check=False)  # removes both ends of the veth
    if (NETNS_DIR / ns).exists():
        _ip("netns", "del", ns, check=False)


def remove_bridge() -> None:
    _ip("link", "del", BRIDGE, check=False)


def ensure_shared_root() -> bool:
    """Make the host's root mount a shared one (as systemd does at boot), so that what the host mounts later
    under it (the GlusterFS volume of ``up --shared gluster``) reaches the machines, whose copies are its slaves.

    True if it changed (it was private, as where no systemd runs)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[4] == "/":
            optional = fields[6:fields.index("-")]
            if any(o.startswith("shared:") for o in optional):
                return False
            break
    subprocess.run(["mount", "--make-shared", "/"], check=True, timeout=30, stdin=subprocess.DEVNULL)
    return True


def hosts_file(nodes: dict[str, str], head_name: str) -> str:
    """/etc/hosts as every machine sees it: the head and every node by name."""
    lines = ["# slurm-bt dev cluster (devcluster/nodes.py): the head and the isolated nodes",
             "127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{HEAD_ADDR}\t{head_name} btdev-head"]
    lines += [f"{addr}\t{name}" for name, addr in sorted(nodes.items())]
    return "\n".join(lines) + "\n"


def init_argv(node: str, local_src: Path, local_dst: Path, hosts: Path, keep: Path | None = None) -> list[str]:
    """The command that starts node's machine: join its network namespace, make the others, run the init.
    ``keep``: a directory of this host's own /tmp the node must see too (see :func:`tmp_to_keep`)."""
    return ["nsenter", f"--net={NETNS_DIR / netns(node)}", "--",
            "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child=SIGTERM",
            "--propagation", "slave", "--",
            "/usr/bin/python3", "-I", str(HERE), "_init", node, str(local_src), str(local_dst), str(hosts),
            str(keep) if keep else "-"]


def tmp_to_keep(checkout: Path) -> Path | None:
    """The checkout, when it lies under /tmp or /dev/shm (a clone made there): each node gets its own
    empty ones, and slurm.conf's Prolog and Epilog, like the venv's link to the package, name files
    in the checkout, which a real site keeps on storage every node mounts."""
    for private in ("/tmp", "/dev/shm"):
        if checkout.is_relative_to(private):
            return checkout
    return None


def kept_by(pid: int) -> str:
    """What a running machine's init keeps from this host's /tmp ("-": nothing; "" when not an init)."""
    argv = cmdline(pid)
    return argv[8] if len(argv) >= 9 else "-" if len(argv) >= 5 else ""


def enter_argv(init_pid: int) -> list[str]:
    """Prefix that runs a command inside the machine whose init is init_pid (as the host sees it)."""
    return ["nsenter", f"--target={init_pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--"]


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_init(pid: int, node: str) -> bool:
    """Is ``pid`` the init of ``node``'s machine? Whichever checkout started it: a machine belongs to the
    state directory, and another clone's ``up`` (a fresh clone of the repository, scripts/quickstart.sh)
    must adopt it, not start a second machine in the same network namespace."""
    argv = cmdline(pid)
    return (len(argv) >= 5 and argv[2].endswith(f"/devcluster/{HERE.name}") and argv[3] == "_init"
            and argv[4] == node)


# ------------------------------------------------------------------------------------------- the init
# Runs as PID 1 of the machine's PID namespace (the child of `unshare --fork`).

class _Stop(Exception):
    pass


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, timeout=30, stdin=subprocess.DEVNULL)


def _init(node: str, local_src: str, local_dst: str, hosts: str, keep: str = "-") -> int:
    # The node-local disk first: the tmpfs on /tmp below would hide a source under /tmp.
    _mount("--bind", local_src, local_dst)
    # So would it hide a checkout under /tmp (tmp_to_keep): held at a place of the node's disk meanwhile
    # (a mount of this machine only), moved back to its own path once the node's /tmp is there.
    held = f"{local_dst}/.host-checkout"
    if keep != "-":
        Path(held).mkdir(exist_ok=True)
        _mount("--bind", keep, held)
    # The other nodes' disks are not there: the parent of node/<n> becomes an empty read-only tmpfs holding
    # only this node's own disk, also at its old path (a site storage root with %n still finds it).
    parent = str(Path(local_src).parent)
    _mount("-t", "tmpfs", "-o", "mode=0755,nosuid,nodev,size=1m", f"disks-{node}", parent)
    Path(local_src).mkdir()
    _mount("--bind", local_dst, local_src)
    _mount("-o", "remount,ro,bind", parent)
    _mount("--bind", hosts, "/etc/hosts")
    _mount("-t", "proc", "proc", "/proc")
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev,size=2g", f"tmp-{node}", "/tmp")
    _mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev,size=2g", f"shm-{node}", "/dev/shm")
    if keep != "-":
        Path(keep).mkdir(parents=True, exist_ok=True)
        _mount("--move", held, keep)
        os.rmdir(held)
    # The hooks' per-node notes (slurm_bt/posix/job_notes.py) live in /run, a tmpfs of each real machine:
    # shared, one node's epilog would count another node's jobs as "another job of this user on this host".
    Path(RUN_NOTES).mkdir(mode=0o755, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0755,nosuid,nodev,size=64m", f"run-{node}", RUN_NOTES)
    socket.sethostname(node)

    def stop(_sig: int, _frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"node {node}: up", flush=True)
    try:
        while True:
            try:
                os.waitpid(-1, 0)  # reap whatever was reparented here
            except ChildProcessError:
                time.sleep(1)
    except _Stop:
        pass
    # Power off: every process of this machine ends (slurmd first, as SIGTERM lets it finish cleanly).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.kill(-1, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.1)
    os.kill(-1, signal.SIGKILL)
    print(f"node {node}: stopped", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) in (6, 7) and sys.argv[1] == "_init":
        sys.exit(_init(*sys.argv[2:]))
    print(__doc__.strip(), file=sys.stderr)
    sys.exit(2)
