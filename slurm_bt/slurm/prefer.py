"""``sbatch --prefer``: ask Slurm to favour some nodes, without requiring them.

``--prefer`` (Slurm >= 22.05; :mod:`slurm_bt.slurm.release`) takes node *features*, like
``--constraint``, not node names: Slurm first tries to place the job on nodes with those features
and falls back to the job's ordinary placement when none is free. To favour a set of nodes, each
needs a feature no node outside the set has. Sites commonly give every node a feature named after
itself (``NodeName=gpu07 Features=gpu07,h100``; the dev cluster does, devcluster/devcluster.py);
any such distinguishing feature works (a rack's feature when the whole rack is wanted).

:func:`prefer_expression` picks those features from ``scontrol show node``'s ``ActiveFeatures``.
A node without a distinguishing feature cannot be favoured alone and is left out; when none can,
there is no preference (never a wrong one).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

__all__ = ["FEATURE_NAME", "node_features", "prefer_expression"]

#: A feature slurm-bt writes into ``--prefer`` unquoted: no operator (``&|*[]()``) can slip in.
FEATURE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def node_features(node: Mapping[str, str]) -> set[str]:
    """Active features of one ``scontrol show node`` record (``(null)`` and junk dropped)."""
    raw = node.get("ActiveFeatures") or node.get("Features") or ""
    return {f for f in raw.split(",") if f and f != "(null)" and FEATURE_NAME.fullmatch(f)}


def _in_partition(node: Mapping[str, str], partition: str | None) -> bool:
    return partition is None or partition in node.get("Partitions", "").split(",")


def prefer_expression(nodes: Sequence[Mapping[str, str]], preferred: Collection[str],
                      partition: str | None = None) -> str | None:
    """The ``--prefer`` value that favours the ``preferred`` node names, or ``None``.

    Args:
        nodes: ``scontrol show node`` records (``NodeName``, ``ActiveFeatures``, ``Partitions``).
        preferred: node names to favour.
        partition: only nodes of this partition count (others cannot run the job, and Slurm
            validates ``--prefer`` against the job's partition); ``None``: every node.

    Returns:
        ``"f1|f2"``: for each preferred node of the partition, one feature that no other node of
        the partition has (its own name when it carries it, else the first in sorted order);
        ``None`` when no preferred node has such a feature, or every node of the partition is
        preferred (nothing to favour).
    """
    members = [n for n in nodes if n.get("NodeName") and _in_partition(n, partition)]
    want = {n["NodeName"] for n in members} & set(preferred)
    if not want or len(want) == len(members):
        return None
    others: set[str] = set()
    for n in members:
        if n["NodeName"] not in want:
            others |= node_features(n)
    chosen: list[str] = []
    for n in sorted(members, key=lambda n: n["NodeName"]):
        if n["NodeName"] not in want:
            continue
        unique = node_features(n) - others
        if not unique:
            continue
        pick = n["NodeName"] if n["NodeName"] in unique else sorted(unique)[0]
        if pick not in chosen:
            chosen.append(pick)
    return "|".join(chosen) or None
