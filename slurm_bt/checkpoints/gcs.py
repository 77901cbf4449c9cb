"""Google Cloud Storage checkpoint store (``gs://bucket/prefix``).

GCS offers CRC32C (and no MD5 for composite objects, threats-and-faults.md §5), so uploads stream
the file once through a reader that feeds both our sha256 (recorded in the index) and a CRC32C that
must equal the object's ``crc32c`` after the upload. Downloads are sha256-verified before they are
renamed into place. ``google-cloud-storage`` is imported only when a ``gs://`` store is opened.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

from slurm_bt.atomic import atomic_output
from slurm_bt.checkpoints.layout import StoreUri
from slurm_bt.checkpoints.store import StoreCredentials, UploadResult, sha256_fd
from slurm_bt.errors import IntegrityError, StorageError

__all__ = ["GcsStore"]


class _HashingReader:
    """A file-like view of ``fd`` that hashes (sha256 + crc32c) exactly what the client reads."""

    def __init__(self, fd: int, size: int) -> None:
        import google_crc32c

        self.fd, self.size, self.pos = fd, size, 0
        self.sha = hashlib.sha256()
        self.crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]

    def read(self, n: int = -1) -> bytes:
        want = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        data = os.pread(self.fd, want, self.pos) if want > 0 else b""
        self.pos += len(data)
        self.sha.update(data)
        self.crc.update(data)  # type: ignore[no-untyped-call]
        return data

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        if (whence, offset) != (0, self.pos):
            # A retried chunk re-reads bytes already hashed; start both digests over.
            if whence == 0 and offset == 0:
                return self._restart()
            raise OSError("non-sequential seek in checkpoint upload")
        return self.pos

    def _restart(self) -> int:
        import google_crc32c

        self.pos, self.sha, self.crc = 0, hashlib.sha256(), google_crc32c.Checksum()  # type: ignore[no-untyped-call]
        return 0


class GcsStore:
    """A checkpoint store in a GCS bucket under a prefix."""

    def __init__(self, uri: StoreUri, *, credentials: StoreCredentials | None) -> None:
        """Build the client (``endpoint_url`` option for emulators; anonymous without credentials)."""
        from google.cloud import storage

        self.uri = uri
        endpoint = uri.options.get("endpoint_url")
        client_options = {"api_endpoint": endpoint} if endpoint else None
        if credentials is not None and credentials.gcs_service_account:
            from google.oauth2 import service_account

            creds = service_account.Credentials.from_service_account_info(credentials.gcs_service_account)  # type: ignore[no-untyped-call]
            self._client = storage.Client(credentials=creds, project=creds.project_id, client_options=client_options)
        elif endpoint:
            from google.auth.credentials import AnonymousCredentials

            self._client = storage.Client(credentials=AnonymousCredentials(), project="slurm-bt",  # type: ignore[no-untyped-call]
                                          client_options=client_options)
        else:
            self._client = storage.Client(client_options=client_options)
        self._bucket = self._client.bucket(uri.bucket)

    def _err(self, exc: Exception, key: str, what: str) -> StorageError:
        return StorageError(f"gs://{self.uri.bucket}/{key}", f"{what}: {type(exc).__name__}: {exc}")

    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Stream ``fd`` to ``key``; the object's CRC32C must equal what we sent."""
        key = self.uri.key(key)
        blob = self._bucket.blob(key)
        if expect_sha256 is not None:
            existing = self._bucket.get_blob(key)
            if existing is not None and existing.size == size and (existing.metadata or {}).get(
                    "bt-sha256") == expect_sha256:
                return UploadResult(expect_sha256, size, "existing", skipped=True)
        reader = _HashingReader(fd, size)
        try:
            blob.upload_from_file(reader, size=size, checksum="crc32c", rewind=False)
            sha = reader.sha.hexdigest()
            blob.metadata = {"bt-sha256": sha}
            blob.patch()
            blob.reload()
        except Exception as exc:
            raise self._err(exc, key, "upload failed") from exc
        expected = base64.b64encode(reader.crc.digest()).decode()  # type: ignore[no-untyped-call]
        if blob.size != size or blob.crc32c != expected:
            raise IntegrityError(self.uri.display(), "stored object differs", file=key,
                                 expected=f"crc32c {expected} ({size} bytes)",
                                 actual=f"crc32c {blob.crc32c} ({blob.size})")
        return UploadResult(sha, size, "crc32c")

    def download_file(self, key: str, dest: Path, *, size: int, sha256: str) -> None:
        """Download into a temp file, verify sha256, then publish (``atomic_output``)."""
        key = self.uri.key(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(dest, mode=0o640) as fd:
            with os.fdopen(os.dup(fd), "wb") as fh:
                try:
                    self._bucket.blob(key).download_to_file(fh, checksum="crc32c")
                except Exception as exc:
                    raise self._err(exc, key, "download failed") from exc
            actual = sha256_fd(fd)
            if actual != sha256 or os.fstat(fd).st_size != size:
                raise IntegrityError(self.uri.display(), "checkpoint file does not match the index", file=key,
                                     expected=sha256, actual=actual)

    def read_bytes(self, key: str) -> bytes | None:
        """Small object bytes or None."""
        from google.api_core.exceptions import NotFound

        key = self.uri.key(key)
        try:
            return bytes(self._bucket.blob(key).download_as_bytes())
        except NotFound:
            return None
        except Exception as exc:
            raise self._err(exc, key, "read failed") from exc

    def write_bytes(self, key: str, data: bytes) -> None:
        """Replace a small object (CRC32C-checked by the client library)."""
        key = self.uri.key(key)
        try:
            self._bucket.blob(key).upload_from_string(data, checksum="crc32c")
        except Exception as exc:
            raise self._err(exc, key, "write failed") from exc

    def list_dirs(self, prefix: str) -> list[str]:
        """Prefixes one level below ``prefix``."""
        full = self.uri.key(prefix)
        base = f"{full.rstrip('/')}/" if full else ""
        try:
            it: Any = self._client.list_blobs(self.uri.bucket, prefix=base, delimiter="/")
            for _ in it:
                pass
            return sorted(p[len(base):].rstrip("/") for p in it.prefixes)
        except Exception as exc:
            raise self._err(exc, base, "list failed") from exc

    def close(self) -> None:
        """Close the HTTP session."""
        self._client.close()
