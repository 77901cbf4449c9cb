"""Print the address of the job's leader node (runs in the batch script, on the leader, as the user).

Why not the node name: Slurm node names need not resolve (on the dev cluster ``n1`` does not), while
``NodeAddr`` is what slurmd itself is reached at, so every node of the job can reach it. When NodeAddr
is a host name we resolve it here once, so every rank sees the same literal address.
"""

from __future__ import annotations

import os
import socket
import sys

from slurm_bt.errors import BtError
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.runner import SubprocessRunner

__all__ = ["leader_address", "main"]


def leader_address(client: SlurmClient, nodelist: str) -> str:
    """The reachable address of the first node of ``nodelist`` (a Slurm hostlist expression).

    Raises:
        SlurmCommandError: scontrol could not expand the list or does not know the node.
        ValueError: ``nodelist`` is empty or not a hostlist expression.
    """
    addr = client.node_addr(client.hostnames(nodelist)[0])
    try:
        infos = socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return addr
    return str(infos[0][4][0]) if infos else addr


def main() -> int:
    """Entry point: ``python -I -m slurm_bt.steps.leader`` prints the address on stdout."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    try:
        print(leader_address(SlurmClient(SubprocessRunner()), nodelist))
    except (BtError, RuntimeError, ValueError, OSError) as exc:
        print(f"slurm-bt: cannot determine the leader address: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
