"""What slurm-bt adds on top of every backend: verified downloads to a file, and upload results.

``download_to`` fetches one object with parallel ranged reads (``pwrite`` at each offset, pinned
to the version given), hashes it with sha256 and publishes it only when size and sha256 match
(temp + fsync + rename, :func:`slurm_bt.atomic.atomic_output`). The weights cache has its own,
larger engine (per-part resume, origin checksums, :mod:`slurm_bt.weights.download`); this one is
for checkpoint files, whose sha256 the index records.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from slurm_bt.atomic import atomic_output
from slurm_bt.errors import IntegrityError, StorageError
from slurm_bt.storage.base import Backend, RemoteFile
from slurm_bt.storage.checksums import CHUNK_BYTES, sha256_fd

__all__ = ["UploadOptions", "UploadResult", "download_to"]


@dataclass(frozen=True)
class UploadResult:
    """What one verified upload produced.

    Attributes:
        sha256: hex digest of the bytes sent (computed while sending).
        size: bytes sent.
        verified: how the store confirmed it: ``sha256`` (the store checked our sha256),
            ``composite-crc32c`` / ``composite-crc32`` / ``composite-sha256`` (per-part checksums
            checked on receipt plus the object's composite checksum compared after completion),
            ``full-<alg>`` (a whole-object CRC the store computed), ``crc32c`` (GCS and Azure: the
            stored object's checksum equals what we sent), ``size`` (the store offers nothing
            better), ``local`` (``file://``: written and fsynced).
        skipped: the object was already there with the same content.
        resumed_parts: parts of an interrupted multipart upload that were verified against the
            local bytes and kept instead of being sent again.
    """

    sha256: str
    size: int
    verified: str
    skipped: bool = False
    resumed_parts: int = 0


@dataclass(frozen=True)
class UploadOptions:
    """Upload knobs (checkpoint-store URI options ``part_checksum``, ``part_size_mib``, ``concurrency``).

    Attributes:
        part_checksum: per-part checksum for S3 multipart uploads (``crc32c`` | ``crc32`` |
            ``sha256``); None = the scheme's default (crc32c when computable; sha256 for R2).
        part_size: bytes per part (doubled until the file fits in 10,000 parts).
        concurrency: parts in flight at once.
    """

    part_checksum: str | None = None
    part_size: int = 64 * 1024 * 1024
    concurrency: int = 8


def download_to(backend: Backend, path: str, dest: Path, *, size: int, sha256: str, part_size: int = 64 << 20,
                workers: int = 8) -> None:
    """Fetch ``path`` into ``dest`` with parallel ranged reads; publish only if size and sha256 match.

    Raises:
        IntegrityError: the bytes received do not hash to ``sha256`` (nothing is published).
        StorageError: the object is shorter than ``size`` or a read failed.
    """
    pinned = RemoteFile(path, size, sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(dest, mode=0o640) as fd:
        os.ftruncate(fd, size)

        def fetch(offset: int) -> None:
            end = min(offset + part_size, size)
            stream = backend.open_range(pinned, offset, end)
            pos = offset
            try:
                while pos < end:
                    chunk = stream.read(min(CHUNK_BYTES, end - pos))
                    if not chunk:
                        break
                    os.pwrite(fd, chunk, pos)
                    pos += len(chunk)
            finally:
                stream.close()
            if pos != end:
                raise StorageError(backend.url.canonical, f"{path}: short read at byte {pos} (expected {end})")

        if size:
            with ThreadPoolExecutor(max(1, min(workers, -(-size // part_size))), thread_name_prefix="bt-get") as pool:
                for f in [pool.submit(fetch, off) for off in range(0, size, part_size)]:
                    f.result()
        actual = sha256_fd(fd, size)[0]
        if actual != sha256 or os.fstat(fd).st_size != size:
            raise IntegrityError(backend.url.canonical, "checkpoint file does not match the index", file=path,
                                 expected=sha256, actual=actual)
