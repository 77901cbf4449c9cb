"""What a test on the host needs to know about the dev cluster's nodes, in either layout (devcluster/README.md).

In the isolated layout each node is a machine with its own PID namespace: a PID a job or a root helper
records on a node is that node's, not the host's. The host sees every process (it is the hypervisor here),
and ``/proc/<pid>/status``'s ``NSpid`` line lists a process's PID in each namespace from the host's down;
these helpers translate through it. In the host layout the two are the same.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))


def cluster_info() -> dict[str, Any]:
    info = json.loads((STATE / "cluster.json").read_text())
    assert isinstance(info, dict)
    return info


def isolated() -> bool:
    return cluster_info().get("layout") == "isolated"


def head_addr() -> str:
    """Where a job on a node reaches this host (its registries, the tests' servers)."""
    return str(cluster_info().get("head_addr") or "127.0.0.1")


def registry_host() -> str:
    """The dev registry (the site's docker.io mirror) as jobs and bt-sbatch name it."""
    return f"{head_addr()}:5443"


def mirror_toml() -> str:
    """The ``[containers]`` table of a test's own site file that pulls ``docker.io`` names from the dev
    registry at the address the nodes reach (the product default is the host layout's 127.0.0.1)."""
    return f'[containers]\nregistry_mirrors = {{"docker.io" = "{registry_host()}"}}\n'


def _machine_init(node: str) -> int | None:
    try:
        return int((STATE / "run" / f"machine-{node}.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def node_root(node: str) -> Path:
    """``/`` as ``node`` sees it, from the host: the machine's mounts (its own /tmp, /dev/shm and local disk)
    through ``/proc/<its init>/root`` in the isolated layout; this host's ``/`` in the host layout."""
    init = _machine_init(node) if isolated() else None
    return Path(f"/proc/{init}/root") if init is not None else Path("/")


def notes_dir(node: str) -> Path:
    """The hooks' notes of ``node`` (``/run/slurm-bt/<node>``, slurm_bt/posix/job_notes.py) seen from the
    host: each machine's own ``/run/slurm-bt`` where nodes are isolated."""
    return node_root(node) / "run" / "slurm-bt" / node


def on_node(node: str) -> list[str]:
    """The argv prefix that runs a command on ``node`` as a process of that machine (its namespaces, so
    its hostname, disks and slurmd), as an admin would over ssh; empty in the host layout, where every
    node is this host."""
    init = _machine_init(node) if isolated() else None
    return ["nsenter", "-t", str(init), "--all", "--"] if init is not None else []


def nodes() -> list[str]:
    """Every node of the dev cluster, n1 first."""
    return [str(n) for n in cluster_info().get("nodes", [])] or ["n1", "n2"]


def _machine_pid_ns(node: str) -> str | None:
    init = _machine_init(node)
    try:
        return os.readlink(f"/proc/{init}/ns/pid") if init is not None else None
    except OSError:
        return None


def _nspid(pid: str) -> list[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(p) for p in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return []


def host_pid(node: str, pid: int) -> int | None:
    """The host's PID of the process that is ``pid`` on ``node``; None when no such process is alive."""
    ns = _machine_pid_ns(node) if isolated() else None
    if ns is None:
        return pid if Path(f"/proc/{pid}").exists() else None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        ids = _nspid(entry.name)
        if len(ids) >= 2 and ids[-1] == pid:
            try:
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                    return int(entry.name)
            except OSError:
                continue
    return None


def on_a_node(pid: str) -> bool:
    """Is host process ``pid`` one of a node's (a job's, a hook's), not of this host (a login session, a
    test, another test's ``runuser bt-sbatch``)? Every process is a node's in the host layout."""
    if not isolated():
        return True
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def node_pid(pid: int) -> int:
    """The PID the process ``pid`` (the host's) has on its node: the innermost of its NSpid line."""
    ids = _nspid(str(pid))
    return ids[-1] if ids else pid


def job_nodes(job_id: str) -> list[str]:
    """The nodes of a running job, in Slurm's order (its node rank 0 first)."""
    listed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True,
                            timeout=30, check=True).stdout.strip()
    out = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    return out.split()
