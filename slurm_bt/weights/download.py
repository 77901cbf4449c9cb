"""Verified, resumable, parallel downloads into a content-addressed directory.

Publish protocol for every file:

1. Create a process-unique temp file beside the final name (:func:`slurm_bt.atomic.temp_name`,
   ``O_CREAT|O_EXCL|O_NOFOLLOW``) and preallocate it to the expected size.
2. Fetch byte ranges in parallel (``part_size``, default 16 MiB, as S3 guidance and the fastest
   clients do; bench/ compares them) and ``pwrite`` each chunk at its offset: no reassembly, no
   large buffers, one pool of kept-alive connections.
3. Hash *behind* the writers: whichever worker completes the next part in file order takes the
   hash cursor and feeds the contiguous prefix to sha256 by ``pread`` from the page cache.
   hashlib and ``pread`` release the GIL, so hashing overlaps the network on another core and
   ends moments after the last byte (no second pass over a cold file).
4. ``fsync`` the temp file, compare size and sha256 with the manifest; on mismatch delete it and
   raise :class:`~slurm_bt.errors.IntegrityError` with both hashes. Nothing is ever published
   unverified, and a partial file is never visible under a final name. A file without a known
   sha256 (HF non-LFS, most object-store objects) is named by the sha256 computed here, and the
   same cursor also computes one checksum the origin published for it (git blob sha1, CRC32C,
   CRC32 or MD5: :func:`slurm_bt.storage.checksums.pick_check`), which must match: a body
   corrupted in transit or at the origin is refused, not published under its own hash.
5. ``rename`` to ``dest_dir/<sha256>`` and ``fsync`` the directory.

Resume design: every part keeps its own cursor. A transient failure (reset, short body, read
timeout, 5xx) re-requests ``Range: bytes=<cursor>-<end>`` after full-jitter backoff, pinned to the
resolved version (HF: commit in the URL; S3/R2: ``If-Match`` ETag; GCS: ``generation``), so bytes
already written are never fetched again and two versions are never mixed. Retries are bounded per
part (``max_retries`` consecutive failures without progress, ``4 * max_retries`` in total). If the
origin ignores ``Range`` (200 with the whole body), the file falls back to one stream and restarts
from byte 0, overwriting in place, so no byte is duplicated. Across processes nothing is resumed:
a killed stager leaves only its ``.<name>.tmp-<pid>-<hex>`` file, which
:func:`remove_stale_temps` deletes once its owner is gone, and a rerun starts a fresh temp file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from slurm_bt.atomic import fsync_dir, temp_basename, temp_name
from slurm_bt.errors import SourceError, SourceIntegrityError, SourceUnavailableError, StorageError
from slurm_bt.storage.base import Backend, RemoteFile, TransportOptions, backoff_delay_s
from slurm_bt.storage.checksums import Hasher, OriginChecksum, feed_fd, new_hasher, pick_check
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.registry import open_backend
from slurm_bt.storage.url import StorageUrl, parse_source_uri
from slurm_bt.weights.cache_layout import _start_writeback
from slurm_bt.weights.manifest import Manifest, ManifestFile

__all__ = [
    "DownloadOptions",
    "FetchResult",
    "download_file",
    "download_manifest",
    "each_in_threads",
    "each_streamed",
    "fetch_file",
    "fetch_small",
    "hash_remote_file",
    "open_manifest_source",
    "release_thread_buffers",
    "remove_stale_temps",
]

MiB = 1024 * 1024
_T = TypeVar("_T")
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_TEMP_RE = re.compile(r"^\..+\.tmp-(\d+)-[0-9a-f]+$")


@dataclass(frozen=True)
class DownloadOptions:
    """Throughput and robustness knobs.

    Attributes:
        part_size: bytes per ranged GET; 16 MiB balances request overhead and parallelism.
        parallel_threshold: files at least this large are split into parts.
        max_workers: concurrent range requests in total (over all files).
        max_files: files transferred concurrently (each may use several workers).
        read_size: bytes per ``read``/``pwrite``; large reads keep Python overhead small.
        max_retries: consecutive failed attempts without progress before a part gives up.
        backoff_base_s: first backoff delay (full jitter, doubling, capped at ``backoff_cap_s``).
        backoff_cap_s: longest backoff delay.
        file_mode: permission bits of published blobs (read-only: they are content-addressed).
        transport: timeouts and pool size passed to the backend.
        small_file_max: files up to this size may take :func:`fetch_small` (one GET into memory,
            verified there, published in batches by the caller).
        max_small_files: such small files in flight at once, where the caller runs them on their
            own threads (the staging job does; bigger files stay bounded by ``max_files``). Why
            more: a small file is one request, so against a store a round trip away this many
            round trips in flight is the rate: behind a 20 ms proxy on the bench VM 10,000 small
            objects took 17 s with 16 and 8-9 s with 64 (s5cmd, 256 workers: 8-10 s); on
            loopback 64 cost ~5% more than 16 (bench/README.md).
    """

    part_size: int = 16 * MiB
    parallel_threshold: int = 32 * MiB
    max_workers: int = 8
    max_files: int = 4
    read_size: int = 1 * MiB
    max_retries: int = 5
    backoff_base_s: float = 0.2
    backoff_cap_s: float = 5.0
    file_mode: int = 0o444
    transport: TransportOptions = field(default_factory=TransportOptions)
    small_file_max: int = 1 * MiB
    max_small_files: int = 64


@dataclass(frozen=True)
class FetchResult:
    """A published (or hashed) file: its verified sha256 and where it now lives."""

    sha256: str
    size: int
    path: Path | None


# Chunks at least this large feed the origin-checksum hasher on another thread while sha256 runs
# here (hashlib and zlib release the GIL): an MD5 beside sha256 then costs wall time max(), not sum().
_SIDE_PARALLEL_MIN = 1 * MiB
_side_pool: ThreadPoolExecutor | None = None
_side_lock = threading.Lock()


def _side_executor() -> ThreadPoolExecutor:
    global _side_pool
    with _side_lock:
        if _side_pool is None:
            # One side hash per file being hashed at a time; tasks never wait on anything, so a full
            # pool only delays them (no deadlock), and more workers than cores would not help.
            _side_pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="bt-sidehash")
        return _side_pool


def _side_update(side: Hasher, chunk: bytes | memoryview) -> None:
    try:
        side.update(chunk)
    except TypeError:  # google-crc32c's C extension takes bytes only (the check runs before any state change)
        side.update(bytes(chunk))


def _feed(sha: Any, side: Hasher | None, chunk: bytes | memoryview) -> None:
    """Feed ``chunk`` to the sha256 and to the origin-checksum hasher (if any), in parallel when big."""
    if side is None:
        sha.update(chunk)
    elif len(chunk) >= _SIDE_PARALLEL_MIN:
        fut = _side_executor().submit(_side_update, side, chunk)
        sha.update(chunk)
        fut.result()
    else:
        sha.update(chunk)
        _side_update(side, chunk)


def _check_origin(source: Backend, file: RemoteFile, check: OriginChecksum, got: str, *, published: bool,
                  reread: Callable[[OriginChecksum], str] | None = None) -> None:
    """Raise IntegrityError unless ``got`` is the origin's ``check`` (or the check turns out not to apply).

    An S3/R2 ETag may look like an MD5 without being one (SSE-KMS, SSE-C): only after a mismatch is
    the source asked (one HEAD); a source that cannot answer counts as "it is an MD5" (fail closed).
    A per-part value computed over an *assumed* part layout (equal parts but the last) is recomputed
    by ``reread`` over the real one (one HEAD per part) before the file is refused: an uploader that
    cut unequal parts must not look like corruption.
    """
    if got == check.value:
        return
    if check.maybe_not_content_hash:  # one HEAD, before the layout's one per part
        confirm = getattr(source, "etag_is_md5", None)
        if confirm is not None and not confirm(file):
            return
    if check.layout_assumed and reread is not None:
        exact_check = getattr(source, "exact_check", None)
        exact = exact_check(file, check) if exact_check is not None else None
        if exact is not None:
            _check_origin(source, file, dataclasses.replace(exact, maybe_not_content_hash=False), reread(exact),
                          published=published)
            return
    raise SourceIntegrityError(
        source.uri.canonical,
        f"{'per-part ' if check.per_part else ''}{check.kind} of the received bytes does not match the origin's "
        f"{check.label} (corrupted in "
        f"transit or at the origin){'; not published' if published else ''}",
        file=file.path, expected=check.value, actual=got)


_HASH_CHUNK = 4 * MiB
_buffers = threading.local()


def _thread_buffer(size: int, *, hashing: bool = False) -> memoryview:
    """This thread's reusable buffer of at least ``size`` bytes (one for reads, one for hashing).

    Why: a fresh ``bytes`` per 1 MiB read or 8 MiB ``pread`` is an ``mmap``, its page faults and a
    ``munmap`` each time (glibc serves such sizes from ``mmap``); with a reused buffer the bytes are
    copied once by the kernel (``readinto``/``preadv``) and never again.
    """
    name = "hash" if hashing else "read"
    buf: bytearray | None = getattr(_buffers, name, None)
    if buf is None or len(buf) < size:
        buf = bytearray(size)
        setattr(_buffers, name, buf)
    return memoryview(buf)


def release_thread_buffers() -> None:
    """Drop this thread's read and hash buffers (up to 5 MiB): for a thread that fetched a big file
    and goes on with small ones, among many such threads (the staging job's)."""
    for name in ("read", "hash"):
        if hasattr(_buffers, name):
            delattr(_buffers, name)


def _hash_fd(fd: int, check: OriginChecksum, size: int) -> str:
    """``check``'s digest of the first ``size`` bytes of ``fd`` (a temp file, re-read from the page cache)."""
    h = new_hasher(check, size)
    assert h is not None  # the same kind as the check already computed
    feed_fd(h, fd, _thread_buffer(_HASH_CHUNK, hashing=True), 0, size)
    return h.hexdigest()


class _RangeIgnored(Exception):
    """The origin answered a ranged GET with the whole body; fall back to one stream."""


class _Aborted(Exception):
    """Another part of the same file failed; stop quietly."""


class _Transfer:
    """One file being fetched into an open temp file by one or more range workers."""

    def __init__(
        self,
        source: Backend,
        file: ManifestFile,
        fd: int,
        options: DownloadOptions,
        check: OriginChecksum | None,
    ) -> None:
        self.source = source
        self.file = file
        self.fd = fd
        self.options = options
        self.abort = threading.Event()
        self._check = check
        self._hash_lock = threading.Lock()
        self.plan(parallel=file.size >= options.parallel_threshold)

    def plan(self, *, parallel: bool) -> None:
        size, step = self.file.size, self.options.part_size
        if parallel:
            self.parts = [(s, min(s + step, size)) for s in range(0, size, step)]
        else:
            self.parts = [(0, size)]
        self.done = [False] * len(self.parts)
        self.next_hash = 0
        self.sha = hashlib.sha256()
        self.side = new_hasher(self._check, self.file.size) if self._check is not None else None

    # -- hashing behind the writers ------------------------------------------------------------

    def _ready(self) -> bool:
        return self.next_hash < len(self.parts) and self.done[self.next_hash]

    def advance_hash(self, *, blocking: bool = False) -> None:
        """Hash every contiguous completed part; only one thread hashes at a time."""
        while self._ready() or blocking:
            if not self._hash_lock.acquire(blocking=blocking):
                return
            try:
                while self._ready():
                    start, end = self.parts[self.next_hash]
                    pos = start
                    buf = _thread_buffer(_HASH_CHUNK, hashing=True)
                    while pos < end:
                        n = os.preadv(self.fd, [buf[:min(_HASH_CHUNK, end - pos)]], pos)
                        if not n:
                            raise StorageError(str(self.file.path), f"temp file shorter than expected at {pos}")
                        _feed(self.sha, self.side, buf[:n])
                        pos += n
                    # Start writeback of the hashed part now, so the final fsync (durability before
                    # publish) does not have to write the whole file at the end.
                    _start_writeback(self.fd, start, end - start)
                    self.next_hash += 1
            finally:
                self._hash_lock.release()
            blocking = False  # re-check once without blocking: a part may have finished meanwhile

    # -- one part ----------------------------------------------------------------------------

    def run_part(self, index: int) -> None:
        start, end = self.parts[index]
        cur = start
        whole = start == 0 and end == self.file.size
        failures = total = 0
        last_progress = cur
        while True:
            if self.abort.is_set():
                raise _Aborted()
            stream = None
            try:
                stream = self.source.open_range(self.file, cur, None if end == self.file.size else end)
                if not stream.partial and cur != 0:
                    if not whole:
                        raise _RangeIgnored()
                    cur = 0  # single stream: the origin restarted from byte 0, so do we
                elif not stream.partial and not whole:
                    raise _RangeIgnored()
                readinto = getattr(stream, "readinto", None)
                while cur < end:
                    if self.abort.is_set():
                        raise _Aborted()
                    want = min(self.options.read_size, end - cur)
                    if readinto is not None:  # into this thread's buffer: no 1 MiB object per read
                        view = _thread_buffer(self.options.read_size)[:want]
                        view = view[:readinto(view)]
                    else:
                        view = memoryview(stream.read(want))
                    if not view:
                        raise SourceUnavailableError(
                            self.source.uri.canonical, "body ended before the expected size",
                            file=self.file.path, offset=cur, transient=True,
                        )
                    while view:
                        written = os.pwrite(self.fd, view, cur)
                        view = view[written:]
                        cur += written
                break
            except SourceUnavailableError as exc:
                total += 1
                failures = 1 if cur > last_progress else failures + 1
                last_progress = cur
                if failures > self.options.max_retries or total > 4 * self.options.max_retries:
                    raise SourceUnavailableError(
                        self.source.uri.canonical,
                        f"gave up after {total} attempts: {exc.args[0].split(': ', 1)[-1]}",
                        file=self.file.path, offset=cur, transient=True,
                    ) from exc
                time.sleep(backoff_delay_s(total - 1, self.options.backoff_base_s, self.options.backoff_cap_s))
            finally:
                if stream is not None:
                    stream.close()
        self.done[index] = True
        self.advance_hash()


def _run_transfer(transfer: _Transfer, pool: ThreadPoolExecutor) -> None:
    """Run all parts of ``transfer`` on ``pool``; fall back to one stream if Range is ignored."""
    for attempt in range(2):
        futures: list[Future[None]] = [pool.submit(transfer.run_part, i) for i in range(len(transfer.parts))]
        error: BaseException | None = None
        for fut in futures:
            try:
                fut.result()
            except BaseException as exc:
                transfer.abort.set()
                if error is None or isinstance(error, _Aborted):
                    error = exc
        if error is None:
            transfer.advance_hash(blocking=True)
            return
        if isinstance(error, _RangeIgnored) and attempt == 0:
            transfer.abort.clear()
            transfer.plan(parallel=False)
            continue
        raise error
    raise AssertionError("unreachable")


def _publish(fd: int, tmp: Path, final: Path, mode: int) -> None:
    os.fchmod(fd, mode)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, final)
    fsync_dir(final.parent)


