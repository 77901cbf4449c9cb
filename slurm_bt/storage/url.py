"""Storage URLs: one parser for every scheme, one spelling per object, keys never escape the root.

Accepted forms (weights sources and checkpoint stores share them; docs/storage.md):

=============================================  ================================================
``hf://org/repo[@revision]``                   Hugging Face Hub (also legacy ``hf://repo``)
``s3://bucket[/prefix]``                       AWS S3 or the site's S3-compatible endpoint
``r2://<account_id>.bucket[/prefix]``          Cloudflare R2; account id = 32 lower-case hex
``cw://bucket[/prefix]``                       CoreWeave AI Object Storage (S3 API, endpoint
                                               from the site file's ``cw_endpoint_template``)
``gs://bucket[/prefix]``                       Google Cloud Storage
``azure://account/container[/prefix]``         Azure Blob Storage
``https://host[:port]/path``                   one file on any HTTPS server
``file:///absolute/dir``                       a local or shared directory
=============================================  ================================================

Checkpoint stores (``storage.checkpoint_store``) are read by :func:`parse_store_url`: the
``file``, ``s3``, ``r2`` and ``gs`` forms above plus query options (see :data:`STORE_OPTIONS`).

Canonicalisation (cache keys derive from :attr:`StorageUrl.canonical`): schemes are lower-case
and case-sensitive; object prefixes are directories (``s3://b/p/`` = ``s3://b/p``, and ``p`` never
matches ``p-2/``); no key is silently rewritten: empty, ``.`` and ``..`` segments, ``%`` escapes and
control characters are refused, and nothing is percent-decoded, so ``%2e%2e`` can never become
``..`` and ``b//k`` (key ``/k`` in S3) never aliases ``b/k``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qsl, urlsplit

from slurm_bt.errors import Problem, SourceSpecError, StorageError

__all__ = [
    "OBJECT_SCHEMES",
    "SCHEMES",
    "STORE_OPTIONS",
    "STORE_SCHEMES",
    "WEIGHT_SCHEMES",
    "Scheme",
    "StorageUrl",
    "StoreUrl",
    "is_commit",
    "parse_source_uri",
    "parse_store_url",
    "parse_url",
    "safe_relative_path",
]

Scheme = Literal["hf", "s3", "r2", "cw", "gs", "azure", "https", "file"]
SCHEMES: tuple[Scheme, ...] = ("azure", "cw", "file", "gs", "hf", "https", "r2", "s3")
OBJECT_SCHEMES: frozenset[str] = frozenset({"s3", "r2", "cw", "gs", "azure"})
"""Schemes whose URL names a bucket (container) and a key prefix."""
WEIGHT_SCHEMES: frozenset[str] = frozenset({"hf", "s3", "r2", "cw", "gs", "azure", "https"})
"""Schemes a ``WeightsSource`` may use (``file://`` is not one: a job's weights come from an origin)."""

_HF_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_HF_REVISION = re.compile(r"[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_R2_ACCOUNT = re.compile(r"[0-9a-f]{32}")
_R2_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_GS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_AZ_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_AZ_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252}[A-Za-z0-9])?(?::[0-9]{1,5})?")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SUPPORTED = ", ".join(f"{s}://" for s in SCHEMES)


