"""Checksums an origin publishes for a file, and streaming hashers that check them.

The cache names every blob by the sha256 we compute while writing it (download.py). When the origin
does not publish a sha256 (HF non-LFS files, most S3/R2/GCS objects), that sha256 would only say
"these are the bytes we received": a body corrupted in transit or at the origin would be published
and served to later jobs as a hit. So the listing also records what the origin says the content
hashes to, and the same single pass over the bytes checks it (docs/weights-cache.md, "What is
verified, per scheme"; docs/storage.md):

* ``git-sha1``: HF non-LFS files; the tree's ``oid`` is the git blob id,
  ``sha1(b"blob <size>\\0" + content)``;
* ``crc64nvme``: S3 ``x-amz-checksum-crc64nvme`` (always full-object; what AWS S3 stores for new
  objects by default);
* ``crc32c``: GCS ``crc32c`` (every object, composites included), S3 ``x-amz-checksum-crc32c``;
* ``crc32``: S3 ``x-amz-checksum-crc32``;
* ``md5``: GCS ``md5Hash`` (non-composite objects), the S3/R2/CoreWeave ETag of a single-part
  object, Azure ``Content-MD5``;
* ``sha256``: an HTTPS server's ``Repr-Digest``/``Digest`` header (RFC 9530 / RFC 3230).

A **per-part** (composite) value covers a multipart S3 object: its ETag ``<md5 of the part
md5s>-<n>`` and a ``COMPOSITE`` ``x-amz-checksum-*`` are the algorithm applied to the concatenated
raw digests of the upload's parts. With the part sizes known (one HEAD of part 1: its length and
the part count) the same single pass computes it (:class:`_Partwise`): each part's digest as its
bytes stream by, then the digest of those digests.

Only one check runs per file, the cheapest that can be computed here (:func:`pick_check`): md5 is
the slowest of these hashes (about 0.4x sha256 on the dev VM), so it runs only when the origin
offers nothing else. CRCs detect corruption, not forgery; the transport (TLS) and the version pin
(commit, ETag, generation) are what keep a third party from substituting content.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = [
    "CHUNK_BYTES",
    "ChecksumKind",
    "Hasher",
    "OriginChecksum",
    "b64_to_hex",
    "computable",
    "feed_fd",
    "git_blob_hasher",
    "git_blob_sha1",
    "new_hasher",
    "pick_check",
    "s3_etag_md5",
    "sha256_fd",
]

CHUNK_BYTES = 8 * 1024 * 1024

ChecksumKind = Literal["git-sha1", "crc64nvme", "crc32c", "crc32", "sha1", "md5", "sha256"]

# Cheapest first (dev VM, one core: crc64nvme and crc32c 18-20 GB/s with awscrt, crc32c 12 GB/s
# with google-crc32c, crc32 3.9 GB/s (zlib), sha1 1.8 GB/s, md5 0.7 GB/s; sha256 itself is 1.7 GB/s).
_COST_ORDER: tuple[ChecksumKind, ...] = ("crc64nvme", "crc32c", "crc32", "git-sha1", "sha1", "sha256", "md5")
_HEX = {"git-sha1": re.compile(r"^[0-9a-f]{40}$"), "sha1": re.compile(r"^[0-9a-f]{40}$"),
        "md5": re.compile(r"^[0-9a-f]{32}$"), "crc32": re.compile(r"^[0-9a-f]{8}$"),
        "crc32c": re.compile(r"^[0-9a-f]{8}$"), "crc64nvme": re.compile(r"^[0-9a-f]{16}$"),
        "sha256": re.compile(r"^[0-9a-f]{64}$")}


class Hasher(Protocol):
    """The part of the hashlib API the download engine uses."""

    def update(self, data: bytes | memoryview, /) -> None:
        """Feed the next bytes."""
        ...

    def hexdigest(self) -> str:
        """Lower-case hex of the digest so far."""
        ...

    def digest(self) -> bytes:
        """The digest so far as raw bytes (CRCs big-endian, as S3 concatenates them per part)."""
        ...


@dataclass(frozen=True)
class OriginChecksum:
    """One checksum the origin publishes for a file version.

    Attributes:
        kind: the algorithm.
        value: lower-case hex, as :meth:`Hasher.hexdigest` spells it (CRCs big-endian, 8 digits).
        label: where the value came from, for error messages (``"git blob id"``, ``"ETag"``).
        maybe_not_content_hash: an S3/R2 ETag taken for an MD5: an object encrypted with SSE-KMS or
            SSE-C has an ETag that is not the MD5 of its content, and a listing cannot tell. On a
            mismatch the source is asked (``etag_is_md5``) before the file is refused.
    """

    kind: ChecksumKind
    value: str
    label: str
    maybe_not_content_hash: bool = False
    part_sizes: tuple[int, ...] = ()
    layout_assumed: bool = False

    def __post_init__(self) -> None:
        if not _HEX[self.kind].match(self.value):
            raise ValueError(f"{self.kind} checksum must be lower-case hex, got {self.value!r}")
        if self.kind in ("git-sha1", "crc64nvme") and self.part_sizes:
            raise ValueError(f"{self.kind} has no per-part form")
        if any(n <= 0 for n in self.part_sizes):
            raise ValueError("part sizes must be positive")

    @property
    def per_part(self) -> bool:
        """The value is over the digests of ``part_sizes``' parts (multipart ETag, COMPOSITE checksum)."""
        return bool(self.part_sizes)