def fetch_file(
    source: Backend,
    file: ManifestFile | RemoteFile,
    dest_dir: Path,
    *,
    options: DownloadOptions | None = None,
    pool: ThreadPoolExecutor | None = None,
) -> FetchResult:
    """Fetch one file into ``dest_dir/<sha256>``, verified; the engine behind every download.

    ``file.sha256`` may be None (HF non-LFS files, object stores without a published sha256): the
    hash computed while streaming then names the blob, after the origin's own checksum (git blob
    sha1, CRC32C, CRC32 or MD5, whichever is cheapest of those listed) matched on the same pass, so
    the bytes we name are the bytes the origin stored. That is how ``resolve(mirror_dir=...)`` and
    the staging job get a verified sha256 without streaming the object twice.

    Raises:
        IntegrityError: size or hash mismatch (nothing published).
        SourceError: from the backend, naming source, file and offset.
        StorageError: local filesystem failure.
    """
    options = options or DownloadOptions()
    expected = file.sha256
    mfile = file if isinstance(file, ManifestFile) else ManifestFile(
        path=file.path, size=file.size, sha256=expected or _EMPTY_SHA256, etag=file.etag
    )
    check = pick_check(file.checksums) if expected is None and isinstance(file, RemoteFile) else None
    if expected is not None:
        final = dest_dir / expected
        try:
            if os.stat(final).st_size == file.size:
                return FetchResult(expected, file.size, final)  # content-addressed: already here
        except FileNotFoundError:
            pass
    tmp = temp_name(dest_dir / (expected or "blob"))
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StorageError(str(tmp), f"cannot create temp file: {exc.strerror}") from exc
    closed = False
    try:
        if file.size:
            try:
                os.posix_fallocate(fd, 0, file.size)
            except OSError:
                os.ftruncate(fd, file.size)  # filesystems without fallocate (some NFS, tmpfs quirks)
        transfer = _Transfer(source, mfile, fd, options, check)
        if file.size:
            own_pool = pool is None
            workers = pool or ThreadPoolExecutor(max_workers=options.max_workers, thread_name_prefix="bt-part")
            try:
                _run_transfer(transfer, workers)
            finally:
                if own_pool:
                    workers.shutdown(wait=True)
        actual_size = os.fstat(fd).st_size
        actual = transfer.sha.hexdigest()
        uri = source.uri.canonical
        if actual_size != file.size:
            raise SourceIntegrityError(uri, "size mismatch; not published", file=file.path,
                                 expected=str(file.size), actual=str(actual_size))
        if expected is not None and actual != expected:
            raise SourceIntegrityError(uri, "sha256 mismatch; not published", file=file.path,
                                 expected=expected, actual=actual)
        if check is not None and transfer.side is not None:
            assert isinstance(file, RemoteFile)
            _check_origin(source, file, check, transfer.side.hexdigest(), published=True,
                          reread=lambda c: _hash_fd(fd, c, file.size))
        final = dest_dir / actual
        closed = True
        _publish(fd, tmp, final, options.file_mode)
        return FetchResult(actual, file.size, final)
    except BaseException:
        if not closed:
            os.close(fd)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _create_fanned(dest_dir: Path, sha256: str) -> tuple[Path, int]:
    """Create :func:`fetch_small`'s temp file in ``dest_dir/.fan-<first hex digit>``; (path, fd).

    Why: creating files is serialized per directory (and its inode group): on the bench VM's ext4,
    16 threads creating 4 KiB files in one directory managed one per ~0.6 ms, spread over 16
    directories one per ~0.18 ms, and 10,000 small files in one writer dir spent seconds there.
    The subdirectory is made on first use (no extra system call per file) with ``dest_dir``'s
    permission bits (a teammate's collector may empty a team tier's writer dir,
    cluster_cache.ClusterCache.writer_dir) and goes with ``dest_dir``'s tree.
    """
    sub = f"{os.fspath(dest_dir)}/.fan-{sha256[0]}"
    tmp = f"{sub}/{temp_basename(sha256)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return Path(tmp), os.open(tmp, flags, 0o600)
        except FileNotFoundError:
            try:
                os.mkdir(sub, 0o700)
                os.chmod(sub, stat.S_IMODE(os.stat(dest_dir).st_mode))
            except FileExistsError:
                pass  # another thread made it
            return Path(tmp), os.open(tmp, flags, 0o600)
    except OSError as exc:
        raise StorageError(str(tmp), f"cannot create temp file: {exc.strerror}") from exc


