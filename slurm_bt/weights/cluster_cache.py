"""The cluster tier: a shared-filesystem mirror of pinned sources, filled once before GPUs are held.

Who writes it and why it may still be trusted only so far (docs/weights-cache.md):

* ``<base>/teams/<team>/`` is written by the staging job *as the user*, with the user's own
  credentials, so a teammate can in principle plant or replace files there. Nothing is trusted
  because of where it sits: every reader that copies a blob onward (the node tier) re-hashes it.
* ``<base>/shared/`` is curated by admins (root-owned, read-only to users) for public models.

Publishing follows the one publish protocol (slurm_bt/atomic.py): each blob is fetched into a private temp directory
under ``.tmp/``, fsynced, hashed, renamed to ``blobs/<sha256>`` and the directory fsynced; then the
snapshot is built under a temp name and renamed; the manifest (COMPLETE marker) is written last.
Locks (:mod:`slurm_bt.weights.locks`) only make concurrent stagers fetch each blob once; with locks
disabled the result is still one correct entry.

A cache hit still needs the requester's authorization: :meth:`ClusterCache.ensure` calls the
caller's ``authorize(manifest)`` before anything else, hit or miss. The cache records nothing secret.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from slurm_bt.atomic import fsync_dir, write_file_atomic
from slurm_bt.errors import StorageError
from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.privdrop import FileOpener, NotRegularFile
from slurm_bt.posix.safefs import remove_owned_tree
from slurm_bt.storage.checksums import sha256_fd
from slurm_bt.trusted_files import describe_owner as _describe
from slurm_bt.trusted_files import is_team_dir, read_trusted_file
from slurm_bt.weights.cache_layout import (
    CacheLayout,
    build_snapshot,
    copy_and_hash,
    open_regular,
    parse_tmp_name,
    publish_blob_batch,
    publish_blob_file,
    remove_tree,
    tmp_name,
)
from slurm_bt.weights.locks import LockOptions, optional_lock, writer_is_dead
from slurm_bt.weights.manifest import Manifest, ManifestFile

__all__ = ["WRITER_STALE_AFTER_S", "Authorizer", "BlobBatch", "CacheStats", "ClusterCache", "EntryInfo", "Fetcher",
           "blob_present", "cache_stats", "gc_temp", "shared_tier_problem", "spread_subdirs", "team_tier_problem",
           "unique_blobs"]

_log = logging.getLogger("slurm_bt.weights.cache")
_TEAM = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

WRITER_STALE_AFTER_S = 600.0
"""A writer directory (``.tmp/writer.*``) whose heartbeat is older than this is a dead writer's,
whatever host made it (the heartbeat bumps its mtime every few seconds)."""
_WRITER_HEARTBEAT_S = 10.0
_LEGACY_TEMP = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]+$")  # download temps of writers before writer dirs

Authorizer = Callable[[Manifest], None]
"""Raises if the requesting user's credentials cannot read the manifest's source."""

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


def _tier_dir_stat(root: Path) -> tuple[os.stat_result | None, str | None]:
    """``lstat`` of a tier directory: (its stat, None), or (None, why it is unusable, or None if absent)."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot be checked: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return None, "is not a directory (or is a symlink)"
    return st, None


def shared_tier_problem(root: Path) -> str | None:
    """Why the admin-curated shared tier at ``root`` must not be used, or None (usable, or absent).

    The shared tier is trusted more than a team tier (a hit there skips staging; with
    ``verify_node_copy = "team"`` the node copies it without re-hashing), so it must be exactly what
    an admin makes: a real directory owned by root that nobody else can write, in a parent owned by
    root (a user owning the parent could rename the tier away and put their own in its place). A
    user who creates ``<base>/shared`` before the admin does would otherwise decide what every
    job on the cluster loads.
    """
    st, problem = _tier_dir_stat(root)
    if st is None:
        return problem
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o022:
        return f"was not created by an admin ({_describe(st)}; the shared tier must be root-owned, 0755)"
    try:
        pst = os.lstat(root.parent)
    except OSError as exc:
        return f"its parent cannot be checked: {exc.strerror}"
    if pst.st_uid != 0 or (stat.S_IMODE(pst.st_mode) & 0o022 and not pst.st_mode & stat.S_ISVTX):
        return (f"its parent {root.parent} is not root's ({_describe(pst)}): its owner could replace the "
                "shared tier")
    return None


