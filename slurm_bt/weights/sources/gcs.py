"""``gs://bucket/prefix``: Google Cloud Storage through its JSON API over urllib3.

The JSON API needs two calls (``objects.list`` with paging, ``objects.get?alt=media`` with
Range), so they are made directly; the only client library used is google-auth, and only to turn
a service-account key into a bearer token (anonymous requests need nothing). Each download pins
``generation=<listed generation>``, so an object overwritten after resolve is never mixed in; the
listing's ``crc32c`` (or ``md5Hash`` when google-crc32c is missing) is checked on the same pass that
computes the sha256, so a corrupted body is never published.
"""

from __future__ import annotations

import importlib
import json
import threading
from typing import Any
from urllib.parse import quote, urlencode

from slurm_bt.errors import SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.weights.manifest import ManifestFile
from slurm_bt.weights.sources._http import http_status_error, make_pool, open_http_range
from slurm_bt.weights.sources._retry import retry_transient
from slurm_bt.weights.sources.base import Listing, RangeStream, RemoteFile, TransportOptions
from slurm_bt.weights.sources.checksums import ChecksumKind, OriginChecksum, b64_to_hex
from slurm_bt.weights.sources.config import SourceCredentials, SourceEndpoints
from slurm_bt.weights.sources.s3 import listing_digest, safe_relative_path
from slurm_bt.weights.sources.uri import SourceUri

__all__ = ["GcsSource"]

_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"




class GcsSource:
    """A prefix of a GCS bucket."""

    def __init__(
        self,
        uri: SourceUri,
        *,
        credentials: SourceCredentials | None,
        endpoints: SourceEndpoints,
        options: TransportOptions,
    ) -> None:
        """Bind to ``uri``; the service-account token is fetched on first request."""
        self.uri = uri
        self._endpoint = endpoints.gcs_endpoint
        self._options = options
        self._pool = make_pool(options.connect_timeout_s, options.read_timeout_s, options.max_connections)
        self._sa = credentials.gcs_service_account if credentials else None
        self._creds: Any = None
        self._lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity"}
        if self._sa is None:
            return headers
        with self._lock:
            if self._creds is None:
                sa_module: Any = importlib.import_module("google.oauth2.service_account")
                self._creds = sa_module.Credentials.from_service_account_info(dict(self._sa), scopes=[_SCOPE])
            if not self._creds.valid:
                import google.auth.transport.requests

                try:
                    self._creds.refresh(google.auth.transport.requests.Request())
                except Exception as exc:
                    raise SourceError(self.uri.canonical, f"cannot obtain a GCS token: {type(exc).__name__}") from exc
            headers["Authorization"] = f"Bearer {self._creds.token}"
        return headers

    def _get_json(self, url: str) -> Any:
        import urllib3.exceptions

        def once() -> Any:
            try:
                resp = self._pool.request("GET", url, headers=self._headers())
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise SourceUnavailableError(self.uri.canonical, f"origin unreachable: {type(exc).__name__}: {exc}",
                                             transient=True) from exc
            if resp.status != 200:
                raise http_status_error(resp.status, self.uri.canonical, file=None, offset=None, what="bucket")
            return json.loads(resp.data)

        return retry_transient(once, self._options.list_retries)

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
            raise SourceError(self.uri.canonical, f"object {item.get('name')!r} has a malformed {field}") from exc
        return tuple(checks)

    def list_files(self) -> Listing:
        """List every object under ``prefix/`` with size, generation, crc32c and md5."""
        prefix = self.uri.prefix
        base = f"{self._endpoint}/storage/v1/b/{quote(self.uri.container, safe='')}/o"
        files: list[RemoteFile] = []
        token: str | None = None
        while True:
            params = {"prefix": f"{prefix}/" if prefix else "", "maxResults": "1000",
                      "fields": "items(name,size,generation,md5Hash,crc32c),nextPageToken"}
            if token:
                params["pageToken"] = token
            page = self._get_json(f"{base}?{urlencode(params)}")
            for item in page.get("items", []):
                name: str = item["name"]
                path = name[len(prefix) + 1 :] if prefix else name
                size = int(item["size"])
                if path.endswith("/") and size == 0:
                    continue
                if not safe_relative_path(path):
                    raise SourceError(self.uri.canonical, f"object name {name!r} cannot be mirrored safely")
                files.append(RemoteFile(path, size, None, etag=str(item["generation"]),
                                        checksums=self._checksums(item)))
            token = page.get("nextPageToken")
            if not token:
                break
        if not files:
            raise SourceNotFoundError(self.uri.canonical, "no object under this prefix")
        return Listing(self.uri, listing_digest(files), tuple(files))

    def open_range(self, file: ManifestFile, start: int, end: int | None) -> RangeStream:
        """Ranged ``alt=media`` GET pinned to the listed generation."""
        key = quote(self.uri.key_for(file.path), safe="")
        query = {"alt": "media"}
        if file.etag:
            query["generation"] = file.etag
        url = f"{self._endpoint}/storage/v1/b/{quote(self.uri.container, safe='')}/o/{key}?{urlencode(query)}"
        return open_http_range(self._pool, url, uri=self.uri.canonical, file=file.path, start=start, end=end,
                               headers=self._headers())

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.clear()
