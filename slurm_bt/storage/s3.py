"""``s3://``, ``r2://`` and ``cw://`` (CoreWeave): the S3 API through boto3, one client setup for all three.

One client setup for the three schemes (:func:`client_settings`): R2 is the S3 API at the
account's endpoint with region ``auto``; CoreWeave AI Object Storage is the S3 API at the site's
``cw_endpoint_template``. Each honours its per-endpoint checksum switch (``when_required``),
because S3-alikes disagree with the SDK defaults. Without credentials requests are unsigned;
ambient AWS credentials are never used.

Why not s3fs (fsspec's S3): it runs on aiobotocore, which pins botocore to a narrow range (installing
it next to boto3 downgraded botocore below the installed boto3 on the dev VM), and nothing it
offers is what these URLs need. boto3 is used directly, and for each operation the reason it
must be boto3 anyway:

* listing and ``stat``: ``ListObjectsV2`` gives ``ChecksumAlgorithm``; the HEADs that follow send
  ``ChecksumMode=ENABLED`` and ``If-Match`` (the full-object SHA256/CRC of the *listed* version),
  and ``partNumber`` for a multipart object's part layout (its ETag and COMPOSITE checksums are
  per part), which s3fs's ``info`` does not;
* the data plane: each GET is presigned by boto3 (local SigV4, no network call) and read by the
  urllib3 range engine with ``If-Match`` = the listed ETag (``_http.py``); ``s3_data_plane=boto3``
  reads through botocore instead (the checkpoint store does);
* resumable verified multipart uploads with per-part checksums (``CreateMultipartUpload`` /
  ``ListParts`` / ``UploadPart`` with ``Checksum*``, :mod:`.s3_upload`), which s3fs's writer does
  not offer;
* small writes send ``ChecksumSHA256`` so the server verifies the bytes (s3fs's ``pipe_file``
  sends none).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qsl, quote, urlsplit

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.storage.base import Backend, BodyStream, Listing, Pinned, RangeStream, RemoteFile, TransportOptions
from slurm_bt.storage.checksums import ChecksumKind, OriginChecksum, b64_to_hex, computable, s3_etag_md5
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.transfer import UploadOptions
from slurm_bt.storage.url import StorageUrl

if TYPE_CHECKING:
    from slurm_bt.storage._http import SmallGets
    from slurm_bt.storage.s3_upload import S3Uploader

__all__ = ["ClientSettings", "S3Backend", "client_settings"]

_ACCESS_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled", "403", "401"}
_MISSING_CODES = {"NoSuchBucket", "NoSuchKey", "404", "NotFound"}
# A HEAD costs one round trip (16 run in parallel); an MD5 instead of a CRC costs ~1.5 ms of CPU per
# MiB on the bench VM (weights bench, 200 x 20 MiB: 1.05 s with MD5, 0.73 s with CRC32), on the cores
# the transfer needs: above 8 MiB the HEAD is the cheaper of the two.
_HEAD_MIN_SIZE = 8 * 1024 * 1024
# What a ChecksumMode HEAD may carry, as S3 spells the fields.
_HEAD_CHECKSUMS: tuple[tuple[str, ChecksumKind], ...] = (
    ("ChecksumCRC64NVME", "crc64nvme"), ("ChecksumCRC32C", "crc32c"), ("ChecksumCRC32", "crc32"),
    ("ChecksumSHA1", "sha1"), ("ChecksumSHA256", "sha256"))
# A multipart object whose parts are not all equal but the last has its part lengths asked one HEAD
# each (16 at a time) to check its per-part ETag or checksum; past this many parts it is not checked.
_MAX_PART_HEADS = 1000


@dataclass(frozen=True)
class ClientSettings:
    """Endpoint, region, addressing and checksum behaviour of one S3-API scheme."""

    endpoint_url: str | None
    region: str
    addressing_style: str
    checksum_when_required: bool
    etag_md5: bool


def client_settings(url: StorageUrl, endpoints: StorageEndpoints) -> ClientSettings:
    """Where and how to talk to ``url`` (the one place the three schemes differ)."""
    if url.scheme == "r2":
        assert url.account is not None
        return ClientSettings(endpoints.r2_endpoint(url.account), "auto", "path",
                              endpoints.r2_checksum_when_required, endpoints.r2_etag_md5)
    if url.scheme == "cw":
        return ClientSettings(endpoints.cw_endpoint(), endpoints.cw_region, endpoints.cw_addressing_style,
                              endpoints.cw_checksum_when_required, endpoints.cw_etag_md5)
    return ClientSettings(endpoints.s3_endpoint_url, endpoints.s3_region, endpoints.s3_addressing_style,
                          endpoints.s3_checksum_when_required, endpoints.s3_etag_md5)


def boto_config(settings: ClientSettings, options: TransportOptions, *, signed: bool, retries: int) -> dict[str, Any]:
    """botocore ``Config`` keyword arguments shared by every client of the backend."""
    import botocore

    common: dict[str, Any] = {
        "region_name": settings.region,
        "s3": {"addressing_style": settings.addressing_style},
        "connect_timeout": options.connect_timeout_s,
        "read_timeout": options.read_timeout_s,
        "max_pool_connections": options.max_connections,
        "retries": {"mode": "standard", "max_attempts": retries},
    }
    if not signed:
        common["signature_version"] = botocore.UNSIGNED
    if settings.checksum_when_required:
        common["request_checksum_calculation"] = "when_required"
        common["response_checksum_validation"] = "when_required"
    return common


_PROBE_KEY = "bt-presign-probe/a b+c=d&e~\u00fc%2F"  # odd characters: the probe also checks key encoding
_QS_SAFE = "-_.~"  # SigV4 canonical query encoding: everything but the unreserved characters


class _FastPresigner:
    """SigV4 query presigning of GETs in ~20 us instead of botocore's ~0.7 ms per URL.

    Why: the data plane presigns every GET, and with 10,000 small objects botocore's presigner (a
    request object, handlers, a fresh signing-key derivation per URL) was seconds of the two cores
    the transfer needs. This signer takes everything that is not per-request from one URL botocore
    presigned (endpoint, addressing style, region, parameter set) and only recomputes what changes:
    the date, the canonical request of the key and one HMAC under a signing key cached per day.
    :meth:`probe` signs a probe key both ways and is used only if the URLs are byte-identical, so
    any setup it does not reproduce (another signature version, a custom endpoint resolver) keeps
    botocore.
    """

    def __init__(self, base: str, host: str, params: list[tuple[str, str]], region: str, credentials: Any) -> None:
        self._base = base  # scheme://host/[bucket/] (path or virtual-hosted style, as botocore chose)
        self._host = host
        self._params = params  # botocore's query parameters, in its order, minus the signature
        self._region = region
        self._credentials = credentials  # botocore credentials (refreshable ones refresh on freeze)
        self._key_cache: tuple[tuple[str, str], bytes] | None = None
        self._path = urlsplit(base).path
        self._encoded = {k: quote(k, safe=_QS_SAFE) for k, _ in params}
        self._encoded_values = {k: quote(v, safe=_QS_SAFE) for k, v in params}
        self._stamp: tuple[int, str] = (-1, "")

    @classmethod
    def probe(cls, client: Any, session: Any, bucket: str, signed: bool) -> _FastPresigner | Literal[False]:
        """A signer proven equal to ``client``'s presigner on a probe key, or False (keep botocore)."""
        try:
            ref = str(client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": _PROBE_KEY},
                                                    ExpiresIn=3600))
            parts = urlsplit(ref)
            quoted = quote(_PROBE_KEY, safe="/~")
            if not parts.path.endswith(quoted) or parts.fragment:
                return False
            base = f"{parts.scheme}://{parts.netloc}{parts.path[:-len(quoted)]}"
            params = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
            if not signed:
                return cls(base, parts.netloc, [], "", None) if not params else False
            names = [k for k, _ in params]
            got = dict(params)
            scope = got.get("X-Amz-Credential", "").split("/")
            if (got.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256" or got.get("X-Amz-SignedHeaders") != "host"
                    or len(scope) != 5 or scope[3:] != ["s3", "aws4_request"] or names[-1] != "X-Amz-Signature"
                    or len(set(names)) != len(names)):
                return False
            credentials = session.get_credentials()
            if credentials is None:
                return False
            fast = cls(base, parts.netloc.lower(), params[:-1], scope[2], credentials)
            return fast if fast.url(_PROBE_KEY, amz_date=got["X-Amz-Date"]) == ref else False
        except Exception:  # any surprise: botocore signs, as before
            return False

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached = self._key_cache
        if cached is not None and cached[0] == (secret, day):
            return cached[1]
        key = ("AWS4" + secret).encode()
        for part in (day, self._region, "s3", "aws4_request"):
            key = hmac.digest(key, part.encode(), "sha256")
        self._key_cache = ((secret, day), key)
        return key

    def _now(self) -> str:
        """The SigV4 timestamp, formatted once per second (not once per URL)."""
        now = int(time.time())
        cached = self._stamp
        if cached[0] != now:
            cached = self._stamp = (now, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)))
        return cached[1]

    def url(self, key: str, *, amz_date: str | None = None) -> str:
        """The presigned GET URL of ``key`` (valid for the probe's ``X-Amz-Expires``)."""
        path_key = quote(key, safe="/~")
        if self._credentials is None:
            return self._base + path_key
        creds = self._credentials.get_frozen_credentials()
        stamp = amz_date or self._now()
        day = stamp[:8]
        values = {"X-Amz-Date": stamp,
                  "X-Amz-Credential": f"{creds.access_key}/{day}/{self._region}/s3/aws4_request"}
        if creds.token:
            values["X-Amz-Security-Token"] = creds.token
        params = [(k, values.get(k, v)) for k, v in self._params]
        if ("X-Amz-Security-Token" in values) != any(k == "X-Amz-Security-Token" for k, _ in params):
            params = [(k, v) for k, v in params if k != "X-Amz-Security-Token"]
            if creds.token:
                params.append(("X-Amz-Security-Token", creds.token))
        # Only the per-URL values need quoting; the others were quoted once (_encoded).
        names, fixed = self._encoded, self._encoded_values
        encoded = [(names.get(k) or quote(k, safe=_QS_SAFE), quote(v, safe=_QS_SAFE) if k in values else fixed[k])
                   for k, v in params]
        canonical_qs = "&".join(f"{k}={v}" for k, v in sorted(encoded))
        canonical = f"GET\n{self._path}{path_key}\n{canonical_qs}\nhost:{self._host}\n\nhost\nUNSIGNED-PAYLOAD"
        to_sign = (f"AWS4-HMAC-SHA256\n{stamp}\n{day}/{self._region}/s3/aws4_request\n"
                   f"{hashlib.sha256(canonical.encode()).hexdigest()}")
        sig = hmac.digest(self._signing_key(creds.secret_key, day), to_sign.encode(), "sha256").hex()
        query = "&".join(f"{k}={v}" for k, v in encoded)
        return f"{self._base}{path_key}?{query}&X-Amz-Signature={sig}"