def team_tier_problem(root: Path, gid: int) -> str | None:
    """Why the team tier at ``root`` is not the team's own, or None (usable, or absent).

    A team tier is trusted for authorization (a COMPLETE marker there lets the team's jobs use an
    entry) and teammates' files in it are taken as the team's, so it must be exactly what slurm-bt
    or an admin creates: a real directory whose group is the team's group (``gid``), owned by root
    or a member of that group, and closed to others. Nobody outside the team can create a directory
    with the team's group, so a directory pre-created by another user in a world-writable
    ``teams/`` (a squat) always fails this check.
    """
    st, problem = _tier_dir_stat(root)
    if st is None:
        return problem
    try:
        team = grp.getgrgid(gid).gr_name
    except KeyError:
        team = str(gid)
    if not is_team_dir(st, gid):
        return (f"was not created for team group {team} ({_describe(st)}; slurm-bt creates it as "
                f"<member>:{team} 2770, admins as root:{team} 3770)")
    return None


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
        #: Why this tier must not be used at all (a squatted or user-made tier), else None. A refused
        #: tier has no entries and no blobs for its readers: it is sidestepped, never trusted.
        self.refused: str | None = None
        #: Opens this tier's files for a root reader as the job user (``posix.privdrop.FileOpener``):
        #: set by the node side for a team tier, which root must not (and on a root-squashed
        #: filesystem cannot) open itself. ``None``: this process opens them.
        self.opener: FileOpener | None = None

    @classmethod
    def for_team(cls, base: Path, team: str, **kwargs: object) -> ClusterCache:
        """The team namespace ``<base>/teams/<team>``; ``team`` must be a plain slug."""
        if not _TEAM.match(team):
            raise ValueError(f"invalid team name {team!r}: lower-case letters, digits, '_', '-', '.'")
        return cls(Path(base) / "teams" / team, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def shared(cls, base: Path, **kwargs: object) -> ClusterCache:
        """The admin-curated tier ``<base>/shared`` (root-owned, read-only to users).

        A tier that is not root's (:func:`shared_tier_problem`) comes back with :attr:`refused` set:
        it then holds nothing for anyone, and callers report it.
        """
        cache = cls(Path(base) / "shared", **kwargs)  # type: ignore[arg-type]
        problem = shared_tier_problem(cache.root)
        if problem is not None:
            cache.refused = f"{cache.root} {problem}; it is ignored (an admin must remove it: rm -rf {cache.root})"
        return cache

    def read_as_user(self, uid: int, gid: int) -> None:
        """Open this tier's files as ``uid`` (with ``gid`` and its groups) from now on, when we are root.

        The node side does this for a team tier (the prolog's staging child, the node stager): root
        never opens a path tenants write, and on a root-squashed filesystem could not. The opener is
        started here, before the caller starts threads. A no-op unless root, and for root's own jobs.
        """
        if os.geteuid() == 0 and uid != 0 and self.opener is None:
            self.opener = FileOpener(SlurmHookEnv.for_uid(uid, gid)).start()

    def close_reader(self) -> None:
        """End the opener of :meth:`read_as_user`, if any."""
        if self.opener is not None:
            self.opener.close()
            self.opener = None

    @property
    def root(self) -> Path:
        """The cache root."""
        return self.layout.root

    # -- queries ----------------------------------------------------------------------------------

    def has(self, manifest: Manifest) -> bool:
        """The entry is complete: its COMPLETE marker exists with exactly this manifest's JSON."""
        opener = self.opener
        return self.refused is None and self.layout.is_complete(manifest, opener.open_regular if opener else None)

    def missing_blobs(self, manifest: Manifest) -> list[ManifestFile]:
        """Distinct blobs of ``manifest`` not present at the right size (one per sha256)."""
        return [f for f in unique_blobs(manifest.files) if not blob_present(self.layout, f)]

    def snapshot_path(self, manifest: Manifest) -> Path:
        """Where the entry's snapshot lives (exists only once published)."""
        return self.layout.snapshot(manifest.manifest_id)

    def open_blob(self, f: ManifestFile) -> int:
        """A read fd on ``blobs/<sha256>``: regular file only, no symlink, no FIFO.

        Raises:
            FileNotFoundError: not in this tier.
            StorageError: something other than a regular file is there.
        """
        if self.refused is not None:
            raise FileNotFoundError(errno.ENOENT, self.refused, str(self.layout.blob(f.sha256)))
        path = self.layout.blob(f.sha256)
        if self.opener is None:
            return open_regular(path)
        try:
            return self.opener.open_regular(path)
        except NotRegularFile:
            raise StorageError(str(path), "is not a regular file; refusing to read it") from None
        except FileNotFoundError:
            raise
        except OSError as exc:  # as open_regular says it: the user may not open it, a hung filesystem
            raise StorageError(str(path), f"cannot open as the job user: {exc.strerror}") from exc

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

    @contextlib.contextmanager
    def writer_dir(self, heartbeat_s: float = _WRITER_HEARTBEAT_S) -> Iterator[Path]:
        """A private ``.tmp/writer.<pid>_<start>.<rand>@<host>`` dir for one writer's temp files.

        Downloads write their (preallocated, possibly huge) temp files in here instead of beside
        the final blob names, so a writer killed with ``kill -9`` leaves debris that names its host,
        pid and pid start time. A thread bumps the dir's mtime every ``heartbeat_s`` while the writer
        lives; :func:`gc_temp` removes the dir once the writer is provably dead (same host: pid gone
        or reused; other host: heartbeat older than :data:`WRITER_STALE_AFTER_S`). Mode 2770, so a
        teammate's collector may delete its files. Removed on exit.
        """
        self.layout.ensure(dir_mode=self.dir_mode)
        path = self.layout.tmp / tmp_name("writer")
        os.mkdir(path, 0o700)
        os.chmod(path, 0o2770 if self.dir_mode & 0o070 else 0o700)
        spread_subdirs(path)
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(heartbeat_s):
                with contextlib.suppress(OSError):
                    os.utime(path)

        t = threading.Thread(target=beat, name="cache-writer-heartbeat", daemon=True)
        t.start()
        try:
            yield path
        finally:
            stop.set()
            t.join(timeout=1.0)
            remove_owned_tree(path)

    def publish_fetched(self, path: Path, f: ManifestFile) -> bool:
        """Move a blob that the download engine verified (in a :meth:`writer_dir`) to ``blobs/``.

        ``link`` + ``unlink`` rather than ``rename``: an existing blob is never replaced (in a sticky
        ``blobs/`` a teammate's blob could not be anyway), content addressing makes it the same bytes.
        No second hash: every reader that copies onward re-hashes team-tier blobs.

        Returns:
            True when this call published the blob.

        Raises:
            StorageError: ``path`` is not a regular file of the expected size, or the link failed.
        """
        fd = open_regular(path)
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size != f.size:
            raise StorageError(str(path), f"fetched {size} bytes for {f.path}, expected {f.size}")
        final = self.layout.blob(f.sha256)
        try:
            os.link(path, final)
            published = True
        except FileExistsError:
            published = False
        except OSError as exc:
            raise StorageError(str(final), f"cannot publish blob: {exc.strerror}") from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if published:
            fsync_dir(self.layout.blobs)
        return published

    @contextlib.contextmanager
    def fetched_batch(self, max_items: int = 1000) -> Iterator[BlobBatch]:
        """A :class:`BlobBatch` publishing into ``blobs/``; what is still queued is published on a clean exit.

        On an exception nothing more is published (the queued temp files stay in the writer dir,
        which :meth:`writer_dir` removes).
        """
        self.layout.ensure(dir_mode=self.dir_mode)
        batch = BlobBatch(self.layout.blobs, max_items)
        try:
            yield batch
            batch.flush()
        finally:
            batch.close()

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

    def remove_pins(self, manifest_ids: set[str]) -> list[str]:
        """Delete the pin records (``pins/*.json``) of this caller's that name one of ``manifest_ids``.

        Evicting an entry leaves its pins pointing at nothing: harmless (``lookup_pin`` checks the
        entry) but they would pile up. Only records the caller owns are read and removed: in a
        sticky team tier a teammate's are theirs to remove. Returns the names removed.
        """
        folder = self.root / "pins"
        try:
            names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith("."))
        except OSError:
            return []
        removed = []
        for name in names:
            raw = read_trusted_file(folder / name, max_bytes=256 << 20, owner_ok=lambda st: st.st_uid == os.geteuid())
            if raw is None:
                continue
            try:
                mid = Manifest.model_validate_json(raw).manifest_id
            except ValueError:
                continue
            if mid in manifest_ids:
                with contextlib.suppress(OSError):
                    os.unlink(folder / name)
                    removed.append(name)
        return removed

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
        """Remove debris of killed writers; returns what was removed (see :func:`gc_temp`)."""
        if self.refused is not None:
            return []
        return gc_temp(self.layout, older_than_s)



