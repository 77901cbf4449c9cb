"""The on-disk layout shared by the cluster and node weights caches, and the file primitives both use.

Both tiers look the same (after the Hugging Face cache), so staging to a node is
"copy the missing blobs, relink the snapshot"::

    <root>/
      CACHEDIR.TAG                       tells backup tools to skip the cache
      blobs/<sha256>                     content-addressed files, mode 0444
      snapshots/<manifest_id>/<path...>  hard links to blobs (copies across filesystems), dirs 0555
      manifests/<manifest_id>.json       the pinned Manifest; written LAST = the COMPLETE marker
      .locks/  .tmp/                     lock files; temp files and trash of killed writers
      leases/<manifest_id>/<job_id>      node tier only: jobs using an entry
      jobs/<job_id>/w<i>                 node tier only: per-job links for container binds

Readers trust an entry only if ``manifests/<manifest_id>.json`` exists *and* holds exactly the
manifest's canonical JSON: the file name is the sha256 of its content, so a manifest is
self-verifying and cannot be swapped for another source's. Hard links rather than symlinks make a
bind mount of ``snapshots/<id>`` work inside a container, where the ``../../blobs`` targets of HF's
symlinks would not exist. A snapshot is built under a temp name and renamed into place whole, and
removed by renaming it away first, so a reader never sees a half tree under the final name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import mmap
import os
import secrets
import socket
import stat
import threading
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from slurm_bt.atomic import fsync_dir, publish_dir_atomic, syncfs
from slurm_bt.errors import CacheIntegrityError, StorageError
from slurm_bt.posix.safefs import remove_owned_tree
from slurm_bt.storage.checksums import feed_fd
from slurm_bt.weights.locks import process_start_time
from slurm_bt.weights.manifest import Manifest, ManifestFile

__all__ = [
    "BLOB_MODE",
    "CACHEDIR_TAG",
    "CacheLayout",
    "SmallBlobWriter",
    "build_snapshot",
    "copy_and_hash",
    "copy_only",
    "new_snapshot_tree",
    "open_regular",
    "parse_tmp_name",
    "publish_blob_file",
    "read_small_at",
    "remove_tree",
    "snapshot_is_intact",
    "tmp_name",
]

_log = logging.getLogger("slurm_bt.weights.cache")

BLOB_MODE = 0o444
SNAPSHOT_DIR_MODE = 0o555
CACHEDIR_TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This file is a cache directory tag created by slurm-bt (weights cache).\n"
    b"# For information about cache directory tags see https://bford.info/cachedir/\n"
)
_CHUNK = 64 << 20
_SMALL = 1 << 20


@dataclass(frozen=True)
class CacheLayout:
    """Paths of one cache root; pure apart from :meth:`ensure` and the readers."""

    root: Path
    #: Node tier, credentialed entries: the group of the team allowed to read them. Blobs are then
    #: ``0440 root:<group>`` and snapshot dirs ``0550`` (the same audience as the team's cluster
    #: tier); None = world-readable ``0444``/``0555`` (public sources, cluster tiers).
    group: int | None = None

    @property
    def blob_mode(self) -> int:
        """Mode of published blobs: 0444, or 0440 for a group-restricted tier."""
        return BLOB_MODE if self.group is None else BLOB_MODE & ~0o004

    @property
    def ro_dir_mode(self) -> int:
        """Mode of published snapshot directories: 0555, or 0550 for a group-restricted tier."""
        return SNAPSHOT_DIR_MODE if self.group is None else SNAPSHOT_DIR_MODE & ~0o005

    @property
    def blobs(self) -> Path:
        """``<root>/blobs``."""
        return self.root / "blobs"

    @property
    def manifests(self) -> Path:
        """``<root>/manifests``."""
        return self.root / "manifests"

    @property
    def snapshots(self) -> Path:
        """``<root>/snapshots``."""
        return self.root / "snapshots"

    @property
    def locks(self) -> Path:
        """``<root>/.locks``."""
        return self.root / ".locks"

    @property
    def tmp(self) -> Path:
        """``<root>/.tmp``: temp files and trash; same filesystem as blobs, so renames are atomic."""
        return self.root / ".tmp"

    @property
    def leases(self) -> Path:
        """``<root>/leases`` (node tier)."""
        return self.root / "leases"

    @property
    def jobs(self) -> Path:
        """``<root>/jobs`` (node tier)."""
        return self.root / "jobs"

    def blob(self, sha256: str) -> Path:
        """``blobs/<sha256>``."""
        return self.blobs / sha256

    def manifest_file(self, manifest_id: str) -> Path:
        """``manifests/<manifest_id>.json``."""
        return self.manifests / f"{manifest_id}.json"

    def snapshot(self, manifest_id: str) -> Path:
        """``snapshots/<manifest_id>``."""
        return self.snapshots / manifest_id

    def lock(self, name: str) -> Path:
        """``.locks/<name>.lock``."""
        return self.locks / f"{name}.lock"

    def ensure(self, *, dir_mode: int = 0o755, extra: tuple[str, ...] = ()) -> None:
        """Create the root and its subdirectories, and ``CACHEDIR.TAG``; idempotent.

        Create, don't adopt: an existing entry must be a real
        directory (not a symlink); its mode and owner are left alone, since an admin may have
        provisioned it (e.g. ``3770 root:<team>``).

        Raises:
            StorageError: an entry exists as a symlink or non-directory, or cannot be created.
        """
        for d in (self.root, self.blobs, self.manifests, self.snapshots, self.locks, self.tmp,
                  *(self.root / e for e in extra)):
            _mkdir_checked(d, dir_mode)
        tag = self.root / "CACHEDIR.TAG"
        if not tag.exists():
            try:
                fd = os.open(tag, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            except FileExistsError:
                return
            except OSError as exc:
                raise StorageError(str(tag), f"cannot create: {exc.strerror}") from exc
            try:
                os.write(fd, CACHEDIR_TAG)
                os.fchmod(fd, 0o444)
            finally:
                os.close(fd)

    def read_manifest(self, manifest_id: str) -> Manifest | None:
        """The complete entry's manifest, or None when absent or not self-consistent."""
        try:
            fd = os.open(self.manifest_file(manifest_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            raw = _read_all(fd, limit=256 << 20)
        finally:
            os.close(fd)
        try:
            m = Manifest.model_validate_json(raw)
        except ValidationError:
            _log.warning("ignoring unparsable manifest %s", self.manifest_file(manifest_id))
            return None
        if m.manifest_id != manifest_id:
            _log.warning("ignoring manifest %s: content does not match its name", manifest_id)
            return None
        return m

    def is_complete(self, manifest: Manifest, open_file: Callable[[Path], int] | None = None) -> bool:
        """True when the COMPLETE marker for ``manifest`` exists with exactly its canonical JSON.

        ``open_file``: how to open the marker (a regular file, no symlink), e.g. a
        :class:`~slurm_bt.posix.privdrop.FileOpener` acting as the job user; default: ourselves.
        """
        want = manifest.canonical_json()
        path = self.manifest_file(manifest.manifest_id)
        try:
            if open_file is not None:
                fd = open_file(path)
            else:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return _read_all(fd, limit=len(want) + 1) == want
        finally:
            os.close(fd)

    def manifest_ids(self) -> list[str]:
        """Ids of every COMPLETE marker (not validated; see :meth:`read_manifest`)."""
        try:
            names = os.listdir(self.manifests)
        except FileNotFoundError:
            return []
        return sorted(n[:-5] for n in names if n.endswith(".json") and not n.startswith("."))


def tmp_name(kind: str) -> str:
    """A unique name for a temp entry: ``<kind>.<pid>_<start>.<random>@<host>``.

    Host, pid and the pid's start time (``/proc/<pid>/stat`` field 22) let a garbage collector on
    the same host prove the writer dead at once, even after the pid was reused
    (:func:`slurm_bt.weights.locks.writer_is_dead`); a shared ``.tmp/`` on Lustre is seen by many
    hosts, whose pids mean nothing here, so those wait for the writer's heartbeat to go stale.
    """
    pid = os.getpid()
    return f"{kind}.{pid}_{process_start_time(pid) or 0}.{secrets.token_hex(6)}@{socket.gethostname()}"


def parse_tmp_name(name: str) -> tuple[str, int, int | None] | None:
    """``(host, pid, start time or None)`` from a :func:`tmp_name` (possibly with a prefix), or None.

    Names written before start times were recorded (``<kind>.<pid>.<random>@<host>``) parse with
    ``None``.
    """
    head, sep, host = name.rpartition("@")
    parts = head.split(".")
    if not sep or len(parts) < 3 or not host:
        return None
    pid_text, _, start_text = parts[-2].partition("_")
    try:
        pid = int(pid_text)
        start = int(start_text) if start_text else None
    except ValueError:
        return None
    return host, pid, (start or None)


def _mkdir_checked(path: Path, mode: int) -> None:
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(str(path), f"cannot create directory: {exc.strerror}") from exc
    else:
        os.chmod(path, mode)  # umask-independent; we just created it
        return
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StorageError(str(path), "exists but is not a directory (or is a symlink); refusing to use it")


def _read_all(fd: int, *, limit: int) -> bytes:
    chunks = []
    total = 0
    while total < limit:
        b = os.read(fd, min(1 << 20, limit - total))
        if not b:
            break
        chunks.append(b)
        total += len(b)
    return b"".join(chunks)


def read_small_at(dir_fd: int, name: str, limit: int, where: str) -> bytes:
    """Up to ``limit`` bytes of the regular file ``name`` in the directory ``dir_fd``: the
    per-file read of the node copy's small-blob loop.

    The same checks as :func:`open_regular` (``O_NOFOLLOW|O_NONBLOCK``, ``fstat`` must be
    ``S_ISREG``), resolved relative to a descriptor on the tier's ``blobs/`` opened once (no
    path walk from ``/`` per file), and without clearing ``O_NONBLOCK`` first: Linux ignores it
    for regular files, so that was one ``ioctl`` per file; a filesystem that does honour it
    (``EAGAIN``) gets the descriptor made blocking and the read retried.

    Raises:
        FileNotFoundError: nothing there.
        StorageError: a symlink, FIFO, device or directory, or it cannot be opened.
    """
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise
        raise StorageError(where, f"cannot open: {exc.strerror}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StorageError(where, "is not a regular file; refusing to read it")
        try:
            return os.pread(fd, limit, 0)
        except BlockingIOError:
            os.set_blocking(fd, True)
            return os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def open_regular(path: Path) -> int:
    """Open an existing regular file for reading without following a final symlink or blocking.

    ``O_NONBLOCK`` keeps a FIFO planted at a blob name from hanging a root prolog, and the
    ``fstat`` check refuses anything but a regular file.

    Why not :func:`slurm_bt.posix.user_files.open_user_file` (the walk from ``/``): the cache tiers
    are root-made or the caller's own, so only the last component needs refusing a symlink; that
    walk would also refuse a non-root symlink on the way (an admin's cache path through a service
    account's link) and raise ``UnsafeFile`` instead of ``StorageError`` (docs/architecture.md,
    "The safe-filesystem rules, once").

    Raises:
        FileNotFoundError: nothing there.
        StorageError: a symlink, FIFO, device or directory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise
        raise StorageError(str(path), f"cannot open: {exc.strerror}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StorageError(str(path), "is not a regular file; refusing to read it")
    os.set_blocking(fd, True)
    return fd


def _move(src_fd: int, dst_fd: int, off: int, count: int, use_cfr: list[bool]) -> int:
    """Copy ``count`` bytes at ``off`` in the kernel; returns bytes copied (short only at EOF)."""
    done = 0
    while done < count:
        n = 0
        if use_cfr[0]:
            try:
                n = os.copy_file_range(src_fd, dst_fd, count - done, off + done, off + done)
            except OSError as exc:
                # EXDEV: across filesystems (Lustre → NVMe) on kernels ≥ 5.19; fall back to sendfile.
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                use_cfr[0] = False
                continue
        else:
            os.lseek(dst_fd, off + done, os.SEEK_SET)
            n = os.sendfile(dst_fd, src_fd, off + done, count - done)
        if n == 0:
            break
        done += n
    return done


_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


# Looked up once: a ctypes.CDLL per call cost more than the call itself on small chunks.
_SYNC_FILE_RANGE = _load_sync_file_range()


def _start_writeback(fd: int, off: int, count: int) -> None:
    """``sync_file_range(SYNC_FILE_RANGE_WRITE)``: start writeback now so the final fsync is short."""
    if _SYNC_FILE_RANGE is not None and count > 0:
        _SYNC_FILE_RANGE(fd, off, count, _SYNC_FILE_RANGE_WRITE)  # an optimisation only: errors ignored


_HASH_READ = 1 << 20
_hash_buffers = threading.local()


def _hash_range(h: hashlib._Hash, fd: int, off: int, count: int) -> None:
    """Feed ``count`` bytes of ``fd`` at ``off`` to ``h``, then start their writeback.

    ``preadv`` into this thread's reused 1 MiB buffer, which stays in the CPU cache for the sha256
    that follows. Why not ``mmap`` (as before): faulting in 64 MiB windows cost more than the copy it
    saved; a node copy of an 8 GiB blob from a cold team tier took 16.8-24.1 s with ``mmap`` and
    13.8-15.4 s this way, against 13.3-14.2 s for the copy alone (docs/weights-cache.md §3.3).
    """
    if count == 0:
        return
    buf: bytearray | None = getattr(_hash_buffers, "buf", None)
    if buf is None:
        buf = _hash_buffers.buf = bytearray(_HASH_READ)
    feed_fd(h, fd, memoryview(buf), off, count)  # short file: the digest covers what is there, and mismatches
    _start_writeback(fd, off, count)


def copy_and_hash(src_fd: int, dst_fd: int, size: int, *, chunk_bytes: int = _CHUNK,
                  progress: Callable[[int], None] | None = None, start: int = 0,
                  hasher: hashlib._Hash | None = None) -> tuple[str, int]:
    """Copy ``size`` bytes from ``src_fd`` to ``dst_fd`` and return the sha256 of what was *written*.

    Data moves in the kernel (``copy_file_range``, else ``sendfile``); each chunk is then hashed
    from the destination's page cache (``preadv``, :func:`_hash_range`) in a second thread while the next chunk is
    copied, so the copy costs about max(copy, hash) instead of their sum. Hashing the destination
    rather than the source matters: the source may be in a tenant-writable cluster tier whose owner
    can rewrite the bytes between our read and our copy, but nobody else can touch our fresh
    root-owned temp file. Small files take a single read/hash/write pass (less overhead).

    ``progress(n)`` is called after each chunk with its byte count (the node stager's progress,
    rate cap and cancellation, slurm_bt/weights/node_stager.py); an exception it raises stops the copy.
    ``start``/``hasher``: resume after ``start`` bytes already in ``dst_fd``, hashed into ``hasher``
    (:func:`hash_prefix`).

    Returns:
        (sha256 hex, bytes copied); fewer bytes than ``size`` means the source was short.
    """
    if size <= _SMALL and not start:
        data = os.pread(src_fd, size, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(dst_fd, view):]
        if progress is not None:
            progress(len(data))
        return hashlib.sha256(data).hexdigest(), len(data)
    chunk_bytes = max(mmap.ALLOCATIONGRANULARITY, chunk_bytes - chunk_bytes % mmap.ALLOCATIONGRANULARITY)
    h = hasher if hasher is not None else hashlib.sha256()
    use_cfr = [True]
    off = start
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="hash") as pool:
        pending: Future[None] | None = None
        while off < size:
            want = min(chunk_bytes, size - off)
            got = _move(src_fd, dst_fd, off, want, use_cfr)
            # Start writeback as copy_only does: without it a multi-GiB file piles up dirty pages
            # until the kernel throttles the writer (a 4 GiB copy ran 4x slower than copy_only).
            # Pages under writeback stay readable in the page cache for the hash.
            _start_writeback(dst_fd, off, got)
            if pending is not None:
                pending.result()
            pending = pool.submit(_hash_range, h, dst_fd, off, got)
            off += got
            if progress is not None:
                progress(got)
            if got < want:
                break
        if pending is not None:
            pending.result()
    return h.hexdigest(), off


def hash_prefix(fd: int, count: int, *, chunk_bytes: int = _CHUNK) -> hashlib._Hash:
    """A sha256 of the first ``count`` bytes of ``fd`` (a resumed copy's prefix, read back from disk)."""
    h = hashlib.sha256()
    chunk_bytes = max(mmap.ALLOCATIONGRANULARITY, chunk_bytes - chunk_bytes % mmap.ALLOCATIONGRANULARITY)
    off = 0
    while off < count:
        n = min(chunk_bytes, count - off)
        _hash_range(h, fd, off, n)
        off += n
    return h


def copy_only(src_fd: int, dst_fd: int, size: int, *, chunk_bytes: int = _CHUNK,
              progress: Callable[[int], None] | None = None, start: int = 0) -> int:
    """Copy ``size`` bytes in the kernel without hashing; returns bytes copied.

    Only for sources the caller trusts to hold exactly the pinned bytes (the root-owned shared
    tier, verified when it was published): this is what lets a node-tier copy run at ``cp`` speed.
    """
    use_cfr = [True]
    off = start
    while off < size:
        want = min(chunk_bytes, size - off)
        got = _move(src_fd, dst_fd, off, want, use_cfr)
        _start_writeback(dst_fd, off, got)
        off += got
        if progress is not None:
            progress(got)
        if got < want:
            break
    return off


def publish_blob_file(tmp: Path, fd: int, final: Path, f: ManifestFile, actual_sha: str, actual_size: int, *,
                      group: int | None = None) -> bool:
    """Verify, seal (0444, fsync) and rename a written temp blob into place; the temp is gone after.

    With ``group`` (a credentialed node-tier entry) the blob is sealed ``0440`` with that group
    instead, so only the team that may read the source can read the bytes.

    An existing blob at ``final`` is kept (content addressing: same name, same bytes), so the
    temp is dropped. Returns True when this call published the blob. The name is made with
    ``link(2)``, which refuses an existing name atomically (an ``lexists`` check before a
    ``rename`` left a window in which a concurrent writer's blob was replaced by another inode,
    detaching it from the snapshots already linked to it); a filesystem without hard links falls
    back to that check and ``rename``.

    Raises:
        CacheIntegrityError: hash or size differ from the manifest (the temp is removed).
        StorageError: the flush or rename failed (the temp is removed).
    """
    try:
        if actual_size != f.size or actual_sha != f.sha256:
            raise CacheIntegrityError(str(final), f.sha256, actual_sha, f.size, actual_size)
        if group is not None:
            os.fchown(fd, -1, group)
        os.fchmod(fd, BLOB_MODE if group is None else BLOB_MODE & ~0o004)  # after chown (clears bits)
        os.fsync(fd)
        if not _link_noreplace(tmp, final):
            return False
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, StorageError):
            raise
        raise StorageError(str(final), f"cannot publish blob: {exc.strerror}") from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # the link is the blob now; the temp name goes either way
    fsync_dir(final.parent)
    return True


#: ``link(2)`` errors meaning "no hard link here" (a few FUSE mounts, filesystems without them, a full
#: link count), where the callers fall back to another way of naming the file.
_NO_HARD_LINK = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK)


def _link_noreplace(tmp: Path | str, final: Path | str) -> bool:
    """Give the file at ``tmp`` the name ``final`` unless that exists; True when this call named it.

    ``tmp`` is left in place (the caller unlinks it). Hard links are refused by some filesystems
    (``EPERM`` on a few FUSE mounts, ``ENOTSUP``/``EOPNOTSUPP``); there an existence check and
    ``rename`` do it (``rename`` moves ``tmp`` away, which the caller's unlink tolerates).
    """
    try:
        os.link(tmp, final)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINK:
            raise
    if os.path.lexists(final):
        return False
    os.rename(tmp, final)
    return True


def publish_blob_batch(sync_fd: int, temps: list[tuple[str, str, int]], blobs: str,
                       published: list[str] | None = None) -> list[str]:
    """Name a batch of written, verified temp blobs ``blobs/<sha256>`` with one ``syncfs`` and one dir fsync.

    The one batch publish of both tiers (the node copy's :class:`SmallBlobWriter`, the download
    engine's :class:`slurm_bt.weights.cluster_cache.BlobBatch`). Order: ``syncfs(sync_fd)`` first,
    so no final name can point at bytes still in the page cache (a failed ``syncfs`` publishes
    nothing); then each temp, checked to be a regular file of its expected size (a temp swapped
    after it was written is refused), is linked to its name without replacing one (content
    addressing: an existing blob is the same bytes); last one fsync of ``blobs/`` makes the names
    durable before a snapshot or COMPLETE marker may list them. Every temp of the batch is gone
    afterwards, published or not.

    Args:
        sync_fd: a descriptor on the temps' filesystem opened *before* they were written (Linux
            reports a write-back error to ``syncfs`` only on descriptors opened before it happened).
        temps: ``(temp path, sha256, size)`` per blob, on the same filesystem as ``blobs``.
        published: the list the sha256 of each blob this call names is appended to as it is
            named (so a caller that rolls back after an error knows what was published).

    Returns:
        ``published`` (a new list when not given).

    Raises:
        StorageError: ``syncfs`` failed, a temp is not what was written, or a link failed (blobs
            linked before it stay: their bytes are durable and verified).
    """
    published = [] if published is None else published
    if not temps:
        return published
    named = len(published)
    try:
        syncfs(sync_fd)
        for path, sha, size in temps:
            try:
                st = os.lstat(path)
            except OSError as exc:
                raise StorageError(path, f"temp blob vanished before publish: {exc.strerror}") from exc
            if not stat.S_ISREG(st.st_mode) or st.st_size != size:
                raise StorageError(path, f"temp blob is not the {size} bytes written for {sha}")
            final = os.path.join(blobs, sha)
            try:
                if _link_noreplace(path, final):
                    published.append(sha)
            except OSError as exc:
                raise StorageError(final, f"cannot publish blob: {exc.strerror}") from exc
    finally:
        for path, _sha, _size in temps:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if len(published) > named:
            fsync_dir(Path(blobs))
    return published


class SmallBlobWriter:
    """Publish a batch of small blobs with one ``syncfs`` and one directory fsync, not two fsyncs each.

    Why: 10,000 small blobs published one by one cost an fsync of each file and of ``blobs/``:
    journal commits, not bytes, were most of a node copy (bench/weights_bench.py, section ``node``,
    small dataset: 6.6 s against 0.83 s for ``cp -a``). Here each blob is verified and written
    without a flush (:meth:`add`); :meth:`publish` then makes the whole batch durable with ONE
    ``syncfs`` of the cache's filesystem *before* any of it gets its final name, links every file
    to ``blobs/<sha256>`` and makes the names durable with one fsync of ``blobs/``. So the
    invariant of the per-blob path still holds: a blob under its final name has verified, durable
    bytes. A crash before ``publish`` leaves only temp names (``tmp_name`` names, so
    :func:`slurm_bt.weights.cluster_cache.gc_temp` removes them as a dead writer's); a failed
    ``syncfs`` publishes nothing of the batch; a blob whose bytes do not hash to its name is refused
    in :meth:`add` before anything of it is written.

    Where the bytes are written first:

    * ``tree`` given (the node copy of an entry whose snapshot is not built yet): straight into
      the entry's snapshot temp tree (:func:`new_snapshot_tree`), at the file's manifest path, and
      that very inode is then linked to ``blobs/<sha256>``. The snapshot needs both names anyway,
      so a small file costs one create (as in ``cp -a``) and one link, instead of a create in
      ``.tmp/``, a link to ``blobs/``, an unlink of the temp and a link into the snapshot:
      directory updates in the journal, not bytes, bound a copy of thousands of 4 KiB files
      (docs/weights-cache.md §3.3). The tree has a ``tmp_name`` too and nobody trusts it
      until :func:`build_snapshot` renames it into place and the COMPLETE marker follows.
      :attr:`placed` lists the manifest paths whose tree file is its blob (so the snapshot build
      skips them). If the blob is already under its name (another entry's stage published the same
      bytes meanwhile), the tree file is replaced by a link to that blob: one inode per blob, the
      space counted once.
    * ``tree`` None: a temp ``.tmp/<n>-sblob.<...>`` that is linked to ``blobs/<sha256>`` and
      unlinked (used when the snapshot already exists, and by tests of the unit).

    ``syncfs`` flushes every dirty page of the filesystem, other writers' too, so it only pays
    when a batch has many blobs (the node cache uses it from 16 small blobs on) and the node cache
    writes its small blobs before its big ones. The directory fd used for ``syncfs`` is opened
    before any file is written: Linux reports a write-back error only to descriptors opened before
    it happened. One writer, one thread (the node cache's small blobs are done in a tight loop:
    a thread pool costs more than a 4 KiB copy). Names are resolved against directory descriptors
    opened once (``blobs/``, ``.tmp/`` and the tree's root), not full paths from ``/``.
    """

    def __init__(self, layout: CacheLayout, *, tree: Path | None = None) -> None:
        self.layout = layout
        #: Blobs (sha256) this writer gave their final name; the caller rolls them back on failure.
        self.published: list[str] = []
        #: Manifest paths whose file in ``tree`` is the published blob itself (hard link).
        self.placed: list[str] = []
        self._tmp_dir = os.fspath(layout.tmp)
        self._blobs = os.fspath(layout.blobs)
        self._base = tmp_name("sblob")  # one /proc read per batch; "<n>-" makes each name unique
        self._mode = layout.blob_mode
        # The mode given to open() is masked by the umask; fchmod only when that would change it.
        self._fchmod = layout.group is not None or bool(_current_umask() & self._mode)
        self._tree = None if tree is None else os.fspath(tree)
        #: ``(dir fd, name relative to it, sha256, size, manifest path)`` of each file written, not
        #: yet published.
        self._temps: list[tuple[int, str, str, int, str]] = []
        self._made = {""}  # tree directories known to exist
        self._blobs_fd = self._tmp_fd = self._tree_fd = -1
        self._fd = os.open(layout.tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._blobs_fd = _open_dir(self._blobs)
            if self._tree is None:
                self._tmp_fd = self._fd
            else:
                self._tree_fd = _open_dir(self._tree)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> SmallBlobWriter:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        """Blobs written and not yet published."""
        return len(self._temps)

    def _dir(self, path: str) -> tuple[int, str]:
        """``(directory fd, name relative to it)`` where the file of manifest path ``path`` is written."""
        if self._tree is None:
            return self._tmp_fd, f"{len(self._temps)}-{self._base}"
        parent = path.rpartition("/")[0]
        if parent not in self._made:
            # Manifest paths are relative with no empty, "." or ".." part (ManifestFile), and the
            # tree is root's fresh directory (nobody else can plant a link in it), so the name
            # stays inside it.
            os.makedirs(f"{self._tree}/{parent}", 0o755, exist_ok=True)
            self._made.add(parent)
        return self._tree_fd, path

    def add(self, f: ManifestFile, data: bytes, *, verify: bool = True) -> None:
        """Write ``data`` as blob ``f`` (no flush), after checking it is ``f``'s content.

        The hash is of ``data``, the very buffer that is written, so a source rewritten after it
        was read cannot slip other bytes in. ``verify`` False (a trusted tier, ``copy_only``'s
        policy) checks the size only. With a ``tree`` the file is written at ``f.path`` in it.

        Raises:
            CacheIntegrityError: size or sha256 differ from ``f`` (nothing written).
            OSError: the file could not be written (ENOSPC included); its name is removed by
                :meth:`close`.
        """
        actual = hashlib.sha256(data).hexdigest() if verify else f.sha256
        if len(data) != f.size or actual != f.sha256:
            raise CacheIntegrityError(os.path.join(self._blobs, f.sha256), f.sha256, actual, f.size, len(data))
        dir_fd, name = self._dir(f.path)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, self._mode,
                     dir_fd=dir_fd)
        self._temps.append((dir_fd, name, f.sha256, f.size, f.path))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.layout.group is not None:
                os.fchown(fd, -1, self.layout.group)
            if self._fchmod:
                os.fchmod(fd, self._mode)  # after chown (which may clear bits)
        finally:
            os.close(fd)

    def publish(self) -> list[str]:
        """Flush the batch (one ``syncfs``), name every blob, flush ``blobs/``; returns the new blobs.

        Blobs already under their name are kept (same name, same bytes). Without a ``tree`` every
        temp is gone after; with one, the files stay in the tree (they are the snapshot's) and a
        file that could not be named is removed.

        Raises:
            StorageError: ``syncfs`` failed (nothing of the batch is published) or a link failed
                (those linked before stay: their bytes are durable and verified).
        """
        temps, self._temps = self._temps, []
        if not temps:
            return self.published
        named = len(self.published)
        done = 0
        try:
            syncfs(self._fd)
            for dir_fd, name, sha, size, path in temps:
                self._name_one(dir_fd, name, sha, size, path)
                done += 1
        finally:
            for dir_fd, name, _sha, _size, _path in (temps if self._tree is None else temps[done:]):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
            if len(self.published) > named:
                _fsync_dir_fd(self._blobs_fd, self._blobs)
        return self.published

    def _name_one(self, dir_fd: int, name: str, sha: str, size: int, path: str) -> None:
        """Give the written file ``name`` (in ``dir_fd``) the name ``blobs/<sha>`` unless it exists."""
        where = f"{self._tree or self._tmp_dir}/{name}"
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError as exc:
            raise StorageError(where, f"temp blob vanished before publish: {exc.strerror}") from exc
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:  # swapped after it was written
            raise StorageError(where, f"temp blob is not the {size} bytes written for {sha}")
        try:
            # follow_symlinks=False: linkat without AT_SYMLINK_FOLLOW, as link(2) behaves
            os.link(name, sha, src_dir_fd=dir_fd, dst_dir_fd=self._blobs_fd, follow_symlinks=False)
        except FileExistsError:
            if self._tree is not None:
                self._share_existing(dir_fd, name, sha, path)
            return
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINK:
                raise StorageError(f"{self._blobs}/{sha}", f"cannot publish blob: {exc.strerror}") from exc
            # No hard links here: the file is renamed to its blob name (the snapshot build copies
            # it back into the tree), unless the name exists (same bytes) and it is dropped.
            try:
                renamed = _link_noreplace(where, f"{self._blobs}/{sha}")
            except OSError as exc2:
                raise StorageError(f"{self._blobs}/{sha}", f"cannot publish blob: {exc2.strerror}") from exc2
            if not renamed:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)
                return
            self.published.append(sha)
            return
        self.published.append(sha)
        if self._tree is not None:
            self.placed.append(path)

    def _share_existing(self, dir_fd: int, name: str, sha: str, path: str) -> None:
        """The blob was published meanwhile (same bytes): the tree file becomes a link to it, so the
        snapshot and ``blobs/`` share one inode; if that fails the snapshot build links it."""
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
            os.link(sha, name, src_dir_fd=self._blobs_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            self.placed.append(path)

    def close(self) -> None:
        """Remove the files not published and drop the directory fds; idempotent."""
        for dir_fd, name, _sha, _size, _path in self._temps:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
        self._temps = []
        for fd in (self._tree_fd, self._blobs_fd, self._fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._blobs_fd = self._tmp_fd = self._tree_fd = -1


def _open_dir(path: str | Path) -> int:
    """An ``O_DIRECTORY|O_NOFOLLOW`` descriptor on ``path``, for names resolved relative to it."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _fsync_dir_fd(fd: int, where: str) -> None:
    """fsync an open directory (as :func:`slurm_bt.atomic.fsync_dir`: EINVAL/ENOTSUP ignored)."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise StorageError(where, f"cannot fsync directory: {exc.strerror}") from exc


def _current_umask() -> int:
    """The process umask, read from ``/proc/self/status`` (``os.umask`` can only be read by setting it,
    which would race with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", "rb") as fh:
        for line in fh:
            if line.startswith(b"Umask:"):
                return int(line.split()[1], 8)
    return 0o777  # unknown: assume the worst, so fchmod always runs


def _link_or_copy_at(blobs_fd: int, sha: str, dir_fd: int, name: str, layout: CacheLayout) -> None:
    """Hard-link ``blobs/<sha>`` at ``name`` (relative to ``dir_fd``), else (another filesystem, no
    hard links) copy it.

    A copy is fsynced here; a link needs only its directory flushed, which the caller does.

    Raises:
        FileNotFoundError: the blob is missing.
    """
    try:
        # follow_symlinks=False: linkat without AT_SYMLINK_FOLLOW, as link(2) behaves
        os.link(sha, name, src_dir_fd=blobs_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, *_NO_HARD_LINK):
            raise
    try:
        src_fd = os.open(sha, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=blobs_fd)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise
        raise StorageError(f"{layout.blobs}/{sha}", f"cannot open: {exc.strerror}") from exc
    try:
        st = os.fstat(src_fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError(f"{layout.blobs}/{sha}", "is not a regular file; refusing to read it")
        os.set_blocking(src_fd, True)
        dst_fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
        try:
            copy_and_hash(src_fd, dst_fd, st.st_size)
            if layout.group is not None:
                os.fchown(dst_fd, -1, layout.group)
            os.fchmod(dst_fd, layout.blob_mode)
            os.fsync(dst_fd)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


#: A snapshot with more directories than this is made durable with one ``syncfs`` instead of an
#: fsync per directory (each one a journal commit; see :class:`SmallBlobWriter` for the trade-off).
_SYNCFS_MIN_DIRS = 16


def snapshot_is_intact(layout: CacheLayout, manifest: Manifest) -> bool:
    """Cheap check (``lstat`` per file, no hashing) that a published snapshot has every file at its size."""
    snap = layout.snapshot(manifest.manifest_id)
    for f in manifest.files:
        try:
            st = os.lstat(snap / f.path)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != f.size:
            return False
    return True


def new_snapshot_tree(layout: CacheLayout, manifest_id: str) -> Path:
    """A fresh empty directory beside ``snapshots/<manifest_id>`` to build that snapshot in.

    Named ``.<manifest_id>.<tmp_name>`` (host, pid and start time), so
    :func:`slurm_bt.weights.cluster_cache.gc_temp` removes the tree of a writer that died.

    Raises:
        OSError: it cannot be made.
    """
    tree = layout.snapshot(manifest_id).with_name(f".{manifest_id}.{tmp_name('snap')}")
    os.mkdir(tree, 0o755)
    return tree


def build_snapshot(layout: CacheLayout, manifest: Manifest, *, tree: Path | None = None,
                   placed: Collection[str] = ()) -> Path:
    """Publish ``snapshots/<manifest_id>`` from blobs (hard links, else copies); idempotent.

    The tree is built under a temp name beside its final name, every directory is made 0555 and
    fsynced (one ``syncfs`` for all of them from ``_SYNCFS_MIN_DIRS`` directories on: a vocabulary
    split over hundreds of folders cost a journal commit per folder), then it is renamed into place
    whole. If a snapshot is already there and intact it is
    kept; a damaged one (e.g. an eviction killed half-way) is moved to trash and rebuilt.

    Args:
        tree: a temp tree from :func:`new_snapshot_tree` the caller already filled in part (the
            node copy writes small blobs straight into it, :class:`SmallBlobWriter`); it is used
            instead of a new one and removed on failure.
        placed: manifest paths whose file in ``tree`` already is its blob (a hard link), skipped.

    Raises:
        StorageError: a blob is missing or a link/copy failed.
    """
    mid = manifest.manifest_id
    final = layout.snapshot(mid)
    if final.exists():
        if snapshot_is_intact(layout, manifest):
            if tree is not None:
                remove_tree(layout, tree)
            return final
        remove_tree(layout, final)
    tmp = tree
    try:
        if tmp is None:
            tmp = new_snapshot_tree(layout, mid)
        _link_tree(layout, manifest, os.fspath(tmp), frozenset(placed))
        try:
            publish_dir_atomic(tmp, final)
        except StorageError:
            if final.exists() and snapshot_is_intact(layout, manifest):  # a concurrent builder won
                remove_tree(layout, tmp)
                return final
            raise
    except OSError as exc:
        if tmp is not None and tmp.exists():
            remove_tree(layout, tmp)
        if isinstance(exc, StorageError):
            raise
        raise StorageError(str(final), f"cannot build snapshot: {exc.strerror}") from exc
    return final


def _link_tree(layout: CacheLayout, manifest: Manifest, root: str, placed: frozenset[str]) -> None:
    """Link every file of ``manifest`` not in ``placed`` into the temp tree ``root``, then seal its
    directories (group, read-only mode) and flush them.

    Plain strings, not Path objects: at 10,000 files pathlib's parsing was half of the build. Links
    are made relative to descriptors on ``blobs/`` and on the tree (``linkat``), so each costs the
    walk of the manifest path only. Manifest paths are relative with no empty, "." or ".." part
    (ManifestFile), and the tree is root's fresh directory, so every name stays inside it.
    """
    mid = manifest.manifest_id
    blobs = os.fspath(layout.blobs)
    dirs = {root}
    blobs_fd = _open_dir(blobs)
    try:
        root_fd = _open_dir(root)
        try:
            for f in manifest.files:
                dst = f"{root}/{f.path}"
                parent = os.path.dirname(dst)
                if parent not in dirs:
                    os.makedirs(parent, exist_ok=True)
                    while parent not in dirs:
                        dirs.add(parent)
                        parent = os.path.dirname(parent)
                if f.path in placed:
                    continue
                try:  # no exists() first: link(2) says ENOENT itself (one syscall per file, not two)
                    _link_or_copy_at(blobs_fd, f.sha256, root_fd, f.path, layout)
                except FileNotFoundError as exc:
                    raise StorageError(f"{blobs}/{f.sha256}",
                                       f"blob for {f.path} is missing; cannot build snapshot {mid}") from exc
        finally:
            os.close(root_fd)
    finally:
        os.close(blobs_fd)
    batched = len(dirs) >= _SYNCFS_MIN_DIRS
    for d in sorted(dirs, key=lambda p: p.count("/"), reverse=True):
        if not batched:
            fsync_dir(Path(d))
        if layout.group is not None:
            os.chown(d, -1, layout.group)
        os.chmod(d, layout.ro_dir_mode)
    if batched:
        fd = _open_dir(root)
        try:
            syncfs(fd)  # every new entry and mode at once, before the tree gets its name
        finally:
            os.close(fd)


def remove_tree(layout: CacheLayout, path: Path) -> None:
    """Remove a cache tree so no reader ever sees it half-deleted under its name.

    The tree is first renamed into ``.tmp/`` (atomic), then deleted there by
    :func:`slurm_bt.posix.safefs.remove_owned_tree` (read-only (0555) directories made writable on
    the way, fd-relative, never following a symlink). Missing paths are fine (idempotent).
    """
    trash = layout.tmp / tmp_name("trash")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    except PermissionError as exc:
        # Moving a directory to another parent rewrites its ".." entry, so Linux wants write
        # permission on the directory itself: a sealed (0555) snapshot moves only for root. Its
        # owner may add u+w first (through a descriptor opened without following a link; callers
        # have already withdrawn the entry's manifest, so no reader trusts the tree any more).
        if not _make_owner_writable(path):
            raise StorageError(str(path), f"cannot move to trash: {exc.strerror}") from exc
        try:
            os.rename(path, trash)
        except OSError as exc2:
            raise StorageError(str(path), f"cannot move to trash: {exc2.strerror}") from exc2
    except OSError as exc:
        raise StorageError(str(path), f"cannot move to trash: {exc.strerror}") from exc
    remove_owned_tree(trash)


def _make_owner_writable(path: Path) -> bool:
    """Add u+w to the directory ``path`` if the caller owns it (never through a symlink); done?"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            return False
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