def fetch_small(
    source: Backend,
    file: ManifestFile | RemoteFile,
    dest_dir: Path,
    *,
    options: DownloadOptions | None = None,
) -> FetchResult:
    """Fetch a small file into memory, verify it there, and write it to a temp file in ``dest_dir``.

    The bytes are checked exactly as :func:`fetch_file` checks them (size, the expected sha256 or
    the origin's own checksum) *before* anything is written, so a corrupted body never reaches the
    disk. The temp file (``FetchResult.path``) is neither fsynced nor renamed: the caller publishes
    many of them with one ``syncfs`` (:class:`slurm_bt.weights.cluster_cache.BlobBatch`), which is
    what makes 10,000 small files cost milliseconds of journal instead of seconds. Transient
    failures resume from the byte reached (``Range``), pinned to the listed version, with the same
    bounded retries as the big-file engine.

    Raises:
        IntegrityError: size, sha256 or origin-checksum mismatch (nothing written).
        SourceError: from the backend after bounded retries.
        StorageError: the temp file could not be written (it is removed).
    """
    options = options or DownloadOptions()
    uri = source.uri.canonical
    expected = file.sha256
    check = pick_check(file.checksums) if expected is None and isinstance(file, RemoteFile) else None
    # Both a RemoteFile and a ManifestFile name the pinned version (path, etag, size): no copy of
    # it per file. The body is kept as the bytes objects read: one read of the whole object (the
    # usual case) is neither copied nor joined.
    parts: list[bytes] = []
    got = failures = total = 0
    while got < file.size:  # an empty file needs no request; its checks still run below
        stream = None
        reached = got
        try:
            stream = source.open_range(file, got, None)
            if not stream.partial and got:
                parts.clear()  # the origin ignored Range and restarted from byte 0: so do we
                got = 0
            while got < file.size:
                data = stream.read(file.size - got)
                if not data:
                    raise SourceUnavailableError(uri, "body ended before the expected size", file=file.path,
                                                 offset=got, transient=True)
                parts.append(data)
                got += len(data)
        except SourceUnavailableError as exc:
            total += 1
            failures = 1 if got > reached else failures + 1
            if failures > options.max_retries or total > 4 * options.max_retries:
                raise SourceUnavailableError(uri, f"gave up after {total} attempts: {exc.args[0].split(': ', 1)[-1]}",
                                             file=file.path, offset=got, transient=True) from exc
            time.sleep(backoff_delay_s(total - 1, options.backoff_base_s, options.backoff_cap_s))
        finally:
            if stream is not None:
                stream.close()
    body = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(body) != file.size:
        raise SourceIntegrityError(uri, "size mismatch; not published", file=file.path,
                                   expected=str(file.size), actual=str(len(body)))
    actual = hashlib.sha256(body).hexdigest()
    if expected is not None and actual != expected:
        raise SourceIntegrityError(uri, "sha256 mismatch; not published", file=file.path,
                                   expected=expected, actual=actual)
    side = new_hasher(check, file.size) if check is not None else None
    if check is not None and side is not None:  # pick_check picks only what can be computed here
        assert isinstance(file, RemoteFile)
        side.update(body)

        def reread(c: OriginChecksum) -> str:
            h = new_hasher(c, file.size)
            assert h is not None
            h.update(body)
            return h.hexdigest()

        _check_origin(source, file, check, side.hexdigest(), published=True, reread=reread)
    tmp, fd = _create_fanned(dest_dir, actual)
    try:
        view = memoryview(body)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, options.file_mode)
    except BaseException as exc:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise StorageError(str(tmp), f"cannot write temp file: {exc.strerror}") from exc
        raise
    os.close(fd)
    return FetchResult(actual, file.size, tmp)