_LIST_PAGE_MAX = 64 << 20  # a 1,000-key page is ~0.3 MB; a page bigger than this is not a listing


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]  # S3's namespace (or none, as some S3-alikes answer)


def _parse_list_page(body: bytes, uri: str) -> tuple[list[dict[str, Any]], str | None]:
    """(objects, next continuation token or None) of one ``ListObjectsV2`` XML page.

    Each object is ``{"Key", "Size", "ETag", "ChecksumAlgorithm"}`` as botocore gives them: keys
    URL-decoded (``unquote_plus``) when the page says ``EncodingType=url``, ETag text as sent.
    """
    from urllib.parse import unquote_plus
    from xml.etree.ElementTree import ParseError, fromstring

    try:
        root = fromstring(_no_dtd(body, uri))  # noqa: S314 - no DTD, hence no entity of any kind
    except ParseError as exc:
        raise SourceUnavailableError(uri, f"malformed listing page: {exc}", transient=True) from exc
    if _local(root.tag) != "ListBucketResult":
        raise SourceError(uri, f"unexpected listing answer <{_local(root.tag)[:40]}>")
    fields = {_local(child.tag): child.text or "" for child in root if _local(child.tag) != "Contents"}
    encoded = fields.get("EncodingType") == "url"
    objects: list[dict[str, Any]] = []
    for item in root:
        if _local(item.tag) != "Contents":
            continue
        obj: dict[str, Any] = {"ChecksumAlgorithm": []}
        for child in item:
            name, text = _local(child.tag), child.text or ""
            if name == "ChecksumAlgorithm":
                obj["ChecksumAlgorithm"].append(text)
            elif name in ("Key", "ETag", "Size"):
                obj[name] = text
        if "Key" not in obj or not obj.get("Size", "").isdigit():
            raise SourceError(uri, "listing page with an object lacking a key or size")
        obj["Size"] = int(obj["Size"])
        if encoded:
            obj["Key"] = unquote_plus(obj["Key"])
        objects.append(obj)
    truncated = fields.get("IsTruncated", "false").lower() == "true"
    token = fields.get("NextContinuationToken") or None
    if truncated and token is None:
        raise SourceError(uri, "listing page is truncated but names no continuation token")
    return objects, token if truncated else None


