"""``s3://bucket/prefix`` and ``r2://account.bucket/prefix`` through boto3.

R2 is the S3 API at the account's endpoint (``SourceEndpoints.r2_endpoint``) with region ``auto``;
both honour the per-endpoint checksum switch (``when_required``) because S3-alikes disagree with
the SDK defaults (transfer-perf.md §2). Ranged GETs carry ``IfMatch=<etag from the listing>``, so
an object replaced after resolve fails with 412 instead of mixing two versions (threats F06).
A source without a secret is read with unsigned requests; ambient AWS credentials (environment,
instance profile) are deliberately not used, so a job never reads with the login node's identity.

Two clients share one session: the metadata client lets botocore retry (standard mode); the data
client does not retry, because the download engine resumes ranges itself and must see each failure.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.weights.manifest import ManifestFile
from slurm_bt.weights.sources._retry import retry_transient
from slurm_bt.weights.sources.base import BodyStream, Listing, RangeStream, RemoteFile, TransportOptions
from slurm_bt.weights.sources.config import SourceCredentials, SourceEndpoints
from slurm_bt.weights.sources.uri import SourceUri

__all__ = ["S3Source", "listing_digest", "safe_relative_path"]

_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "403", "401"}
_MISSING_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}


def listing_digest(files: list[RemoteFile]) -> str:
    """The "revision" of an object-store listing: sha256 over (path, size, etag) of every object."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\t{f.size}\t{f.etag or ''}\n".encode())
    return h.hexdigest()


def safe_relative_path(path: str) -> bool:
    """Whether ``path`` can be a manifest path (no empty, ``.`` or ``..`` parts, no control chars)."""
    return (
        bool(path)
        and not path.startswith("/")
        and all(p not in {"", ".", ".."} for p in path.split("/"))
        and not any(ord(c) < 0x20 or c == "\x7f" for c in path)
    )


