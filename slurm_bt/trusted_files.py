"""Reading files whose *owner* is what makes them trustworthy.

Several hand-offs cross a trust boundary through a file: the root prolog's verdict for the job's step 1,
the prolog's record of staged weights, a pin record in a team's cluster cache. The reader must not be
fooled by a symlink, a FIFO (which would block it), a file someone else could have written, or a huge
file. One function does this, so every such hand-off is checked the same way.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Callable
from pathlib import Path

from slurm_bt.errors import StorageError

__all__ = ["check_own_dir", "describe_owner", "is_group_member", "is_team_dir", "owned_by_root", "read_trusted_file"]


def owned_by_root(st: os.stat_result) -> bool:
    """The default rule: written by root."""
    return st.st_uid == 0


def read_trusted_file(path: str | Path, *, max_bytes: int,
                      owner_ok: Callable[[os.stat_result], bool] = owned_by_root) -> bytes | None:
    """The content of ``path``, or ``None`` when it is absent or not trustworthy.

    Trustworthy: a regular file (opened without following a symlink, without blocking on a FIFO),
    whose owner passes ``owner_ok``, that neither group nor others may write, and no larger than
    ``max_bytes``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or not owner_ok(st) or stat.S_IMODE(st.st_mode) & 0o022
                or st.st_size > max_bytes):
            return None
        chunks = []
        size = 0
        while size <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return None if size > max_bytes else b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def describe_owner(st: os.stat_result) -> str:
    """``owner NAME, group NAME, mode 0NNN`` of a stat result, for refusal messages."""
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return f"owner {owner}, group {group}, mode {stat.S_IMODE(st.st_mode):04o}"


def is_group_member(uid: int, gid: int) -> bool:
    """Whether the user ``uid`` is in group ``gid`` (primary or supplementary, per the group database)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return False
    if pw.pw_gid == gid:
        return True
    try:
        return pw.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def is_team_dir(st: os.stat_result, gid: int) -> bool:
    """The one rule for a directory that belongs to team group ``gid`` (team weights tier, checkpoint projects).

    Exactly what slurm-bt (``<member>:<team> 2770``) or an admin (``root:<team> 2770/3770``) creates: a
    real directory whose group is the team's, owned by root or a member of that group, and closed to
    others. Nobody outside the team can create a directory with the team's group (``chown``/``chgrp``
    to a group one is not in is refused by the kernel), so a name squatted by another user in a
    world-writable parent always fails it.
    """
    return (stat.S_ISDIR(st.st_mode) and st.st_gid == gid and not stat.S_IMODE(st.st_mode) & 0o007
            and (st.st_uid == 0 or is_group_member(st.st_uid, gid)))


def check_own_dir(path: Path) -> None:
    """Raise :class:`StorageError` unless ``path`` is the caller's own real directory.

    A per-job directory must be the user's own real directory, whoever made the name first.

    Why: a host job may name its checkpoint directory anywhere (``checkpoint_path``), e.g. in ``/tmp``,
    where another user can create that name first, as a directory open to them or a symlink into their
    home, and then read or replace the job's checkpoints. ``mkdir(exist_ok=True)`` alone would adopt it.
    """
    try:
        st = path.lstat()
    except OSError as exc:
        raise StorageError(str(path), f"cannot check the directory: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise StorageError(str(path), "is a symlink or not a directory; this job's directories must be real "
                           "directories of yours (remove it, or choose a path under your home or leave "
                           "checkpoint_path unset)")
    if st.st_uid != os.getuid():
        raise StorageError(str(path), f"belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): someone else "
                           "created it first, so they could read or change what this job writes there; choose "
                           "a path under your home, or leave checkpoint_path unset (node-local scratch)")
    parent = path.parent.lstat()
    if parent.st_uid not in (0, os.getuid()):  # its owner could rename ours away and put theirs in its place
        raise StorageError(str(path), f"is in {path.parent}, which belongs to uid {parent.st_uid}: they could swap "
                           "this directory for their own; choose a path under your home, or leave "
                           "checkpoint_path unset (node-local scratch)")