def each_in_threads(fn: Callable[[Any], Any], items: list[Any], workers: int, *,
                    name: str = "bt-file") -> list[Any]:
    """``[fn(x) for x in items]`` run by ``workers`` threads that take the next item from one shared
    list; results in ``items``' order. The first failure stops the hand-out and is raised once every
    thread has stopped (items already started finish).

    Why not ``ThreadPoolExecutor.map``: it makes a future per item and the caller wakes up to collect
    each one; with 10,000 small files that is 10,000 futures and as many GIL hand-offs to the waiting
    thread, on the two cores the transfer and the server share.
    """
    def produce(submit: Callable[[Any], None]) -> None:
        for x in items:
            submit(x)

    return each_streamed(fn, produce, min(workers, len(items)), name=name)[1]


class _HandOutStopped(BaseException):
    """A worker failed: the producer stops submitting (the worker's error is what is raised).

    A BaseException, so that a backend's ``except Exception`` around its listing loop does not
    wrap it into a source error of its own."""


def each_streamed(fn: Callable[[Any], Any], produce: Callable[[Callable[[Any], None]], _T], workers: int, *,
                  name: str = "bt-file") -> tuple[_T, list[Any]]:
    """Run ``produce(submit)`` in this thread while ``workers`` threads run ``fn`` on each item it
    submits, as soon as it is submitted; returns (what ``produce`` returned, the results in
    submission order).

    Why: the staging job's listing and its downloads overlap (``Backend.list_files_streaming``), as
    ``s5cmd cp`` does: a 10,000-object listing is ~0.7 s of the bench VM's ~5 s stage, which would
    otherwise run before the first GET.

    The first failure wins: a worker's makes ``submit`` stop the producer; the producer's (e.g. the
    source changed since submit) stops the hand-out. Either is raised once every thread has stopped
    (items already started finish; they are bounded, and publish only verified blobs).
    """
    items: list[Any] = []
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    cond = threading.Condition()
    state = {"next": 0, "closed": False}

    def submit(item: Any) -> None:
        with cond:
            if errors:
                raise _HandOutStopped()
            items.append(item)
            cond.notify()

    def work() -> None:
        while True:
            with cond:
                while not errors and state["next"] >= len(items) and not state["closed"]:
                    cond.wait()
                if errors or state["next"] >= len(items):
                    return
                i = state["next"]
                state["next"] = i + 1
            try:
                results[i] = fn(items[i])
            except BaseException as exc:
                with cond:
                    errors.append(exc)
                    cond.notify_all()
                return

    threads = [threading.Thread(target=work, name=f"{name}-{n}", daemon=True) for n in range(max(1, workers))]
    for t in threads:
        t.start()
    out: Any = None
    try:
        out = produce(submit)
    except _HandOutStopped:
        pass
    except BaseException as exc:
        with cond:
            errors.append(exc)
    finally:
        with cond:
            state["closed"] = True
            cond.notify_all()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return out, [results[i] for i in range(len(items))]


