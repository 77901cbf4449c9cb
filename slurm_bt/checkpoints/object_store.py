"""Object-store checkpoint stores (``s3://``, ``r2://``, ``gs://``) on top of :mod:`slurm_bt.storage`.

The storage layer owns the clients, credentials, endpoints, error mapping and the verified
transfers (S3 resumable multipart uploads with per-part checksums, GCS uploads checked against the
stored crc32c, parallel ranged downloads verified against the index's sha256 before they are
published); this adapter only maps a checkpoint-store URI and its query options onto it and keys
onto the URI's prefix (docs/checkpoints.md, docs/storage.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from slurm_bt.errors import StorageError
from slurm_bt.storage.base import TransportOptions
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.registry import open_backend
from slurm_bt.storage.transfer import UploadOptions, UploadResult, download_to
from slurm_bt.storage.url import StoreUrl

__all__ = ["ObjectStore", "store_endpoints"]

_MiB = 1024 * 1024


def store_endpoints(uri: StoreUrl) -> StorageEndpoints:
    """The storage endpoints a checkpoint-store URI's options name (``endpoint_url``, ``region``, ...)."""
    opts = uri.options
    endpoint = opts.get("endpoint_url")
    fields: dict[str, Any] = {
        # Checkpoint uploads always send their own checksums; never let the SDK add a second pass.
        "s3_checksum_when_required": True,
        # Bytes through botocore, as the checkpoint store always read them (one client, its retries).
        "s3_data_plane": "boto3",
    }
    if uri.scheme == "s3":
        fields.update(s3_endpoint_url=endpoint, s3_region=opts.get("region", "us-east-1"),
                      s3_addressing_style=opts.get("addressing_style", "path" if endpoint else "auto"))
    elif uri.scheme == "r2" and endpoint:
        fields["r2_endpoint_template"] = endpoint
    elif uri.scheme == "gs" and endpoint:
        fields["gcs_endpoint"] = endpoint
    return StorageEndpoints(**fields)


class ObjectStore:
    """A checkpoint store in a bucket under a prefix (the :class:`~slurm_bt.checkpoints.store.CheckpointStore` API)."""

    def __init__(self, uri: StoreUrl, *, credentials: Credentials | None) -> None:
        """Open the storage backend for ``uri``; no request is made yet.

        Raises:
            MissingExtraError: the scheme's optional packages are not installed (names the extra).
        """
        self.uri = uri
        opts = uri.options
        self.part_size = int(opts.get("part_size_mib", "64")) * _MiB
        self.concurrency = max(1, int(opts.get("concurrency", "8")))
        self.url = uri.url
        if credentials is None and not (uri.scheme == "gs" and opts.get("endpoint_url")):
            # No secret and no service credentials: the SDK's default chain, as root-configured
            # stores on cloud nodes expect (docs/checkpoints.md); a gs:// emulator is anonymous.
            credentials = Credentials(ambient=True)
        self._backend = open_backend(
            self.url, credentials=credentials, endpoints=store_endpoints(uri),
            options=TransportOptions(read_timeout_s=120.0, max_connections=self.concurrency + 4, list_retries=6))
        self._uploader: Any = None
        if uri.scheme in ("s3", "r2"):
            self._uploader = self._backend.uploader(UploadOptions(  # type: ignore[attr-defined]
                part_checksum=opts.get("part_checksum"), part_size=self.part_size, concurrency=self.concurrency))
            self.part_checksum: str = self._uploader.part_checksum

    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Send ``size`` bytes of ``fd`` to ``key`` (relative to the prefix), verified; skip when identical."""
        if self._uploader is not None:
            result: UploadResult = self._uploader.upload_file(fd, size, self.url.key_for(key),
                                                              expect_sha256=expect_sha256)
            return result
        result = self._backend.upload_file(fd, size, key, expect_sha256=expect_sha256)  # type: ignore[attr-defined]
        return result

    def download_file(self, key: str, dest: Path, *, size: int, sha256: str) -> None:
        """Parallel ranged GETs into a temp file, sha256-verified, then published."""
        download_to(self._backend, key, dest, size=size, sha256=sha256, part_size=self.part_size,
                    workers=self.concurrency)

    def read_bytes(self, key: str) -> bytes | None:
        """A small object's bytes, or None."""
        return self._backend.read_bytes(key)

    def write_bytes(self, key: str, data: bytes) -> None:
        """Replace a small object (the store verifies its checksum)."""
        self._backend.write_bytes(key, data)

    def list_dirs(self, prefix: str) -> list[str]:
        """Common prefixes one level below ``prefix``."""
        return self._backend.list_dirs(prefix)

    def presigned_url(self, key: str, expires_s: int) -> str:
        """A time-limited GET URL of ``key`` (relative to the prefix), signed with the caller's credentials."""
        return self._backend.presigned_url(key, expires_s)

    def delete_tree(self, key: str) -> None:
        """Delete every object under ``key/`` (retention of one rank's copy of a checkpoint)."""
        self._backend.delete_prefix(key)

    def head(self, key: str) -> dict[str, Any] | None:
        """S3 ``HeadObject`` with checksums of ``key`` (absolute in the bucket), or None when absent."""
        if self._uploader is None:
            raise StorageError(self.uri.display(), "head is an S3 operation")
        found: dict[str, Any] | None = self._uploader.head(key)
        return found

    def abort_incomplete(self, key: str) -> int:
        """Abort every incomplete multipart upload of exactly ``key`` (absolute; left by a killed uploader)."""
        if self._uploader is None:
            return 0
        count: int = self._uploader.abort_incomplete(key)
        return count

    def close(self) -> None:
        """Stop the part pool and close the clients."""
        if self._uploader is not None:
            self._uploader.close()
        self._backend.close()