@dataclass(frozen=True)
class StorageUrl:
    """A parsed, validated storage URL.

    Attributes:
        scheme: one of :data:`SCHEMES`.
        container: HF repo id (``org/repo``), bucket / container name, the HTTPS ``host[:port]``,
            or ``""`` for ``file``.
        prefix: key prefix without leading/trailing ``/`` (``""`` = whole bucket); the path
            without its leading ``/`` for ``https``; the absolute directory for ``file``; ``""``
            for HF.
        revision: HF branch, tag or commit as written (None = ``main``); None otherwise.
        account: the R2 account id or the Azure storage account; None otherwise.
    """

    scheme: Scheme
    container: str
    prefix: str = ""
    revision: str | None = None
    account: str | None = None

    @property
    def kind(self) -> Scheme:
        """The scheme (the name manifests use)."""
        return self.scheme

    @property
    def canonical(self) -> str:
        """The URL without ``@revision``: what manifests record and cache keys derive from."""
        if self.scheme == "hf":
            return f"hf://{self.container}"
        if self.scheme == "file":
            return f"file://{self.prefix}"
        if self.scheme == "r2":
            host = f"{self.account}.{self.container}"
        elif self.scheme == "azure":
            host = f"{self.account}/{self.container}"
        else:
            host = self.container
        return f"{self.scheme}://{host}/{self.prefix}" if self.prefix else f"{self.scheme}://{host}"

    def key_for(self, path: str) -> str:
        """The object key (``file``: the absolute path) of ``path`` relative to the URL's root."""
        if self.scheme == "file":
            return f"{self.prefix.rstrip('/')}/{path}" if path else self.prefix
        if not path:
            return self.prefix
        return f"{self.prefix}/{path}" if self.prefix else path

    def with_container(self, container: str) -> StorageUrl:
        """A copy naming the container as the origin spells it (the Hub's canonical repo id)."""
        return StorageUrl(self.scheme, container, self.prefix, self.revision, self.account)

    def with_revision(self, revision: str | None) -> StorageUrl:
        """A copy pinned to ``revision`` (HF: the commit the Hub answered with)."""
        return StorageUrl(self.scheme, self.container, self.prefix, revision, self.account)

    def with_prefix(self, prefix: str) -> StorageUrl:
        """A copy rooted at ``prefix`` (a single object listed at its own key is re-rooted one level up)."""
        return StorageUrl(self.scheme, self.container, prefix, self.revision, self.account)

    def __str__(self) -> str:
        return f"{self.canonical}@{self.revision}" if self.revision else self.canonical


def _fail(source: str, message: str) -> SourceSpecError:
    return SourceSpecError(source, [Problem("source", message)])


def safe_relative_path(path: str) -> bool:
    """Whether ``path`` can name a file below a root (no empty, ``.`` or ``..`` parts, no control chars)."""
    return (
        bool(path)
        and not path.startswith("/")
        and all(p not in {"", ".", ".."} for p in path.split("/"))
        and not _CONTROL.search(path)
    )


def _check_prefix(source: str, prefix: str) -> str:
    prefix = prefix[:-1] if prefix.endswith("/") else prefix
    if not prefix:
        return ""
    if _CONTROL.search(prefix) or "%" in prefix:
        raise _fail(source, "object prefix must not contain control characters or %-escapes")
    if any(segment in {"", ".", ".."} for segment in prefix.split("/")):
        raise _fail(
            source,
            "object prefix must not contain empty, '.' or '..' segments "
            "(s3://b//k and s3://b/k name different objects; write the prefix exactly once)",
        )
    return prefix


def _parse_hf(source: str, rest: str) -> StorageUrl:
    revision: str | None = None
    if "@" in rest:
        rest, revision = rest.split("@", 1)
        if not revision or "@" in revision:
            raise _fail(source, "expected hf://org/repo@revision with exactly one non-empty revision")
        if ".." in revision or not _HF_REVISION.fullmatch(revision) or len(revision) > 255:
            raise _fail(source, f"invalid revision {revision!r} (branch, tag or 40-hex commit)")
    parts = rest.split("/")
    if len(parts) not in (1, 2) or not all(_HF_NAME.fullmatch(p) for p in parts):
        raise _fail(source, "invalid Hugging Face repo id: expected hf://owner/repo[@revision]")
    if any("--" in p or ".." in p for p in parts) or rest.endswith(".git"):
        raise _fail(source, "invalid Hugging Face repo id: '--', '..' and a '.git' suffix are not allowed")
    return StorageUrl("hf", rest, revision=revision)


