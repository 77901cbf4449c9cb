"""Finish handed-off checkpoints: ``slurm-bt checkpoints resume-handoffs`` (root, or a sweeper).

Each entry of the hand-off area (``<node storage>/checkpoint-handoff/<job>.<node>/``, root-owned
``0711``) holds ``handoff.json`` (root-written: job, node, uid, gid) and ``data/`` (the job's
checkpoint directory, still owned by the user). The upload runs in a child dropped to that uid,
with the user's own store credentials, exactly like the epilog's flush; afterwards the entry is
deleted (``shutil.rmtree`` is fd-based on Linux, so a symlink planted in ``data/`` is never
followed). An entry whose upload fails stays for the next run; running twice is harmless.

When it runs: the epilog that hands something off starts one detached sweep of its node's area
right away (:func:`start_background_sweep`: its own session, ``nice`` 10, output to the hook log),
so the node is released at once and the upload finishes shortly after without an admin step; a
periodic run (``slurm-bt checkpoints resume-handoffs`` from a timer, see docs/admin.md) catches what
a reboot or a store outage left behind. Each entry is taken under a non-blocking ``flock`` on its
directory (the area is node-local), so overlapping sweeps never upload the same entry twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_bt.checkpoints.flush import build_uploader, read_state
from slurm_bt.checkpoints.layout import handoff_root
from slurm_bt.errors import StorageError
from slurm_bt.job_spec import JobSpec
from slurm_bt.site_settings import load_site_settings

__all__ = ["HandoffOutcome", "main", "resume_handoffs", "start_background_sweep"]


@dataclass(frozen=True)
class HandoffOutcome:
    """The result for one hand-off entry."""

    entry: str
    status: str  # "uploaded", "failed", "skipped", "busy" (another sweep holds it), "removed" (empty)
    message: str


def _resume_one(data_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """As the owner: upload every checkpoint in ``data_dir`` (all are complete: the job has ended)."""
    if not data_dir.is_dir():
        # Not moved: the checkpoints were outside scratch (checkpoint_path); find them from the spec.
        from slurm_bt.checkpoints.layout import host_checkpoint_dir

        try:
            spec = JobSpec.model_validate_json(Path(str(record.get("work_dir")), "job.json").read_bytes())
        except FileNotFoundError:
            return {"uploaded": [], "gone": True}  # neither the checkpoints nor the job's spec exist any more
        host = host_checkpoint_dir(spec, str(record["job_id"]), record.get("node"))
        if not host or not Path(host).is_dir():
            return {"uploaded": [], "gone": True}
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
    if root is None:
        root = Path(handoff_root(load_site_settings().storage.model_dump(), node))
    outcomes: list[HandoffOutcome] = []
    if not root.is_dir():
        return outcomes
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() or not entry.is_dir():
            continue
        try:
            lock_fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # removed by a concurrent sweep, or swapped for something else
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            outcomes.append(HandoffOutcome(entry.name, "busy", "another sweep is uploading it"))
            continue
        try:
            if os.path.samestat(os.fstat(lock_fd), os.lstat(entry)):
                outcomes.append(_resume_entry(entry, timeout_s, keep))
        except OSError:
            pass  # finished and removed by the sweep that held the lock before us
        finally:
            os.close(lock_fd)
    return outcomes


_EMPTY_ENTRY_AGE_S = 3600.0


def _resume_entry(entry: Path, timeout_s: float, keep: bool) -> HandoffOutcome:
    """Upload one locked entry as its owner, then remove it."""
    from slurm_bt.hooks.privdrop import ChildError, run_as_uid

    try:
        record = json.loads((entry / "handoff.json").read_bytes()[:65536])
    except (OSError, ValueError):
        # An empty entry an hour old is what a hand-off that failed before moving anything leaves
        # (an epilog mid-hand-off has it for milliseconds); rmdir removes only an empty directory.
        if time.time() - os.lstat(entry).st_mtime > _EMPTY_ENTRY_AGE_S:
            try:
                os.rmdir(entry)
                return HandoffOutcome(entry.name, "removed", "empty entry left by a failed hand-off")
            except OSError:
                pass
        return HandoffOutcome(entry.name, "skipped", "no readable handoff.json")
    st = os.lstat(entry / "handoff.json")
    if os.geteuid() == 0 and st.st_uid != 0:
        return HandoffOutcome(entry.name, "skipped", "handoff.json is not root-owned")
    data = entry / "data" if record.get("moved") else Path(str(record.get("source")))
    try:
        uid, gid = int(record["uid"]), int(record["gid"])
    except (KeyError, TypeError, ValueError):
        return HandoffOutcome(entry.name, "skipped", "handoff.json has no valid uid/gid")
    env = {"PATH": "/usr/bin:/bin"}
    if os.environ.get("SLURM_BT_SITE_CONFIG"):
        env["SLURM_BT_SITE_CONFIG"] = os.environ["SLURM_BT_SITE_CONFIG"]
    started = time.monotonic()
    try:
        res = run_as_uid(lambda data=data, record=record: _resume_one(data, record),  # type: ignore[misc]
                         uid=uid, gid=gid, timeout_s=timeout_s, extra_env=env)
    except ChildError as exc:
        return HandoffOutcome(entry.name, "failed", str(exc))
    if not keep:
        shutil.rmtree(entry, ignore_errors=True)
    if res.get("gone"):
        return HandoffOutcome(entry.name, "removed", f"nothing left to upload: {data} no longer exists")
    took = time.monotonic() - started
    return HandoffOutcome(entry.name, "uploaded", f"{len(res.get('uploaded', []))} checkpoint(s) in {took:.1f} s")


def start_background_sweep(
    node: str | None, *, site_path: str | None = None, log_path: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a detached sweep of ``node``'s hand-off area and return at once (root, epilog).

    Detached so that Slurm releases the node now: a new session (the epilog's process group may be
    killed when the epilog ends), no inherited descriptors (slurmd reads the epilog's output until
    EOF), ``nice`` 10 (it shares the node with the next job). Output is appended to ``log_path``
    (the root-owned hook log), else discarded.

    Raises:
        OSError: the interpreter could not be started.
    """
    argv = [sys.executable, "-I", "-m", "slurm_bt.checkpoints.handoff", "--nice", "10"]
    if node:
        argv += ["--node", node]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if site_path:
        env["SLURM_BT_SITE_CONFIG"] = site_path
    stdout = subprocess.DEVNULL
    if log_path is not None:
        try:
            stdout = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        except OSError:
            pass  # no log: still finish the upload
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True, cwd="/")
    finally:
        if stdout != subprocess.DEVNULL:
            os.close(stdout)
    return proc


def main(argv: list[str] | None = None) -> int:
    """``python -I -m slurm_bt.checkpoints.handoff [--node N] [--root DIR] [--nice K]``: one sweep.

    Prints one line per entry (for the hook log); exit 1 if any entry failed.
    """
    import argparse
    from datetime import datetime, timezone

    parser = argparse.ArgumentParser(prog="slurm-bt-resume-handoffs")
    parser.add_argument("--node", default=None)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    outcomes = resume_handoffs(root=args.root, node=args.node)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for o in outcomes:
        print(f"{stamp} slurm-bt resume-handoffs node={args.node or '-'} entry={o.entry} {o.status}: {o.message}",
              flush=True)
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