_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x40086602, 0x00020000  # linux/fs.h


def spread_subdirs(path: Path) -> bool:
    """Mark ``path`` as a top of a directory hierarchy (``chattr +T``) where the filesystem knows it (ext4).

    Why: ext4 then places each new subdirectory (the writer dir's ``.fan-*`` dirs, download.py) in a
    block group with many free inodes (the Orlov allocator) instead of the parent's group, and the
    files created in it go there too. Without a journal (the bench VM's root filesystem) ext4 will
    not reuse an inode freed in the last 5 s (305 s while its inode table block is unwritten) and
    scans past every such inode for each file it creates: after an eviction or a deleted 10,000-file
    tree, staging 10,000 small files into the same group spent ~40% of its CPU in that scan
    (``perf``: ``find_inode_bit``/``recently_deleted``) and ~1 s of system time. Elsewhere it is a
    placement hint at most; a filesystem without the flag refuses the ``ioctl`` and nothing changes.
    Returns whether the flag is set.
    """
    import fcntl
    import struct

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, b"\0" * 4))[0]
        if not flags & _FS_TOPDIR_FL:
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags | _FS_TOPDIR_FL))
        return True
    except OSError:  # ENOTTY/EOPNOTSUPP/EINVAL (no such flags here), EPERM: only a hint
        return False
    finally:
        os.close(fd)