def _parse_https(source: str, rest: str) -> StorageUrl:
    # Query strings and fragments are refused: a presigned URL's query is a credential and would
    # end up in manifests and cache keys; credentials come from the secret store instead.
    if "?" in rest or "#" in rest or "@" in rest.partition("/")[0]:
        raise _fail(source, "https:// sources must not contain a query, a fragment or user@ "
                    "(credentials go in auth_secret_name)")
    host, _, path = rest.partition("/")
    if not _HOST.fullmatch(host):
        raise _fail(source, f"invalid host {host!r}")
    path = _check_prefix(source, path)
    if not path:
        raise _fail(source, "https:// sources name one file: https://host/path/to/file")
    return StorageUrl("https", host.lower(), path)


def parse_url(source: str, *, allowed: frozenset[str] | None = None) -> StorageUrl:
    """Parse ``source`` into a :class:`StorageUrl`, rejecting anything ambiguous.

    Args:
        source: the URL as the user wrote it.
        allowed: schemes the caller accepts (None: all of :data:`SCHEMES`).

    Raises:
        SourceSpecError: unknown or not allowed scheme, bad repo id / bucket / account / prefix,
            or ``@revision`` outside ``hf://``.
    """
    ok = set(SCHEMES) if allowed is None else set(allowed)
    supported = ", ".join(f"{s}://" for s in sorted(ok))
    if "://" not in source:
        raise _fail(source, f"missing a URI scheme; supported: {supported}")
    scheme, rest = source.split("://", 1)
    if scheme not in ok:
        raise _fail(source, f"unsupported scheme '{scheme}://'; supported: {supported}")
    if scheme == "file":
        if not rest.startswith("/") or _CONTROL.search(rest) or ".." in rest.split("/"):
            raise _fail(source, "file:// must name an absolute path without '..' (file:///dir)")
        return StorageUrl("file", "", rest.rstrip("/") or "/")
    if not rest or rest.startswith("/"):
        raise _fail(source, f"invalid {scheme} URI: expected {scheme}://<name>[/path]")
    if scheme == "hf":
        return _parse_hf(source, rest)
    if scheme == "https":
        return _parse_https(source, rest)
    if "@" in rest:
        raise _fail(source, "the @revision syntax is only valid for Hugging Face sources (hf://)")
    host, _, prefix = rest.partition("/")
    if scheme == "azure":
        container, _, prefix = prefix.partition("/")
        if not _AZ_ACCOUNT.fullmatch(host):
            raise _fail(source, "expected azure://<account>/<container>/path with a 3-24 character "
                        "lower-case alphanumeric storage account")
        if not _AZ_CONTAINER.fullmatch(container):
            raise _fail(source, f"invalid Azure container name {container!r}")
        return StorageUrl("azure", container, _check_prefix(source, prefix), account=host)
    prefix = _check_prefix(source, prefix)
    if scheme == "r2":
        account, dot, bucket = host.partition(".")
        if not dot or not _R2_ACCOUNT.fullmatch(account):
            raise _fail(source, "expected r2://<account_id>.<bucket>/path with a 32-hex account id")
        if not _R2_BUCKET.fullmatch(bucket):
            raise _fail(source, f"invalid R2 bucket name {bucket!r}")
        return StorageUrl("r2", bucket, prefix, account=account)
    pattern = _GS_BUCKET if scheme == "gs" else _S3_BUCKET
    if not pattern.fullmatch(host) or ".." in host:
        raise _fail(source, f"invalid {scheme} bucket name {host!r}")
    return StorageUrl(scheme, host, prefix)  # type: ignore[arg-type]


def is_commit(revision: str) -> bool:
    """Whether ``revision`` is already a full 40-hex commit id."""
    return _COMMIT.fullmatch(revision) is not None


def parse_source_uri(source: str) -> StorageUrl:
    """Parse a weights source (:data:`WEIGHT_SCHEMES`); see :func:`parse_url`.

    Raises:
        SourceSpecError: as :func:`parse_url`; ``http://`` is refused naming ``https://``.
    """
    if source.startswith("http://"):
        raise _fail(source, "plain http:// is not accepted (no integrity in transit); use https://")
    return parse_url(source, allowed=WEIGHT_SCHEMES)