class _Crc:
    """A CRC ``fn(data, previous) -> int`` of ``width`` bytes behind the hashlib API."""

    def __init__(self, fn: Any, width: int) -> None:
        self._fn, self._width, self._v = fn, width, 0

    def update(self, data: bytes | memoryview, /) -> None:
        self._v = self._fn(data, self._v)

    def hexdigest(self) -> str:
        return self.digest().hex()

    def digest(self) -> bytes:
        return int(self._v).to_bytes(self._width, "big")


class _Crc32c:
    """google-crc32c (hardware CRC32C; a dependency of the ``gcs`` extra) behind the hashlib API."""

    def __init__(self, module: Any) -> None:
        self._c = module.Checksum()

    def update(self, data: bytes | memoryview, /) -> None:
        self._c.update(data)

    def hexdigest(self) -> str:
        return self.digest().hex()

    def digest(self) -> bytes:
        digest: bytes = self._c.digest()
        return digest


def _crc32c_module() -> Any:
    try:
        module = importlib.import_module("google_crc32c")
    except ImportError:
        return None
    # Its pure-Python fallback runs at a few MB/s: a multi-GB file would take longer to check than
    # to download, so without the C extension crc32c counts as not computable here.
    return module if getattr(module, "implementation", "c") == "c" else None


def _awscrt_checksums() -> Any:
    """awscrt's hardware CRCs (the ``s3`` extra installs it; boto3 uses it for CRC64NVME too), or None."""
    try:
        return importlib.import_module("awscrt.checksums")
    except ImportError:
        return None


class _Partwise:
    """A per-part (composite) digest: each part's raw digest as its bytes stream by, then the
    digest of their concatenation, as S3 defines multipart ETags and COMPOSITE checksums.

    Parts are cut at ``part_sizes`` whatever the caller's chunking; a stream longer or shorter than
    their sum yields a value no origin published (``"<n> parts, got <m>"`` is not hex), so it
    mismatches.
    """

    def __init__(self, new: Any, part_sizes: tuple[int, ...]) -> None:
        self._new, self._sizes = new, part_sizes
        self._digests: list[bytes] = []
        self._cur = new()
        self._left = part_sizes[0]
        self._extra = 0

    def update(self, data: bytes | memoryview, /) -> None:
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        while len(view):
            if self._left == 0:
                self._extra += len(view)
                return
            n = min(self._left, len(view))
            self._cur.update(view[:n])
            view = view[n:]
            self._left -= n
            if self._left == 0:
                self._digests.append(self._cur.digest())
                i = len(self._digests)
                if i < len(self._sizes):
                    self._cur, self._left = self._new(), self._sizes[i]

    def hexdigest(self) -> str:
        if len(self._digests) != len(self._sizes) or self._extra:
            return f"{len(self._sizes)} parts, got {len(self._digests)} and {self._extra} bytes more"
        outer = self._new()
        outer.update(b"".join(self._digests))
        digest: str = outer.hexdigest()
        return digest

    def digest(self) -> bytes:
        return bytes.fromhex(self.hexdigest())