def hash_remote_file(source: Backend, file: RemoteFile, *, options: DownloadOptions | None = None) -> str:
    """sha256 of a remote file computed by streaming it once (no disk), with resume on resets.

    The origin's own checksum (git blob sha1, CRC32C, CRC32 or MD5), when listed, is checked on the
    same pass.

    Raises:
        IntegrityError: the origin's own checksum disagrees with the bytes received.
        SourceError: from the backend after bounded retries.
    """
    options = options or DownloadOptions()
    mfile = ManifestFile(path=file.path, size=file.size, sha256=_EMPTY_SHA256, etag=file.etag)
    uri = source.uri.canonical

    check = pick_check(file.checksums)

    def fresh() -> tuple[Any, Hasher | None]:
        return hashlib.sha256(), new_hasher(check, file.size) if check is not None else None

    sha, side = fresh()
    cur = failures = total = 0
    while cur < file.size:
        stream = None
        try:
            stream = source.open_range(mfile, cur, None)
            if not stream.partial and cur:
                sha, side = fresh()
                cur = 0
            while cur < file.size:
                data = stream.read(min(options.read_size, file.size - cur))
                if not data:
                    raise SourceUnavailableError(uri, "body ended before the expected size",
                                                 file=file.path, offset=cur, transient=True)
                _feed(sha, side, data)
                cur += len(data)
        except SourceUnavailableError as exc:
            total += 1
            failures += 1
            if failures > options.max_retries or total > 4 * options.max_retries:
                raise SourceUnavailableError(uri, f"gave up after {total} attempts: {exc}", file=file.path,
                                             offset=cur, transient=True) from exc
            time.sleep(backoff_delay_s(total - 1, options.backoff_base_s, options.backoff_cap_s))
        finally:
            if stream is not None:
                stream.close()
    if check is not None and side is not None:
        def restream(c: OriginChecksum) -> str:
            # Nothing was kept: stream the object again, checked against ``c`` (raises on a mismatch).
            hash_remote_file(source, dataclasses.replace(file, checksums=(c,)), options=options)
            return c.value

        _check_origin(source, file, check, side.hexdigest(), published=False, reread=restream)
    digest: str = sha.hexdigest()
    return digest


