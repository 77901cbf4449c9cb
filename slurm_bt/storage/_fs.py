"""The part of a backend that fsspec does well: listing, stat, small reads and writes, "directories".

:class:`FsspecBackend` wraps one fsspec filesystem (s3fs, gcsfs, adlfs, HfFileSystem,
HTTPFileSystem) and maps its builtin exceptions once (:func:`~slurm_bt.storage.base.map_os_error`).
Subclasses build the filesystem from our :class:`~slurm_bt.storage.endpoints.StorageEndpoints` and
:class:`~slurm_bt.storage.credentials.Credentials` and turn its ``info`` dicts into
:class:`~slurm_bt.storage.base.RemoteFile` (size, version pin, the checksums the listing gives).
The byte path (:meth:`open_range`) is each subclass's own: pinned, large reads (see ``_http.py``).
"""

from __future__ import annotations

from typing import Any

from slurm_bt.errors import SourceError, SourceNotFoundError
from slurm_bt.storage.base import Backend, Listing, RemoteFile, listing_digest, map_os_error, retry_transient
from slurm_bt.storage.url import safe_relative_path

__all__ = ["FsspecBackend"]


class FsspecBackend(Backend):
    """A backend whose metadata and small-object operations go through an fsspec filesystem."""

    fs: Any
    list_retries: int = 4

    def _root(self) -> str:
        """The fsspec path of the URL's root (``bucket/prefix``)."""
        raise NotImplementedError

    def _fs_path(self, path: str) -> str:
        root = self._root().rstrip("/")
        return f"{root}/{path}" if path else root

    def _to_remote(self, path: str, info: dict[str, Any]) -> RemoteFile:
        """One ``info`` dict as a :class:`RemoteFile` (version pin and listed checksums)."""
        raise NotImplementedError

    def _call(self, what: str, fn: Any, *args: Any, file: str | None = None, **kwargs: Any) -> Any:
        def once() -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                raise map_os_error(exc, self.url.canonical, file=file, what=what) from exc

        return retry_transient(once, self.list_retries)

    def list_files(self) -> Listing:
        """``find`` under the root (directory semantics: ``p`` never matches ``p-2/``)."""
        root = self._root().rstrip("/")
        found: dict[str, dict[str, Any]] = self._call("listing", self.fs.find, root + "/", detail=True)
        self.fs.invalidate_cache()
        files = []
        for name, info in sorted(found.items()):
            if info.get("type") == "directory":
                continue
            path = name[len(root) + 1:] if name.startswith(root + "/") else name
            if path.endswith("/") and not int(info.get("size") or 0):
                continue  # a "folder" marker made by consoles
            if not safe_relative_path(path):
                raise SourceError(self.url.canonical, f"object name {name!r} cannot be mirrored safely "
                                  "(empty, '.' or '..' segment, or control character)")
            files.append(self._to_remote(path, info))
        if not files:
            raise SourceNotFoundError(self.url.canonical, "no object under this prefix")
        return Listing(self.url, listing_digest(files), tuple(files))

    def stat(self, path: str) -> RemoteFile:
        """``info`` of one object (fresh, not from fsspec's listing cache)."""
        self.fs.invalidate_cache()
        info = self._call("stat", self.fs.info, self._fs_path(path), file=path)
        if info.get("type") == "directory":
            raise SourceNotFoundError(self.url.canonical, "not found (a directory)", file=path)
        return self._to_remote(path, info)

    def read_bytes(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        """A small object's content, or None when absent (size-capped before reading)."""
        if self.small_object(path, max_bytes) is None:
            return None
        data: bytes = self._call("read", self.fs.cat_file, self._fs_path(path), file=path)
        return data

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace a small object in one request (object stores publish it atomically)."""
        if not self.writable:
            super().write_bytes(path, data)
        self._call("write", self.fs.pipe_file, self._fs_path(path), data, file=path)
        self.fs.invalidate_cache()

    def presigned_url(self, path: str, expires_s: int) -> str:
        """fsspec's ``sign``: gcsfs signs with service-account keys, adlfs with an account key (SAS)."""
        try:
            url = self.fs.sign(self._fs_path(path), expiration=expires_s)
        except NotImplementedError:
            raise SourceError(self.url.canonical, f"{self.url.scheme}:// cannot presign URLs", file=path) from None
        except Exception as exc:  # e.g. gcsfs without a service-account key: say so, per file
            raise SourceError(self.url.canonical, f"cannot presign with these credentials: "
                              f"{type(exc).__name__}: {exc}", file=path) from exc
        return str(url)

    def delete_prefix(self, prefix: str) -> int:
        """Delete everything under ``prefix/`` (fsspec ``rm`` recursive); returns the objects listed first."""
        base = self._fs_path(prefix.strip("/"))
        if not prefix.strip("/"):
            raise SourceError(self.url.canonical, "refusing to delete the whole store", file=prefix)
        self.fs.invalidate_cache()
        try:
            found = self._call("listing", self.fs.find, base.rstrip("/") + "/")
        except SourceNotFoundError:
            return 0
        if found:
            self._call("delete", self.fs.rm, list(found), file=prefix)
            self.fs.invalidate_cache()
        return len(found)

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate "subdirectories" of ``prefix`` (common prefixes)."""
        base = self._fs_path(prefix.strip("/"))
        self.fs.invalidate_cache()
        try:
            entries = self._call("listing", self.fs.ls, base, detail=True)
        except SourceNotFoundError:
            return []
        names = []
        for entry in entries:
            if entry.get("type") == "directory":
                name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
                if name:
                    names.append(name)
        return sorted(set(names))
