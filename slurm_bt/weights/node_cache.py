"""The node tier: a root-owned, verified copy of cluster entries on local NVMe, with leases and LRU.

Written only by the root prolog. Every blob copied in from a cluster tier is hashed *as written*
(:func:`~slurm_bt.weights.cache_layout.copy_and_hash`) and rejected on mismatch, so a poisoned or
rotten cluster blob is never served. Because nothing but verified bytes ever lands here
and users cannot write here (0444 files, 0555 snapshot dirs), a hit trusts the COMPLETE marker and
does no hashing: it costs one lock, one small read and one lease file, whatever the model size.

Concurrency on one node (several prologs at once):

* ``entry-<manifest_id>`` lock: single-flight staging of one entry, and excludes eviction of that
  entry while a hit takes its lease;
* ``evict`` lock: eviction, and the moment a stager registers the blobs it is about to use (a
  pending manifest copy in ``leases/<id>/.manifest.json``), so eviction never deletes a blob that
  an in-progress stage relies on.

The evictor only *tries* entry locks (short timeout) while holding ``evict``, so the two locks
never deadlock.

Audiences (docs/weights-cache.md §2): an entry fetched with credentials must not be readable by
everyone on the node. Such entries live in the team's own subtree ``private/<team>/`` (a full
layout of its own, ``root:<team gid> 0750``, blobs ``0440`` and snapshot dirs ``0550`` with the
team's group), so only the team that could read the source can read the bytes, and a job of another
team looks in its own subtree and never gets a hit on them. Public entries stay in the root layout,
shared by everyone. Space, LRU eviction, leases and temp collection cover every subtree; the
``evict`` lock is node-wide, in the root layout.

Leases are ``leases/<manifest_id>/<job_id>`` files; the lease directory's mtime is the entry's
last use (atime is unreliable). The epilog calls :meth:`NodeCache.release`; leases of jobs
that died with their node are dropped by :meth:`NodeCache.prune_leases`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from slurm_bt.atomic import fsync_dir, write_file_atomic
from slurm_bt.errors import CacheFullError, CacheIntegrityError, CacheLockTimeout, StorageError
from slurm_bt.weights.cache_layout import (
    CacheLayout,
    SmallBlobWriter,
    build_snapshot,
    copy_and_hash,
    copy_only,
    hash_prefix,
    new_snapshot_tree,
    publish_blob_batch,
    publish_blob_file,
    read_small_at,
    remove_tree,
    tmp_name,
)
from slurm_bt.weights.cluster_cache import (
    Authorizer,
    CacheStats,
    ClusterCache,
    EntryInfo,
    cache_stats,
    gc_temp,
    unique_blobs,
)
from slurm_bt.weights.eviction import EvictionCandidate, EvictionPlan, EvictionResult, plan_lru_eviction
from slurm_bt.weights.locks import LockOptions, optional_lock
from slurm_bt.weights.manifest import Manifest, ManifestFile

__all__ = ["NodeAudience", "NodeCache", "set_dir_owner_mode",
           "validate_job_id"]

#: The default cap (``max_bytes`` 0) as a share of the node-cache filesystem's size.
_DEFAULT_FS_SHARE = 0.9

_log = logging.getLogger("slurm_bt.weights.cache")
_T = TypeVar("_T")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_+.-]{0,63}$")
_TEAM = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_PENDING = ".manifest.json"
PRIVATE = "private"


@dataclass(frozen=True)
class NodeAudience:
    """Who may read a node-tier subtree: the team (slug, as in the cluster tier's name) and its gid."""

    team: str
    gid: int

    def __post_init__(self) -> None:
        if not _TEAM.match(self.team):
            raise ValueError(f"invalid team name {self.team!r}")


def validate_job_id(job_id: str) -> str:
    """A job id safe to use as a file name (``123``, ``123_4``, ``123+0``); else ValueError."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id


def set_dir_owner_mode(path: Path, gid: int, mode: int) -> None:
    """Give the directory ``path`` group ``gid`` (unless -1) and ``mode``, through an ``O_NOFOLLOW`` fd.

    Raises:
        OSError: not a directory (a symlink included) or the change failed.
    """
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if gid >= 0 and st.st_gid != gid:
            os.fchown(fd, -1, gid)
        if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            os.fchmod(fd, mode)  # after the chown, which may clear setgid
    finally:
        os.close(fd)


class NodeCache:
    """One node-local cache root.

    Args:
        root: e.g. ``/nvme/slurm-bt/weights`` (root-owned, on one local filesystem).
        max_bytes: cap on blob bytes; staging evicts lease-free entries LRU to stay under it (0: 90%
            of the filesystem, :meth:`cap_bytes`).
        reserve_bytes: filesystem space never to use (root ignores reserved blocks).
        lock_options: lock behaviour; node disks are local, so flock works by default.
        copy_workers: blobs copied in parallel (each copy also hashes in its own thread).
        evict_lock_timeout_s: how long the evictor waits for a busy entry before skipping it.
        audience: None for public entries (the root layout); a team for credentialed entries, which
            then live in ``<root>/private/<team>`` readable by that team's group only.
    """

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        *,
        reserve_bytes: int = 0,
        lock_options: LockOptions | None = None,
        copy_workers: int = 2,
        evict_lock_timeout_s: float = 2.0,
        audience: NodeAudience | None = None,
    ) -> None:
        #: The node cache root's own layout: public entries, ``jobs/``, the node-wide ``evict`` lock.
        self.base = CacheLayout(Path(root))
        self.audience = audience
        #: Where this instance stages and looks for hits (the base, or the team's private subtree).
        self.layout = self.base if audience is None else CacheLayout(
            self.base.root / PRIVATE / audience.team, group=audience.gid)
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes
        self.lock_options = lock_options or LockOptions()
        self.copy_workers = max(1, copy_workers)
        self.evict_lock_timeout_s = evict_lock_timeout_s
        #: Called with the bytes of a partial blob a resumed copy did not have to move again.
        self.on_resume: Callable[[int], None] | None = None

    @property
    def root(self) -> Path:
        """The node cache root (``jobs/`` and public entries live here)."""
        return self.base.root

    # -- subtrees ---------------------------------------------------------------------------------

    def _subtrees(self) -> list[tuple[str, CacheLayout]]:
        """``(key prefix, layout)`` of every subtree: the base (prefix ``""``) and each team's."""
        out = [("", self.base)]
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for name in sorted(os.listdir(self.base.root / PRIVATE)):
                if _TEAM.match(name):
                    out.append((f"{PRIVATE}/{name}/", CacheLayout(self.base.root / PRIVATE / name)))
        return out

    @property
    def _prefix(self) -> str:
        return "" if self.audience is None else f"{PRIVATE}/{self.audience.team}/"

    def _split(self, key: str) -> tuple[CacheLayout, str]:
        """A qualified id or blob key (``private/<team>/<name>`` or ``<name>``) → (layout, name)."""
        head, _, name = key.rpartition("/")
        if not head:
            return self.base, name
        return CacheLayout(self.base.root / head), name

    def _ensure(self) -> None:
        """Create the base layout and, for a team, its private subtree (``root:<gid> 0750``).

        Only root writes the node cache (its root is root-owned under a root-owned parent), so
        nobody else can pre-create ``private/`` or a team's directory; an existing one that does
        not belong to this process's user is refused, and group and mode are corrected otherwise.
        """
        self.base.ensure(extra=("leases", "jobs"))
        if self.audience is None:
            return
        me = os.geteuid()
        for path, gid, mode in ((self.base.root / PRIVATE, -1, 0o755),
                                (self.layout.root, self.audience.gid, 0o750)):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                raise StorageError(str(path), f"is not a directory owned by uid {me}; refusing to use it "
                                              "(an admin must remove it)")
            set_dir_owner_mode(path, gid, mode)
        self.layout.ensure(extra=("leases",))

    def snapshot_path(self, manifest: Manifest) -> Path:
        """``snapshots/<manifest_id>`` (exists once staged)."""
        return self.layout.snapshot(manifest.manifest_id)

    def is_ready(self, manifest: Manifest) -> bool:
        """Complete on this node (COMPLETE marker matches and the snapshot exists)."""
        return self.layout.is_complete(manifest) and self.snapshot_path(manifest).is_dir()

    # -- staging ----------------------------------------------------------------------------------

    def stage(
        self,
        manifest: Manifest,
        cluster: ClusterCache | Sequence[ClusterCache],
        job_id: str,
        *,
        authorize: Authorizer,
    ) -> Path:
        """Make ``manifest`` ready on this node, lease it to ``job_id`` and return its snapshot.

        ``authorize(manifest)`` runs first, on hits too; if it raises, no lease, copy or link is
        made and its exception propagates. On a miss each missing blob is copied from the
        first cluster tier that has it (e.g. ``[shared, team]``), hashed while written and verified;
        a blob that fails verification in one tier is tried in the next.

        Raises:
            CacheFullError: not enough room even after evicting every lease-free entry, or the disk
                filled mid-write; the cache is left as it was.
            CacheIntegrityError: a blob failed verification in every tier holding it (not served).
            CacheLockTimeout: another stager of this entry stayed alive past the hard timeout.
            StorageError: a blob is in no cluster tier, or I/O failed.
        """
        validate_job_id(job_id)
        authorize(manifest)
        clusters = [cluster] if isinstance(cluster, ClusterCache) else list(cluster)
        mid = manifest.manifest_id
        self._ensure()
        with self._lock(f"entry-{mid}"):
            if self.is_ready(manifest):  # hit: no hashing, trust the root-owned verified tier
                self._add_lease(mid, job_id)
                return self.snapshot_path(manifest)
            return self._stage_miss(manifest, clusters, job_id)

    def _lease_pending(self, manifest: Manifest, job_id: str) -> Path:
        """Lease an entry that is not on the node yet: its manifest is kept as pending (what eviction
        and a stager read) and the job's lease keeps it from being evicted while it is copied."""
        with self._evict_lock():
            lease_dir = self.layout.leases / manifest.manifest_id
            lease_dir.mkdir(exist_ok=True)
            if not (lease_dir / _PENDING).exists():
                write_file_atomic(lease_dir / _PENDING, manifest.canonical_json(), mode=0o444)
            self._add_lease(manifest.manifest_id, job_id)
        return lease_dir

    def _stage_miss(self, manifest: Manifest, clusters: list[ClusterCache], job_id: str) -> Path:
        mid = manifest.manifest_id
        lease_dir = self._lease_pending(manifest, job_id)
        published: list[str] = []
        try:
            missing = _missing_blobs(self.layout, manifest.files)
            need = sum(f.size for f in missing)
            self._make_room(need)
            snap = self._copy_and_build(manifest, missing, clusters, need, published)
            write_file_atomic(self.layout.manifest_file(mid), manifest.canonical_json(), mode=0o444)
            with contextlib.suppress(OSError):
                os.unlink(lease_dir / _PENDING)
            return snap
        except BaseException:
            self._remove_lease(mid, job_id)
            if not self.leases(mid):
                with contextlib.suppress(OSError):
                    os.unlink(lease_dir / _PENDING)
                with contextlib.suppress(OSError):
                    os.rmdir(lease_dir)
            if published:
                with self._evict_lock():
                    self._remove_unreferenced([self._prefix + sha for sha in published])
            raise

    # -- staging outside the prolog (slurm_bt/weights/node_stager.py) ------------------------------

    def join(self, manifest: Manifest, job_id: str, *, authorize: Authorizer) -> bool:
        """Lease ``manifest`` to ``job_id`` without copying; True when it is already ready (a hit).

        For a miss the lease comes with the pending manifest (``leases/<id>/.manifest.json``) under
        the ``evict`` lock, exactly as :meth:`stage` registers an in-progress copy, so eviction keeps
        every blob the node stager has already published for it. The copy itself is the stager's
        (:meth:`fill`); the job's first step waits for the snapshot.
        """
        validate_job_id(job_id)
        authorize(manifest)
        mid = manifest.manifest_id
        self._ensure()
        if self.is_ready(manifest):
            self._add_lease(mid, job_id)
            return True
        self._lease_pending(manifest, job_id)
        return self.is_ready(manifest)  # a stager may have finished in between

    def missing_bytes(self, manifest: Manifest) -> int:
        """Bytes of ``manifest``'s blobs not yet on this node (what a resumed copy still has to move)."""
        return sum(f.size for f in _missing_blobs(self.layout, manifest.files))

    def fill(self, manifest: Manifest, cluster: Sequence[ClusterCache], *,
             progress: Callable[[int], None] | None = None) -> Path:
        """Copy what is missing of ``manifest`` and publish its snapshot; the node stager's work.

        The caller holds the ``entry-<id>`` lock (single flight) and the waiting jobs hold the
        leases (:meth:`join`). Blobs already published (by an earlier stager that was killed) are
        kept, so a restarted copy resumes with what is missing. Nothing is published as an entry
        until every blob is verified: the snapshot is renamed into place whole and the COMPLETE
        marker comes after it. If ``progress`` raises (cancelled: no job waits any more), the copy
        stops, this process's temp files are removed and the verified blobs stay for a later job.

        Raises:
            The same errors as :meth:`stage`, or whatever ``progress`` raised.
        """
        mid = manifest.manifest_id
        self._ensure()
        if self.is_ready(manifest):
            return self.snapshot_path(manifest)
        try:
            missing = _missing_blobs(self.layout, manifest.files)
            need = sum(f.size for f in missing)
            self._make_room(need)
            snap = self._copy_and_build(manifest, missing, list(cluster), need, [], progress)
            write_file_atomic(self.layout.manifest_file(mid), manifest.canonical_json(), mode=0o444)
            with contextlib.suppress(OSError):
                os.unlink(self.layout.leases / mid / _PENDING)
            return snap
        finally:
            self._remove_own_temps()

    def _remove_own_temps(self) -> None:
        """Remove temp blobs this process left (a cancelled copy); dead writers' are :meth:`gc_temp`'s."""
        from slurm_bt.weights.cache_layout import parse_tmp_name

        me = os.getpid()
        with contextlib.suppress(OSError), os.scandir(self.layout.tmp) as it:
            for e in it:
                owner = parse_tmp_name(e.name)
                if owner is not None and owner[1] == me and e.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)

    def _copy_and_build(self, manifest: Manifest, missing: list[ManifestFile], clusters: list[ClusterCache],
                        need: int, published: list[str], progress: Callable[[int], None] | None = None) -> Path:
        """Copy the ``missing`` blobs and build the snapshot; returns it.

        Many small blobs are written straight into the snapshot's temp tree, which then needs no
        link of its own for them (:class:`~slurm_bt.weights.cache_layout.SmallBlobWriter`); the
        tree is removed if anything fails (it was never trusted: it has a temp name).
        """
        tree = None
        if sum(1 for f in missing if f.size <= SMALL_BLOB_MAX_BYTES) >= SMALL_BATCH_MIN and not os.path.lexists(
                self.snapshot_path(manifest)):
            tree = new_snapshot_tree(self.layout, manifest.manifest_id)
        try:
            placed = self._copy_all(missing, clusters, need, published, progress, tree)
            return build_snapshot(self.layout, manifest, tree=tree, placed=placed)
        except BaseException:
            if tree is not None:
                with contextlib.suppress(OSError):
                    remove_tree(self.layout, tree)
            raise

    def _copy_all(self, missing: list[ManifestFile], clusters: list[ClusterCache], need: int,
                  published: list[str], progress: Callable[[int], None] | None = None,
                  tree: Path | None = None) -> list[str]:
        """Copy ``missing``; returns the manifest paths written into ``tree`` as their blobs."""
        placed: list[str] = []
        small = [f for f in missing if f.size <= SMALL_BLOB_MAX_BYTES]
        if len(small) >= SMALL_BATCH_MIN:
            # First, before any big blob dirties the page cache: the batch's syncfs would wait for it.
            self._copy_small(small, clusters, need, published, progress, tree, placed)
            missing = [f for f in missing if f.size > SMALL_BLOB_MAX_BYTES]
        order = sorted(missing, key=lambda f: -f.size)  # big first: better balance across workers
        medium = {f.sha256 for f in missing if SMALL_BLOB_MAX_BYTES < f.size < RESUME_MIN_BYTES}
        if len(medium) < MEDIUM_BATCH_MIN:
            medium = set()
        errors: list[BaseException] = []
        # Medium blobs are published in batches (one syncfs per MEDIUM_BATCH_BYTES, not an fsync of
        # each blob and of blobs/): the fd for syncfs is opened before any of them is written, as
        # SmallBlobWriter does (write-back errors reach only descriptors opened before them).
        sync_fd = os.open(self.layout.tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if medium else -1
        deferred: list[tuple[str, str, int]] = []
        flushed = time.monotonic()
        try:
            with ThreadPoolExecutor(max_workers=self.copy_workers, thread_name_prefix="stage") as pool:
                futures = {pool.submit(self._copy_blob, f, clusters, need, progress, f.sha256 in medium): f
                           for f in order}
                for fut, f in futures.items():
                    try:
                        result = fut.result()
                        if isinstance(result, str):  # written, verified, sealed; not yet durable or named
                            deferred.append((result, f.sha256, f.size))
                            if not errors and (sum(t[2] for t in deferred) >= MEDIUM_BATCH_BYTES
                                               or time.monotonic() - flushed >= MEDIUM_BATCH_S):
                                batch, deferred = deferred, []
                                publish_blob_batch(sync_fd, batch, os.fspath(self.layout.blobs), published)
                                flushed = time.monotonic()
                        elif result:
                            published.append(f.sha256)
                    except BaseException as exc:
                        errors.append(exc)
            if deferred and not errors:
                batch, deferred = deferred, []
                publish_blob_batch(sync_fd, batch, os.fspath(self.layout.blobs), published)
        finally:
            for path, _sha, _size in deferred:  # a failed stage: these never get a name
                with contextlib.suppress(OSError):
                    os.unlink(path)
            if sync_fd >= 0:
                os.close(sync_fd)
        if errors:
            raise errors[0]
        return placed

    def _copy_small(self, files: list[ManifestFile], clusters: list[ClusterCache], need: int,
                    published: list[str], progress: Callable[[int], None] | None = None,
                    tree: Path | None = None, placed: list[str] | None = None) -> None:
        """Copy small blobs in one thread, published in batches (:class:`SmallBlobWriter`).

        Why one thread and no per-blob fsync: for a 4 KiB blob the pool's hand-off, the
        ``posix_fallocate`` and the two fsyncs of the per-blob path cost far more than the copy
        (10,000 x 4 KiB: 6.6 s against 0.83 s for ``cp -a``). Each source is read whole into
        memory (at most ``SMALL_BLOB_MAX_BYTES``), hashed and written from that same buffer, so the
        hash is of the bytes written even if a tenant rewrites the source meanwhile. Blobs published
        before a failure are added to ``published`` (the caller rolls them back).
        """
        tiers = _TierDirs(clusters)
        try:
            self._copy_small_batches(files, tiers, need, published, progress, tree, placed)
        finally:
            tiers.close()

    def _copy_small_batches(self, files: list[ManifestFile], tiers: _TierDirs, need: int,
                            published: list[str], progress: Callable[[int], None] | None,
                            tree: Path | None, placed: list[str] | None) -> None:
        for i in range(0, len(files), SMALL_BATCH_FILES):
            current: ManifestFile | None = None
            try:
                with SmallBlobWriter(self.layout, tree=tree) as batch:
                    try:
                        for current in files[i:i + SMALL_BATCH_FILES]:
                            data, trusted = self._read_small(current, tiers)
                            batch.add(current, data, verify=not trusted)
                            if progress is not None:
                                progress(current.size)
                        current = None
                        batch.publish()
                    finally:
                        published.extend(batch.published)
                        if placed is not None:
                            placed.extend(batch.placed)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    where = current.path if current is not None else "a batch of small files"
                    raise CacheFullError(str(self.root), need, self._fs_free(), tier="node cache",
                                         detail=f"disk filled while writing {where}") from exc
                raise

    @staticmethod
    def _read_small(f: ManifestFile, tiers: _TierDirs) -> tuple[bytes, bool]:
        """``(content, from a trusted tier)`` of a small blob from the first tier whose copy is right.

        A copy of the wrong size (or, from an untrusted tier, the wrong hash) is logged and the next
        tier tried, as for big blobs (:func:`_from_first_good_tier`); a tier without the blob is
        skipped; a symlink, FIFO or other non-regular file at its name fails the copy.
        """
        first_error: CacheIntegrityError | None = None
        for c, blobs_fd, blobs in tiers.tiers:
            where = f"{blobs}/{f.sha256}"
            try:
                if blobs_fd >= 0:  # one byte more: a grown source is caught
                    data = read_small_at(blobs_fd, f.sha256, f.size + 1, where)
                else:
                    src = c.open_blob(f)
                    try:
                        data = os.pread(src, f.size + 1, 0)
                    finally:
                        os.close(src)
            except FileNotFoundError:
                continue
            actual = f.sha256 if c.trusted_copy and len(data) == f.size else hashlib.sha256(data).hexdigest()
            if len(data) == f.size and actual == f.sha256:
                return data, c.trusted_copy
            exc = CacheIntegrityError(where, f.sha256, actual, f.size, len(data))
            _log.error("rejected blob %s for %s from %s: %s", f.sha256, f.path, c.root, exc)
            first_error = first_error or exc
        if first_error is not None:
            raise first_error
        raise StorageError(f.sha256, f"blob for {f.path} is in no cluster cache "
                                     f"({', '.join(str(c.root) for c in tiers.clusters)}); stage the source first")

    def _copy_blob(self, f: ManifestFile, clusters: list[ClusterCache], need: int,
                   progress: Callable[[int], None] | None = None, defer: bool = False) -> bool | str:
        """Copy one blob (see :meth:`_copy_from`); ``defer``: leave it as a sealed temp to batch."""
        return _from_first_good_tier(f, clusters, lambda src, c: self._copy_from(src, f, need, c, progress, defer))

    def _copy_from(self, src: int, f: ManifestFile, need: int, cluster: ClusterCache,
                   progress: Callable[[int], None] | None = None, defer: bool = False) -> bool | str:
        """Copy, verify and publish one blob; True when this call named it (False: it was there).

        ``defer`` (a medium blob, :meth:`_copy_all`): verified and sealed (group, mode) but neither
        flushed nor named; its temp path is returned for :func:`publish_blob_batch`, which flushes a
        whole batch with one ``syncfs`` before any of it gets its name.
        """
        size = os.fstat(src).st_size
        src_uri = str(cluster.layout.blob(f.sha256))
        if size != f.size:
            raise CacheIntegrityError(src_uri, f.sha256, "", f.size, size)
        # The node stager (progress given) keeps big blobs resumable: a fixed partial name and a
        # mark of the durable prefix, so a killed copy of a 100 GB file does not start over.
        part = self._open_partial(f) if progress is not None and f.size >= RESUME_MIN_BYTES else None
        if part is not None:
            tmp, dst, start = part
        else:
            tmp, start = self.layout.tmp / tmp_name("blob"), 0
            dst = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        mark = _mark_path(tmp) if part is not None else None
        written = [start, start]  # bytes in dst, bytes made durable and marked

        def step(n: int) -> None:
            written[0] += n
            if mark is not None and written[0] - written[1] >= _MARK_EVERY_BYTES:
                os.fdatasync(dst)
                _write_mark(mark, f.sha256, written[0])
                written[1] = written[0]
            if progress is not None:
                progress(n)

        try:
            try:
                try:  # reserve early: ENOSPC before any byte is copied, and contiguous extents
                    if f.size:
                        os.posix_fallocate(dst, 0, f.size)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise
                hasher = None
                if start:
                    if self.on_resume is not None:
                        self.on_resume(start)
                    if not cluster.trusted_copy:  # what was written before is hashed again, from disk
                        hasher = hash_prefix(dst, start)
                if cluster.trusted_copy:  # root-owned shared tier, verified at publish (site policy)
                    actual, n = f.sha256, copy_only(src, dst, f.size, progress=step, start=start)
                else:
                    actual, n = copy_and_hash(src, dst, f.size, progress=step, start=start, hasher=hasher)
                if actual != f.sha256 or n != f.size:
                    if mark is not None:  # a bad prefix or source: never resume from it
                        with contextlib.suppress(OSError):
                            os.unlink(mark)
                    raise CacheIntegrityError(src_uri, f.sha256, actual, f.size, n)
            except CacheIntegrityError:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            except BaseException:  # OSError, or the node stager's cancellation raised by progress()
                if mark is not None:  # keep what is durable for the next stager
                    with contextlib.suppress(OSError):
                        os.fdatasync(dst)
                        _write_mark(mark, f.sha256, written[0])
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                raise
            if defer and mark is None:
                try:
                    if self.layout.group is not None:
                        os.fchown(dst, -1, self.layout.group)
                    os.fchmod(dst, self.layout.blob_mode)  # after chown (which may clear bits)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
                return os.fspath(tmp)
            published = publish_blob_file(tmp, dst, self.layout.blob(f.sha256), f, actual, n,
                                          group=self.layout.group)
            if mark is not None:
                with contextlib.suppress(OSError):
                    os.unlink(mark)
            return published
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT) or (
                    isinstance(exc.__cause__, OSError) and exc.__cause__.errno in (errno.ENOSPC, errno.EDQUOT)):
                raise CacheFullError(str(self.root), need, self._fs_free(), tier="node cache",
                                     detail=f"disk filled while writing {f.path}") from exc
            raise
        finally:
            os.close(dst)

    def _open_partial(self, f: ManifestFile) -> tuple[Path, int, int] | None:
        """``(path, fd, durable prefix)`` of this blob's partial copy, locked; None when another
        process writes it (then this copy uses a private temp name, as the prolog's path does)."""
        import fcntl

        tmp = self.layout.tmp / f"partial-{f.sha256}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise StorageError(str(tmp), "is not a regular file of this user; refusing to resume from it")
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        start = _read_mark(_mark_path(tmp), f.sha256, min(f.size, st.st_size))
        if start == 0:
            os.ftruncate(fd, 0)
        return tmp, fd, start

    # -- space ------------------------------------------------------------------------------------

    def _fs_free(self) -> int:
        st = os.statvfs(self.root)
        return max(0, st.f_bavail * st.f_frsize - self.reserve_bytes)

    def cap_bytes(self) -> int:
        """The cap on blob bytes: ``max_bytes``, or with 0 (the site default) 90% of the filesystem.

        Why a share of the filesystem by default: a fixed number either refuses a 1 TB model on a
        node that has room for it or lets the cache fill a small disk; the remaining 10% (and
        ``reserve_bytes`` of free space, always) is left for whatever else shares the disk.
        """
        if self.max_bytes > 0:
            return self.max_bytes
        st = os.statvfs(self.root)
        return int(st.f_blocks * st.f_frsize * _DEFAULT_FS_SHARE)

    def usage_bytes(self) -> int:
        """Bytes held by blobs of every subtree (snapshots are hard links to them)."""
        return sum(self._blob_sizes().values())

    def _blob_sizes(self) -> dict[str, int]:
        """Qualified blob key → size, over every subtree (one node-wide budget)."""
        out = {}
        for prefix, layout in self._subtrees():
            with contextlib.suppress(FileNotFoundError), os.scandir(layout.blobs) as it:
                for e in it:
                    if not e.name.startswith(".") and e.is_file(follow_symlinks=False):
                        out[prefix + e.name] = e.stat(follow_symlinks=False).st_size
        return out

    def _make_room(self, need: int) -> None:
        """Pre-flight: ``need`` more bytes must fit under ``max_bytes`` and in free space."""
        if need == 0:
            return
        usage = self.usage_bytes()
        cap = self.cap_bytes()
        room = min(cap - usage, self._fs_free())
        if need <= room:
            return
        with self._evict_lock():
            plan = self.plan_eviction(usage - (need - room))
            if need > cap or not plan.satisfied:
                raise CacheFullError(str(self.root), need, max(room, 0), tier="node cache",
                                     detail=f"{plan.bytes_freed} bytes evictable; cache left unchanged")
            self._execute_locked(plan)
        room = min(cap - self.usage_bytes(), self._fs_free())
        if need > room:
            raise CacheFullError(str(self.root), need, max(room, 0), tier="node cache")

    # -- leases -----------------------------------------------------------------------------------

    def _add_lease(self, mid: str, job_id: str) -> None:
        d = self.layout.leases / mid
        d.mkdir(exist_ok=True)
        # Leases need no fsync: after a crash no job holds anything, and prune_leases cleans up.
        fd = os.open(d / job_id, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, json.dumps({"job_id": job_id, "since": time.time()}).encode())
        finally:
            os.close(fd)
        os.utime(d)

    def _remove_lease(self, mid: str, job_id: str) -> bool:
        return _unlink_lease(self.layout.leases / mid, job_id)

    def leases(self, manifest_id: str) -> list[str]:
        """Job ids holding a lease on an entry (``manifest_id`` may be qualified: ``private/<team>/<id>``)."""
        layout, mid = self._split(manifest_id) if "/" in manifest_id else (self.layout, manifest_id)
        try:
            return sorted(n for n in os.listdir(layout.leases / mid) if not n.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def _all_lease_ids(self) -> list[str]:
        """Qualified ids of every lease directory in every subtree."""
        out = []
        for prefix, layout in self._subtrees():
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                out += [prefix + mid for mid in os.listdir(layout.leases)]
        return out

    def _remove_qualified_lease(self, key: str, job_id: str) -> bool:
        layout, mid = self._split(key)
        return _unlink_lease(layout.leases / mid, job_id)

    def release(self, job_id: str) -> list[str]:
        """Drop every lease of ``job_id`` in every subtree (epilog); idempotent. Returns the ids released."""
        validate_job_id(job_id)
        out = [key for key in self._all_lease_ids() if self._remove_qualified_lease(key, job_id)]
        return sorted(out)

    def prune_leases(self, active_job_ids: Collection[str], *, min_age_s: float = 0.0,
                     still_inactive: Callable[[str], bool] = lambda _job: True) -> list[tuple[str, str]]:
        """Drop leases of jobs not in ``active_job_ids`` (their epilog never ran: node crash); called by
        every epilog before its LRU pass (:func:`slurm_bt.weights.node_stage.epilog_enforce_lru`), or the
        entries such a job leased would never be evicted.

        Args:
            active_job_ids: the jobs between prolog and end of epilog on this host (root's notes).
            min_age_s: leave leases younger than this (a lease is taken after its job's note is
                written, so a young lease without a note is a race, not a crash).
            still_inactive: asked again just before each unlink (a job may have started since
                ``active_job_ids`` was read).

        Returns:
            ``(manifest_id, job_id)`` pairs removed (ids of private entries qualified).
        """
        active = set(active_job_ids)
        now = time.time()
        out = []
        for key in self._all_lease_ids():
            layout, mid = self._split(key)
            for job in self.leases(key):
                if job in active:
                    continue
                try:
                    if now - os.lstat(layout.leases / mid / job).st_mtime < min_age_s:
                        continue
                except OSError:
                    continue
                if still_inactive(job) and self._remove_qualified_lease(key, job):
                    out.append((key, job))
        return out

    # -- eviction ---------------------------------------------------------------------------------

    def _last_used(self, key: str) -> float:
        layout, mid = self._split(key)
        for p in (layout.leases / mid, layout.manifest_file(mid)):
            with contextlib.suppress(OSError):
                return os.lstat(p).st_mtime
        return 0.0

    def _pending_blobs(self) -> set[str]:
        """Blob keys of leased entries without a COMPLETE marker yet (in-progress stages)."""
        out: set[str] = set()
        for key in self._all_lease_ids():
            layout, mid = self._split(key)
            prefix = key[: len(key) - len(mid)]
            p = layout.leases / mid / _PENDING
            if self.leases(key) and p.exists():
                with contextlib.suppress(OSError, ValueError):
                    out.update(prefix + f.sha256 for f in Manifest.model_validate_json(p.read_bytes()).files)
        return out

    def _candidates(self) -> list[EvictionCandidate]:
        """Every complete entry of every subtree; ids and blob keys qualified by subtree."""
        out = []
        for prefix, layout in self._subtrees():
            for mid in layout.manifest_ids():
                m = layout.read_manifest(mid)
                if m is None:
                    continue
                key = prefix + mid
                out.append(EvictionCandidate(key, self._last_used(key), frozenset(prefix + f.sha256 for f in m.files),
                                             bool(self.leases(key))))
        return out

    def plan_eviction(self, target_bytes: int) -> EvictionPlan:
        """Plan LRU eviction of lease-free entries down to ``target_bytes`` of blob usage (no changes)."""
        return plan_lru_eviction(self._candidates(), self._blob_sizes(), self._pending_blobs(), target_bytes)

    def execute(self, plan: EvictionPlan) -> EvictionResult:
        """Carry out a plan: markers and snapshots first, then blobs no remaining entry references.

        Leases are re-checked under each entry's lock; an entry that gained a lease, or whose lock
        stays busy, is skipped (and its blobs kept).
        """
        with self._evict_lock():
            return self._execute_locked(plan)

    def withdraw(self, manifest: Manifest) -> bool:
        """Remove ``manifest``'s entry from this instance's layout now if no job leases it.

        For upgrades: an entry of a credentialed source that older versions staged world-readable in
        the public layout is withdrawn from there when its team stages its own copy (issue #8 item 2).

        Returns:
            True when the entry was removed.
        """
        mid = manifest.manifest_id
        if not self.layout.is_complete(manifest):
            return False
        key = self._prefix + mid
        plan = EvictionPlan(0, 0, (key,), tuple(self._prefix + f.sha256 for f in unique_blobs(manifest.files)), 0)
        with self._evict_lock():
            return bool(self._execute_locked(plan).manifests)

    def _execute_locked(self, plan: EvictionPlan) -> EvictionResult:
        removed: list[str] = []
        skipped: list[str] = []
        quick = dataclasses.replace(self.lock_options, timeout_s=self.evict_lock_timeout_s)
        for key in plan.manifests:
            layout, mid = self._split(key)
            try:
                with optional_lock(layout.lock(f"entry-{mid}"), quick):
                    if self.leases(key):
                        skipped.append(key)
                        continue
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(layout.manifest_file(mid))
                    fsync_dir(layout.manifests)
                    remove_tree(layout, layout.snapshot(mid))
                    with contextlib.suppress(OSError):
                        os.unlink(layout.leases / mid / _PENDING)
                    with contextlib.suppress(OSError):
                        os.rmdir(layout.leases / mid)
                    removed.append(key)
                    _log.info("evicted entry %s", key)
            except CacheLockTimeout:
                skipped.append(key)
        blobs, freed = self._remove_unreferenced(plan.blobs)
        return EvictionResult(tuple(removed), tuple(skipped), tuple(blobs), freed)

    def _referenced_blobs(self) -> set[str]:
        refs = self._pending_blobs()
        for c in self._candidates():
            refs |= c.blobs
        return refs

    def _remove_unreferenced(self, keys: Sequence[str]) -> tuple[list[str], int]:
        """Remove the given blobs (qualified keys) unless an entry, complete or in progress, still uses them."""
        refs = self._referenced_blobs()
        removed, freed = [], 0
        dirs: set[Path] = set()
        for key in keys:
            if key in refs:
                continue
            layout, sha = self._split(key)
            p = layout.blob(sha)
            try:
                size = os.lstat(p).st_size
                os.unlink(p)
            except FileNotFoundError:
                continue
            removed.append(key)
            freed += size
            dirs.add(layout.blobs)
        for d in dirs:
            fsync_dir(d)
        return removed, freed

    # -- listing ----------------------------------------------------------------------------------

    def entries(self) -> list[EntryInfo]:
        """Complete entries of every subtree (private ones as ``private/<team>/<id>``), LRU first."""
        out = []
        for prefix, layout in self._subtrees():
            for mid in layout.manifest_ids():
                m = layout.read_manifest(mid)
                if m is None:
                    continue
                key = prefix + mid
                published = os.lstat(layout.manifest_file(mid)).st_mtime
                out.append(EntryInfo(key, m.kind, m.source, m.revision, len(m.files), m.total_bytes, published,
                                     self._last_used(key), tuple(self.leases(key))))
        return sorted(out, key=lambda e: (e.last_used, e.manifest_id))

    def stat(self) -> CacheStats:
        """Counts and sizes for ``slurm-bt cache ls --node``, over every subtree."""
        entries = tuple(self.entries())
        parts = [cache_stats(layout, ()) for _, layout in self._subtrees()]
        return CacheStats(self.root, entries, sum(p.blobs for p in parts), sum(p.blob_bytes for p in parts),
                          sum(p.temp_entries for p in parts))

    def gc_temp(self, *, older_than_s: float = 3600.0) -> list[Path]:
        """Remove temp debris of dead writers in every subtree (node-local: pids are checked directly)."""
        out: list[Path] = []
        for _, layout in self._subtrees():
            out += gc_temp(layout, older_than_s)
        return out

    def _lock(self, name: str, options: LockOptions | None = None) -> contextlib.AbstractContextManager[None]:
        return optional_lock(self.layout.lock(name), options or self.lock_options)

    def _evict_lock(self) -> contextlib.AbstractContextManager[None]:
        """The node-wide ``evict`` lock (in the base layout: eviction spans every subtree)."""
        return optional_lock(self.base.lock("evict"), self.lock_options)


#: Blobs up to this size are copied by :meth:`NodeCache._copy_small` (read whole, batched publish).
SMALL_BLOB_MAX_BYTES = 1 << 20
#: The batched publish is used from this many small blobs on: its ``syncfs`` flushes the whole
#: filesystem (other writers' dirty pages too), which only pays against many per-blob fsyncs.
SMALL_BATCH_MIN = 16
#: Small blobs per batch: what a crash mid-copy can cost (unpublished temps), and one syncfs each.
SMALL_BATCH_FILES = 4096
#: Blobs bigger than small and smaller than ``RESUME_MIN_BYTES`` ("medium") are published in batches
#: (one ``syncfs`` each) from this many on; fewer keep the per-blob fsyncs (syncfs flushes the whole
#: filesystem, other writers' pages too).
MEDIUM_BATCH_MIN = 4
#: Bytes of medium blobs per batch: one ``syncfs`` each, and what a crash mid-copy can cost.
MEDIUM_BATCH_BYTES = 1 << 30
#: ... or seconds of copying, whichever comes first: a slow (rate-capped) node stager still makes
#: its progress durable every second or so, so a killed one resumes from there (§3.1), while a
#: fast copy (about 1 GB/s) still needs one flush per ~50 blobs of 20 MiB instead of 100 fsyncs.
MEDIUM_BATCH_S = 1.0
#: Blobs at least this big are copied resumably by the node stager (smaller ones restart whole).
RESUME_MIN_BYTES = 128 << 20
#: How often a resumable copy makes its prefix durable and records it.
_MARK_EVERY_BYTES = 256 << 20


class _TierDirs:
    """A descriptor on each cluster tier's ``blobs/`` for the small-blob loop: one path walk per
    tier instead of one per file (and no ``Path`` object per file).

    Tiers keep their order. A refused tier, or one without ``blobs/``, holds nothing (as
    ``ClusterCache.open_blob`` says: ``FileNotFoundError``) and is left out; where ``blobs/``
    cannot be opened for another reason the fd is -1 and each blob goes through
    ``ClusterCache.open_blob``, so its error is the one it always was.
    """

    def __init__(self, clusters: list[ClusterCache]) -> None:
        self.clusters = clusters
        #: ``(tier, fd on its blobs/ or -1, blobs/ path)``
        self.tiers: list[tuple[ClusterCache, int, str]] = []
        for c in clusters:
            if c.refused is not None:
                continue
            blobs = os.fspath(c.layout.blobs)
            if c.opener is not None:  # opened as the job user, blob by blob (root may not open blobs/)
                self.tiers.append((c, -1, blobs))
                continue
            try:
                fd = os.open(blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError:
                fd = -1
            self.tiers.append((c, fd, blobs))

    def close(self) -> None:
        for _c, fd, _blobs in self.tiers:
            if fd >= 0:
                os.close(fd)
        self.tiers = []


def _missing_blobs(layout: CacheLayout, files: tuple[ManifestFile, ...] | list[ManifestFile]) -> list[ManifestFile]:
    """One file per distinct blob of ``files`` not yet at ``blobs/<sha256>`` as a regular file of its
    size (``cluster_cache.blob_present``'s test), with an ``lstat`` relative to one descriptor on
    ``blobs/``: at 10,000 files a ``Path`` per blob cost more than the ``lstat``."""
    unique = unique_blobs(files)
    try:
        fd = os.open(layout.blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return unique
    out = []
    try:
        for f in unique:
            try:
                st = os.lstat(f.sha256, dir_fd=fd)
            except OSError:
                out.append(f)
                continue
            if not stat.S_ISREG(st.st_mode) or st.st_size != f.size:
                out.append(f)
    finally:
        os.close(fd)
    return out


def _from_first_good_tier(f: ManifestFile, clusters: list[ClusterCache],
                          use: Callable[[int, ClusterCache], _T]) -> _T:
    """``use(fd, tier)`` on the blob of ``f`` in the first tier that has a right copy (tiers in order).

    A tier whose copy ``use`` rejects (:class:`CacheIntegrityError`: wrong size or hash) is logged
    and the next one tried; the descriptor is closed after each try.

    Raises:
        CacheIntegrityError: every tier holding the blob had a wrong copy (the first error).
        StorageError: no tier has it, or a symlink/FIFO sits at its name.
    """
    first_error: CacheIntegrityError | None = None
    for c in clusters:
        try:
            src = c.open_blob(f)
        except FileNotFoundError:
            continue
        try:
            return use(src, c)
        except CacheIntegrityError as exc:
            _log.error("rejected blob %s for %s from %s: %s", f.sha256, f.path, c.root, exc)
            first_error = first_error or exc
        finally:
            os.close(src)
    if first_error is not None:
        raise first_error
    raise StorageError(f.sha256, f"blob for {f.path} is in no cluster cache "
                                 f"({', '.join(str(c.root) for c in clusters)}); stage the source first")


def _mark_path(partial: Path) -> Path:
    return partial.with_name(partial.name + ".mark")


def _write_mark(mark: Path, sha: str, done: int) -> None:
    write_file_atomic(mark, json.dumps({"sha256": sha, "done": done}).encode(), mode=0o600)


def _read_mark(mark: Path, sha: str, limit: int) -> int:
    """The durable prefix a killed copy recorded (0 if none, unreadable, or not for this blob)."""
    from slurm_bt.trusted_files import read_trusted_file

    raw = read_trusted_file(mark, max_bytes=4096, owner_ok=lambda st: st.st_uid == os.geteuid())
    try:
        data = json.loads(raw) if raw is not None else None
    except ValueError:
        return 0
    if not isinstance(data, dict) or data.get("sha256") != sha or not isinstance(data.get("done"), int):
        return 0
    return max(0, min(int(data["done"]), limit))


def _unlink_lease(lease_dir: Path, job_id: str) -> bool:
    """Remove ``job_id``'s lease in ``lease_dir``; True if it was there. The directory's mtime is
    touched so that the entry's last use is when its last lease went, not when it was made."""
    try:
        os.unlink(lease_dir / job_id)
    except FileNotFoundError:
        return False
    with contextlib.suppress(OSError):
        os.utime(lease_dir)
    return True
