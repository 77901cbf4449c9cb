"""What every storage backend offers, and the parts that are the same for all of them.

A backend (one class per scheme, found through :mod:`slurm_bt.storage.registry`) is bound to one
:class:`~slurm_bt.storage.url.StorageUrl` and answers:

* ``list_files()``: every object under the URL's root, each with its size, its version pin (ETag,
  GCS generation, Azure ETag, HF LFS oid / blob id) and the checksums the *listing* gives, so
  nothing has to be downloaded twice to know what it should hash to;
* ``stat(path)``: the same for one object (a HEAD where the listing lacks checksums);
* ``open_range(file, start, end)``: a byte range of one object **pinned to the listed version**
  (``If-Match`` / ``generation`` / commit in the URL), so an object replaced meanwhile fails with
  "changed since it was resolved" instead of mixing two versions;
* ``read_bytes`` / ``write_bytes`` / ``list_dirs``: small objects and one level of "directories"
  (checkpoint indexes and listings).

Errors are mapped once (:func:`map_os_error` for fsspec's builtin exceptions, :func:`http_status_error`
in :mod:`._http` for raw HTTP) into the tree in :mod:`slurm_bt.errors`: ``SourceAccessError`` (bad or
missing credentials), ``SourceNotFoundError``, ``SourceUnavailableError`` (transient: retried by
callers) and ``SourceError`` for the rest. All of them are ``StorageError``.

What fsspec does not do stays in slurm-bt and is built on top of this interface: pinning and
verification (sha256 plus the origin's checksum on the same pass), parallel ranged transfer with
per-part resume (:mod:`slurm_bt.weights.download`), atomic publish (:mod:`slurm_bt.atomic`) and
resumable verified uploads (the S3 backend's multipart upload).
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from slurm_bt.errors import (
    SourceAccessError,
    SourceError,
    SourceNotFoundError,
    SourceUnavailableError,
)
from slurm_bt.storage.checksums import OriginChecksum
from slurm_bt.storage.url import StorageUrl

__all__ = [
    "Backend",
    "BodyStream",
    "Listing",
    "Pinned",
    "RangeStream",
    "RemoteFile",
    "TransportOptions",
    "backoff_delay_s",
    "listing_digest",
    "map_os_error",
    "read_all",
    "retry_transient",
]

T = TypeVar("T")


@dataclass(frozen=True)
class TransportOptions:
    """Network knobs shared by all backends.

    Attributes:
        connect_timeout_s: TCP/TLS connect timeout per attempt.
        read_timeout_s: longest silence tolerated on one read (a stalled origin fails here).
        max_connections: connection-pool size; at least the number of parallel ranges.
        list_retries: attempts for metadata calls (listing, HEAD) on transient errors.
    """

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    max_connections: int = 32
    list_retries: int = 4


@dataclass(frozen=True)
class RemoteFile:
    """One listed object, before it has a verified sha256.

    Attributes:
        path: POSIX path relative to the URL's root.
        size: bytes.
        sha256: lower-case hex when the origin publishes a trustworthy one (HF LFS oid, S3
            full-object ``ChecksumSHA256``, an HTTPS ``Repr-Digest``); None = computed by streaming.
        etag: the version pin (S3/Azure ETag, GCS generation, HF oid).
        checksums: what else the origin says the content hashes to (checksums.py); checked on the
            same pass that computes the sha256, so a corrupted body is never published.
    """

    path: str
    size: int
    sha256: str | None
    etag: str | None = None
    checksums: tuple[OriginChecksum, ...] = ()


@dataclass(frozen=True)
class Listing:
    """A URL listed at one immutable revision.

    Attributes:
        uri: the URL as the origin spells it (HF: the Hub's repo id, revision = the commit).
        revision: HF commit; for object stores a digest of (path, size, etag) of every object.
        files: every object under the root, unfiltered.
    """

    uri: StorageUrl
    revision: str
    files: tuple[RemoteFile, ...]


class Pinned(Protocol):
    """Anything naming one object version: a :class:`RemoteFile` or a manifest entry."""

    @property
    def path(self) -> str:
        """Path relative to the URL's root."""
        ...

    @property
    def etag(self) -> str | None:
        """The version pin from the listing."""
        ...


class RangeStream(Protocol):
    """An open response body for one byte range.

    ``partial`` is False when the origin ignored the Range header and is sending the whole object
    from byte 0 (the download engine then restarts the file from 0).
    """

    partial: bool

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; ``b""`` at end. Network failures raise SourceUnavailableError."""
        ...

    def close(self) -> None:
        """Release the connection (never raises)."""
        ...


class BodyStream:
    """Any client's response body behind the :class:`RangeStream` API.

    Read failures of the listed types become :class:`SourceUnavailableError` naming the URL, the
    file and the byte offset reached, so the engine can resume from there whatever the client.
    """

    def __init__(self, read: Callable[[int], bytes], close: Callable[[], None], *, partial: bool, uri: str,
                 file: str, start: int, errors: tuple[type[BaseException], ...] = (Exception,)) -> None:
        self._read = read
        self._close = close
        self.partial = partial
        self._uri = uri
        self._file = file
        self._pos = start
        self._errors = errors

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; ``b""`` at end."""
        try:
            data = self._read(n)
        except self._errors as exc:
            raise SourceUnavailableError(
                self._uri, f"connection failed while reading: {type(exc).__name__}: {exc}",
                file=self._file, offset=self._pos, transient=True,
            ) from exc
        self._pos += len(data)
        return data

    def close(self) -> None:
        """Release the connection; closing must never mask the real error."""
        try:
            self._close()
        except Exception:  # noqa: S110
            pass


def read_all(stream: RangeStream, limit: int | None = None) -> bytes:
    """Everything ``stream`` sends (at most ``limit + 1`` bytes are read when a limit is given)."""
    chunks: list[bytes] = []
    got = 0
    try:
        while limit is None or got <= limit:
            chunk = stream.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        stream.close()
    return b"".join(chunks)


def backoff_delay_s(attempt: int, base_s: float = 0.2, cap_s: float = 5.0) -> float:
    """Full-jitter exponential backoff: uniform in ``[0, min(cap, base * 2**attempt)]``."""
    return random.uniform(0, min(cap_s, base_s * (2**attempt)))  # noqa: S311 - jitter, not crypto


def retry_transient(call: Callable[[], T], attempts: int, *, base_s: float = 0.2) -> T:
    """Run ``call``; on :class:`SourceUnavailableError` retry up to ``attempts`` times in all."""
    for attempt in range(max(1, attempts)):
        try:
            return call()
        except SourceUnavailableError:
            if attempt + 1 >= attempts:
                raise
            time.sleep(backoff_delay_s(attempt, base_s))
    raise AssertionError("unreachable")


def listing_digest(files: list[RemoteFile]) -> str:
    """The "revision" of an object-store listing: sha256 over (path, size, etag) of every object."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\t{f.size}\t{f.etag or ''}\n".encode())
    return h.hexdigest()


# Transport failures by exception name; azure-core's are ServiceRequestError (the request never went out:
# refused, DNS, TLS) and ServiceResponseError (no answer).
_TRANSPORT_HINTS = ("Connect", "Timeout", "Network", "Read", "Protocol", "Remote", "Disconnected",
                    "ServiceRequest", "ServiceResponse")


def map_os_error(exc: BaseException, uri: str, *, file: str | None = None, offset: int | None = None,
                 what: str = "request") -> SourceError:
    """Map what an fsspec filesystem raises to the error tree.

    fsspec implementations translate their service errors into builtin ones (``FileNotFoundError``
    for 404, ``PermissionError`` for 401/403); connection failures surface as ``OSError`` or the
    transport's own exception types, which are transient.
    """
    if isinstance(exc, SourceError):
        return exc
    # Service exceptions that fsspec passes through keep their HTTP status (azure-core's
    # ``status_code``, aiohttp's ``status``).
    status = getattr(exc, "status_code", None) or getattr(exc, "status", None)
    if isinstance(status, int) and status in (401, 403):
        exc = PermissionError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    elif isinstance(status, int) and status == 404:
        exc = FileNotFoundError(str(exc).splitlines()[0] if str(exc) else "404")
    if isinstance(exc, PermissionError):
        return SourceAccessError(uri, f"not authorized for {uri}: {what} refused ({exc}); check the "
                                 "credentials (auth_secret_name / ?secret=) and access to it", file=file)
    if isinstance(exc, FileNotFoundError):
        return SourceNotFoundError(uri, f"{what}: not found", file=file)
    name = type(exc).__name__
    if isinstance(exc, (ConnectionError, TimeoutError)) or any(h in name for h in _TRANSPORT_HINTS):
        return SourceUnavailableError(uri, f"origin unreachable: {name}: {exc}", file=file, offset=offset,
                                      transient=True)
    if isinstance(exc, OSError) and exc.errno is None:
        return SourceUnavailableError(uri, f"{what} failed: {name}: {exc}", file=file, offset=offset,
                                      transient=True)
    return SourceError(uri, f"{what} failed: {name}: {exc}", file=file, offset=offset)


class Backend:
    """The per-scheme implementation interface (see the module docstring).

    Subclasses set :attr:`url` and implement the methods; the fsspec-based ones inherit the
    small-object and directory operations from :class:`slurm_bt.storage._fs.FsspecBackend`.
    """

    url: StorageUrl
    writable: bool = False

    @property
    def uri(self) -> StorageUrl:
        """The URL (the name weights sources use)."""
        return self.url

    @uri.setter
    def uri(self, value: StorageUrl) -> None:
        self.url = value

    def list_files(self) -> Listing:
        """Every object under the root with size, version pin and listed checksums."""
        raise NotImplementedError

    def list_files_streaming(self, on_file: Callable[[RemoteFile], None]) -> Listing:
        """:meth:`list_files`, calling ``on_file`` with each file as soon as it is final (its
        checksums known), before the listing ends, so its download can start.

        Not every file need be passed to ``on_file`` (this default passes none): callers take
        the rest from the returned listing. Only backends whose listing takes many requests (S3's
        pages) override it.
        """
        del on_file
        return self.list_files()

    def stat(self, path: str) -> RemoteFile:
        """One object's size, version pin and checksums.

        Raises:
            SourceNotFoundError: no such object.
        """
        raise NotImplementedError

    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """Bytes ``[start, end)`` of ``file`` (``end=None``: to EOF), pinned to its version.

        Raises:
            SourceAccessError, SourceNotFoundError: permanent; not retried.
            SourceUnavailableError: transient (connection refused/reset, timeout, 5xx, 429).
            SourceError: anything else, e.g. the object changed since it was listed (412).
        """
        raise NotImplementedError

    def small_object(self, path: str, max_bytes: int) -> RemoteFile | None:
        """``stat`` of an object about to be read whole: None when absent, refused above ``max_bytes``."""
        try:
            info = self.stat(path)
        except SourceNotFoundError:
            return None
        if info.size > max_bytes:
            raise SourceError(self.url.canonical, f"object is {info.size} bytes, more than {max_bytes}", file=path)
        return info

    def read_bytes(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        """A small object's content, or None when absent."""
        info = self.small_object(path, max_bytes)
        return None if info is None else read_all(self.open_range(info, 0, None), max_bytes)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Replace a small object."""
        raise SourceError(self.url.canonical, f"{self.url.scheme}:// is read-only here", file=path)

    def list_dirs(self, prefix: str) -> list[str]:
        """Names of the immediate "subdirectories" of ``prefix``."""
        raise SourceError(self.url.canonical, f"{self.url.scheme}:// cannot list directories")

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix/`` (checkpoint retention); returns how many."""
        raise SourceError(self.url.canonical, f"{self.url.scheme}:// cannot delete here", file=prefix)

    def etag_is_md5(self, file: RemoteFile) -> bool:
        """Whether ``file``'s ETag really is its content's MD5 (asked only after an MD5 mismatch)."""
        return True

    def exact_check(self, file: RemoteFile, check: OriginChecksum) -> OriginChecksum | None:
        """``check`` over the real part lengths when its assumed layout was wrong (asked only after a
        per-part mismatch, storage/s3.py); None: the layout was right, or cannot be known."""
        return None

    def presigned_url(self, path: str, expires_s: int) -> str:
        """A URL anyone holding it can GET ``path`` with for ``expires_s`` seconds (``train get_checkpoint_urls``).

        Raises:
            SourceError: this scheme (or these credentials) cannot sign URLs.
        """
        raise SourceError(self.url.canonical, f"{self.url.scheme}:// cannot presign URLs", file=path)

    def close(self) -> None:
        """Release pools and sessions."""


