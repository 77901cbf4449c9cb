"""The cluster tier: a shared-filesystem mirror of pinned sources, filled once before GPUs are held.

Who writes it and why it may still be trusted only so far (docs/weights-cache.md):

* ``<base>/teams/<team>/`` is written by the staging job *as the user*, with the user's own
  credentials, so a teammate can in principle plant or replace files there. Nothing is trusted
  because of where it sits: every reader that copies a blob onward (the node tier) re-hashes it.
* ``<base>/shared/`` is curated by admins (root-owned, read-only to users) for public models.

Publishing follows threats-and-faults.md §5: each blob is fetched into a private temp directory
under ``.tmp/``, fsynced, hashed, renamed to ``blobs/<sha256>`` and the directory fsynced; then the
snapshot is built under a temp name and renamed; the manifest (COMPLETE marker) is written last.
Locks (:mod:`slurm_bt.weights.locks`) only make concurrent stagers fetch each blob once; with locks
disabled the result is still one correct entry (R7).

A cache hit still needs the requester's authorization (R8): :meth:`ClusterCache.ensure` calls the
caller's ``authorize(manifest)`` before anything else, hit or miss. The cache records nothing secret.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from slurm_bt.atomic import write_file_atomic
from slurm_bt.errors import StorageError
from slurm_bt.weights.cache_layout import (
    CacheLayout,
    build_snapshot,
    copy_and_hash,
    force_rmtree,
    open_regular,
    parse_tmp_name,
    publish_blob_file,
    remove_tree,
    sha256_fd,
    tmp_name,
)
from slurm_bt.weights.locks import LockOptions, optional_lock, process_start_time
from slurm_bt.weights.manifest import Manifest, ManifestFile

__all__ = ["Authorizer", "CacheStats", "ClusterCache", "EntryInfo", "Fetcher", "blob_present", "cache_stats", "gc_temp",
           "unique_blobs"]

_log = logging.getLogger("slurm_bt.weights.cache")
_TEAM = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

Authorizer = Callable[[Manifest], None]
"""Raises if the requesting user's credentials cannot read the manifest's source (R8, P11)."""

Fetcher = Callable[[ManifestFile, Path], Path]
"""``fetch(file, tmp_dir)`` downloads one file into ``tmp_dir`` and returns the path it wrote."""


@dataclass(frozen=True)
class EntryInfo:
    """One complete cache entry, for ``slurm-bt cache ls|inspect``.

    Attributes:
        manifest_id: the entry's name.
        kind: source kind (``hf``, ``s3``...).
        source: canonical source URI.
        revision: pinned revision.
        files: number of files.
        total_bytes: logical size (blobs may be shared with other entries).
        published: mtime of the COMPLETE marker (epoch seconds).
        last_used: node tier: last lease or release (epoch seconds); else ``published``.
        leases: node tier: job ids holding a lease.
    """

    manifest_id: str
    kind: str
    source: str
    revision: str
    files: int
    total_bytes: int
    published: float
    last_used: float
    leases: tuple[str, ...] = ()


@dataclass(frozen=True)
class CacheStats:
    """A cache root at a glance.

    Attributes:
        root: the cache root.
        entries: complete entries, oldest ``last_used`` first.
        blobs: number of blobs.
        blob_bytes: bytes in blobs (each counted once: this is the disk use).
        temp_entries: leftovers in ``.tmp/`` (in-flight writes or debris of killed writers).
    """

    root: Path
    entries: tuple[EntryInfo, ...]
    blobs: int
    blob_bytes: int
    temp_entries: int


def unique_blobs(files: tuple[ManifestFile, ...] | list[ManifestFile]) -> list[ManifestFile]:
    """One file per distinct sha256 (a manifest may list identical content at several paths)."""
    seen: set[str] = set()
    out = []
    for f in files:
        if f.sha256 not in seen:
            seen.add(f.sha256)
            out.append(f)
    return out


def blob_present(layout: CacheLayout, f: ManifestFile) -> bool:
    """A regular file of the right size is at ``blobs/<sha256>`` (no hashing)."""
    try:
        st = os.lstat(layout.blob(f.sha256))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == f.size


class ClusterCache:
    """One cluster-tier root (a team namespace or the shared tier).

    Args:
        root: the cache root, e.g. ``/lustre/bt-cache/teams/vision``.
        lock_options: lock behaviour (``use_flock=False`` where flock is a no-op).
        dir_mode: mode for directories this process creates (existing ones are left as provisioned).
    """

    def __init__(self, root: Path, *, lock_options: LockOptions | None = None, dir_mode: int = 0o755,
                 trusted_copy: bool = False) -> None:
        self.layout = CacheLayout(Path(root))
        self.lock_options = lock_options or LockOptions()
        self.dir_mode = dir_mode
        #: The node tier may copy from this tier without re-hashing: only for a root-owned tier
        #: that users cannot write (the shared tier), when the site accepts undetected storage rot
        #: (``[weights] verify_node_copy = "team"``). Never set for team tiers.
        self.trusted_copy = trusted_copy

    @classmethod
    def for_team(cls, base: Path, team: str, **kwargs: object) -> ClusterCache:
        """The team namespace ``<base>/teams/<team>``; ``team`` must be a plain slug (P04)."""
        if not _TEAM.match(team):
            raise ValueError(f"invalid team name {team!r}: lower-case letters, digits, '_', '-', '.'")
        return cls(Path(base) / "teams" / team, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def shared(cls, base: Path, **kwargs: object) -> ClusterCache:
        """The admin-curated tier ``<base>/shared`` (root-owned, read-only to users)."""
        return cls(Path(base) / "shared", **kwargs)  # type: ignore[arg-type]

    @property
    def root(self) -> Path:
        """The cache root."""
        return self.layout.root

    # -- queries ----------------------------------------------------------------------------------

    def has(self, manifest: Manifest) -> bool:
        """The entry is complete: its COMPLETE marker exists with exactly this manifest's JSON."""
        return self.layout.is_complete(manifest)

    def missing_blobs(self, manifest: Manifest) -> list[ManifestFile]:
        """Distinct blobs of ``manifest`` not present at the right size (one per sha256)."""
        return [f for f in unique_blobs(manifest.files) if not blob_present(self.layout, f)]

    def snapshot_path(self, manifest: Manifest) -> Path:
        """Where the entry's snapshot lives (exists only once published)."""
        return self.layout.snapshot(manifest.manifest_id)

    def open_blob(self, f: ManifestFile) -> int:
        """A read fd on ``blobs/<sha256>``: regular file only, no symlink, no FIFO (P10).

        Raises:
            FileNotFoundError: not in this tier.
            StorageError: something other than a regular file is there.
        """
        return open_regular(self.layout.blob(f.sha256))

    # -- publishing -------------------------------------------------------------------------------

    def publish_blob(self, tmp_path: Path, sha256: str, size: int) -> Path:
        """Verify a downloaded temp file and move it to ``blobs/<sha256>``.

        The temp file is fsynced, hashed and renamed (copied first if it is on another filesystem);
        it is gone afterwards whatever happens. An existing blob is kept.

        Raises:
            CacheIntegrityError: content differs from ``sha256``/``size``; nothing published.
            StorageError: I/O failure; nothing published.
        """
        self.layout.ensure(dir_mode=self.dir_mode)
        final = self.layout.blob(sha256)
        f = ManifestFile(path="blob", size=size, sha256=sha256)
        fd = open_regular(tmp_path)
        try:
            if os.fstat(fd).st_dev != os.stat(self.layout.blobs).st_dev:
                return self._publish_copy(fd, tmp_path, f)
            actual, n = sha256_fd(fd)
            publish_blob_file(tmp_path, fd, final, f, actual, n)
        finally:
            os.close(fd)
        return final

    def _publish_copy(self, src_fd: int, src: Path, f: ManifestFile) -> Path:
        tmp = self.layout.tmp / tmp_name("blob")
        dst_fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            actual, n = copy_and_hash(src_fd, dst_fd, f.size)
            publish_blob_file(tmp, dst_fd, self.layout.blob(f.sha256), f, actual, n)
        finally:
            os.close(dst_fd)
            with contextlib.suppress(OSError):
                os.unlink(src)
        return self.layout.blob(f.sha256)

    def add_manifest(self, manifest: Manifest) -> Path:
        """Build the snapshot and write the COMPLETE marker last; idempotent.

        Raises:
            StorageError: a blob is missing (publish them first) or I/O failed.
        """
        self.layout.ensure(dir_mode=self.dir_mode)
        missing = self.missing_blobs(manifest)
        if missing:
            raise StorageError(str(self.root), f"{len(missing)} blob(s) missing for {manifest.source}, "
                                               f"e.g. {missing[0].path}; publish them first")
        snap = build_snapshot(self.layout, manifest)
        if not self.has(manifest):
            write_file_atomic(self.layout.manifest_file(manifest.manifest_id), manifest.canonical_json(),
                              mode=0o444)
        return snap

    def ensure(self, manifest: Manifest, fetch: Fetcher, *, authorize: Authorizer) -> Path:
        """Make the entry complete, fetching each missing blob once; returns the snapshot path.

        ``authorize(manifest)`` runs first, on hits too, and its exception propagates unchanged
        (nothing is fetched or linked for an unauthorized user). Each missing blob is fetched under
        a per-blob lock, re-checked after the lock is taken, so N concurrent callers fetch it once
        while locks work, and still publish one verified blob when they do not.

        Raises:
            CacheIntegrityError: a fetched file did not match the manifest (not published).
            CacheLockTimeout: a lock holder stayed alive past the hard timeout.
            StorageError: I/O failure.
        """
        authorize(manifest)
        if self.has(manifest) and self.snapshot_path(manifest).is_dir():
            return self.snapshot_path(manifest)
        self.layout.ensure(dir_mode=self.dir_mode)
        for f in self.missing_blobs(manifest):
            with self._lock(f"blob-{f.sha256}"):
                if blob_present(self.layout, f):
                    continue
                self._fetch_one(f, fetch)
        with self._lock(f"manifest-{manifest.manifest_id}"):
            return self.add_manifest(manifest)

    def _fetch_one(self, f: ManifestFile, fetch: Fetcher) -> None:
        tmp_dir = self.layout.tmp / tmp_name("fetch")
        os.mkdir(tmp_dir, 0o700)
        try:
            got = Path(fetch(f, tmp_dir))
            if got.parent.resolve() != tmp_dir.resolve():
                raise StorageError(str(got), f"fetch must write inside {tmp_dir}")
            self.publish_blob(got, f.sha256, f.size)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def lock(self, name: str, options: LockOptions | None = None) -> contextlib.AbstractContextManager[None]:
        """The tier's weak lock ``name`` (single-flight across stagers; correctness never needs it)."""
        return self._lock(name, options)

    def write_pin(self, key: str, manifest: Manifest) -> Path:
        """Record that listing pin ``key`` resolved to ``manifest`` (``pins/<key>.json``, 0444).

        Lets a later submit of the same pinned source find the full manifest without reading
        data; readers trust a pin only if root or they themselves wrote it (``plan.lookup_pin``).
        """
        folder = self.root / "pins"
        folder.mkdir(mode=self.dir_mode, exist_ok=True)
        path = folder / f"{key}.json"
        write_file_atomic(path, manifest.canonical_json(), mode=0o444)
        return path

    def _lock(self, name: str, options: LockOptions | None = None) -> contextlib.AbstractContextManager[None]:
        return optional_lock(self.layout.lock(name), options or self.lock_options)

    # -- listing and housekeeping -----------------------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Every complete entry, oldest first."""
        out = []
        for mid in self.layout.manifest_ids():
            info = self.inspect(mid)
            if info is not None:
                out.append(info)
        return sorted(out, key=lambda e: (e.last_used, e.manifest_id))

    def inspect(self, manifest_id: str) -> EntryInfo | None:
        """Details of one complete entry, or None."""
        m = self.layout.read_manifest(manifest_id)
        if m is None:
            return None
        published = os.lstat(self.layout.manifest_file(manifest_id)).st_mtime
        return EntryInfo(manifest_id, m.kind, m.source, m.revision, len(m.files), m.total_bytes,
                         published, published)

    def stat(self) -> CacheStats:
        """Counts and sizes for ``slurm-bt cache ls``."""
        return cache_stats(self.layout, tuple(self.entries()))

    def gc_temp(self, *, older_than_s: float = 24 * 3600.0) -> list[Path]:
        """Remove debris of killed writers; returns what was removed.

        An entry of ``.tmp/`` (or a snapshot temp) is removed when it was made on this host by a
        process that is gone, or when it is older than ``older_than_s`` (other hosts' pids cannot
        be checked from here; keep this well above the longest download).
        """
        return gc_temp(self.layout, older_than_s)