class S3Source:
    """A prefix of an S3 (or R2, or S3-compatible) bucket."""

    def __init__(
        self,
        uri: SourceUri,
        *,
        credentials: SourceCredentials | None,
        endpoints: SourceEndpoints,
        options: TransportOptions,
    ) -> None:
        """Build the boto3 clients for ``uri``'s endpoint; no request is made yet."""
        import boto3
        import botocore
        from botocore.config import Config

        self.uri = uri
        self._options = options
        if uri.kind == "r2":
            assert uri.account is not None
            endpoint: str | None = endpoints.r2_endpoint(uri.account)
            region, when_required, style = "auto", endpoints.r2_checksum_when_required, "path"
        else:
            endpoint = endpoints.s3_endpoint_url
            region, when_required = endpoints.s3_region, endpoints.s3_checksum_when_required
            style = endpoints.s3_addressing_style
        creds = credentials or SourceCredentials()
        session = boto3.session.Session(
            aws_access_key_id=creds.aws_access_key_id,
            aws_secret_access_key=creds.aws_secret_access_key,
            aws_session_token=creds.aws_session_token,
            region_name=region,
        )
        common: dict[str, Any] = {
            "region_name": region,
            "s3": {"addressing_style": style},
            "connect_timeout": options.connect_timeout_s,
            "read_timeout": options.read_timeout_s,
            "max_pool_connections": options.max_connections,
        }
        if creds.aws_access_key_id is None:
            common["signature_version"] = botocore.UNSIGNED
        if when_required:
            common["request_checksum_calculation"] = "when_required"
            common["response_checksum_validation"] = "when_required"
        meta_cfg = Config(**common, retries={"mode": "standard", "max_attempts": options.list_retries})
        data_cfg = Config(**common, retries={"mode": "standard", "max_attempts": 1})
        self._meta = session.client("s3", endpoint_url=endpoint, config=meta_cfg)
        self._data = session.client("s3", endpoint_url=endpoint, config=data_cfg)
        self._pool: Any = None
        if endpoints.s3_data_plane == "presigned":
            from slurm_bt.weights.sources._http import make_pool

            self._pool = make_pool(options.connect_timeout_s, options.read_timeout_s, options.max_connections)

    def _map_error(self, exc: Exception, *, file: str | None = None, offset: int | None = None) -> SourceError:
        from botocore.exceptions import BotoCoreError, ClientError

        src = self.uri.canonical
        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            code = str(err.get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in _ACCESS_CODES or status in (401, 403):
                return SourceAccessError(
                    src, f"not authorized for {src} ({code or status}); check auth_secret_name", file=file
                )
            if code in _MISSING_CODES or status == 404:
                return SourceNotFoundError(src, f"{code or 'HTTP 404'}: bucket or object not found", file=file)
            if code == "PreconditionFailed" or status == 412:
                return SourceError(src, "object changed since it was resolved (412); resolve again",
                                   file=file, offset=offset)
            if status in (408, 429) or status >= 500 or code in {"SlowDown", "RequestTimeout"}:
                return SourceUnavailableError(src, f"origin answered {code} ({status})", file=file,
                                              offset=offset, transient=True)
            return SourceError(src, f"{code} ({status})", file=file, offset=offset)
        if isinstance(exc, (BotoCoreError, OSError)):
            return SourceUnavailableError(src, f"origin unreachable: {type(exc).__name__}: {exc}",
                                          file=file, offset=offset, transient=True)
        return SourceError(src, f"{type(exc).__name__}: {exc}", file=file, offset=offset)

    def _call(self, fn: Any, **kwargs: Any) -> Any:
        def once() -> Any:
            try:
                return fn(**kwargs)
            except Exception as exc:
                raise self._map_error(exc, file=kwargs.get("Key")) from exc

        return retry_transient(once, 2)

    def _full_object_sha256(self, key: str) -> str | None:
        head = self._call(self._meta.head_object, Bucket=self.uri.container, Key=key, ChecksumMode="ENABLED")
        value = head.get("ChecksumSHA256")
        if not value or "-" in value or head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
            return None  # a COMPOSITE (per-part) checksum is not the content's sha256
        return base64.b64decode(value).hex()

    def list_files(self) -> Listing:
        """List every object under ``prefix/`` (directory semantics); one object if prefix is a key."""
        prefix = self.uri.prefix
        pages = self._meta.get_paginator("list_objects_v2").paginate(
            Bucket=self.uri.container, Prefix=f"{prefix}/" if prefix else ""
        )
        files: list[RemoteFile] = []
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    key: str = obj["Key"]
                    path = key[len(prefix) + 1 :] if prefix else key
                    if path.endswith("/") and obj["Size"] == 0:
                        continue  # a "folder" marker made by consoles
                    if not safe_relative_path(path):
                        raise SourceError(self.uri.canonical, f"object key {key!r} cannot be mirrored safely "
                                          "(empty, '.' or '..' segment, or control character)")
                    sha = self._full_object_sha256(key) if "SHA256" in obj.get("ChecksumAlgorithm", []) else None
                    files.append(RemoteFile(path, int(obj["Size"]), sha, etag=obj.get("ETag")))
        except SourceError:
            raise
        except Exception as exc:
            raise self._map_error(exc) from exc
        if not files and prefix:
            try:
                head = self._meta.head_object(Bucket=self.uri.container, Key=prefix)
            except Exception as exc:
                mapped = self._map_error(exc)
                if isinstance(mapped, SourceNotFoundError):
                    raise SourceNotFoundError(self.uri.canonical, "no object under this prefix") from exc
                raise mapped from exc
            name = prefix.rsplit("/", 1)[-1]
            files.append(RemoteFile(name, int(head["ContentLength"]), None, etag=head.get("ETag")))
            # The single object lives at the prefix itself: re-root the URI one level up.
            parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
            self.uri = SourceUri(self.uri.kind, self.uri.container, parent, account=self.uri.account)
        return Listing(self.uri, listing_digest(files), tuple(files))

    def open_range(self, file: ManifestFile, start: int, end: int | None) -> RangeStream:
        """Ranged GetObject pinned with ``IfMatch`` to the listed ETag."""
        if self._pool is not None:
            return self._open_presigned(file, start, end)
        kwargs: dict[str, Any] = {"Bucket": self.uri.container, "Key": self.uri.key_for(file.path)}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if file.etag:
            kwargs["IfMatch"] = file.etag
        try:
            resp = self._data.get_object(**kwargs)
        except Exception as exc:
            raise self._map_error(exc, file=file.path, offset=start) from exc
        partial = "ContentRange" in resp
        body = resp["Body"]
        # botocore/urllib3 read errors have no common base besides Exception
        return BodyStream(body.read, body.close, partial=partial, uri=self.uri.canonical, file=file.path,
                          start=start)

    def _open_presigned(self, file: ManifestFile, start: int, end: int | None) -> RangeStream:
        """The same GET as a presigned URL read by the shared urllib3 range engine.

        Presigning is local computation (SigV4 over the query string; ``Range`` and ``If-Match``
        travel as ordinary, unsigned headers, which S3 allows), so the data plane avoids botocore's
        per-read overhead while keeping the ETag pin (412 if the object changed).
        """
        from slurm_bt.weights.sources._http import open_http_range

        url = self._data.generate_presigned_url(
            "get_object", Params={"Bucket": self.uri.container, "Key": self.uri.key_for(file.path)}, ExpiresIn=3600)
        headers = {"Accept-Encoding": "identity"}
        if file.etag:
            headers["If-Match"] = file.etag
        return open_http_range(self._pool, url, uri=self.uri.canonical, file=file.path, start=start, end=end,
                               headers=headers)

    def close(self) -> None:
        """Close the clients' connection pools."""
        if self._pool is not None:
            self._pool.clear()
        for client in (self._meta, self._data):
            try:
                client.close()
            except Exception:  # noqa: S110 - best effort
                pass
