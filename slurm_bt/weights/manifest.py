"""The pinned, verifiable description of one weights source: what every tier agrees on.

A manifest is resolved once, at submit time, on the login node: every file of the source (after
``allow_patterns``/``ignore_patterns``), its size and its sha256, plus the immutable revision it came
from (an HF commit, S3 ETag/VersionId, GCS generation). Every node and every requeue stages exactly
this; nothing downstream re-resolves a branch or re-lists a prefix.

Content addressing: a blob is stored once under its sha256 whatever source or revision it came from.
``manifest_id`` names the manifest itself (sha256 of its canonical JSON), so two jobs with the same
pinned source share one cache entry.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["Manifest", "ManifestFile", "SourceKind"]

# "oci": a container image, one file image.sqfs, source oci://registry/repo@sha256:<hex> (docs/containers.md)
SourceKind = Literal["hf", "s3", "r2", "cw", "gs", "azure", "https", "oci"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class ManifestFile(BaseModel):
    """One file of a source.

    Attributes:
        path: POSIX path relative to the source root; no ``..``, no leading ``/``, no empty parts.
        size: bytes.
        sha256: lower-case hex digest of the content; the blob's name in every cache tier.
        etag: the origin's identity for this object version (S3 ETag, GCS generation, HF etag),
            used to pin ranged downloads; informational otherwise.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    size: int = Field(ge=0)
    sha256: str
    etag: str | None = None

    @field_validator("path")
    @classmethod
    def _safe_path(cls, v: str) -> str:
        parts = v.split("/")
        if not v or v.startswith("/") or any(p in {"", ".", ".."} for p in parts) or "\0" in v or "\n" in v:
            raise ValueError(f"unsafe path in manifest: {v!r}")
        return v

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        if not _SHA256.match(v):
            raise ValueError("sha256 must be 64 lower-case hex digits")
        return v


class Manifest(BaseModel):
    """A pinned source: canonical URI, immutable revision, files sorted by path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    kind: SourceKind
    source: str  # canonical URI without @revision, e.g. hf://org/repo, s3://bucket/prefix
    revision: str  # HF commit sha; for object stores a digest of the listing (etags/generations)
    files: tuple[ManifestFile, ...]

    @field_validator("files")
    @classmethod
    def _sorted_unique(cls, v: tuple[ManifestFile, ...]) -> tuple[ManifestFile, ...]:
        paths = [f.path for f in v]
        if len(set(paths)) != len(paths):
            raise ValueError("duplicate paths in manifest")
        return tuple(sorted(v, key=lambda f: f.path))

    @property
    def total_bytes(self) -> int:
        """Sum of file sizes."""
        return sum(f.size for f in self.files)

    def canonical_json(self) -> bytes:
        """Deterministic JSON (sorted keys, no whitespace): what ``manifest_id`` hashes."""
        return self._canonical

    @cached_property
    def _canonical(self) -> bytes:
        # Computed once per (frozen) manifest: a node hit asks for it several times, and at
        # 10,000 files each serialisation costs ~40 ms, which would make a hit grow with file count.
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()

    @cached_property
    def manifest_id(self) -> str:
        """sha256 of the canonical JSON: the name of this pinned source in every cache tier."""
        return hashlib.sha256(self.canonical_json()).hexdigest()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Manifest:
        """A copy whose canonical JSON and id are recomputed (``update`` may change them)."""
        copy = super().model_copy(update=update, deep=deep)
        for cached in ("_canonical", "manifest_id"):
            copy.__dict__.pop(cached, None)
        return copy
