"""The one small interface every backend implements, and the lazy registry that finds them.

A backend does two things only: **list** a source at one immutable revision, and **open a byte
range** of one file pinned to that revision. Everything that makes downloads fast and safe
(parallel ranges, ``pwrite``, hashing, resume, retries, temp + rename) lives once in
:mod:`slurm_bt.weights.download`, so each backend stays about a hundred lines and its heavy client
(boto3, huggingface_hub, google-cloud-storage) is imported only when that scheme is first used
(style.md §2.1: importing ``slurm_bt`` must not import them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from slurm_bt.errors import SourceError, SourceUnavailableError
from slurm_bt.weights.manifest import ManifestFile, SourceKind
from slurm_bt.weights.sources.checksums import OriginChecksum
from slurm_bt.weights.sources.config import SourceCredentials, SourceEndpoints
from slurm_bt.weights.sources.uri import SourceUri

__all__ = [
    "BodyStream",
    "Listing",
    "RangeStream",
    "RemoteFile",
    "Source",
    "TransportOptions",
    "open_source",
]


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
    """One listed file, before it has a verified sha256.

    Attributes:
        path: POSIX path relative to the source root.
        size: bytes.
        sha256: lower-case hex when the origin publishes a trustworthy one (HF LFS oid, S3
            full-object ``ChecksumSHA256``); None = must be computed by streaming.
        etag: the version pin (S3 ETag, GCS generation, HF etag).
        checksums: what else the origin says the content hashes to (HF git blob id, GCS
            crc32c/md5Hash, S3 CRC32/CRC32C, the MD5 of a single-part S3/R2 ETag). When
            ``sha256`` is None, the download checks one of them on the same pass that computes the
            sha256, so a corrupted body is never published (checksums.py).
    """

    path: str
    size: int
    sha256: str | None
    etag: str | None = None
    checksums: tuple[OriginChecksum, ...] = ()


@dataclass(frozen=True)
class Listing:
    """A source listed at one immutable revision.

    Attributes:
        uri: the source as the origin spells it (HF: the Hub's repo id), revision set for HF.
        revision: HF commit; for object stores a digest of (path, size, etag) of every object.
        files: every file under the root, unfiltered.
    """

    uri: SourceUri
    revision: str
    files: tuple[RemoteFile, ...]


class RangeStream(Protocol):
    """An open response body for one byte range.

    ``partial`` is False when the origin ignored the Range header and is sending the whole file
    from byte 0 (the engine then restarts the file from 0, transfer-perf F05).
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

    Read failures of the listed types become :class:`SourceUnavailableError` naming the source, the
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


class Source(Protocol):
    """A backend bound to one source URI, credentials and endpoints.

    A backend whose listing may take an ETag for an MD5 when it is not one (S3/R2: SSE-KMS, SSE-C)
    also has ``etag_is_md5(file: RemoteFile) -> bool``; the download engine asks it before refusing
    a file whose bytes do not match that ETag (download.py).
    """

    uri: SourceUri

    def list_files(self) -> Listing:
        """List the source, pinning branch/tag to a commit (HF) or recording etags/generations."""
        ...

    def open_range(self, file: ManifestFile, start: int, end: int | None) -> RangeStream:
        """Open bytes ``[start, end)`` of ``file`` (``end=None``: to EOF), pinned to its version.

        Raises:
            SourceAccessError, SourceNotFoundError: permanent; not retried.
            SourceUnavailableError: transient (connection refused/reset, timeout, 5xx, 429).
            SourceError: anything else, e.g. the object changed since resolve (412).
        """
        ...

    def close(self) -> None:
        """Release pools and sessions."""
        ...


# scheme -> (module, class, pip requirement shown when the import fails)
_REGISTRY: dict[SourceKind, tuple[str, str, str]] = {
    "hf": ("slurm_bt.weights.sources.hf", "HfSource", "huggingface_hub"),
    "s3": ("slurm_bt.weights.sources.s3", "S3Source", "boto3"),
    "r2": ("slurm_bt.weights.sources.s3", "S3Source", "boto3"),
    "gs": ("slurm_bt.weights.sources.gcs", "GcsSource", "google-cloud-storage"),
}


def open_source(
    uri: SourceUri,
    *,
    credentials: SourceCredentials | None = None,
    endpoints: SourceEndpoints | None = None,
    options: TransportOptions | None = None,
) -> Source:
    """Instantiate the backend for ``uri.kind``, importing its client on first use.

    Raises:
        SourceError: the backend's client library is not installed (the message names the
            package to install, e.g. ``pip install 'slurm-bt[s3]'``).
    """
    module_name, class_name, requirement = _REGISTRY[uri.kind]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SourceError(
            uri.canonical, f"{uri.kind}:// sources need the {requirement!r} package ({exc.name} is missing)"
        ) from exc
    cls = getattr(module, class_name)
    source: Source = cls(
        uri, credentials=credentials, endpoints=endpoints or SourceEndpoints(), options=options or TransportOptions()
    )
    return source
