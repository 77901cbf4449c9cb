"""Per-job weights visibility: which tier served each source on each node, bytes, seconds.

Step 1 of a job (``slurm_bt.steps.prepare``, as the user) writes ``<job_dir>/weights/status-<node>.json``
on every node; ``slurm-bt status --json`` reads them with :func:`read_weights_status`. The staging
job's outcome (cluster hit or miss, bytes fetched from the origin) is in the same folder, one file per
source (``staging-<i>.json``). Light on purpose: the status command imports only this module.

Tiers, from fastest to slowest:

``node-hit``        the node cache already held the entry (the prolog took a lease and linked it);
``cluster-hit``     the prolog copied it from the cluster cache to the node cache (verified);
``cluster-direct``  no prolog staging: the job reads the cluster cache snapshot directly (fallback);
``node-staging``    a node stager is still copying it (slurm_bt/weights/node_stager.py): the job waits in
                    DEPLOYING; ``progress`` has bytes done/total, rate and ETA (becomes ``cluster-hit``);
``miss``            (staging job only) fetched from the origin into the cluster cache.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.units import format_bytes

if TYPE_CHECKING:
    from slurm_bt.records import SubmissionRecord

__all__ = ["copying_nodes", "progress_text", "read_weights_status", "summary_lines", "weights_status",
           "with_node_copy_state", "write_node_status", "write_staging_status"]



def write_node_status(job_dir: str | Path, node: str, entries: list[dict[str, Any]]) -> Path:
    """Write this node's view of the job's weights (as the job user, into the job dir)."""
    from slurm_bt.atomic import write_file_atomic  # here, not at the top: status reads must not load ctypes

    folder = Path(job_dir) / "weights"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"status-{node}.json"
    write_file_atomic(path, json.dumps({"node": node, "weights": entries}, indent=2).encode(), mode=0o600)
    return path


def write_staging_status(job_dir: str | Path, index: int, entry: dict[str, Any]) -> Path:
    """Write the staging job's outcome for ``job.weights[index]``."""
    from slurm_bt.atomic import write_file_atomic

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


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def summary_lines(status: Mapping[str, Any]) -> list[str]:
    """One short line per declared source for ``slurm-bt status``'s table, from :func:`read_weights_status`.

    Once the job started somewhere, the node view: ``weights: hf://org/m@0123456789ab node-hit (n1)
    11.7 MiB 0.01s``; several nodes are grouped by tier (``node-hit (n1,n2), cluster-hit (n3)``, with the
    slowest node's seconds). Before that, the staging job's outcome (``... staging miss 11.7 MiB 4.10s``). The
    files are the user's own, so every field is type-checked and a malformed one is shown as ``?``.
    """
    # The job's container image is reported in the same files (kind "image"; docs/containers.md): first.
    by_index: dict[tuple[int, int], list[tuple[str, Mapping[str, Any]]]] = {}
    nodes = status.get("nodes")
    for node, entries in sorted(nodes.items() if isinstance(nodes, Mapping) else []):
        for e in entries if isinstance(entries, list) else []:
            if isinstance(e, Mapping):
                index = e.get("index")
                key = (0 if e.get("kind") == "image" else 1, index if isinstance(index, int) else 0)
                by_index.setdefault(key, []).append((str(node), e))
    lines = []
    for (weights, _), group in sorted(by_index.items()):
        what = "weights" if weights else "image"
        tiers: dict[str, list[str]] = {}
        for node, e in group:
            tiers.setdefault(str(e.get("tier", "?")), []).append(node)
        where = ", ".join(f"{tier} ({','.join(names)})" for tier, names in tiers.items())
        first = group[0][1]
        seconds = max(_num(e.get("seconds")) for _, e in group)
        copying = [(node, p) for node, e in group
                   if e.get("tier") == "node-staging" and isinstance(p := e.get("progress"), Mapping)]
        if copying:
            lines.append(f"{what}: {first.get('source', '?')} {where} "
                         + "; ".join(f"{node} {progress_text(p)}" for node, p in copying))
            continue
        lines.append(f"{what}: {first.get('source', '?')} {where} {format_bytes(_num(first.get('bytes')))} "
                     f"{seconds:.2f}s")
    if lines:
        return lines
    staging = status.get("staging")
    for e in staging if isinstance(staging, list) else []:
        if isinstance(e, Mapping):
            lines.append(f"weights: {e.get('source', '?')} staging {e.get('tier', '?')} "
                         f"{format_bytes(_num(e.get('total_bytes')))} {_num(e.get('seconds')):.2f}s")
    return lines


def progress_text(p: Mapping[str, Any]) -> str:
    """``1.2 GiB/4.0 GiB (30%) 310.0 MiB/s ETA 9 s`` from a node stager's progress (fields type-checked)."""
    done, total = _num(p.get("done_bytes")), _num(p.get("total_bytes"))
    if not total:
        return str(p.get("state", "starting"))[:20] if isinstance(p.get("state"), str) else "starting"
    text = f"{format_bytes(done)}/{format_bytes(total)} ({100 * done / total:.0f}%)"
    if _num(p.get("rate_bytes_s")) > 0:
        text += f" {format_bytes(_num(p.get('rate_bytes_s')))}/s"
    if isinstance(p.get("eta_s"), (int, float)):
        text += f" ETA {_num(p.get('eta_s')):.0f} s"
    return text


def copying_nodes(status: Mapping[str, Any] | None) -> list[str]:
    """Nodes where a node stager is still copying one of the job's sources (tier ``node-staging``)."""
    nodes = status.get("nodes") if isinstance(status, Mapping) else None
    if not isinstance(nodes, Mapping):
        return []
    return sorted(str(node) for node, entries in nodes.items() if isinstance(entries, list) and any(
        isinstance(e, Mapping) and e.get("tier") == "node-staging" for e in entries))


def with_node_copy_state(row: dict[str, Any]) -> dict[str, Any]:
    """A RUNNING row whose first step still waits for a node copy is DEPLOYING (its GPUs wait too).

    Slurm sees the job running (the prolog ended); the job's own status file says step 1 is waiting
    for the node stager (slurm_bt/weights/node_stage.py ``wait_for_node_copies``). Only while the
    file says so: step 1 rewrites it once the copy is done.
    """
    waiting = copying_nodes(row.get("weights"))
    if waiting and row.get("current_status") == "TRAINING_JOB_RUNNING":
        row["current_status"] = "TRAINING_JOB_DEPLOYING"
        row["detail"] = f"{row.get('detail') or ''}; copying weights to {','.join(waiting)}".lstrip("; ")
    return row


def weights_status(record: SubmissionRecord | None) -> dict[str, Any] | None:
    """Which tier served each weights source, per node (``read_weights_status``), or None.

    ``None`` for jobs without a record or without weights or image: those cost no file access (one
    lstat for jobs without weights), which keeps ``slurm-bt status`` as fast as before for them.
    Otherwise ``<job_dir>/weights`` is read only if it is a directory the caller owns (step 1 and the
    staging job write it as the job user), so a record edited to point elsewhere cannot make status
    read someone else's files.
    """
    if record is None:
        return None
    # A container job's image is reported in the same files (its node tier, kind "image"): one lstat
    # of <job_dir>/image for jobs without weights.
    if record.weights_sources <= 0 and not os.path.isdir(Path(record.job_dir) / "image"):
        return None
    folder = Path(record.job_dir) / "weights"
    try:
        st = os.lstat(folder)
    except OSError:
        return {"staging": [], "nodes": {}}  # submitted, nothing written yet
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    return read_weights_status(record.job_dir)
