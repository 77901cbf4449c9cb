"""Per-job weights visibility: which tier served each source on each node, bytes, seconds.

Step 1 of a job (``slurm_bt.node.prepare``, as the user) writes ``<job_dir>/weights/status-<node>.json``
on every node; ``slurm-bt status --json`` reads them with :func:`read_weights_status`. The staging
job's outcome (cluster hit or miss, bytes fetched from the origin) is in the same folder, one file per
source (``staging-<i>.json``). Light on purpose: the status command imports only this module.

Tiers, from fastest to slowest:

``node-hit``        the node cache already held the entry (the prolog took a lease and linked it);
``cluster-hit``     the prolog copied it from the cluster cache to the node cache (verified);
``cluster-direct``  no prolog staging: the job reads the cluster cache snapshot directly (fallback);
``miss``            (staging job only) fetched from the origin into the cluster cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from slurm_bt.atomic import write_file_atomic

__all__ = ["read_weights_status", "write_node_status", "write_staging_status"]


def write_node_status(job_dir: str | Path, node: str, entries: list[dict[str, Any]]) -> Path:
    """Write this node's view of the job's weights (as the job user, into the job dir)."""
    folder = Path(job_dir) / "weights"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"status-{node}.json"
    write_file_atomic(path, json.dumps({"node": node, "weights": entries}, indent=2).encode(), mode=0o600)
    return path


def write_staging_status(job_dir: str | Path, index: int, entry: dict[str, Any]) -> Path:
    """Write the staging job's outcome for ``job.weights[index]``."""
    folder = Path(job_dir) / "weights"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"staging-{index}.json"
    write_file_atomic(path, json.dumps(entry, indent=2).encode(), mode=0o600)
    return path


def read_weights_status(job_dir: str | Path) -> dict[str, Any]:
    """Everything known about the job's weights delivery, for ``slurm-bt status --json``.

    Returns:
        ``{"staging": [per source: source, tier, total_bytes, fetched_bytes, seconds],
        "nodes": {node: [per source: index, source, mount_location, tier, bytes, seconds, path,
        view]}}``; empty lists/dicts when nothing was written (no weights, or not started yet).
        Unreadable or malformed files are skipped.
    """
    folder = Path(job_dir) / "weights"
    out: dict[str, Any] = {"staging": [], "nodes": {}}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            data = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        if name.startswith("status-") and isinstance(data, dict):
            out["nodes"][str(data.get("node", name[7:-5]))] = data.get("weights", [])
        elif name.startswith("staging-") and isinstance(data, dict):
            out["staging"].append(data)
    out["staging"].sort(key=lambda e: e.get("index", 0))
    return out