def cache_stats(layout: CacheLayout, entries: tuple[EntryInfo, ...]) -> CacheStats:
    n = size = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(layout.blobs) as it:
        for e in it:
            if e.is_file(follow_symlinks=False) and not e.name.startswith("."):
                n += 1
                size += e.stat(follow_symlinks=False).st_size
    try:
        temps = len(os.listdir(layout.tmp))
    except FileNotFoundError:
        temps = 0
    return CacheStats(layout.root, entries, n, size, temps)


def gc_temp(layout: CacheLayout, older_than_s: float) -> list[Path]:
    removed = []
    host = socket.gethostname()
    now = time.time()
    candidates: list[Path] = []
    for d in (layout.tmp, layout.snapshots):
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(d):
                if d == layout.tmp or (name.startswith(".") and "@" in name):
                    candidates.append(d / name)
    for p in candidates:
        parsed = parse_tmp_name(p.name)
        try:
            age = now - os.lstat(p).st_mtime
        except FileNotFoundError:
            continue
        dead_here = parsed is not None and parsed[0] == host and process_start_time(parsed[1]) is None
        if dead_here or age > older_than_s:
            if p.is_dir() and not p.is_symlink():
                if p.parent == layout.tmp:
                    force_rmtree(p)
                else:
                    remove_tree(layout, p)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(p)
            removed.append(p)
    return removed