def open_manifest_source(
    manifest: Manifest,
    *,
    credentials: Credentials | None = None,
    endpoints: StorageEndpoints | None = None,
    options: DownloadOptions | None = None,
) -> Backend:
    """The backend for ``manifest``'s source, pinned to its revision (HF commit)."""
    uri = parse_source_uri(manifest.source)
    if uri.kind == "hf":
        uri = StorageUrl("hf", uri.container, revision=manifest.revision)
    return open_backend(uri, credentials=credentials, endpoints=endpoints,
                       options=(options or DownloadOptions()).transport)


def download_manifest(
    manifest: Manifest,
    dest_dir: Path,
    *,
    credentials: Credentials | None = None,
    endpoints: StorageEndpoints | None = None,
    options: DownloadOptions | None = None,
    files: Iterable[ManifestFile] | None = None,
    on_file: Callable[[ManifestFile, Path], None] | None = None,
) -> dict[str, Path]:
    """Download every file of ``manifest`` (or ``files``) into ``dest_dir/<sha256>``, verified.

    Identical contents are fetched once. Files run ``max_files`` at a time and their ranges share
    one pool of ``max_workers`` connections. The first failure cancels the rest and is raised;
    blobs already published stay (they are verified and content-addressed).

    Returns:
        manifest path -> published blob path.
    """
    options = options or DownloadOptions()
    wanted = list(files if files is not None else manifest.files)
    by_sha: dict[str, ManifestFile] = {}
    for f in wanted:
        by_sha.setdefault(f.sha256, f)
    source = open_manifest_source(manifest, credentials=credentials, endpoints=endpoints, options=options)
    results: dict[str, Path] = {}
    try:
        with ThreadPoolExecutor(options.max_workers, thread_name_prefix="bt-part") as parts, \
                ThreadPoolExecutor(options.max_files, thread_name_prefix="bt-file") as filepool:
            futs = {sha: filepool.submit(fetch_file, source, f, dest_dir, options=options, pool=parts)
                    for sha, f in by_sha.items()}
            error: BaseException | None = None
            for sha, fut in futs.items():
                try:
                    results[sha] = fut.result().path or dest_dir / sha
                except BaseException as exc:
                    error = error or exc
                    for other in futs.values():
                        other.cancel()
            if error is not None:
                raise error
    finally:
        source.close()
    out = {f.path: results[f.sha256] for f in wanted}
    if on_file is not None:
        for f in wanted:
            on_file(f, out[f.path])
    return out


