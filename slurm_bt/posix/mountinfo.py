"""The one parser of ``/proc/self/mountinfo``: which mounts exist, and on which filesystem a path lives.

Two callers need it: the safe tree removal (:func:`slurm_bt.posix.safefs.remove_tree_at`) must not
descend into a mount point below the tree, including same-device bind mounts that an ``st_dev``
comparison alone would miss; and the checkpoint uploader asks whether a directory is on a shared
filesystem (:func:`slurm_bt.checkpoints.locations.is_shared_fs`). Fields are as in proc(5): the mount
point is field 5, the filesystem type is the first field after the ``-`` separator, and both escape
space, tab, newline and backslash as three-digit octal (``\\040``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["MOUNTINFO", "Mount", "filesystem_type", "mount_points_below", "mount_points_under", "read_mounts"]

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: the mount point (unescaped) and the filesystem type (``""`` if absent)."""

    point: str
    fstype: str


def _unescape(field: str) -> str:
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def read_mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """Every mount of this mount namespace, in file order (empty if the file cannot be read)."""
    mounts = []
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) > 4:
                    mounts.append(Mount(_unescape(fields[4]), _unescape(right.split()[0]) if right.split() else ""))
    except OSError:
        return []
    return mounts


def mount_points_under(path: str, mountinfo: str = MOUNTINFO) -> list[str]:
    """Mount points strictly below ``path`` in this mount namespace, sorted."""
    prefix = path.rstrip("/") + "/"
    return sorted(m.point for m in read_mounts(mountinfo) if m.point.startswith(prefix))


def mount_points_below(path: str) -> frozenset[tuple[str, ...]]:
    """:func:`mount_points_under` ``path`` as path components relative to it (``remove_tree_at``'s form)."""
    real = os.path.realpath(path)
    return frozenset(tuple(m[len(real) + 1:].split("/")) for m in mount_points_under(real))


def filesystem_type(path: str | os.PathLike[str], mountinfo: str = MOUNTINFO) -> str:
    """Filesystem type of the longest mount point containing ``path`` (``""`` if unknown)."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    for m in read_mounts(mountinfo):
        inside = real == m.point or real.startswith(m.point.rstrip("/") + "/")
        if inside and len(m.point) >= len(best):
            best, fstype = m.point, m.fstype
    return fstype
