"""Open files a job controls, for a root-started process or its privilege-dropped child, safely.

Why: after a job ends, the epilog's flush and the detached hand-off sweep still read what the job
left (its ``job.json``, the uploader's state file, checkpoint files). A job can swap any of them for
a FIFO (``open``/``read`` block for ever), a device such as ``/dev/zero`` (a read never ends: one
sweep reached 16.7 GB resident), or a symlink to either. So every such read here

* walks the path from ``/`` one component at a time, never following a symlink a user could have
  made: a symlink is followed only if root owns it (an admin's ``/home -> /data/home``), and the
  last component is never a symlink (``O_NOFOLLOW``);
* opens the last component ``O_PATH`` first and checks ``fstat`` is a regular file before a real
  ``open`` (through ``/proc/self/fd``, ``O_NONBLOCK``), so a FIFO or device is never opened at all
  and its driver never runs;
* reads at most ``max_bytes`` (callers pass a small cap for JSON and the ``fstat`` size for
  checkpoint files; the stores read exactly that many bytes with ``pread``).

Refusals raise :class:`UnsafeFile` (an ``OSError``), so callers that already handle "cannot read"
need nothing new. The walk is :func:`slurm_bt.posix.safefs.walk_dirs`, the one that
:func:`slurm_bt.posix.safefs.open_trusted_dir` uses too; that one demands root-owned directories,
here the directories belong to the user (no ownership rule, root-owned symlinks followed).
"""

from __future__ import annotations

import errno
import os
import stat

from slurm_bt.posix.safefs import walk_dirs

__all__ = ["UnsafeFile", "open_user_file", "read_fd_capped", "read_user_file"]

_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A file a job controls is not something we read: a symlink, FIFO, device, or too large."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EINVAL, f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _open_parent(path: str) -> tuple[int, str]:
    """An ``O_PATH`` descriptor of the directory holding ``path``'s last component, and that name."""
    if not path.startswith("/"):
        raise UnsafeFile(path, "not an absolute path")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or parts[-1] == "..":
        raise UnsafeFile(path, "does not name a file")
    last = parts.pop()
    parent = walk_dirs("/" + "/".join(parts), flags=_PATH_FLAGS, refuse=lambda _shown, why: UnsafeFile(path, why),
                       follow_root_symlinks=True)
    return parent, last


def open_user_file(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> int:
    """Open a file a job controls for reading (module docstring); returns an ``O_RDONLY`` descriptor.

    Args:
        path: absolute path.
        max_bytes: refuse files larger than this (``None``: any size).

    Raises:
        UnsafeFile: a user's symlink on the way, not a regular file, or larger than ``max_bytes``.
        OSError: the file does not exist or cannot be opened (``FileNotFoundError``...).
    """
    text = os.fspath(path)
    parent, name = _open_parent(text)
    try:
        pfd = os.open(name, _PATH_FLAGS, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        st = os.fstat(pfd)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFile(text, "is a symlink (not followed)")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(text, "is not a regular file (a FIFO, device or directory is never read)")
        if max_bytes is not None and st.st_size > max_bytes:
            raise UnsafeFile(text, f"is {st.st_size} bytes, more than the {max_bytes} allowed")
        # Reopen the very inode we checked (an O_PATH descriptor cannot be read).
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(pfd)
    again = os.fstat(fd)
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(again.st_mode):
        os.close(fd)
        raise UnsafeFile(text, "changed while being opened")
    return fd


def read_user_file(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """The bytes of a file a job controls, at most ``max_bytes`` (see :func:`open_user_file`).

    Raises:
        UnsafeFile: as :func:`open_user_file`, or the file grew past ``max_bytes`` while read.
        OSError: it cannot be opened or read.
    """
    fd = open_user_file(path, max_bytes=max_bytes)
    try:
        data = read_fd_capped(fd, max_bytes)
    finally:
        os.close(fd)
    if data is None:
        raise UnsafeFile(os.fspath(path), f"grew past the {max_bytes} bytes allowed while being read")
    return data


def read_fd_capped(fd: int, max_bytes: int) -> bytes | None:
    """All of ``fd`` from its offset, or None once it holds more than ``max_bytes`` (it grew after
    the ``fstat`` that checked its size): never more than ``max_bytes + 1`` bytes are read."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
