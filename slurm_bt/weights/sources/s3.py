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

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.weights.manifest import ManifestFile
from slurm_bt.weights.sources._retry import retry_transient
from slurm_bt.weights.sources.base import BodyStream, Listing, RangeStream, RemoteFile, TransportOptions
from slurm_bt.weights.sources.checksums import ChecksumKind, OriginChecksum, b64_to_hex, s3_etag_md5
from slurm_bt.weights.sources.config import SourceCredentials, SourceEndpoints
from slurm_bt.weights.sources.uri import SourceUri

__all__ = ["S3Source", "listing_digest", "safe_relative_path"]

_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "403", "401"}
_MISSING_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
# A HEAD costs one round trip; an MD5 instead of a CRC over 64 MiB costs ~60 ms of CPU (checksums.py).
_HEAD_MIN_SIZE = 64 * 1024 * 1024


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
            self._etag_md5 = endpoints.r2_etag_md5
        else:
            endpoint = endpoints.s3_endpoint_url
            region, when_required = endpoints.s3_region, endpoints.s3_checksum_when_required
            style = endpoints.s3_addressing_style
            self._etag_md5 = endpoints.s3_etag_md5
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

    def _head_checksums(self, key: str, etag: str | None) -> tuple[str | None, tuple[OriginChecksum, ...]]:
        """The full-object sha256 and CRCs of ``key`` at version ``etag`` (one HEAD)."""
        kwargs: dict[str, Any] = {"Bucket": self.uri.container, "Key": key, "ChecksumMode": "ENABLED"}
        if etag:
            kwargs["IfMatch"] = etag  # the checksums of the listed version, not of a later overwrite
        return self._checks_from_head(self._call(self._meta.head_object, **kwargs), key)

    def _checks_from_head(self, head: dict[str, Any], key: str) -> tuple[str | None, tuple[OriginChecksum, ...]]:
        if head.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
            return None, ()  # a COMPOSITE (per-part) checksum says nothing about the whole content
        sha: str | None = None
        checks: list[OriginChecksum] = []
        fields: tuple[tuple[str, ChecksumKind], ...] = (("ChecksumCRC32C", "crc32c"), ("ChecksumCRC32", "crc32"))
        try:
            value = head.get("ChecksumSHA256")
            if value and "-" not in value:
                sha = b64_to_hex(value)
            for field, kind in fields:
                value = head.get(field)
                if value and "-" not in value:
                    hexv = b64_to_hex(value)
                    assert hexv is not None
                    checks.append(OriginChecksum(kind, hexv, f"x-amz-checksum-{kind}"))
        except ValueError as exc:
            raise SourceError(self.uri.canonical, f"object {key!r} has a malformed checksum header") from exc
        if sha is not None and len(sha) != 64:
            raise SourceError(self.uri.canonical, f"object {key!r} has a malformed x-amz-checksum-sha256")
        return sha, tuple(checks)

    def _etag_check(self, etag: str | None) -> tuple[OriginChecksum, ...]:
        md5 = s3_etag_md5(etag) if self._etag_md5 else None
        # maybe_not_content_hash: SSE-KMS / SSE-C ETags look the same; a mismatch asks etag_is_md5.
        return (OriginChecksum("md5", md5, "ETag", maybe_not_content_hash=True),) if md5 else ()

    def list_files(self) -> Listing:
        """List every object under ``prefix/`` (directory semantics); one object if prefix is a key.

        Each object carries the checksums its origin vouches for: the MD5 of a single-part ETag
        (free with the listing) and, from one HEAD, full-object SHA256/CRC32/CRC32C when the listing
        says the object has them. The HEAD is made when it buys something: always for SHA256 (no
        sha256 to compute), for a CRC only when there is no MD5 ETag (multipart) or the object is big
        enough that checking a CRC instead of an MD5 saves real CPU (``_HEAD_MIN_SIZE``), and for a
        multipart object whose listing names no algorithm (the store may not list them).
        """
        prefix = self.uri.prefix
        pages = self._meta.get_paginator("list_objects_v2").paginate(
            Bucket=self.uri.container, Prefix=f"{prefix}/" if prefix else ""
        )
        found: list[tuple[str, str, int, str | None, bool]] = []  # path, key, size, etag, head?
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
                    size, etag = int(obj["Size"]), obj.get("ETag")
                    algos = set(obj.get("ChecksumAlgorithm", []))
                    multipart = bool(etag) and "-" in str(etag)
                    head = ("SHA256" in algos
                            or (bool(algos & {"CRC32", "CRC32C"}) and (not self._etag_check(etag)
                                                                      or size >= _HEAD_MIN_SIZE))
                            # Some stores keep full-object checksums but do not list them (SeaweedFS);
                            # a multipart object has nothing else that covers its content.
                            or (multipart and not algos))
                    found.append((path, key, size, etag, head))
        except SourceError:
            raise
        except Exception as exc:
            raise self._map_error(exc) from exc
        heads: dict[str, tuple[str | None, tuple[OriginChecksum, ...]]] = {}
        wanted = [(key, etag) for _, key, _, etag, head in found if head]
        if wanted:
            with ThreadPoolExecutor(min(16, self._options.max_connections), thread_name_prefix="bt-head") as pool:
                heads = dict(zip((k for k, _ in wanted), pool.map(lambda ke: self._head_checksums(*ke), wanted),
                                 strict=True))
        files: list[RemoteFile] = []
        for path, key, size, etag, _ in found:
            sha, crcs = heads.get(key, (None, ()))
            files.append(RemoteFile(path, size, sha, etag=etag, checksums=crcs + self._etag_check(etag)))
        if not files and prefix:
            try:
                head = self._meta.head_object(Bucket=self.uri.container, Key=prefix, ChecksumMode="ENABLED")
            except Exception as exc:
                mapped = self._map_error(exc)
                if isinstance(mapped, SourceNotFoundError):
                    raise SourceNotFoundError(self.uri.canonical, "no object under this prefix") from exc
                raise mapped from exc
            name = prefix.rsplit("/", 1)[-1]
            sha, crcs = self._checks_from_head(head, prefix)
            files.append(RemoteFile(name, int(head["ContentLength"]), sha, etag=head.get("ETag"),
                                    checksums=crcs + self._etag_check(head.get("ETag"))))
            # The single object lives at the prefix itself: re-root the URI one level up.
            parent = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
            self.uri = SourceUri(self.uri.kind, self.uri.container, parent, account=self.uri.account)
        return Listing(self.uri, listing_digest(files), tuple(files))

    def etag_is_md5(self, file: RemoteFile) -> bool:
        """Whether ``file``'s ETag really is the MD5 of its content (asked only after a mismatch).

        S3 documents the ETag of a single-part object as its MD5 except under SSE-KMS (also DSSE-KMS)
        and SSE-C, which a listing does not show; one HEAD of the pinned version tells.
        """
        kwargs: dict[str, Any] = {"Bucket": self.uri.container, "Key": self.uri.key_for(file.path)}
        if file.etag:
            kwargs["IfMatch"] = file.etag
        head = self._call(self._meta.head_object, **kwargs)
        encrypted = str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or head.get("SSECustomerAlgorithm")
        return not encrypted

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
