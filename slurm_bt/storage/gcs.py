"""``gs://bucket/prefix``: Google Cloud Storage through gcsfs, bytes through the JSON API over urllib3.

Where fsspec serves: gcsfs lists (size, ``generation``, ``crc32c``, ``md5Hash`` come with the
listing), stats, reads and writes small objects and lists "directories"; its credentials object
(a service-account key from the secret store, or anonymous) also signs our data-plane requests.

Where it does not: the byte path is a ranged ``alt=media`` GET pinned to the listed
``generation`` (``_http.py``), so an object overwritten after it was listed is never mixed in; the
listing's ``crc32c`` (or ``md5Hash`` when google-crc32c is missing) is checked on the same pass
that computes the sha256 (checksums.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any
from urllib.parse import quote, urlencode

from slurm_bt.errors import IntegrityError, SourceAccessError, SourceError, SourceNotFoundError
from slurm_bt.storage._fs import FsspecBackend
from slurm_bt.storage._http import make_pool, open_http_range
from slurm_bt.storage.base import Pinned, RangeStream, RemoteFile, TransportOptions, map_os_error
from slurm_bt.storage.checksums import ChecksumKind, OriginChecksum, b64_to_hex
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.transfer import UploadResult
from slurm_bt.storage.url import StorageUrl

__all__ = ["GcsBackend"]


class GcsBackend(FsspecBackend):
    """A prefix of a GCS bucket."""

    writable = True

    def __init__(self, url: StorageUrl, *, credentials: Credentials | None, endpoints: StorageEndpoints,
                 options: TransportOptions) -> None:
        """Build the gcsfs filesystem; the service-account token is fetched on first request."""
        # gcsfs.core's filesystem, not the package default: gcsfs >= 2025 defaults to an
        # "extended" filesystem that first probes the bucket type over gRPC (a minute of timeouts
        # against an emulator or a firewalled node) for features we do not use.
        from gcsfs.core import GCSFileSystem

        self.url = url
        self.list_retries = options.list_retries
        self._endpoint = endpoints.gcs_endpoint
        sa = credentials.gcs_service_account if credentials else None
        token: Any = "anon"  # noqa: S105 - gcsfs's name for anonymous access
        project: str | None = "slurm-bt"
        if sa is None and credentials is not None and credentials.ambient:
            token, project = None, None  # gcsfs: google_default, then the metadata server
        if sa is not None:
            from google.oauth2 import service_account

            try:
                token = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
                    dict(sa), scopes=["https://www.googleapis.com/auth/devstorage.read_write"])
            except (ValueError, KeyError, TypeError) as exc:
                # Not chained: the parser's message may quote the key.
                raise SourceAccessError(url.canonical, "the secret's service-account key cannot be used "
                                        f"({type(exc).__name__}); check the secret") from None
            project = str(sa.get("project_id") or project)
        # Verification is ours (sha256 + the listed crc32c, checksums.py), so gcsfs's own
        # consistency check (which needs crcmod) stays off.
        self.fs = _one_try_filesystem(GCSFileSystem)(token=token, project=project, endpoint_url=self._endpoint,
                                                     skip_instance_cache=True, use_listings_cache=False)
        self._pool = make_pool(options.connect_timeout_s, options.read_timeout_s, options.max_connections)

    def _root(self) -> str:
        return f"{self.url.container}/{self.url.prefix}" if self.url.prefix else self.url.container

    def _checksums(self, item: dict[str, Any]) -> tuple[OriginChecksum, ...]:
        """crc32c (every object) and md5Hash (absent on composite objects) as the listing gives them."""
        checks = []
        fields: tuple[tuple[str, ChecksumKind], ...] = (("crc32c", "crc32c"), ("md5Hash", "md5"))
        try:
            for field, kind in fields:
                value = b64_to_hex(item.get(field))
                if value is not None:
                    checks.append(OriginChecksum(kind, value, field))
        except ValueError as exc:
            raise SourceError(self.url.canonical, f"object {item.get('name')!r} has a malformed {field}") from exc
        return tuple(checks)

    def _to_remote(self, path: str, info: dict[str, Any]) -> RemoteFile:
        checks = self._checksums(info)
        generation = info.get("generation")
        return RemoteFile(path, int(info["size"]), None, etag=str(generation) if generation else None,
                          checksums=checks)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity"}
        try:
            self.fs.credentials.apply(headers)
        except Exception as exc:
            raise SourceAccessError(self.url.canonical, f"cannot obtain a GCS token: {type(exc).__name__}; "
                                    "check the service-account key in the secret") from exc
        return headers

    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """Ranged ``alt=media`` GET pinned to the listed generation."""
        key = quote(self.url.key_for(file.path), safe="")
        query = {"alt": "media"}
        if file.etag:
            query["generation"] = file.etag
        url = f"{self._endpoint}/storage/v1/b/{quote(self.url.container, safe='')}/o/{key}?{urlencode(query)}"
        return open_http_range(self._pool, url, uri=self.url.canonical, file=file.path, start=start, end=end,
                               headers=self._headers())

    def upload_file(self, fd: int, size: int, path: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Stream ``fd`` to ``path`` through gcsfs's resumable upload; the stored crc32c must be what we sent.

        The one read of the file feeds the upload, our sha256 (recorded in the object's
        ``bt-sha256`` metadata and returned for the index) and a CRC32C that must equal the
        object's ``crc32c`` afterwards. A rerun whose object already has this size and
        ``bt-sha256`` is skipped.
        """
        import google_crc32c

        target = self._fs_path(path)
        if expect_sha256 is not None:
            try:
                info = self._call("stat", self.fs.info, target, file=path)
            except SourceNotFoundError:
                info = None
            if info is not None and int(info.get("size", -1)) == size and \
                    (info.get("metadata") or {}).get("bt-sha256") == expect_sha256:
                return UploadResult(expect_sha256, size, "existing", skipped=True)
        sha = hashlib.sha256()
        crc = google_crc32c.Checksum()  # type: ignore[no-untyped-call]
        block = 16 * 1024 * 1024  # a multiple of 256 KiB, as resumable uploads require

        def send() -> None:
            with self.fs.open(target, "wb", block_size=block) as out:
                offset = 0
                while offset < size:
                    chunk = os.pread(fd, min(block, size - offset), offset)
                    if not chunk:
                        raise SourceError(self.url.canonical, f"source shrank while uploading (at byte {offset} "
                                          f"of {size})", file=path)
                    sha.update(chunk)
                    crc.update(chunk)  # type: ignore[no-untyped-call]
                    out.write(chunk)
                    offset += len(chunk)

        try:
            send()
            self.fs.setxattrs(target, **{"bt-sha256": sha.hexdigest()})
        except SourceError:
            raise
        except Exception as exc:
            raise map_os_error(exc, self.url.canonical, file=path, what="upload") from exc
        self.fs.invalidate_cache()
        info = self._call("stat", self.fs.info, target, file=path)
        expected = base64.b64encode(crc.digest()).decode()  # type: ignore[no-untyped-call]
        if int(info.get("size", -1)) != size or info.get("crc32c") != expected:
            raise IntegrityError(self.url.canonical, "stored object differs", file=path,
                                 expected=f"crc32c {expected} ({size} bytes)",
                                 actual=f"crc32c {info.get('crc32c')} ({info.get('size')})")
        return UploadResult(sha.hexdigest(), size, "crc32c")

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.clear()


def _one_try_filesystem(base: type[Any]) -> type[Any]:
    """gcsfs's filesystem making one attempt per HTTP request.

    Why: gcsfs retries every request 6 times with back-off up to 32 s (``retry_request``, fixed when
    the class is defined: its ``retries`` argument does not reach it), and our calls retry transient
    errors themselves (options.list_retries, base.retry_transient; the downloads resume), so an
    unreachable origin took 2 min 14 s to fail one listing. The request is gcsfs's own, undecorated
    (``__wrapped__``), under the same retry decorator with one attempt.
    """
    from gcsfs.retry import retry_request

    request = getattr(base._request, "__wrapped__", None)
    if request is None:  # a gcsfs that changed its decoration: keep its retries rather than break
        return base
    return type("OneTryGCSFileSystem", (base,), {"_request": retry_request(retries=1)(request)})