def git_blob_hasher(size: int) -> Hasher:
    """A sha1 already fed with git's blob header: feed the ``size`` content bytes, then ``hexdigest``."""
    h = hashlib.sha1(usedforsecurity=False)
    h.update(b"blob %d\0" % size)
    return h


def git_blob_sha1(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints, what the Hub lists as ``oid``)."""
    h = git_blob_hasher(len(data))
    h.update(data)
    return h.hexdigest()


def _plain_factory(kind: ChecksumKind) -> Any:
    """A zero-argument constructor of a fresh hasher of ``kind`` (no git header), or None."""
    if kind == "md5":
        return lambda: hashlib.md5(usedforsecurity=False)
    if kind == "sha256":
        return hashlib.sha256
    if kind == "sha1":
        return lambda: hashlib.sha1(usedforsecurity=False)
    if kind == "crc32":
        return lambda: _Crc(zlib.crc32, 4)  # zlib beats awscrt's crc32 here (3.9 vs 2.8 GB/s)
    crt = _awscrt_checksums()
    if kind == "crc64nvme":
        return (lambda: _Crc(crt.crc64nvme, 8)) if crt is not None else None
    if kind == "crc32c":
        if crt is not None:
            return lambda: _Crc(crt.crc32c, 4)
        module = _crc32c_module()
        return (lambda: _Crc32c(module)) if module is not None else None
    return None


def new_hasher(check: OriginChecksum, size: int) -> Hasher | None:
    """A fresh hasher for ``check`` over a ``size``-byte file, or None if it cannot be computed here."""
    if check.kind == "git-sha1":
        return git_blob_hasher(size)
    factory = _plain_factory(check.kind)
    if factory is None:
        return None
    if check.per_part:
        return _Partwise(factory, check.part_sizes)
    hasher: Hasher = factory()
    return hasher


def computable(kind: ChecksumKind) -> bool:
    """Whether this process can compute ``kind`` at a useful speed (CRC32C and CRC64NVME need a C library)."""
    return kind == "git-sha1" or _plain_factory(kind) is not None


def pick_check(checks: tuple[OriginChecksum, ...]) -> OriginChecksum | None:
    """The cheapest of ``checks`` this process can compute, or None (nothing to check against).

    A whole-object value wins over a per-part one of the same cost: it needs no part layout.
    """
    usable = [c for c in checks if c.kind in _COST_ORDER and computable(c.kind)]
    if not usable:
        return None
    return min(usable, key=lambda c: (_COST_ORDER.index(c.kind), c.per_part))


def b64_to_hex(value: str | None) -> str | None:
    """A base64 checksum as S3 and GCS spell it, in lower-case hex (None stays None)."""
    return base64.b64decode(value, validate=True).hex() if value else None


def s3_etag_md5(etag: str | None) -> str | None:
    """The MD5 an S3/R2 ETag stands for, or None when it is not one.

    A single-part object's ETag is the hex MD5 of its content (quoted); a multipart object's is
    ``<md5 of the part md5s>-<parts>`` and says nothing about the content as a whole. SSE-KMS and
    SSE-C ETags look like MD5s but are not (see :attr:`OriginChecksum.maybe_not_content_hash`).
    """
    if not etag:
        return None
    value = etag.strip().strip('"').lower()
    return value if _HEX["md5"].match(value) else None


def feed_fd(h: Hasher | Any, fd: int, buf: memoryview, off: int = 0, count: int | None = None) -> int:
    """Feed ``h`` the bytes of ``fd`` from ``off`` (at most ``count``, else to EOF); returns how many.

    ``preadv`` into the caller's reused ``buf``: the fd's offset is untouched and no per-chunk bytes
    object is allocated (this runs over every blob the caches verify). Fewer bytes than ``count``
    means the file is shorter.
    """
    done = 0
    while count is None or done < count:
        want = len(buf) if count is None else min(len(buf), count - done)
        n = os.preadv(fd, [buf[:want]], off + done)
        if n <= 0:
            break
        h.update(buf[:n])
        done += n
    return done


def sha256_fd(fd: int, size: int | None = None) -> tuple[str, int]:
    """sha256 hex digest and byte count of an open file from offset 0 (at most ``size`` bytes)."""
    h = hashlib.sha256()
    n = feed_fd(h, fd, memoryview(bytearray(CHUNK_BYTES)), 0, size)
    return h.hexdigest(), n