class BlobBatch:
    """Publish many small fetched blobs in batches (:func:`~slurm_bt.weights.cache_layout.publish_blob_batch`).

    Why: 10,000 small files published one by one cost an fsync of the file and of two directories
    each (the writer dir and ``blobs/``): journal commits, not bytes, were most of the remote ->
    cluster time (bench/weights_bench.py, small dataset). The download engine writes each verified
    small file to a temp name without fsync (:func:`slurm_bt.weights.download.fetch_small`) and
    queues it here; a flush then makes the whole batch durable with one ``syncfs`` *before* any of
    it is linked under its final name, links them all, and makes the names durable with one fsync
    of ``blobs/`` (the same publish as the node copy's). A blob under its final name therefore
    always has durable, verified bytes; a crash before the ``syncfs`` completes leaves only temp
    files (the writer dir's debris), and a failed ``syncfs`` publishes nothing of the batch.

    Full batches are published by one background thread while downloads keep adding to the next
    batch (a ``syncfs`` waits for every dirty page of the filesystem, which on a busy shared
    filesystem can take a while); ``add`` blocks only when ``4 * max_items`` are waiting, and
    raises the error of a failed background flush. :meth:`flush` publishes the rest and waits.

    The filesystem fd is opened when the batch is made, before any of its files is written: Linux
    reports a write-back error to ``syncfs`` only on descriptors opened before the error happened.
    """

    def __init__(self, blobs: Path, max_items: int) -> None:
        self._blobs = blobs
        self._max = max(1, max_items)
        self._fd = os.open(blobs, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._cond = threading.Condition()
        self._items: list[tuple[Path, ManifestFile]] = []
        self._busy = False  # a flush is running (background or final)
        self._error: BaseException | None = None
        self.published = 0

    def add(self, path: Path, f: ManifestFile) -> None:
        """Queue ``path`` (a verified temp file of ``f.size`` bytes, same filesystem) for ``blobs/<f.sha256>``.

        Raises:
            StorageError: an earlier background flush failed (nothing of that batch was published).
        """
        with self._cond:
            while self._error is None and len(self._items) >= 4 * self._max:
                self._cond.wait()  # back-pressure: the publisher is behind
            if self._error is not None:
                raise self._error
            self._items.append((path, f))
            if len(self._items) >= self._max and not self._busy:
                self._busy = True
                # Not joined: flush() and close() wait on _busy, which the thread clears last.
                threading.Thread(target=self._background, name="bt-blob-batch", daemon=True).start()

    def _background(self) -> None:
        try:
            while True:
                with self._cond:
                    if len(self._items) < self._max or self._error is not None:
                        return
                    items, self._items = self._items, []
                    self._cond.notify_all()
                self._publish(items)
        except BaseException as exc:
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def flush(self) -> None:
        """Publish everything queued and wait for it (see the class doc for the order).

        Raises:
            StorageError: ``syncfs`` failed (nothing of that batch is published), a temp file is
                not a regular file of the expected size, or a link failed.
        """
        with self._cond:
            while self._busy:
                self._cond.wait()
            if self._error is not None:
                raise self._error
            items, self._items = self._items, []
            self._busy = bool(items)
        if items:
            try:
                self._publish(items)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _publish(self, items: list[tuple[Path, ManifestFile]]) -> None:
        named = publish_blob_batch(self._fd, [(str(path), f.sha256, f.size) for path, f in items],
                                   str(self._blobs))
        self.published += len(named)

    def close(self) -> None:
        """Stop: wait for a running background flush, then drop the fd (queued items are left to the
        writer dir's cleanup)."""
        with self._cond:
            self._error = self._error or StorageError(str(self._blobs), "blob batch closed")
            self._cond.notify_all()
            while self._busy:
                self._cond.wait()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


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


def gc_temp(layout: CacheLayout, older_than_s: float, *,
            writer_stale_after_s: float = WRITER_STALE_AFTER_S) -> list[Path]:
    """Remove temp debris of writers that are provably dead; returns what was removed.

    Looked at: every entry of ``.tmp/`` and snapshot temps (``snapshots/.<id>.snap.*@<host>``), whose
    names record host, pid and pid start time (:func:`~slurm_bt.weights.cache_layout.tmp_name`), and
    download temps that writers before writer dirs left in ``blobs/`` (``.<name>.tmp-<pid>-<hex>``).
    Dead (:func:`~slurm_bt.weights.locks.writer_is_dead`): on this host, the pid is gone or now
    another process; on another host, a writer dir's heartbeat is older than
    ``writer_stale_after_s``. Entries that prove nothing (no host in the name, or another host's
    entry without heartbeat) go only when older than ``older_than_s`` (well above the longest
    download). Live writers are never touched.
    """
    removed: list[Path] = []
    now = time.time()
    candidates: list[Path] = []
    for d in (layout.tmp, layout.snapshots, layout.blobs):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for name in os.listdir(d):
                if d == layout.tmp or (d == layout.snapshots and name.startswith(".") and "@" in name) or (
                        d == layout.blobs and _LEGACY_TEMP.match(name)):
                    candidates.append(d / name)
    for p in candidates:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        age = now - st.st_mtime
        parsed = parse_tmp_name(p.name) if p.parent != layout.blobs else None
        if parsed is None:
            dead = age > older_than_s
        else:
            host, pid, start = parsed
            heartbeat = p.name.startswith("writer.")
            dead = writer_is_dead(host, pid, start, st.st_mtime, now=now,
                                  stale_after_s=writer_stale_after_s if heartbeat else older_than_s)
        if not dead:
            continue
        if stat.S_ISDIR(st.st_mode):
            if p.parent == layout.tmp:
                remove_owned_tree(p)
            else:
                with contextlib.suppress(StorageError):
                    remove_tree(layout, p)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)
        if not os.path.lexists(p):
            removed.append(p)
            _log.info("removed %s of a dead writer", p)
    return removed
