"""Durable, atomic publishing of files and directories: the one place the project does it.

Correctness on shared filesystems comes from *unique temp name + fsync + rename + fsync(dir)*,
never from locks: ``flock`` silently succeeds for everyone on Lustre, GPFS and some NFS mounts.
``rename`` is atomic but not durable until the parent directory is
fsynced (microsoft/CCF#7030), so every publish ends with :func:`fsync_dir`.

Temp files are created with ``O_CREAT|O_EXCL|O_NOFOLLOW`` so a pre-planted file or symlink at the
temp name is never written through, and their mode is set with
``fchmod`` so the result does not depend on the caller's umask.

Every failure is raised as :class:`~slurm_bt.errors.StorageError` (an ``OSError``) naming the path;
no message ever contains the data being written.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from slurm_bt.errors import StorageError

__all__ = [
    "atomic_output",
    "fsync_dir",
    "make_private_dir",
    "publish_dir_atomic",
    "syncfs",
    "temp_name",
    "write_file_atomic",
]

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def temp_name(final: Path) -> Path:
    """A process-unique temp path beside ``final`` (same directory, hence same filesystem).

    The name starts with a dot and contains ``.tmp-`` so that garbage collectors can recognise
    leftovers of a killed process, and it never matches a secret or snapshot name.
    """
    return final.with_name(temp_basename(final.name))


def temp_basename(name: str) -> str:
    """The last component of :func:`temp_name` for a file called ``name`` (for callers that build
    many paths as strings: pathlib's parsing cost ~20 us a file over 10,000 small blobs)."""
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(6)}"


def _reason(exc: OSError) -> str:
    return exc.strerror or exc.__class__.__name__


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (creations, renames, unlinks) to stable storage.

    Some filesystems (certain FUSE and network mounts) reject fsync on a directory with
    ``EINVAL``; there is nothing more we can do there, so that case is ignored.

    Raises:
        StorageError: the directory cannot be opened or flushed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(str(path), f"cannot open directory to fsync: {_reason(exc)}") from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise StorageError(str(path), f"cannot fsync directory: {_reason(exc)}") from exc
    finally:
        os.close(fd)


def syncfs(fd: int) -> None:
    """Flush every dirty page and metadata change of the filesystem holding ``fd`` (``syncfs(2)``).

    Why: publishing thousands of small files with an fsync of each file and of its directory costs
    two journal commits per file (10,000 files of 4 KiB: seconds, most of a node copy). A batch of
    files written to temp names is made durable by one ``syncfs`` before any of them is renamed to
    its final name, and the renames by a second one, so a name under which readers trust a file
    still always points at durable bytes. ``syncfs`` waits only for this filesystem (``sync(2)``
    would wait for all of them); where the C library lacks it, ``sync`` is the fallback.

    Raises:
        StorageError: the filesystem reported a write-back error (e.g. EIO, ENOSPC).
    """
    if _SYNCFS is None:
        os.sync()
        return
    if _SYNCFS(fd) != 0:
        err = ctypes.get_errno()
        raise StorageError(f"/proc/self/fd/{fd}", f"syncfs failed: {os.strerror(err)}")


def _load_syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int]
    func.restype = ctypes.c_int
    return func


_SYNCFS = _load_syncfs()


