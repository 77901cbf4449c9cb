"""Download the checkpoints pinned at submit into ``BT_LOAD_CHECKPOINT_DIR``, on every node, as the user.

Runs in step 1 (:mod:`slurm_bt.node.prepare`), before the start commands. The layout follows
upstream's: ``<download_folder>/rank-<n>/<checkpoint_name>/<files>``, so a single-node checkpoint is
in ``rank-0/``. Every node gets every rank of each loaded checkpoint (a resume may change the
node count, and loaders pick their shards themselves).

Each file goes to a unique temp name, is sha256-verified against the pinned manifest, fsynced and
renamed; a ``.slurm-bt-verified`` file written last makes a requeued job skip the work. Paths from
the manifest are re-checked here (a teammate's index must not write outside the folder).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from slurm_bt.atomic import write_file_atomic
from slurm_bt.checkpoints.index import decode_relpath
from slurm_bt.checkpoints.locations import file_key, valid_checkpoint_name
from slurm_bt.checkpoints.resolve import open_user_store, safe_relpath
from slurm_bt.errors import StorageError
from slurm_bt.job_spec import JobSpec
from slurm_bt.node.job_paths import job_layout
from slurm_bt.posix.teams import is_team_slug

__all__ = ["VERIFIED_NAME", "download_manifests", "download_pinned", "host_load_dir"]

VERIFIED_NAME = ".slurm-bt-verified"


def host_load_dir(spec: JobSpec, job_id: str, node: str | None) -> Path | None:
    """The host path behind ``BT_LOAD_CHECKPOINT_DIR`` (the bind source inside containers)."""
    if not (spec.load_checkpoint.enabled or spec.load_checkpoint.resume):
        return None
    host = job_layout(spec, job_id=job_id, node=node).host_path("BT_LOAD_CHECKPOINT_DIR")
    return Path(host) if host is not None else None


def download_pinned(spec: JobSpec, dest_root: Path) -> int:
    """Fetch every pinned checkpoint into ``dest_root``; returns the number of files downloaded.

    Raises:
        StorageError: a reference was not resolved at submit, a path is unsafe, or a download fails
            (IntegrityError on a sha256 mismatch; nothing is left at the final path).
    """
    pinned: list[dict[str, Any]] = []
    for i, ref in enumerate(spec.load_checkpoint.checkpoints):
        resolved = ref.get("resolved")
        if not isinstance(resolved, dict):
            raise StorageError(f"checkpoints[{i}]", "not resolved at submit; resubmit with this slurm-bt version")
        pinned.append(resolved)
    return download_manifests(spec.storage, pinned, dest_root)


def download_manifests(storage: dict[str, str], pinned: list[dict[str, Any]], dest_root: Path) -> int:
    """Fetch pinned manifests (:func:`slurm_bt.checkpoints.resolve.pin`) into ``dest_root``, as the user.

    Raises:
        StorageError: a path is unsafe or a download fails (nothing is left at the final path).
    """
    if not pinned:
        return 0
    count = 0
    store = open_user_store(storage)
    try:
        for res in pinned:
            name = str(res["checkpoint_name"])
            if not valid_checkpoint_name(name):
                raise StorageError(name, "unsafe checkpoint name in the pinned manifest")
            # Where resolve found the job: a team namespace, or (None, or a manifest pinned before team
            # namespaces) the legacy location. job.json is the user's: the value is checked, not trusted.
            team = res.get("team")
            if team is not None and not (isinstance(team, str) and is_team_slug(team)):
                raise StorageError(repr(team), "unsafe team in the pinned manifest")
            for rank_s, files in sorted(res["ranks"].items()):
                target = dest_root / f"rank-{int(rank_s)}" / name
                manifest = hashlib.sha256(json.dumps([res["job_id"], files]).encode()).hexdigest()
                marker = target / VERIFIED_NAME
                try:
                    if marker.read_text().strip() == manifest:
                        continue
                except OSError:
                    pass
                for path, size, sha in files:
                    try:  # index paths are percent-encoded where the name was not plain UTF-8
                        local = os.fsdecode(decode_relpath(str(path))) if safe_relpath(str(path)) else None
                    except ValueError:
                        local = None
                    if local is None:
                        raise StorageError(str(path), "unsafe path in the pinned manifest")
                    key = file_key(str(res["project_id"]), str(res["job_id"]), int(rank_s), name, str(path),
                                   team=team)
                    store.download_file(key, target / local, size=int(size), sha256=str(sha))
                    count += 1
                target.mkdir(parents=True, exist_ok=True)
                write_file_atomic(marker, manifest.encode() + b"\n", mode=0o600)
    finally:
        store.close()
    return count