def download_file(
    manifest: Manifest,
    file: ManifestFile,
    dest_dir: Path,
    *,
    credentials: Credentials | None = None,
    endpoints: StorageEndpoints | None = None,
    options: DownloadOptions | None = None,
) -> Path:
    """Download one file of ``manifest`` into ``dest_dir/<sha256>`` and return that path.

    Raises:
        IntegrityError: size or sha256 mismatch (expected and actual in the message); nothing
            is published.
        SourceError: access, not found, unreachable or stalled, naming source, file and offset.
    """
    if file not in manifest.files:
        raise SourceError(manifest.source, "file is not part of this manifest", file=file.path)
    return download_manifest(manifest, dest_dir, credentials=credentials, endpoints=endpoints,
                             options=options, files=[file])[file.path]


def remove_stale_temps(dest_dir: Path, *, max_age_s: float = 6 * 3600, check_pid: bool = True) -> list[Path]:
    """Delete temp files left by killed downloads; return what was removed.

    A temp file (``.<name>.tmp-<pid>-<hex>``) is stale when its writer process no longer exists
    (``check_pid``; only meaningful when ``dest_dir`` is not shared between hosts) or when it has
    not been modified for ``max_age_s``. Live writers are never touched: a download modifies its
    temp file continuously, and its pid is alive.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        entries = list(os.scandir(dest_dir))
    except FileNotFoundError:
        return removed
    for entry in entries:
        m = _TEMP_RE.match(entry.name)
        if not m or not entry.is_file(follow_symlinks=False):
            continue
        stale = now - entry.stat(follow_symlinks=False).st_mtime > max_age_s
        if check_pid and not stale:
            try:
                os.kill(int(m.group(1)), 0)
            except ProcessLookupError:
                stale = True
            except PermissionError:
                pass  # alive, owned by someone else
        if stale:
            try:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except FileNotFoundError:
                pass
    return removed
