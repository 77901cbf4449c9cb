"""Records of squatted directories: a name that must belong to someone, found taken by someone else.

Why a record: a squat is a (possibly deliberate) denial of service by one user against another, and
the hook that sidesteps it runs unattended; ``slurm-bt admin doctor`` is where an admin looks. The
hooks write one small root-owned JSON file per squatted path under the node's notes,

    /run/slurm-bt/<node>/squats/<sha256(path)[:16]>.json     0644 root (dir 0755 root)

so a path squatted again overwrites its record (with a running count) instead of adding files, and
at most :data:`MAX_RECORDS` paths are kept per node. ``/run`` is cleared at boot, like the notes;
an admin clears records with ``rm`` once the user has been dealt with.

Reading and writing never follow a symlink (the directories are root-owned; files are read with
:func:`~slurm_bt.trusted_files.read_trusted_file`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_bt.posix.job_notes import STATE_ROOT
from slurm_bt.posix.safefs import ensure_dir_at, open_dir_at, remove_tree_at, write_file_at
from slurm_bt.trusted_files import read_trusted_file

__all__ = ["ASIDE_PREFIX", "MAX_RECORDS", "SQUATS_DIR", "Squat", "read_squats", "record_squat", "sidestep_squat"]

SQUATS_DIR = "squats"
ASIDE_PREFIX = ".slurm-bt-squatted-"
"""Name prefix of a squatted entry renamed aside before it is removed."""
MAX_RECORDS = 200
_MAX_RECORD_BYTES = 8192


@dataclass(frozen=True)
class Squat:
    """One squatted path as recorded by a hook.

    Attributes:
        path: the path that had to be created for someone.
        owner_uid: who owned the entry found there.
        kind: ``directory``, ``symlink``, ``file``, ``fifo``, ``socket`` or ``other``.
        victim_uid: the user whose job needed the path.
        job_id: that job.
        action: what the hook did (``moved aside and removed``, ``job failed``...).
        seen_at: Unix time of the latest sighting.
        count: sightings of this path.
    """

    path: str
    owner_uid: int
    kind: str
    victim_uid: int
    job_id: str
    action: str
    seen_at: int
    count: int


def entry_kind(mode: int) -> str:
    """A word for an ``st_mode``'s file type."""
    import stat

    for test, word in ((stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"), (stat.S_ISREG, "file"),
                       (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return word
    return "other"


def _name(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16] + ".json"


def _parse(raw: bytes | None) -> Squat | None:
    if raw is None:
        return None
    try:
        d: Any = json.loads(raw)
        return Squat(path=str(d["path"]), owner_uid=int(d["owner_uid"]), kind=str(d["kind"]),
                     victim_uid=int(d["victim_uid"]), job_id=str(d["job_id"]), action=str(d["action"]),
                     seen_at=int(d["seen_at"]), count=int(d.get("count", 1)))
    except (ValueError, KeyError, TypeError):
        return None


def record_squat(node: str, *, path: str, owner_uid: int, kind: str, victim_uid: int, job_id: str,
                 action: str, state_root: str = STATE_ROOT) -> None:
    """Record (or update) the squat of ``path`` on ``node``.

    Raises:
        OSError: the node's notes directory cannot be written (callers log it; a record is a report,
            never a reason to fail a job or drain a node).
    """
    from slurm_bt.posix.job_notes import open_node_state

    nfd = open_node_state(node, state_root)
    try:
        sfd, _ = ensure_dir_at(nfd, SQUATS_DIR, uid=0, gid=0, mode=0o755)
    finally:
        os.close(nfd)
    try:
        name = _name(path)
        previous = _parse(read_trusted_file(f"/proc/self/fd/{sfd}/{name}", max_bytes=_MAX_RECORD_BYTES))
        if previous is None and len(os.listdir(sfd)) >= MAX_RECORDS:
            return  # bounded: the hook log still has every sighting
        body = {"path": path, "owner_uid": owner_uid, "kind": kind, "victim_uid": victim_uid, "job_id": job_id,
                "action": action[:500], "seen_at": int(time.time()),
                "count": (previous.count + 1) if previous is not None and previous.path == path else 1}
        write_file_at(sfd, name, json.dumps(body, sort_keys=True).encode() + b"\n", mode=0o644)
    finally:
        os.close(sfd)


def read_squats(node: str, state_root: str = STATE_ROOT) -> list[Squat]:
    """Every squat recorded on ``node``, newest first (empty when none or unreadable)."""
    from slurm_bt.posix.safefs import UnsafeEntry

    try:
        rfd = os.open(f"{state_root}/{node}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        try:
            sfd = open_dir_at(rfd, SQUATS_DIR)
        except (OSError, UnsafeEntry):
            return []
        try:
            if os.fstat(sfd).st_uid != 0:
                return []
            found = []
            for name in sorted(os.listdir(sfd))[: MAX_RECORDS * 2]:
                if name.endswith(".json") and not name.startswith("."):
                    sq = _parse(read_trusted_file(f"/proc/self/fd/{sfd}/{name}", max_bytes=_MAX_RECORD_BYTES))
                    if sq is not None:
                        found.append(sq)
            return sorted(found, key=lambda s: -s.seen_at)
        finally:
            os.close(sfd)
    finally:
        with contextlib.suppress(OSError):
            os.close(rfd)


def sidestep_squat(parent_fd: int, parent: str, name: str, *, aside_tag: str, what: str, why: str,
                   node: str, victim_uid: int, job_id: str, state_root: str, removal_deadline: float,
                   warn: Callable[[str], None], notes: list[str], note_label: str,
                   record: Callable[..., None] | None = None) -> None:
    """Rename a squatted ``name`` aside, remove it (bounded), log and record the squat.

    The one sidestep of the root hooks' squat handling (the per-user runtime directory, the weights
    tiers): the entry is renamed to ``<ASIDE_PREFIX><aside_tag>-<random>`` in the same directory
    first, so the real name is free at once even if removing the squatter's tree runs out of time.
    An entry that vanished meanwhile is not an error: the caller retries creating the name.

    Args:
        what: what the name is, for the log line (``runtime directory``, ``weights tier``).
        why: whose directory belongs there (``where uid 1001's directory belongs``).
        removal_deadline: ``time.monotonic()`` value after which the removal stops.
        warn: the hook log's warning writer; ``notes`` gets ``<note_label> squat by uid N sidestepped``.
        record: :func:`record_squat` (default), or a stand-in with its signature for a caller running
            as the shared-filesystem identity, which records in the parent (root's notes).
    """
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return  # gone meanwhile: the caller retries creating it
    aside = f"{ASIDE_PREFIX}{aside_tag}-{secrets.token_hex(8)}"
    try:
        os.rename(name, aside, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except FileNotFoundError:
        return
    report = remove_tree_at(parent_fd, aside, deadline=removal_deadline)
    action = "moved aside and removed"
    if report.leftovers:
        action = f"moved aside to {parent}/{aside}; {len(report.leftovers)} entries could not be removed"
    path = f"{parent}/{name}"
    kind = entry_kind(st.st_mode)
    warn(f"squatted {what} {path}: a {kind} owned by uid {st.st_uid} "
         f"(mode {stat.S_IMODE(st.st_mode):04o}) {why}; {action}")
    notes.append(f"{note_label} squat by uid {st.st_uid} sidestepped")
    try:
        (record or record_squat)(node, path=path, owner_uid=st.st_uid, kind=kind, victim_uid=victim_uid,
                                 job_id=job_id, action=action, state_root=state_root)
    except OSError as exc:  # a report only: the hook log above has it
        warn(f"cannot record the squat of {path}: {exc}")
