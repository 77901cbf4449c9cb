"""The image's cache entry and its files in the job directory (the images contract, docs/containers.md).

An image is a one-file weights :class:`~slurm_bt.weights.manifest.Manifest`: kind ``oci``, its only file
``image.sqfs`` (sha256 and size of the squashfs), source the pinned ``oci://registry/repo@sha256:<hex>``
(after the mirror mapping), revision the digest. The pin record ``<tier>/pins/oci-<hex>.json`` maps the
image digest to that Manifest, trusted like weights pins (root or the requesting user wrote it:
:func:`slurm_bt.weights.plan.lookup_pin`). So the node tier, leases, LRU and ``slurm-bt cache``
serve images without a second cache.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from slurm_bt.atomic import write_file_atomic
from slurm_bt.job_spec import ImagePin
from slurm_bt.site.settings import ContainerSettings
from slurm_bt.weights.manifest import Manifest, ManifestFile

__all__ = [
    "IMAGE_FILE",
    "ImagePlan",
    "digest_hex",
    "entry_label",
    "image_manifest",
    "image_pin_key",
    "image_source",
    "job_image_manifest_path",
    "write_job_image_manifest",
]

IMAGE_FILE = "image.sqfs"
_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")


class ImagePlan(BaseModel):
    """``<job_dir>/image/plan.json``: what the staging job needs besides job.json.

    The staging job runs with ``--export=NONE`` and may read another site file than the submitter
    did, so the submit-time decisions travel here (as weights' plan.json does): the team tier and the
    cluster-cache base to publish into, and the ``[containers]`` settings (CA bundle, size cap).
    Written by the user into their own job directory: authoritative for their staging job only, except
    for limits that protect shared storage (``max_image_bytes``), which the staging job caps by the
    admin's site file (:func:`slurm_bt.images.stage.staging_containers`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    team: str
    cluster_cache: str
    containers: ContainerSettings


def digest_hex(digest: str) -> str:
    """The 64 hex digits of ``sha256:<hex>`` (ValueError otherwise)."""
    m = _DIGEST.match(digest)
    if not m:
        raise ValueError(f"not a sha256 digest: {digest!r}")
    return m.group(1)


def image_pin_key(digest: str) -> str:
    """The pin record's name (``pins/<key>.json``) of image ``digest``."""
    return f"oci-{digest_hex(digest)}"


def image_source(pin: ImagePin) -> str:
    """The Manifest source of the pinned image: ``oci://<resolved>``."""
    return f"oci://{pin.resolved}"


def image_manifest(pin: ImagePin, sqfs_sha256: str, sqfs_size: int) -> Manifest:
    """The one-file Manifest of the image's squashfs."""
    return Manifest(kind="oci", source=image_source(pin), revision=pin.digest,
                    files=(ManifestFile(path=IMAGE_FILE, size=sqfs_size, sha256=sqfs_sha256),))


def job_image_manifest_path(job_dir: str | Path) -> Path:
    """``<job_dir>/image/manifest.json``: the final Manifest the prolog stages to the node tier."""
    return Path(job_dir) / "image" / "manifest.json"


def write_job_image_manifest(job_dir: str | Path, m: Manifest) -> Path:
    """Write the job's image Manifest (canonical JSON, 0600, temp + fsync + rename)."""
    path = job_image_manifest_path(job_dir)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_file_atomic(path, m.canonical_json(), mode=0o600)
    return path


def entry_label(kind: str, source: str, revision: str) -> str:
    """How ``slurm-bt cache`` names an entry: ``image <registry>/<repo>@sha256:<hex>`` for an image,
    ``<source>@<revision prefix>`` for weights."""
    if kind == "oci":
        return f"image {source.removeprefix('oci://')}"
    return f"{source}@{revision[:12]}"
