"""Finish handed-off checkpoints: ``slurm-bt checkpoints resume-handoffs`` (root, or a sweeper).

Each entry of the hand-off area (``<node storage>/checkpoint-handoff/<job>.<node>/``, root-owned
``0711``) holds ``handoff.json`` (root-written: job, node, uid, gid) and ``data/`` (the job's
checkpoint directory, still owned by the user). The upload runs in a child dropped to that uid,
with the user's own store credentials, exactly like the epilog's flush; afterwards the entry is
deleted (``shutil.rmtree`` is fd-based on Linux, so a symlink planted in ``data/`` is never
followed). An entry whose upload fails stays for the next run; running twice is harmless.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_bt.checkpoints.flush import build_uploader, read_state
from slurm_bt.checkpoints.layout import handoff_root
from slurm_bt.errors import StorageError
from slurm_bt.job_spec import JobSpec
from slurm_bt.site_settings import load_site_settings

__all__ = ["HandoffOutcome", "resume_handoffs"]


@dataclass(frozen=True)
class HandoffOutcome:
    """The result for one hand-off entry."""

    entry: str
    status: str  # "uploaded", "failed", "skipped"
    message: str


def _resume_one(data_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """As the owner: upload every checkpoint in ``data_dir`` (all are complete: the job has ended)."""
    if not data_dir.is_dir() and record.get("work_dir"):
        # Not moved: the checkpoints were outside scratch (checkpoint_path); find them from the spec.
        from slurm_bt.checkpoints.layout import host_checkpoint_dir

        spec = JobSpec.model_validate_json(Path(str(record["work_dir"]), "job.json").read_bytes())
        host = host_checkpoint_dir(spec, str(record["job_id"]), record.get("node"))
        if host:
            data_dir = Path(host)
    state = read_state(data_dir)
    if state is None:
        raise StorageError(str(data_dir), "no uploader state file: cannot tell which job and rank this is")
    if str(state.get("job_id")) != str(record.get("job_id")):
        raise StorageError(str(data_dir), "state file names another job")
    spec = JobSpec.model_validate_json(Path(str(state["spec_path"])).read_bytes())
    uploader = build_uploader(spec, job_id=str(record["job_id"]), rank=int(state["rank"]), checkpoint_dir=data_dir)
    try:
        done = uploader.run_once(final=True)
    finally:
        uploader.store.close()
    return {"uploaded": done}


def resume_handoffs(*, root: Path | None = None, node: str | None = None, timeout_s: float = 6 * 3600,
                    keep: bool = False) -> list[HandoffOutcome]:
    """Upload and remove every hand-off entry under ``root`` (default: this node's hand-off area).

    Args:
        root: the hand-off area; defaults to the site's, for ``node`` (``%n`` in storage roots).
        node: the Slurm node name, when the site's roots use ``%n``.
        timeout_s: per-entry limit for the upload child.
        keep: leave entries in place after a successful upload (debugging).
    """
    from slurm_bt.hooks.privdrop import ChildError, run_as_uid

    if root is None:
        root = Path(handoff_root(load_site_settings().storage.model_dump(), node))
    outcomes: list[HandoffOutcome] = []
    if not root.is_dir():
        return outcomes
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() or not entry.is_dir():
            continue
        try:
            record = json.loads((entry / "handoff.json").read_bytes()[:65536])
        except (OSError, ValueError):
            outcomes.append(HandoffOutcome(entry.name, "skipped", "no readable handoff.json"))
            continue
        st = os.lstat(entry / "handoff.json")
        if os.geteuid() == 0 and st.st_uid != 0:
            outcomes.append(HandoffOutcome(entry.name, "skipped", "handoff.json is not root-owned"))
            continue
        data = entry / "data" if record.get("moved") else Path(str(record.get("source")))
        uid, gid = int(record["uid"]), int(record["gid"])
        env = {"PATH": "/usr/bin:/bin"}
        if os.environ.get("SLURM_BT_SITE_CONFIG"):
            env["SLURM_BT_SITE_CONFIG"] = os.environ["SLURM_BT_SITE_CONFIG"]
        started = time.monotonic()
        try:
            res = run_as_uid(lambda data=data, record=record: _resume_one(data, record),  # type: ignore[misc]
                             uid=uid, gid=gid, timeout_s=timeout_s, extra_env=env)
        except ChildError as exc:
            outcomes.append(HandoffOutcome(entry.name, "failed", str(exc)))
            continue
        if not keep:
            shutil.rmtree(entry, ignore_errors=True)
        took = time.monotonic() - started
        outcomes.append(HandoffOutcome(entry.name, "uploaded",
                                       f"{len(res.get('uploaded', []))} checkpoint(s) in {took:.1f} s"))
    return outcomes