def _no_dtd(body: bytes, uri: str) -> str:
    """``body`` as text unless it is not UTF-8 or carries a DTD (S3 sends neither).

    Why: without a DTD an XML document cannot declare or expand entities, so nothing a hostile
    store sends can make the parser read files or build exponentially large text. The check is
    on the decoded text and the parser is given that text (ElementTree then parses it as UTF-8
    whatever its XML declaration says), so no other encoding can hide a ``<!DOCTYPE``.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(uri, "listing page is not UTF-8") from exc
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise SourceError(uri, "listing page with a DTD (<!DOCTYPE/<!ENTITY) refused")
    return text


def _xml_error(body: bytes) -> tuple[str, str]:
    """(Code, Message) of an S3 XML error body ("" when there is none)."""
    from xml.etree.ElementTree import ParseError, fromstring

    try:
        root = fromstring(_no_dtd(body, ""))  # noqa: S314 - no DTD, hence no entity of any kind
    except (ParseError, SourceError):
        return "", ""
    fields = {_local(child.tag): (child.text or "")[:200] for child in root}
    return fields.get("Code", ""), fields.get("Message", "")


class S3Backend(Backend):
    """A prefix of an S3, R2 or CoreWeave bucket."""

    writable = True

    def __init__(self, url: StorageUrl, *, credentials: Credentials | None, endpoints: StorageEndpoints,
                 options: TransportOptions) -> None:
        """Build the clients for ``url``'s endpoint; no request is made yet."""
        import boto3
        import botocore.session
        from botocore.config import Config

        self.url = url
        self.options = options
        self.settings = client_settings(url, endpoints)
        creds = credentials or Credentials()
        signed = creds.aws_access_key_id is not None or creds.ambient
        core = botocore.session.get_session()
        # Timestamps stay the strings the store sent: nothing here reads them as dates (s3_upload sorts
        # ISO 8601 strings), and dateutil parsing two per object was ~40% of a listing's CPU
        # (10,000 objects: ~0.25 s a listing on the bench VM).
        core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
        session = boto3.session.Session(
            aws_access_key_id=creds.aws_access_key_id, aws_secret_access_key=creds.aws_secret_access_key,
            aws_session_token=creds.aws_session_token, region_name=self.settings.region, botocore_session=core)
        endpoint = self.settings.endpoint_url
        # Metadata lets botocore retry; data does not: the download engine resumes ranges itself.
        self._meta = session.client("s3", endpoint_url=endpoint, config=Config(
            **boto_config(self.settings, options, signed=signed, retries=options.list_retries)))
        self._data = session.client("s3", endpoint_url=endpoint, config=Config(
            **boto_config(self.settings, options, signed=signed, retries=1)))
        self._session, self._signed, self._transport = session, signed, options
        self._extra_clients: list[Any] = []
        self._pool: Any = None
        self._fast: _FastPresigner | Literal[False] | None = None  # None: not probed yet; False: botocore
        self._fast_lock = threading.RLock()  # _get_url's probe makes the presign client under it
        self._presigner: Any = None
        self._small: SmallGets | None = None
        if endpoints.s3_data_plane == "presigned":
            from slurm_bt.storage._http import SmallGets, make_pool

            self._pool = make_pool(options.connect_timeout_s, options.read_timeout_s, options.max_connections)
            self._small = SmallGets(options.connect_timeout_s, options.read_timeout_s)

    # -- error mapping ---------------------------------------------------------------------------
    def map_error(self, exc: Exception, *, file: str | None = None, offset: int | None = None) -> SourceError:
        """A boto3/botocore failure in the error tree."""
        from botocore.exceptions import BotoCoreError, ClientError

        src = self.url.canonical
        if isinstance(exc, SourceError):
            return exc
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in _ACCESS_CODES or status in (401, 403):
                return SourceAccessError(src, f"not authorized for {src} ({code or status}); check the credentials "
                                         "(auth_secret_name / ?secret=)", file=file)
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

    def call(self, fn: Any, **kwargs: Any) -> Any:
        """One boto3 call, mapped; transient failures are retried once more here."""
        from slurm_bt.storage.base import retry_transient

        def once() -> Any:
            try:
                return fn(**kwargs)
            except Exception as exc:
                raise self.map_error(exc, file=kwargs.get("Key")) from exc

        return retry_transient(once, 2)

    # -- checksums -------------------------------------------------------------------------------
    def _etag_check(self, etag: str | None, parts: tuple[int, ...] = (), assumed: bool = False,
                    ) -> tuple[OriginChecksum, ...]:
        """The ETag as an MD5 check: of the content (single part), or of the part MD5s (``parts`` known)."""
        if not self.settings.etag_md5 or not etag:
            return ()
        md5 = s3_etag_md5(etag)
        if md5:  # maybe_not_content_hash: SSE-KMS / SSE-C ETags look the same; a mismatch asks etag_is_md5.
            return (OriginChecksum("md5", md5, "ETag", maybe_not_content_hash=True),)
        value, _, count = etag.strip().strip('"').lower().partition("-")
        if parts and s3_etag_md5(value) and count == str(len(parts)):
            return (OriginChecksum("md5", value, f"ETag (multipart, {len(parts)} parts)", maybe_not_content_hash=True,
                                   part_sizes=parts, layout_assumed=assumed),)
        return ()

    def _checks_from_head(self, head: dict[str, Any], key: str, parts: tuple[int, ...] = (), assumed: bool = False,
                          ) -> tuple[str | None, tuple[OriginChecksum, ...]]:
        """(full-object sha256 or None, the other checks) from a ``ChecksumMode=ENABLED`` HEAD.

        A ``COMPOSITE`` value (``<base64>-<n>``: the algorithm over the parts' digests) is a check only
        when the part layout is known (``parts``, from :meth:`_part_layout`).
        """
        whole = head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT"
        sha: str | None = None
        checks: list[OriginChecksum] = []
        try:
            for field, kind in _HEAD_CHECKSUMS:
                value = head.get(field)
                if not value:
                    continue
                b64, _, count = str(value).partition("-")
                hexv = b64_to_hex(b64)
                assert hexv is not None
                if whole and not count:
                    if kind == "sha256":
                        if len(hexv) != 64:
                            raise SourceError(self.url.canonical,
                                              f"object {key!r} has a malformed x-amz-checksum-sha256")
                        sha = hexv
                    else:
                        checks.append(OriginChecksum(kind, hexv, f"x-amz-checksum-{kind}"))
                elif parts and kind != "crc64nvme" and count in ("", str(len(parts))):
                    checks.append(OriginChecksum(kind, hexv, f"x-amz-checksum-{kind} (composite, {len(parts)} parts)",
                                                 part_sizes=parts, layout_assumed=assumed))
        except ValueError as exc:
            raise SourceError(self.url.canonical, f"object {key!r} has a malformed checksum header") from exc
        return sha, tuple(checks)

    def head(self, key: str, etag: str | None = None) -> dict[str, Any]:
        """``HeadObject`` with checksums of ``key`` (absolute in the bucket), pinned to ``etag`` when given."""
        kwargs: dict[str, Any] = {"Bucket": self.url.container, "Key": key, "ChecksumMode": "ENABLED"}
        if etag:
            kwargs["IfMatch"] = etag  # the checksums of the listed version, not of a later overwrite
        return dict(self.call(self._meta.head_object, **kwargs))

    def _head_part(self, key: str, etag: str | None, part: int) -> tuple[int, int] | None:
        """(length, parts count) of one part of a multipart object, or None from a store without part HEADs."""
        from botocore.exceptions import ClientError

        kwargs: dict[str, Any] = {"Bucket": self.url.container, "Key": key, "PartNumber": part}
        if etag:
            kwargs["IfMatch"] = etag

        def head_part(**kw: Any) -> dict[str, Any] | None:
            try:
                return dict(self._meta.head_object(**kw))
            except ClientError as exc:
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
                if status in (400, 405, 416, 501):  # partNumber not supported: no per-part check
                    return None
                raise

        head = self.call(head_part, **kwargs)
        if head is None:
            return None
        return int(head.get("ContentLength") or 0), int(head.get("PartsCount") or 0)

    def _exact_parts(self, key: str, etag: str | None, count: int) -> tuple[int, ...] | None:
        """Every part's length (one HEAD each, 16 at a time), or None past ``_MAX_PART_HEADS`` parts."""
        if not 0 < count <= _MAX_PART_HEADS:
            return None
        with ThreadPoolExecutor(min(16, count), thread_name_prefix="bt-head") as pool:
            heads = list(pool.map(lambda n: self._head_part(key, etag, n), range(1, count + 1)))
        sizes = tuple(h[0] for h in heads if h is not None)
        return sizes if len(sizes) == count and all(n > 0 for n in sizes) else None

    def _part_layout(self, key: str, etag: str | None, size: int) -> tuple[tuple[int, ...], bool]:
        """(part lengths, assumed) of a multipart object; ((), False) when they cannot be known.

        One HEAD of part 1 gives its length and the part count. Every common uploader (boto3, the
        AWS CLI, s5cmd, rclone) cuts equal parts but the last, so that layout is taken when the size
        fits it (``assumed``: a mismatch then asks every part's length before refusing,
        :meth:`exact_check`); a size that fits no such layout asks every part's length at once.
        """
        got = self._head_part(key, etag, 1)
        if got is None:
            return (), False
        first, count = got
        if first <= 0 or count <= 0:
            return (), False
        if count == 1:
            return ((size,) if first == size else ()), False
        last = size - first * (count - 1)
        if 0 < last <= first:
            return (first,) * (count - 1) + (last,), count > 2
        exact = self._exact_parts(key, etag, count)
        return (exact, False) if exact is not None and sum(exact) == size else ((), False)

    def _file_checks(self, key: str, size: int, etag: str | None, head: dict[str, Any] | None,
                     ) -> tuple[str | None, tuple[OriginChecksum, ...]]:
        """sha256 and checks of one listed object: HEAD's full-object values, else the per-part ones."""
        sha, checks = self._checks_from_head(head, key) if head is not None else (None, ())
        checks += self._etag_check(etag)
        multipart = bool(etag) and "-" in str(etag)
        per_part_values = self.settings.etag_md5 or (head is not None and any(
            "-" in str(head.get(field) or "") for field, _ in _HEAD_CHECKSUMS))
        if sha is None and multipart and per_part_values and not any(computable(c.kind) for c in checks):
            # Nothing covers the content as a whole (a multipart upload without a FULL_OBJECT
            # checksum, what boto3, the AWS CLI and s5cmd make): check the per-part values instead.
            parts, assumed = self._part_layout(key, etag, size)
            if parts:
                _, composite = self._checks_from_head(head, key, parts, assumed) if head is not None else (None, ())
                checks = tuple(c for c in composite if c.per_part) + self._etag_check(etag, parts, assumed)
        return sha, checks

    def exact_check(self, file: RemoteFile, check: OriginChecksum) -> OriginChecksum | None:
        """``check`` with every part's real length, when its assumed equal-part layout was wrong (else None)."""
        if not check.layout_assumed:
            return None
        exact = self._exact_parts(self.url.key_for(file.path), file.etag, len(check.part_sizes))
        if exact is None or exact == check.part_sizes or sum(exact) != file.size:
            return None
        return dataclasses.replace(check, part_sizes=exact, layout_assumed=False)

    def _remote_from_head(self, path: str, head: dict[str, Any], key: str) -> RemoteFile:
        etag = head.get("ETag")
        size = int(head["ContentLength"])
        sha, checks = self._file_checks(key, size, etag, head)
        return RemoteFile(path, size, sha, etag=etag, checksums=checks)

    def stat(self, path: str) -> RemoteFile:
        """One HEAD with ``ChecksumMode=ENABLED`` (see the module docstring for why not s3fs)."""
        key = self.url.key_for(path)
        return self._remote_from_head(path, self.head(key), key)

    def _to_remote(self, path: str, info: dict[str, Any]) -> RemoteFile:
        etag = info.get("ETag")
        return RemoteFile(path, int(info.get("size") or info.get("Size") or 0), None, etag=etag,
                          checksums=self._etag_check(etag))

    def list_files(self) -> Listing:
        """See :meth:`list_files_streaming` (which this is, with nothing streamed)."""
        return self.list_files_streaming(lambda _f: None)

    def list_files_streaming(self, on_file: Callable[[RemoteFile], None]) -> Listing:
        """List every object under ``prefix/`` (directory semantics); one object if prefix is a key.

        Each object carries the checksums its origin vouches for: the MD5 of a single-part ETag
        (free with the listing) and, from one HEAD, full-object SHA256/CRC32/CRC32C when the listing
        says the object has them. The HEAD is made when it buys something: always for SHA256 (no
        sha256 to compute), for a CRC only when there is no MD5 ETag (multipart) or the object is big
        enough that checking a CRC instead of an MD5 saves real CPU (``_HEAD_MIN_SIZE``), and, when
        the listing names no algorithm (the store may not list them), for a multipart object or a
        big one.
        """
        from slurm_bt.storage.base import listing_digest
        from slurm_bt.storage.url import safe_relative_path

        prefix = self.url.prefix
        # path, key, size, etag, the ETag's checks, HEAD?
        found: list[tuple[str, str, int, str | None, tuple[OriginChecksum, ...], bool]] = []
        try:
            for page in self._list_pages(f"{prefix}/" if prefix else ""):
                for obj in page:
                    key: str = obj["Key"]
                    path = key[len(prefix) + 1:] if prefix else key
                    if path.endswith("/") and obj["Size"] == 0:
                        continue  # a "folder" marker made by consoles
                    if not safe_relative_path(path):
                        raise SourceError(self.url.canonical, f"object key {key!r} cannot be mirrored safely "
                                          "(empty, '.' or '..' segment, or control character)")
                    size, etag = int(obj["Size"]), obj.get("ETag")
                    algos = set(obj.get("ChecksumAlgorithm", []))
                    multipart = bool(etag) and "-" in str(etag)
                    head = ("SHA256" in algos
                            # A multipart object: a full-object checksum if it has one, else the
                            # per-part values its HEAD (and the part layout) give.
                            or multipart
                            or (bool(algos & {"CRC32", "CRC32C", "CRC64NVME"})
                                and (not self._etag_check(etag) or size >= _HEAD_MIN_SIZE))
                            # Some stores keep full-object checksums but do not list them (SeaweedFS);
                            # for a big single-part object the HEAD may find a CRC that replaces the
                            # MD5 (docs/storage.md: ~2 s of CPU per 2 GiB on the bench VM).
                            or (not algos and size >= _HEAD_MIN_SIZE))
                    checks = self._etag_check(etag)
                    found.append((path, key, size, etag, checks, head))
                    if not head:  # final already: its download may start while the next page is asked
                        on_file(RemoteFile(path, size, None, etag=etag, checksums=checks))
        except SourceError:
            raise
        except Exception as exc:
            raise self.map_error(exc) from exc
        files: list[RemoteFile] = []
        wanted = [(path, key, size, etag) for path, key, size, etag, _, head in found if head]
        heads: dict[str, tuple[str | None, tuple[OriginChecksum, ...]]] = {}
        if wanted:
            with ThreadPoolExecutor(min(16, self.options.max_connections), thread_name_prefix="bt-head") as pool:
                for (path, key, size, etag), got in zip(wanted, pool.map(
                        lambda pkse: self._file_checks(pkse[1], pkse[2], pkse[3], self.head(pkse[1], pkse[3])),
                        wanted), strict=True):
                    heads[key] = got
                    on_file(RemoteFile(path, size, got[0], etag=etag, checksums=got[1]))
        for path, key, size, etag, listed, _ in found:
            sha, checks = heads.get(key) or (None, listed)
            files.append(RemoteFile(path, size, sha, etag=etag, checksums=checks))
        if not files and prefix:
            try:
                one = self.head(prefix)
            except SourceNotFoundError as exc:
                raise SourceNotFoundError(self.url.canonical, "no object under this prefix") from exc
            # The single object lives at the prefix itself: re-root the URL one level up.
            files = [self._remote_from_head(prefix.rsplit("/", 1)[-1], one, prefix)]
            self.url = self.url.with_prefix(prefix.rsplit("/", 1)[0] if "/" in prefix else "")
        return Listing(self.url, listing_digest(files), tuple(files))

    def _list_pages(self, prefix: str) -> Iterator[list[dict[str, Any]]]:
        """The objects under ``prefix``, one ``ListObjectsV2`` page at a time (``Key``, ``Size``, ``ETag``,
        ``ChecksumAlgorithm`` as botocore names them).

        With the presigned data plane each page is a GET of a URL botocore presigned (its usual
        ``encoding-type=url``, decoded the way botocore decodes it), read by urllib3 and parsed
        by ElementTree: botocore's model-driven parser took ~0.3 s of CPU per 10,000 objects on the
        bench VM, most of a listing, and a stage lists twice (pin at submit, check in the job).
        Errors map as botocore's would (the same ``map_error``), transient ones are retried
        ``list_retries`` times. With ``s3_data_plane=boto3`` botocore lists, as before.
        """
        if self._pool is None:
            for page in self._meta.get_paginator("list_objects_v2").paginate(Bucket=self.url.container,
                                                                             Prefix=prefix):
                yield list(page.get("Contents", []))
            return
        from slurm_bt.storage.base import retry_transient

        token: str | None = None
        while True:
            params: dict[str, Any] = {"Bucket": self.url.container, "Prefix": prefix, "EncodingType": "url"}
            if token is not None:
                params["ContinuationToken"] = token
            url = str(self._presign_client().generate_presigned_url("list_objects_v2", Params=params,
                                                                    ExpiresIn=900))
            def page(url: str = url) -> bytes:
                return self._list_page(url)

            body = retry_transient(page, max(1, self.options.list_retries))
            objects, token = _parse_list_page(body, self.url.canonical)
            yield objects
            if token is None:
                return

    def _list_page(self, url: str) -> bytes:
        """One listing page's XML (at most 64 MiB); a non-200 answer raised as botocore's error would map."""
        import urllib3.exceptions
        from botocore.exceptions import ClientError

        try:
            resp = self._pool.request("GET", url, preload_content=False, decode_content=True)
            try:
                body = resp.read(_LIST_PAGE_MAX + 1)
            finally:
                resp.release_conn() if resp.isclosed() else resp.close()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            from slurm_bt.storage._http import describe_error

            raise SourceUnavailableError(self.url.canonical, f"origin unreachable: {describe_error(exc)}",
                                         transient=True) from exc
        if len(body) > _LIST_PAGE_MAX:
            raise SourceError(self.url.canonical, f"a listing page is more than {_LIST_PAGE_MAX} bytes")
        if resp.status != 200:
            code, message = _xml_error(body)
            raise self.map_error(ClientError({"Error": {"Code": code, "Message": message},
                                              "ResponseMetadata": {"HTTPStatusCode": resp.status}}, "ListObjectsV2"))
        return bytes(body)

    def etag_is_md5(self, file: RemoteFile) -> bool:
        """Whether ``file``'s ETag is its MD5: not under SSE-KMS (also DSSE-KMS) or SSE-C (one HEAD)."""
        head = self.head(self.url.key_for(file.path), file.etag)
        encrypted = str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or head.get("SSECustomerAlgorithm")
        return not encrypted

    # -- data plane ------------------------------------------------------------------------------
    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """Ranged GET pinned with ``If-Match`` to the listed ETag (presigned + urllib3, or botocore)."""
        key = self.url.key_for(file.path)
        if self._pool is not None:
            from slurm_bt.storage._http import SMALL_BODY_MAX, open_http_range

            # Presigning is local (SigV4 over the query string); Range and If-Match travel as
            # ordinary unsigned headers, which S3 allows, so the ETag pin is kept (412 if changed).
            url = self._get_url(key)
            headers = {"Accept-Encoding": "identity"}
            if file.etag:
                headers["If-Match"] = file.etag
            size = getattr(file, "size", None)
            want = (size if end is None else end) - start if isinstance(size, int) else 0
            if self._small is not None and 0 < want <= SMALL_BODY_MAX:
                # A small object's whole remainder: one lean GET into memory (_http.SmallGets);
                # None when the answer needs urllib3 (a redirect, chunked...): asked again below.
                # The limit also fits a 200 with the whole object (a store that ignored Range).
                body = self._small.get(url, uri=self.url.canonical, file=file.path, start=start, end=end,
                                       headers=headers, limit=max(want, min(size or 0, SMALL_BODY_MAX)))
                if body is not None:
                    return body
            return open_http_range(self._pool, url, uri=self.url.canonical, file=file.path, start=start, end=end,
                                   headers=headers)
        kwargs: dict[str, Any] = {"Bucket": self.url.container, "Key": key}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if file.etag:
            kwargs["IfMatch"] = file.etag
        try:
            resp = self._data.get_object(**kwargs)
        except Exception as exc:
            raise self.map_error(exc, file=file.path, offset=start) from exc
        body = resp["Body"]
        return BodyStream(body.read, body.close, partial="ContentRange" in resp, uri=self.url.canonical,
                          file=file.path, start=start)

    def _get_url(self, key: str) -> str:
        """A presigned GET URL for ``key`` (1 h): :class:`_FastPresigner` when it proved it signs like botocore."""
        if self._fast is None:
            with self._fast_lock:
                if self._fast is None:
                    self._fast = _FastPresigner.probe(self._presign_client(), self._session, self.url.container,
                                                      self._signed)
        if self._fast:
            return self._fast.url(key)
        return str(self._presign_client().generate_presigned_url(
            "get_object", Params={"Bucket": self.url.container, "Key": key}, ExpiresIn=3600))

    def _presign_client(self) -> Any:
        """The client that presigns: SigV4 explicitly (botocore would presign with the legacy SigV2 for
        us-east-1 and custom endpoints, which newer regions and R2 refuse). Made on first use (~50 ms)."""
        with self._fast_lock:
            if self._presigner is None:
                from botocore.config import Config

                config = boto_config(self.settings, self._transport, signed=self._signed, retries=1)
                if self._signed:
                    config["signature_version"] = "s3v4"
                self._presigner = self._session.client("s3", endpoint_url=self.settings.endpoint_url,
                                                       config=Config(**config))
                self._extra_clients.append(self._presigner)
            return self._presigner

    def presigned_url(self, path: str, expires_s: int) -> str:
        """A presigned ``GetObject`` URL (local SigV4, no request); a plain URL when the store is anonymous."""
        return str(self._presign_client().generate_presigned_url(
            "get_object", Params={"Bucket": self.url.container, "Key": self.url.key_for(path)},
            ExpiresIn=expires_s))

    # -- writes ----------------------------------------------------------------------------------
    def uploader(self, options: UploadOptions | None = None) -> S3Uploader:
        """Resumable verified multipart uploads into this bucket (:mod:`.s3_upload`).

        Its client is this backend's setup with upload settings: payload signing off (per-part
        checksums protect the bytes), the SDK's own checksums off (we always send ours), a longer
        read timeout and more retries (a part is 64 MiB, not a metadata call).
        """
        from botocore.config import Config

        from slurm_bt.storage.s3_upload import S3Uploader

        options = options or UploadOptions()
        config = boto_config(self.settings, self._transport, signed=self._signed, retries=6)
        config["s3"] = {**config["s3"], "payload_signing_enabled": False}
        config.update(request_checksum_calculation="when_required", response_checksum_validation="when_required",
                      max_pool_connections=options.concurrency + 4, read_timeout=120)
        client = self._session.client("s3", endpoint_url=self.settings.endpoint_url, config=Config(**config))
        self._extra_clients.append(client)
        return S3Uploader(self, client, options)

    def write_bytes(self, path: str, data: bytes) -> None:
        """``PutObject`` with ``ChecksumSHA256``: the server verifies the digest (s3fs sends none)."""
        import base64
        import hashlib

        self.call(self._meta.put_object, Bucket=self.url.container, Key=self.url.key_for(path), Body=data,
                  ChecksumSHA256=base64.b64encode(hashlib.sha256(data).digest()).decode())

    def read_bytes(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        """A small object's bytes (one ``GetObject``), or None when absent."""
        try:
            resp = self.call(self._meta.get_object, Bucket=self.url.container, Key=self.url.key_for(path))
        except SourceNotFoundError:
            return None
        if int(resp.get("ContentLength", 0)) > max_bytes:
            resp["Body"].close()
            raise SourceError(self.url.canonical, f"object is more than {max_bytes} bytes", file=path)
        return bytes(resp["Body"].read(max_bytes + 1))

    def list_dirs(self, prefix: str) -> list[str]:
        """Common prefixes one level below ``prefix`` (``ListObjectsV2`` with ``Delimiter``)."""
        full = self.url.key_for(prefix.strip("/"))
        base = f"{full.rstrip('/')}/" if full else ""
        names: list[str] = []
        try:
            for page in self._meta.get_paginator("list_objects_v2").paginate(
                    Bucket=self.url.container, Prefix=base, Delimiter="/"):
                names += [p["Prefix"][len(base):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        except Exception as exc:
            raise self.map_error(exc, file=base) from exc
        return sorted(names)

    def delete_prefix(self, prefix: str) -> int:
        """``ListObjectsV2`` then ``DeleteObjects`` (1000 keys a request) under ``prefix/``."""
        full = self.url.key_for(prefix.strip("/"))
        if not full:
            raise SourceError(self.url.canonical, "refusing to delete the whole store", file=prefix)
        base = f"{full.rstrip('/')}/"
        count = 0
        try:
            for page in self._meta.get_paginator("list_objects_v2").paginate(Bucket=self.url.container, Prefix=base):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                for i in range(0, len(keys), 1000):
                    resp = self._meta.delete_objects(Bucket=self.url.container,
                                                     Delete={"Objects": keys[i:i + 1000], "Quiet": True})
                    if resp.get("Errors"):
                        err = resp["Errors"][0]
                        raise SourceError(self.url.canonical, f"delete failed: {err.get('Code')}", file=err.get("Key"))
                    count += len(keys[i:i + 1000])
        except SourceError:
            raise
        except Exception as exc:
            raise self.map_error(exc, file=base) from exc
        return count

    def close(self) -> None:
        """Close the clients' connection pools."""
        if self._pool is not None:
            self._pool.clear()
        if self._small is not None:
            self._small.close()
        for client in (self._meta, self._data, *self._extra_clients):
            try:
                client.close()
            except Exception:  # noqa: S110 - best effort
                pass
