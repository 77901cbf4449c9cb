"""Parse and canonicalise weights source URIs: one spelling per object, keys never escape the root.

Accepted forms (truss-train-api.md §4, made stricter where truss is ambiguous, threats B04/P13):

=========================================  ===================================================
``hf://org/repo[@revision]``               also legacy ``hf://repo``; revision = branch, tag or
                                           40-hex commit; pinned to a commit by ``resolve``
``s3://bucket[/prefix]``                   AWS S3 or the configured S3-compatible endpoint
``r2://<account_id>.bucket[/prefix]``      Cloudflare R2; account id = 32 lower-case hex digits
``gs://bucket[/prefix]``                   Google Cloud Storage
=========================================  ===================================================

Canonicalisation choices (documented because cache keys derive from them):

* **Schemes are lower-case and case-sensitive** (``HF://`` is rejected, as truss does).
* **HF repo ids keep the user's case here.** Repo ids are case-sensitive on the wire, but the Hub
  answers ``Org/Model`` for ``org/model`` (case-insensitive lookup, redirect to the real id).
  :func:`slurm_bt.weights.sources.resolve` therefore replaces the id with the one the Hub returns
  (``ModelInfo.id``), so both spellings end in the same manifest and cache entry, and two
  different repos can never share one (the Hub itself would have to confuse them).
* **Object prefixes are directories.** ``s3://b/models/llama`` lists ``models/llama/``, never
  ``models/llama-2/...``; a trailing ``/`` is dropped (``s3://b/p/`` = ``s3://b/p``).
* **No key is silently rewritten.** In S3 ``b//k`` (key ``/k``) and ``b/k`` are different objects,
  so collapsing ``//`` would make two objects share a key: empty segments, ``.``, ``..``, ``%``
  escapes and control characters are rejected instead, and the URI is taken literally (no
  percent-decoding anywhere, so ``%2e%2e`` can never become ``..``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_bt.errors import Problem, SourceSpecError
from slurm_bt.weights.manifest import SourceKind

__all__ = ["SourceUri", "parse_source_uri"]

_HF_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")
_HF_REVISION = re.compile(r"[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_R2_ACCOUNT = re.compile(r"[0-9a-f]{32}")
_R2_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_GS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEMES: dict[str, SourceKind] = {"hf": "hf", "s3": "s3", "r2": "r2", "gs": "gs"}
_KNOWN_UNSUPPORTED = ("azure", "cw", "https", "http", "file")


@dataclass(frozen=True)
class SourceUri:
    """A parsed, validated source URI.

    Attributes:
        kind: ``hf``, ``s3``, ``r2`` or ``gs``.
        container: HF repo id (``org/repo``) or bucket name.
        prefix: object-key prefix without leading/trailing ``/`` (``""`` = whole bucket); ``""``
            for HF.
        revision: HF branch, tag or commit as written (None = ``main``); None for object stores.
        account: the R2 account id; None otherwise.
    """

    kind: SourceKind
    container: str
    prefix: str = ""
    revision: str | None = None
    account: str | None = None

    @property
    def canonical(self) -> str:
        """The URI without ``@revision``: what manifests record and cache keys derive from."""
        if self.kind == "hf":
            return f"hf://{self.container}"
        host = f"{self.account}.{self.container}" if self.kind == "r2" else self.container
        return f"{self.kind}://{host}/{self.prefix}" if self.prefix else f"{self.kind}://{host}"

    def key_for(self, path: str) -> str:
        """The object key of manifest path ``path`` (object stores only)."""
        return f"{self.prefix}/{path}" if self.prefix else path

    def with_container(self, container: str) -> SourceUri:
        """A copy naming the container as the origin spells it (the Hub's canonical repo id)."""
        return SourceUri(self.kind, container, self.prefix, self.revision, self.account)

    def __str__(self) -> str:
        return f"{self.canonical}@{self.revision}" if self.revision else self.canonical


def _fail(source: str, message: str) -> SourceSpecError:
    return SourceSpecError(source, [Problem("source", message)])


def _check_prefix(source: str, prefix: str) -> str:
    prefix = prefix[:-1] if prefix.endswith("/") else prefix
    if not prefix:
        return ""
    if _CONTROL.search(prefix) or "%" in prefix:
        raise _fail(source, "object prefix must not contain control characters or %-escapes")
    for segment in prefix.split("/"):
        if segment in {"", ".", ".."}:
            raise _fail(
                source,
                "object prefix must not contain empty, '.' or '..' segments "
                "(s3://b//k and s3://b/k name different objects; write the prefix exactly once)",
            )
    return prefix


def _parse_hf(source: str, rest: str) -> SourceUri:
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
    return SourceUri("hf", rest, revision=revision)


def parse_source_uri(source: str) -> SourceUri:
    """Parse ``source`` into a :class:`SourceUri`, rejecting anything ambiguous.

    Raises:
        SourceSpecError: unknown or unsupported scheme, bad repo id / bucket / account / prefix,
            or ``@revision`` on an object store.
    """
    if "://" not in source:
        raise _fail(source, "missing a URI scheme; supported: gs://, hf://, r2://, s3://")
    scheme, rest = source.split("://", 1)
    kind = _SCHEMES.get(scheme)
    if kind is None:
        hint = " (accepted by truss, not supported by slurm-bt yet)" if scheme in _KNOWN_UNSUPPORTED else ""
        raise _fail(source, f"unsupported scheme '{scheme}://'{hint}; supported: gs://, hf://, r2://, s3://")
    if not rest or rest.startswith("/"):
        raise _fail(source, f"invalid {kind} URI: expected {scheme}://<name>[/path]")
    if kind == "hf":
        return _parse_hf(source, rest)
    if "@" in rest:
        raise _fail(source, "the @revision syntax is only valid for Hugging Face sources (hf://)")
    host, _, prefix = rest.partition("/")
    prefix = _check_prefix(source, prefix)
    if kind == "r2":
        account, dot, bucket = host.partition(".")
        if not dot or not _R2_ACCOUNT.fullmatch(account):
            raise _fail(source, "expected r2://<account_id>.<bucket>/path with a 32-hex account id")
        if not _R2_BUCKET.fullmatch(bucket):
            raise _fail(source, f"invalid R2 bucket name {bucket!r}")
        return SourceUri("r2", bucket, prefix, account=account)
    pattern = _S3_BUCKET if kind == "s3" else _GS_BUCKET
    if not pattern.fullmatch(host) or ".." in host:
        raise _fail(source, f"invalid {kind} bucket name {host!r}")
    return SourceUri(kind, host, prefix)


def is_commit(revision: str) -> bool:
    """Whether ``revision`` is already a full 40-hex commit id."""
    return _COMMIT.fullmatch(revision) is not None
