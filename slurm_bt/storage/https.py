"""``https://host/path``: one file on any HTTPS server (a model mirror, an artifact server).

Why not fsspec's ``HTTPFileSystem``: its ``info`` turns every failed HEAD/GET (401, 403, a
certificate its trust store rejects) into ``FileNotFoundError``, so "bad token" and "untrusted
server" would read as "no such file", and it has no ``If-Match``. So one HEAD over urllib3 gives
the size, the ``ETag`` (the version pin) and the checksums servers publish (``Digest:
sha-256=...``, RFC 3230; ``Content-MD5``), with the status mapped once (``_http.py``); the byte
path is the urllib3 range engine with ``If-Match`` = the ETag, so a file replaced after it was
resolved fails with 412 instead of mixing versions.

TLS: certificates are always verified, against the system store or the site file's
``https_ca_bundle`` (a private CA); there is no switch to turn verification off. Plain ``http://``
is not accepted. A bearer token from the secret store is sent as ``Authorization``.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError
from slurm_bt.storage._http import http_status_error, make_pool, open_http_range
from slurm_bt.storage.base import (
    Backend,
    Listing,
    Pinned,
    RangeStream,
    RemoteFile,
    TransportOptions,
    map_os_error,
    retry_transient,
)
from slurm_bt.storage.checksums import OriginChecksum
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.url import StorageUrl

__all__ = ["HttpsBackend"]


def _digest_sha256(header: str | None) -> str | None:
    """The sha256 in a ``Digest`` header (``sha-256=<base64>``, possibly among others), as hex."""
    for item in (header or "").split(","):
        algo, _, value = item.strip().partition("=")
        if algo.strip().lower() == "sha-256" and value:
            try:
                raw = base64.b64decode(value.strip().strip(":"), validate=True)
            except (binascii.Error, ValueError):
                return None
            return raw.hex() if len(raw) == 32 else None
    return None


class HttpsBackend(Backend):
    """One file at an HTTPS URL; its root is the file's directory, its one path the file name."""

    def __init__(self, url: StorageUrl, *, credentials: Credentials | None, endpoints: StorageEndpoints,
                 options: TransportOptions) -> None:
        """Build the urllib3 pool (verifying against ``https_ca_bundle`` or the system CAs); no request yet."""
        self.url = url
        self._options = options
        self._headers = {"Accept-Encoding": "identity"}
        if credentials is not None and credentials.token:
            self._headers["Authorization"] = f"Bearer {credentials.token}"
        ca = endpoints.https_ca_bundle
        self._pool = make_pool(options.connect_timeout_s, options.read_timeout_s, options.max_connections,
                               ca_bundle=ca)
        self._name = url.prefix.rsplit("/", 1)[-1]
        self._dir = url.prefix.rsplit("/", 1)[0] if "/" in url.prefix else ""

    def _href(self, path: str) -> str:
        key = f"{self._dir}/{path}" if self._dir else path
        return f"https://{self.url.container}/{key}"

    def stat(self, path: str) -> RemoteFile:
        """One HEAD: size, ETag, ``Digest`` sha256, ``Content-MD5``."""
        import urllib3.exceptions

        def once() -> dict[str, Any]:
            try:
                resp = self._pool.request("HEAD", self._href(path), headers=self._headers)
            except urllib3.exceptions.SSLError as exc:
                raise SourceError(self.url.canonical, f"TLS verification failed: {exc}; trust the server's CA "
                                  "with https_ca_bundle in the site file", file=path) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise map_os_error(ConnectionError(str(exc)), self.url.canonical, file=path, what="HEAD") from exc
            if resp.status != 200:
                raise http_status_error(resp.status, self.url.canonical, file=path, offset=None,
                                        what=f"file {path!r}")
            length = resp.headers.get("Content-Length")
            return {"size": int(length) if length and length.isdigit() else None, "ETag": resp.headers.get("ETag"),
                    "Digest": resp.headers.get("Digest"), "Content-MD5": resp.headers.get("Content-MD5")}

        info = retry_transient(once, self._options.list_retries)
        if info.get("size") is None:
            raise SourceError(self.url.canonical, "server sends no Content-Length; cannot pin the file", file=path)
        checks: tuple[OriginChecksum, ...] = ()
        md5 = info.get("Content-MD5")
        if md5:
            try:
                raw = base64.b64decode(md5, validate=True)
                if len(raw) == 16:
                    checks = (OriginChecksum("md5", raw.hex(), "Content-MD5"),)
            except (binascii.Error, ValueError):
                pass
        etag = info.get("ETag")
        if etag and str(etag).startswith("W/"):
            etag = None  # a weak ETag cannot pin bytes (If-Match needs a strong one)
        return RemoteFile(path, int(info["size"]), _digest_sha256(info.get("Digest")), etag=etag, checksums=checks)

    def list_files(self) -> Listing:
        """The one file (a listing of size 1; the revision is its ETag or, without one, its digest)."""
        from slurm_bt.storage.base import listing_digest

        one = self.stat(self._name)
        return Listing(StorageUrl("https", self.url.container, self.url.prefix), listing_digest([one]), (one,))

    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """Ranged GET with ``If-Match`` = the ETag."""
        headers = dict(self._headers)
        if file.etag:
            headers["If-Match"] = file.etag
        return open_http_range(self._pool, self._href(file.path), uri=self.url.canonical, file=file.path,
                               start=start, end=end, headers=headers)

    def read_bytes(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        """A small file's content, or None when absent."""
        try:
            return super().read_bytes(path, max_bytes=max_bytes)
        except SourceNotFoundError:
            return None
        except SourceAccessError:
            raise

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.clear()
