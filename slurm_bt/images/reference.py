"""Image references as Docker spells them, and the site's registry mirrors (docs/containers.md).

``python:3.11-slim`` means ``docker.io/library/python:3.11-slim``: a first path component without a
``.`` or ``:`` (and not ``localhost``) is a Docker Hub repository, and a one-component Hub repository
lives under ``library/``. The mirror mapping replaces the registry host before anything is pulled, so
the pinned reference names what is really fetched.

Strict syntax (the distribution spec's grammar, lower-case repositories): a reference is later an
argv element of skopeo and part of a cache entry's source; nothing else may get through.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = ["DOCKER_HUB", "ImageRef", "parse_reference"]

DOCKER_HUB = "docker.io"
_HOST = re.compile(r"^(localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)(:[0-9]{1,5})?$")
_COMPONENT = re.compile(r"^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: ``registry/repository`` and a tag or a digest (or both, as written)."""

    registry: str
    repository: str
    tag: str | None
    digest: str | None

    @property
    def name(self) -> str:
        """``registry/repository``."""
        return f"{self.registry}/{self.repository}"

    def with_digest(self, digest: str) -> ImageRef:
        """The same repository pinned to ``digest`` (the tag dropped: a digest says it all)."""
        return replace(self, tag=None, digest=digest)

    def mirrored(self, mirrors: Mapping[str, str]) -> ImageRef:
        """The reference with its registry replaced by the site's mirror for it, if any."""
        host = mirrors.get(self.registry)
        if host is None and self.registry == DOCKER_HUB:
            host = mirrors.get("registry-1.docker.io") or mirrors.get("index.docker.io")
        return replace(self, registry=host) if host else self

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag or 'latest'}"


def parse_reference(text: str) -> ImageRef:
    """Parse a Docker image reference.

    Raises:
        ValueError: not a valid reference (the message says why).
    """
    if not text or len(text) > 512 or text != text.strip() or any(c.isspace() for c in text):
        raise ValueError("an image reference is a non-empty name without spaces, e.g. python:3.11-slim")
    rest, _, digest_text = text.partition("@")
    digest = digest_text if "@" in text else None
    if digest is not None and not _DIGEST.match(digest):
        raise ValueError(f"digest {digest!r} is not sha256:<64 hex digits>")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise ValueError(f"tag {tag!r} is not valid (letters, digits, '_', '.', '-'; at most 128)")
    parts = rest.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        registry, repo_parts = first, parts[1:]
        if not _HOST.match(registry):
            raise ValueError(f"registry {registry!r} is not a host name[:port]")
    else:
        registry, repo_parts = DOCKER_HUB, parts
        if len(repo_parts) == 1:
            repo_parts = ["library", *repo_parts]
    for c in repo_parts:
        if not _COMPONENT.match(c):
            raise ValueError(f"repository component {c!r} is not valid (lower-case letters, digits, "
                             "separators '.', '_', '-')")
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry=registry, repository="/".join(repo_parts), tag=tag, digest=digest)