STORE_SCHEMES: frozenset[str] = frozenset({"file", "s3", "r2", "gs"})
"""Schemes a checkpoint store may use."""
STORE_OPTIONS: frozenset[str] = frozenset({
    "endpoint_url", "region", "addressing_style", "secret", "service_credentials", "part_checksum",
    "checksum_when_required", "part_size_mib", "concurrency"})
"""Query options of a checkpoint-store URL, all optional: ``endpoint_url``, ``region``,
``addressing_style`` (``path`` | ``virtual`` | ``auto``), ``secret`` (name of the entry in each
*user's* secret store that holds the credentials), ``service_credentials`` (root-owned JSON file, read
only by root hooks), ``part_checksum`` (``crc32c`` | ``crc32`` | ``sha256``),
``checksum_when_required`` (``1`` for S3-alikes that reject SDK-default checksums), ``part_size_mib``,
``concurrency``."""


@dataclass(frozen=True)
class StoreUrl:
    """A parsed checkpoint-store URL: where (:attr:`url`) and how (the query :attr:`options`).

    Attributes:
        url: the location; ``container`` is the bucket (``""`` for ``file``), ``prefix`` the key
            prefix without leading or trailing slash, or the absolute directory for ``file``.
        options: the query options (:data:`STORE_OPTIONS`); they may name secrets or files, so they
            are never part of :meth:`display`.
    """

    url: StorageUrl
    options: dict[str, str] = field(default_factory=dict)

    @property
    def scheme(self) -> Literal["file", "s3", "r2", "gs"]:
        """``file``, ``s3``, ``r2`` or ``gs``."""
        return self.url.scheme  # type: ignore[return-value]

    @property
    def bucket(self) -> str:
        """The bucket name, or ``""`` for ``file``."""
        return self.url.container

    @property
    def prefix(self) -> str:
        """The key prefix (object stores) or the absolute root directory (``file``)."""
        return self.url.prefix

    @property
    def account(self) -> str | None:
        """The R2 account id (``r2://<account>.<bucket>``), else None."""
        return self.url.account

    def display(self) -> str:
        """The URL without query options (what messages and logs show)."""
        return self.url.canonical

    def key(self, *parts: str) -> str:
        """Join ``parts`` under the prefix (object stores) or the root directory (``file``)."""
        return self.url.key_for("/".join(p.strip("/") for p in parts if p))


def parse_store_url(uri: str) -> StoreUrl:
    """Parse ``storage.checkpoint_store`` (the site's checkpoint store).

    Why its own entry point and not :func:`parse_url`: a store URL carries query options (the
    weights forms refuse queries), and its names are checked only as far as stores always were:
    the bucket is whatever the URL names and an R2 account is any non-empty label before the first
    dot (``r2://acct.bkt`` is accepted, tests/unit/test_checkpoints_scan.py), so a store configured
    before the weights rules existed keeps working. Errors are :class:`StorageError` (a site
    configuration problem reported by the hooks, not a user's source spec).

    Raises:
        StorageError: unknown scheme or option, relative ``file`` path, ``..`` anywhere.
    """
    parts = urlsplit(uri)
    scheme = parts.scheme
    shown = uri.split("?")[0]
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - STORE_OPTIONS)
    if unknown:
        raise StorageError(shown, f"unknown checkpoint store option(s): {', '.join(unknown)}")
    path = parts.path
    if ".." in path.split("/"):
        raise StorageError(shown, "checkpoint store path must not contain '..'")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise StorageError(uri, "file:// checkpoint store must be an absolute path (file:///dir)")
        return StoreUrl(StorageUrl("file", "", path.rstrip("/") or "/"), options)
    if scheme not in STORE_SCHEMES or not parts.netloc:
        raise StorageError(shown, "checkpoint store must be file://, s3://, r2:// or gs:// with a bucket")
    bucket, account = parts.netloc, None
    if scheme == "r2":
        account, dot, bucket = parts.netloc.partition(".")
        if not dot or not account or not bucket:
            raise StorageError(shown, "r2 checkpoint store must be r2://<account_id>.<bucket>/prefix")
    return StoreUrl(StorageUrl(scheme, bucket, path.strip("/"), account=account), options)  # type: ignore[arg-type]
