"""Pin the job's image at submit (login node, as the user): tag → the nodes' platform manifest digest.

``skopeo inspect --raw`` fetches the manifest or index as the registry serves it; from an index the
nodes' platform (``[containers] platform``) is picked and its manifest fetched by digest; the digest
is the sha256 of the manifest bytes, checked against what was asked for. The registry mirror mapping
is applied first, so the pin names what the staging job really pulls. The job runs this digest even
if the tag moves later (docs/containers.md).

Errors (nothing submitted): unknown image or tag → exit 2 at ``job.image.base_image``; refused
credentials → exit 2 at the DockerAuth field; unreachable registry → exit 1 with what to do.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurm_bt.errors import ConfigError, Problem, RegistryToolError, SourceError, SourceUnavailableError
from slurm_bt.images.credentials import auth_field, registry_login
from slurm_bt.images.entry import image_pin_key, image_source
from slurm_bt.images.reference import ImageRef, parse_reference
from slurm_bt.images.skopeo import RegistryAccess, registry_access, run_skopeo
from slurm_bt.job_spec import ImagePin

if TYPE_CHECKING:
    from slurm_bt.job_spec import DockerAuthSpec, JobSpec
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import ContainerSettings, SiteSettings
    from slurm_bt.weights.manifest import Manifest

__all__ = ["INDEX_TYPES", "MANIFEST_TYPES", "cached_image", "pin_image", "pin_reference", "resolve_reference",
           "select_platform"]

INDEX_TYPES = frozenset({"application/vnd.oci.image.index.v1+json",
                         "application/vnd.docker.distribution.manifest.list.v2+json"})
MANIFEST_TYPES = frozenset({"application/vnd.oci.image.manifest.v1+json",
                            "application/vnd.docker.distribution.manifest.v2+json"})
_MAX_MANIFEST = 4 << 20  # registries cap manifests at 4 MiB
_LOC = "job.image.base_image"


def resolve_reference(image: str, containers: ContainerSettings, source: str) -> ImageRef:
    """``image`` parsed and mapped through the site's registry mirrors.

    Raises:
        ConfigError: not a valid reference (exit 2 at ``job.image.base_image``).
    """
    try:
        return parse_reference(image).mirrored(containers.registry_mirrors)
    except ValueError as exc:
        raise ConfigError(source, [Problem(_LOC, f"{image!r}: {exc}")]) from None


def select_platform(index: Mapping[str, object], platform: str) -> str:
    """The digest of ``platform``'s manifest (``os/arch[/variant]``) in an image index.

    Raises:
        ValueError: no manifest for that platform (the message lists the ones there are).
    """
    want = platform.split("/")
    seen = []
    entries = index.get("manifests")
    for m in entries if isinstance(entries, list) else []:
        if not isinstance(m, dict) or not isinstance(m.get("platform"), dict):
            continue
        p = m["platform"]
        have = [str(p.get("os", "")), str(p.get("architecture", ""))]
        have += [str(p["variant"])] if p.get("variant") else []
        seen.append("/".join(have))
        kind_ok = m.get("mediaType", "") in MANIFEST_TYPES | {""}
        if have[:2] == want[:2] and (len(want) == 2 or have[2:] == want[2:]) and kind_ok:
            digest = m.get("digest")
            if isinstance(digest, str):
                return digest
    raise ValueError(f"no image for the nodes' platform {platform} (the image has: {', '.join(seen) or 'none'})")


def _media_type(doc: dict[str, object]) -> str:
    mt = doc.get("mediaType")
    if isinstance(mt, str):
        return mt
    # OCI manifests may omit mediaType: an index has "manifests", an image manifest "layers"
    return next(iter(INDEX_TYPES)) if "manifests" in doc else next(iter(MANIFEST_TYPES))


def _inspect(ref: str, access: RegistryAccess, timeout_s: float) -> bytes:
    return run_skopeo(["inspect", "--raw", "--retry-times", "1", *access.args(), f"docker://{ref}"], access,
                      timeout_s=timeout_s, max_stdout=_MAX_MANIFEST)


def _load(raw: bytes, what: str) -> dict[str, object]:
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise SourceError(what, "the registry returned something that is not an image manifest")
    return doc


def pin_image(spec: JobSpec, site: SiteSettings, store: SecretStore, *, timeout_s: float = 120.0) -> ImagePin:
    """Pin ``spec.image`` for the nodes' platform, with the image's DockerAuth credentials
    (:func:`pin_reference` with the spec's image, DockerAuth and config file)."""
    return pin_reference(spec.image, spec.docker_auth, site, store, source=spec.context.source,
                         timeout_s=timeout_s)


def pin_reference(image: str, auth: DockerAuthSpec | None, site: SiteSettings, store: SecretStore, *,
                  source: str, timeout_s: float = 120.0) -> ImagePin:
    """Pin ``image`` for the nodes' platform; ``source`` prefixes every error line (the config file).

    Raises:
        ConfigError: exit 2, unknown image/tag, refused credentials, no manifest for the platform.
        SecretError: a DockerAuth secret is missing or malformed (exit 2).
        SourceUnavailableError: exit 1, the registry could not be reached.
        SourceError: exit 1, the registry answered with something that is not a usable manifest.
    """
    ref = resolve_reference(image, site.containers, source)
    login = registry_login(auth, store) if auth is not None else None
    shown = f"{image} (pulled as {ref})" if str(ref) != image else image
    try:
        with registry_access(ref.registry, login, site.containers.ca_bundle) as access:
            raw = _inspect(str(ref), access, timeout_s)
            doc = _load(raw, str(ref))
            if _media_type(doc) in INDEX_TYPES:
                try:
                    digest = select_platform(doc, site.containers.platform)
                except ValueError as exc:
                    raise ConfigError(source, [Problem(_LOC, f"{shown}: {exc}")]) from None
                raw = _inspect(str(ref.with_digest(digest)), access, timeout_s)
                doc = _load(raw, str(ref))
            else:
                # a reference written with @sha256: names these very bytes
                digest = ref.digest or "sha256:" + hashlib.sha256(raw).hexdigest()
            if _media_type(doc) not in MANIFEST_TYPES:
                raise SourceError(str(ref), f"unsupported manifest type {_media_type(doc)!r}")
            actual = "sha256:" + hashlib.sha256(raw).hexdigest()
            if actual != digest:  # the manifest bytes must be what the pin names
                raise SourceError(str(ref), f"the registry served a manifest whose digest is {actual}, not {digest}")
    except RegistryToolError as exc:
        raise _failure(exc, auth, source, shown, ref) from None
    return ImagePin(reference=image, resolved=f"{ref.name}@{digest}", digest=digest,
                    private=login is not None)


def _failure(exc: RegistryToolError, auth: DockerAuthSpec | None, source: str, shown: str, ref: ImageRef) -> Exception:
    if exc.kind == "not_found":
        return ConfigError(source, [Problem(_LOC, f"{shown}: no such image or tag in registry {ref.registry} "
                                                  f"({exc})")])
    if exc.kind == "auth":
        if auth is not None:
            return ConfigError(source, [Problem(auth_field(auth),
                                                f"registry {ref.registry} refused these credentials for {shown} "
                                                f"({exc}); check the secret's value")])
        return ConfigError(source, [Problem(_LOC, f"{shown}: registry {ref.registry} requires credentials "
                                                  f"(or the image does not exist): add "
                                                  f"image.docker_auth ({exc})")])
    return SourceUnavailableError(str(ref), f"registry {ref.registry} could not be reached ({exc}); nothing was "
                                            "submitted: retry later, or ask your admin whether the registry or "
                                            "its mirror ([containers] registry_mirrors) is up", transient=True)


def cached_image(pin: ImagePin, cluster_cache: str, team: str) -> tuple[Manifest, str] | None:
    """(Manifest, tier name) of the pinned image when a trusted pin record says it is complete there.

    ``cluster_cache`` is the expanded cluster-cache base. A public image is looked up in the shared
    tier (admin-warmed) and then the team tier; a private one only in the team tier (its audience is
    the team, like private weights).
    """
    from slurm_bt.weights.plan import cluster_tiers, lookup_pin

    team_tier, shared_tier = cluster_tiers(cluster_cache, team)
    tiers = [("team", team_tier)] if pin.private else [("shared", shared_tier), ("team", team_tier)]
    key = image_pin_key(pin.digest)
    for name, tier in tiers:
        m = lookup_pin(tier, key)
        if is_entry_of(m, pin):
            assert m is not None
            return m, name
    return None


def is_entry_of(m: Manifest | None, pin: ImagePin) -> bool:
    """True when ``m`` (a pin record's manifest) is the entry of exactly this pin: digest and name.

    Pin records are keyed by the digest alone; the same image reached under another name (the site's
    registry mirror moved, or one image under two registries) has a record naming the other source, and
    the prolog checks the job's manifest against the job's pin, name included. The staging job then
    adds the entry under this name (``mirror_into``), pointing at the same squashfs."""
    return m is not None and m.kind == "oci" and m.revision == pin.digest and m.source == image_source(pin)
