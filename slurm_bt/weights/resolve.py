"""Resolve a source URI into a pinned :class:`~slurm_bt.weights.manifest.Manifest` (submit time).

sha256 strategy (every manifest file must carry a *verified* sha256):

* **HF LFS files**: the Hub's LFS oid *is* the sha256 of the content (``X-Linked-Etag``, the
  tree's ``lfs.oid``); it is taken from the listing, costs nothing, and every later download
  verifies the bytes against it.
* **HF non-LFS files** (configs, tokenizers; git blobs, at most ~10 MiB each) and **objects
  without a published full-object sha256** (most S3/R2/GCS objects: multipart ETags and GCS
  composites are not content hashes) are streamed **once** at resolve time, pinned to the
  listed version, and hashed on the fly; the origin's own checksum (HF git blob sha1, GCS
  crc32c/md5Hash, S3 CRC32/CRC32C or single-part ETag MD5, Azure Content-MD5, HTTPS Digest;
  storage/checksums.py) is checked on the
  same pass, so a body corrupted in transit or at the origin fails instead of being pinned.
* With ``mirror_dir`` (the cluster cache's blob directory), that single stream is the mirror
  download itself: the file goes through the normal temp + pwrite + hash + rename path and is
  published under the sha256 computed from the very bytes published, so a large bucket is read
  once, not twice (hash at resolve, then download again). This is the recommended mode for
  object stores (Baseten mirrors at job CREATED for the same reason). Without ``mirror_dir`` the
  bytes are hashed and discarded (right for a login node with no cache).
* S3 objects uploaded with a FULL_OBJECT ``ChecksumSHA256`` use that value (one HEAD, no stream).

The trust model for computed hashes is "first verified read": the hash pins the version listed
at resolve (ETag / generation / commit), and every node and requeue afterwards must match it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_bt.storage.base import RemoteFile
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.registry import open_backend
from slurm_bt.storage.url import parse_source_uri
from slurm_bt.weights.manifest import Manifest, ManifestFile
from slurm_bt.weights.patterns import select_paths

if TYPE_CHECKING:
    from slurm_bt.weights.download import DownloadOptions

__all__ = ["resolve"]


def resolve(
    source: str,
    *,
    allow: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    credentials: Credentials | None = None,
    endpoints: StorageEndpoints | None = None,
    mirror_dir: Path | None = None,
    options: DownloadOptions | None = None,
) -> Manifest:
    """List ``source``, filter it, pin it and give every file a verified sha256.

    Args:
        source: ``hf://org/repo[@rev]``, ``s3://bucket/prefix``, ``r2://acct.bucket/prefix``,
            ``cw://bucket/prefix``, ``gs://bucket/prefix``, ``azure://account/container/prefix``,
            ``https://host/path`` (docs/storage.md).
        allow: ``allow_patterns`` (truss semantics, :mod:`slurm_bt.weights.patterns`).
        ignore: ``ignore_patterns``.
        credentials: parsed secret, or None for public sources.
        endpoints: endpoint overrides (on-prem S3, mirrors, test servers).
        mirror_dir: when set, files whose sha256 must be computed are downloaded into
            ``mirror_dir/<sha256>`` on the same pass (see module docstring).
        options: download knobs for the hashing/mirroring streams.

    Raises:
        SourceSpecError: bad URI, or no file left after the filters.
        SourceAccessError: "not authorized for <source>".
        SourceNotFoundError: repo, revision, bucket or prefix missing.
        SourceUnavailableError: origin unreachable or stalled after bounded retries.
        IntegrityError: the origin's own checksum disagrees with what it sent.
    """
    from slurm_bt.weights.download import DownloadOptions, fetch_file, hash_remote_file

    options = options or DownloadOptions()
    uri = parse_source_uri(source)
    backend = open_backend(uri, credentials=credentials, endpoints=endpoints, options=options.transport)
    try:
        listing = backend.list_files()
        by_path = {f.path: f for f in listing.files}
        kept = select_paths(listing.uri.canonical, list(by_path), allow, ignore)

        def verified(rf: RemoteFile) -> ManifestFile:
            sha = rf.sha256
            if sha is None:
                if mirror_dir is not None:
                    sha = fetch_file(backend, rf, mirror_dir, options=options).sha256
                else:
                    sha = hash_remote_file(backend, rf, options=options)
            return ManifestFile(path=rf.path, size=rf.size, sha256=sha, etag=rf.etag)

        with ThreadPoolExecutor(max_workers=options.max_files, thread_name_prefix="bt-resolve") as pool:
            files = list(pool.map(verified, (by_path[p] for p in kept)))
    finally:
        backend.close()
    return Manifest(kind=uri.kind, source=listing.uri.canonical, revision=listing.revision, files=tuple(files))
