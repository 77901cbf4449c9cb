"""``file:///dir``: a local or shared directory behind the same interface as the object stores.

Reads open every component with ``O_NOFOLLOW`` relative to its parent's descriptor and accept
only regular files (a symlink, FIFO or device is never followed or opened); writes are
temp + fsync + rename (:func:`slurm_bt.atomic.atomic_output`). The version pin is
``<mtime_ns>-<size>-<inode>``, so a file replaced after it was listed fails the read instead of
mixing versions. Who may read or write what is the filesystem's business here; the checkpoint
store's stricter ownership rules for shared roots live with it (docs/checkpoints.md).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from slurm_bt.atomic import atomic_output
from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError
from slurm_bt.storage.base import (
    Backend,
    BodyStream,
    Listing,
    Pinned,
    RangeStream,
    RemoteFile,
    TransportOptions,
    listing_digest,
)
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.url import StorageUrl, safe_relative_path

__all__ = ["FileBackend"]

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}"


class FileBackend(Backend):
    """A directory tree (no credentials: the filesystem's permissions apply)."""

    writable = True

    def __init__(self, url: StorageUrl, *, credentials: Credentials | None = None,
                 endpoints: StorageEndpoints | None = None, options: TransportOptions | None = None) -> None:
        """Bind to the directory ``url.prefix``; nothing is opened yet."""
        self.url = url
        self.root = Path(url.prefix)

    def _err(self, exc: OSError, path: str) -> SourceError:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return SourceAccessError(self.url.canonical, f"permission denied: {exc.strerror}", file=path)
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return SourceNotFoundError(self.url.canonical, "not found", file=path)
        if exc.errno == errno.ELOOP:
            return SourceError(self.url.canonical, "is a symlink (never followed)", file=path)
        return SourceError(self.url.canonical, exc.strerror or str(exc), file=path)

    def _parts(self, path: str) -> list[str]:
        if path and not safe_relative_path(path):
            raise SourceError(self.url.canonical, "invalid path", file=path)
        return [p for p in path.split("/") if p]

    def _open_dir(self, parts: list[str], *, create: bool = False) -> int:
        fd = os.open(str(self.root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for name in parts:
                if create:
                    try:
                        os.mkdir(name, 0o750, dir_fd=fd)
                    except FileExistsError:
                        pass
                nfd = os.open(name, _DIR, dir_fd=fd)
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_file(self, path: str) -> tuple[int, os.stat_result]:
        parts = self._parts(path)
        dfd = self._open_dir(parts[:-1])
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise SourceError(self.url.canonical, "is not a regular file", file=path)
        return fd, st

    def stat(self, path: str) -> RemoteFile:
        """Size and version of one regular file (never through a symlink)."""
        try:
            fd, st = self._open_file(path)
        except OSError as exc:
            raise self._err(exc, path) from exc
        os.close(fd)
        return RemoteFile(path, st.st_size, None, etag=_version(st))

    def list_files(self) -> Listing:
        """Every regular file below the root (symlinks and special files are left out)."""
        files: list[RemoteFile] = []

        def walk(dfd: int, rel: str) -> None:
            with os.scandir(dfd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for entry in entries:
                path = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = os.open(entry.name, _DIR, dir_fd=dfd)
                    try:
                        walk(sub, path)
                    finally:
                        os.close(sub)
                elif stat.S_ISREG(st.st_mode) and safe_relative_path(path):
                    files.append(RemoteFile(path, st.st_size, None, etag=_version(st)))

        try:
            root = self._open_dir([])
            try:
                walk(root, "")
            finally:
                os.close(root)
        except OSError as exc:
            raise self._err(exc, "") from exc
        if not files:
            raise SourceNotFoundError(self.url.canonical, "no file under this directory")
        return Listing(self.url, listing_digest(files), tuple(files))

    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """``pread`` of ``[start, end)``; the file must still be the version listed."""
        try:
            fd, st = self._open_file(file.path)
        except OSError as exc:
            raise self._err(exc, file.path) from exc
        if file.etag and _version(st) != file.etag:
            os.close(fd)
            raise SourceError(self.url.canonical, "object changed since it was resolved; resolve again",
                              file=file.path, offset=start)
        pos = [start]
        stop = st.st_size if end is None else min(end, st.st_size)

        def read(n: int) -> bytes:
            want = min(n, stop - pos[0])
            data = os.pread(fd, want, pos[0]) if want > 0 else b""
            pos[0] += len(data)
            return data

        return BodyStream(read, lambda: os.close(fd), partial=True, uri=self.url.canonical, file=file.path,
                          start=start, errors=(OSError,))

    def write_bytes(self, path: str, data: bytes) -> None:
        """temp + fsync + rename into a directory opened without following symlinks."""
        parts = self._parts(path)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            dfd = self._open_dir(parts[:-1], create=True)
            try:
                with atomic_output(Path(f"/proc/self/fd/{dfd}") / parts[-1], mode=0o640) as out:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(out, view):]
            finally:
                os.close(dfd)
        except OSError as exc:
            raise self._err(exc, path) from exc

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate subdirectories (symlinks left out)."""
        try:
            dfd = self._open_dir(self._parts(prefix.strip("/")))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._err(exc, prefix) from exc
        try:
            with os.scandir(dfd) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        finally:
            os.close(dfd)