@contextmanager
def atomic_output(path: Path, *, mode: int = 0o600) -> Iterator[int]:
    """A writable descriptor whose content appears at ``path`` only if the ``with`` block succeeds.

    The one publish protocol for every file slurm-bt writes: a unique
    temp file beside ``path`` (``O_EXCL|O_NOFOLLOW``), written and verified by the caller inside the
    block, then ``fchmod(mode)`` (umask-independent), ``fsync``, ``rename`` over ``path`` and
    ``fsync`` of the directory. A symlink or hard link already at ``path`` is replaced, never
    written through. If the block raises, the temp file is removed and the exception propagates.

    Raises:
        StorageError: naming ``path``, when the temp file cannot be created or published.
    """
    tmp = temp_name(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except OSError as exc:
        raise StorageError(str(path), f"cannot create temp file: {_reason(exc)}") from exc
    try:
        try:
            yield fd
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except StorageError:  # the caller's own verdict (e.g. IntegrityError): keep it as it is
        _unlink_quietly(tmp)
        raise
    except OSError as exc:
        _unlink_quietly(tmp)
        raise StorageError(str(path), f"cannot write atomically: {_reason(exc)}") from exc
    except BaseException:
        _unlink_quietly(tmp)
        raise
    fsync_dir(path.parent)


def write_file_atomic(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` so readers see the old content or the new, never a mix.

    See :func:`atomic_output` for the protocol.

    Args:
        path: the final path; its directory must exist.
        data: the full new content.
        mode: permission bits of the new file.

    Raises:
        StorageError: naming ``path`` (never the data).
    """
    with atomic_output(path, mode=mode) as fd:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """``renameat2(RENAME_NOREPLACE)``; False when the kernel or filesystem does not support it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):  # glibc < 2.28 or musl without the wrapper
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    rc = func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    # NFS and some FUSE filesystems reject the flag with EINVAL; old kernels lack the call.
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(dst))


def publish_dir_atomic(tmp_dir: Path, final_dir: Path) -> None:
    """Move a fully built directory into place in one step, refusing to replace anything.

    The caller must have fsynced the files inside ``tmp_dir``; this fsyncs ``tmp_dir`` itself,
    renames it to ``final_dir`` and fsyncs the parent. ``rename(2)`` would silently replace an
    existing *empty* directory, so ``renameat2(RENAME_NOREPLACE)`` is used where the filesystem
    supports it; elsewhere (NFS) an existence check precedes the rename, which leaves a narrow race
    in which a concurrently created empty directory could be replaced. ``tmp_dir`` is not removed
    on failure: the caller owns it.

    Args:
        tmp_dir: the built directory, on the same filesystem as ``final_dir``.
        final_dir: where it should appear; must not exist.

    Raises:
        StorageError: ``final_dir`` exists, or the rename or a flush failed.
    """
    fsync_dir(tmp_dir)
    try:
        if not _rename_noreplace(tmp_dir, final_dir):
            if os.path.lexists(final_dir):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(final_dir))
            os.rename(tmp_dir, final_dir)
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise StorageError(str(final_dir), "already exists; refusing to replace it") from exc
        raise StorageError(str(final_dir), f"cannot publish {tmp_dir}: {_reason(exc)}") from exc
    fsync_dir(final_dir.parent)


def make_private_dir(path: Path, mode: int = 0o700, *, parents: bool = False) -> None:
    """Create a directory only the current user can use, or adopt one that is safely ours.

    Create, don't adopt: an existing entry is accepted only if it is
    a real directory (not a symlink) owned by the current uid; its mode is then set to ``mode``.
    The check and the chmod go through one ``O_NOFOLLOW`` file descriptor, so the entry cannot be
    swapped in between.

    Args:
        path: the directory.
        mode: its permission bits (applied with ``fchmod``, so umask does not matter).
        parents: create missing parents too (each with ``mode``; existing parents are left alone).

    Raises:
        StorageError: the entry exists but is a symlink, not a directory or owned by someone else,
            or it cannot be created.
    """
    if parents and not path.parent.exists() and path.parent != path:
        make_private_dir(path.parent, mode, parents=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(str(path), f"cannot create directory: {_reason(exc)}") from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StorageError(
                str(path), "exists but is a symlink or not a directory; remove it and retry"
            ) from exc
        raise StorageError(str(path), f"cannot open directory: {_reason(exc)}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(str(path), "exists but is not a directory; remove it and retry")
        if st.st_uid != os.getuid():
            raise StorageError(
                str(path), f"is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); refusing to use it"
            )
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        raise StorageError(str(path), f"cannot set directory mode: {_reason(exc)}") from exc
    finally:
        os.close(fd)
