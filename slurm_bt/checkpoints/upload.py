"""Upload one node rank's completed checkpoints, idempotently and resumably.

:class:`RankUploader` is shared by the background uploader (:mod:`slurm_bt.steps.checkpoint_agent`), the final
flush and the hand-off resumer, so all three behave the same:

* only *complete* checkpoints are uploaded (:mod:`.scan`);
* a checkpoint enters this rank's index part only after every file was uploaded and verified;
* while a checkpoint is in flight, the files already verified are recorded in the part's
  ``uploading`` section (at most every few seconds), so a restart after ``kill -9`` re-hashes those
  files locally and skips the ones whose sha256 and stored copy still match instead of sending them
  again; incomplete multipart uploads of the file that was in flight are aborted by the store;
* everything is keyed by (team, project, job, rank, checkpoint, path), so running twice changes nothing;
* each rank also *reports* in its part whether its ``BT_CHECKPOINT_DIR`` holds any directory at all
  (``empty_at``) and when its last pass of a run is done (``final``): that is how a checkpoint
  written by rank 0 alone becomes complete (:mod:`.index`, :meth:`RankUploader.report`);
* retention (:meth:`RankUploader.apply_retention`) drops this rank's copies of the checkpoints the
  job's policy (:mod:`.retention`) no longer keeps, recording them as ``expired``.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from slurm_bt.checkpoints.index import (
    EMPTY_REFRESH_S,
    FileEntry,
    JobIndex,
    RankCheckpoint,
    RankIndex,
    encode_relpath,
    merge_parts,
    parse_time,
    utc_now,
)
from slurm_bt.checkpoints.locations import checkpoint_key, file_key, index_key, rank_index_key, valid_checkpoint_name
from slurm_bt.checkpoints.retention import RetentionPolicy, select_expired
from slurm_bt.checkpoints.scan import CheckpointFile, CompletionTracker, DirState, scan_dir
from slurm_bt.checkpoints.store import CheckpointStore
from slurm_bt.errors import DeadlineExceeded, StorageError
from slurm_bt.posix.user_files import UnsafeFile, open_user_file

__all__ = ["JobIdentity", "RankUploader", "has_directories", "read_job_index", "read_rank_part"]

_EMPTY_SCAN_MAX = 10000
"""Entries looked at when deciding whether ``BT_CHECKPOINT_DIR`` is empty (beyond: "not empty")."""


def has_directories(checkpoint_dir: Path) -> bool:
    """Whether ``checkpoint_dir`` holds anything but regular files (a checkpoint, or one being written).

    Why anything: a trainer writing its part of a sharded checkpoint has a directory there (often a
    dot or ``tmp-`` name first); only a directory with no such entry is evidence that this node
    writes no checkpoints. Opened without following a symlink; an unreadable directory counts as
    not empty (no evidence). Missing: empty.
    """
    try:
        fd = os.open(checkpoint_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        with os.scandir(fd) as it:
            for count, entry in enumerate(it):
                if count >= _EMPTY_SCAN_MAX or not entry.is_file(follow_symlinks=False):
                    return True
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@dataclass(frozen=True)
class JobIdentity:
    """Which job and rank the uploads belong to (decides every key).

    ``team``: the slug of the job's team (:func:`slurm_bt.checkpoints.store.team_group`); uploads
    always go to its namespace ``_teams/<team>/`` (:mod:`..locations`), never to the legacy layout.
    """

    project_name: str
    project_id: str
    job_id: str
    user: str
    rank: int
    group_size: int
    team: str


def read_rank_part(store: CheckpointStore, project_id: str, job_id: str, rank: int, *,
                   team: str | None) -> RankIndex | None:
    """One rank's index part in ``team``'s namespace (None: legacy), or None (absent or unreadable JSON)."""
    raw = store.read_bytes(rank_index_key(project_id, job_id, rank, team=team))
    if raw is None:
        return None
    try:
        return RankIndex.model_validate_json(raw)
    except ValidationError:
        return None


def read_job_index(store: CheckpointStore, project_id: str, job_id: str, group_size: int | None = None, *,
                   team: str | None) -> JobIndex | None:
    """The job's merged index in ``team``'s namespace (None: legacy), from the rank parts (else ``index.json``)."""
    parts = []
    first = read_rank_part(store, project_id, job_id, 0, team=team)
    if first is not None:
        parts.append(first)
        size = max(group_size or 0, first.group_size)
        for rank in range(1, size):
            part = read_rank_part(store, project_id, job_id, rank, team=team)
            if part is not None:
                parts.append(part)
    merged = merge_parts(parts)
    if merged is not None:
        return merged
    raw = store.read_bytes(index_key(project_id, job_id, team=team))
    if raw is None:
        return None
    try:
        return JobIndex.model_validate_json(raw)
    except ValidationError:
        return None


def _log(rank: int, message: str) -> None:
    try:
        print(f"slurm-bt checkpoints [rank {rank}]: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a closed stderr must never fail an upload
        pass


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass
class RankUploader:
    """Ships one node's ``BT_CHECKPOINT_DIR`` to the store (module docstring).

    Attributes:
        store: the opened checkpoint store.
        ident: job and rank.
        checkpoint_dir: the host directory to watch.
        tracker: the completion rule state.
        file_workers: files uploaded concurrently (parts of big files are parallel inside the store).
        log: where progress lines go.
    """

    store: CheckpointStore
    ident: JobIdentity
    checkpoint_dir: Path
    tracker: CompletionTracker = field(default_factory=CompletionTracker)
    file_workers: int = 4
    log: Callable[[int, str], None] = _log
    _part: RankIndex | None = None
    _uploaded_sig: dict[str, str] = field(default_factory=dict)
    _warned_loose: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def part(self) -> RankIndex:
        """This rank's index part (read from the store once, then kept current in memory)."""
        if self._part is None:
            existing = read_rank_part(self.store, self.ident.project_id, self.ident.job_id, self.ident.rank,
                                      team=self.ident.team)
            i = self.ident
            self._part = existing or RankIndex(project_name=i.project_name, project_id=i.project_id, job_id=i.job_id,
                                               user=i.user, rank=i.rank, group_size=i.group_size, updated=utc_now())
        return self._part

    def _refresh(self) -> RankIndex:
        """This rank's part as stored now (the in-memory copy when absent), before applying a change to it.

        Why: one rank's part normally has one writer, but a requeued job's next run (same job id,
        same ranks) can start while a hand-off sweep of the previous run still uploads into the same
        part. Each change is applied to what is stored at that moment instead of to a copy read when
        the process started, so neither process drops what the other published (the window left is
        the few milliseconds between this read and the write).
        """
        i = self.ident
        stored = read_rank_part(self.store, i.project_id, i.job_id, i.rank, team=i.team)
        if stored is not None:
            self._part = stored
        return self.part()

    def _publish(self, part: RankIndex, *, rewrite_index: bool = True) -> None:
        i = self.ident
        self.store.write_bytes(rank_index_key(i.project_id, i.job_id, i.rank, team=i.team),
                               part.model_dump_json(indent=1).encode())
        self._part = part
        if not rewrite_index:
            return
        parts = [part]
        for rank in range(i.group_size):
            if rank != i.rank:
                other = read_rank_part(self.store, i.project_id, i.job_id, rank, team=i.team)
                if other is not None:
                    parts.append(other)
        merged = merge_parts(parts)
        if merged is not None:
            self.store.write_bytes(index_key(i.project_id, i.job_id, team=i.team),
                                   merged.model_dump_json(indent=1).encode())

    def pending(self, *, final: bool) -> list[tuple[DirState, str]]:
        """Complete checkpoints that are not in the store in their current state."""
        states, loose = scan_dir(self.checkpoint_dir)
        if loose and not self._warned_loose:
            self._warned_loose = True
            shown = ", ".join(encode_relpath(n) for n in loose[:5])
            self.log(self.ident.rank, f"not uploaded (only subdirectories are checkpoints): {shown}")
        out = []
        part = self.part()
        for state in states:
            reason = self.tracker.completion(state, final=final)
            if reason is None or self._uploaded_sig.get(state.name) == state.signature:
                continue
            expired_at = part.expired.get(state.name)
            if expired_at is not None and state.newest_mtime <= expired_at:
                continue  # dropped by retention; uploaded again only if the trainer rewrites it
            if _unchanged_since_upload(part.get(state.name), state):
                self._uploaded_sig[state.name] = state.signature  # uploaded by an earlier process
                continue
            out.append((state, reason))
        return out

    def run_once(self, *, final: bool = False, deadline: float | None = None) -> list[str]:
        """Upload every complete checkpoint not yet uploaded; returns their names.

        Raises:
            DeadlineExceeded: ``deadline`` (a ``time.monotonic()`` value) passed between two files.
            StorageError: a store operation failed after the backend's retries.
        """
        done = []
        for state, reason in self.pending(final=final):
            self.upload_checkpoint(state, reason, deadline=deadline)
            done.append(state.name)
        return done

    def upload_checkpoint(self, state: DirState, completion: str, *, deadline: float | None = None) -> RankCheckpoint:
        """Upload one checkpoint's files, then record it in this rank's part and the merged index."""
        i = self.ident
        part = self.part()
        previous = {f.path: f for c in (part.get(state.name), _uploading(part, state.name)) if c for f in c.files}
        started = time.monotonic()
        entries: dict[str, FileEntry] = {}
        last_progress = [time.monotonic()]
        skipped_bytes = [0]

        def one(f: CheckpointFile) -> None:
            if deadline is not None and time.monotonic() > deadline:
                raise DeadlineExceeded(state.name)
            entry = self._upload_file(state.name, f, previous.get(f.relpath), skipped_bytes)
            with self._lock:
                entries[f.relpath] = entry
                if time.monotonic() - last_progress[0] > 5.0:
                    last_progress[0] = time.monotonic()
                    self._record_progress(state.name, completion, state, list(entries.values()))

        with ThreadPoolExecutor(max_workers=self.file_workers, thread_name_prefix="bt-ckpt-file") as pool:
            futures = [pool.submit(one, f) for f in state.files]
            errors = []
            for fut in futures:
                try:
                    fut.result()
                except BaseException as exc:  # collect, cancel the rest, re-raise the first
                    errors.append(exc)
                    for other in futures:
                        other.cancel()
            if errors:
                if entries:
                    try:
                        self._record_progress(state.name, completion, state, list(entries.values()))
                    except StorageError:
                        pass
                raise errors[0]
        ckpt = RankCheckpoint(name=state.name, created=_iso(state.newest_mtime), uploaded=utc_now(),
                              completion=completion, files=tuple(sorted(entries.values(), key=lambda e: e.path)),
                              source_mtime=state.newest_mtime)
        new_part = self._refresh().with_checkpoint(ckpt)
        new_part = new_part.model_copy(update={
            "uploading": tuple(c for c in _uploading_all(new_part) if c.name != state.name),
            "expired": {n: t for n, t in new_part.expired.items() if n != state.name}})
        self._publish(new_part)
        self._uploaded_sig[state.name] = state.signature
        total = ckpt.size
        secs = max(time.monotonic() - started, 1e-6)
        sent = total - skipped_bytes[0]
        self.log(i.rank, f"uploaded {state.name} ({len(ckpt.files)} files, {total} bytes, {completion}; "
                         f"{sent / secs / 2**20:.0f} MiB/s, {skipped_bytes[0]} bytes already there)")
        if state.skipped:
            self.log(i.rank, f"{state.name}: skipped (symlink out of the checkpoint or special file): "
                             f"{', '.join(state.skipped[:5])}")
        return ckpt

    def report(self, *, final: bool = False, start: bool = False) -> None:
        """Publish what this rank says about itself: ``empty_at`` and ``final`` (:mod:`.index`).

        ``start``: a (re)started run's uploader; clears the previous run's ``final``. ``final``: the
        last pass of this run is done. Otherwise a heartbeat: ``empty_at`` is refreshed at most every
        :data:`~slurm_bt.checkpoints.index.EMPTY_REFRESH_S` while the directory stays empty (only this
        rank's part is written then), cleared as soon as a directory appears.

        Raises:
            StorageError: the store cannot be written.
        """
        part = self.part()  # decided on the copy in memory; re-read only when something is written
        known = part.checkpoints or part.empty_at is not None or part.final or part.uploading
        if has_directories(self.checkpoint_dir):
            empty_at = None
        elif final or start or part.empty_at is None or time.time() - parse_time(part.empty_at) >= EMPTY_REFRESH_S:
            empty_at = utc_now()
        else:
            empty_at = part.empty_at
        if empty_at == part.empty_at and final == part.final and (known or empty_at is None):
            return
        # Only a change of state needs the merged index.json rewritten; a refresh of empty_at does not
        # (readers merge the parts themselves).
        transition = (empty_at is None) != (part.empty_at is None) or final != part.final
        part = self._refresh()
        self._publish(part.model_copy(update={"empty_at": empty_at, "final": final, "updated": utc_now()}),
                      rewrite_index=transition)

    def apply_retention(self, policy: RetentionPolicy) -> list[str]:
        """Drop this rank's copies of the checkpoints ``policy`` no longer keeps; returns their names.

        Every rank decides from the same merged index (:func:`~slurm_bt.checkpoints.retention.select_expired`,
        which never picks the newest complete checkpoint: what a restart loads), so the ranks agree;
        a name one rank already expired is expired by the others too. The part is published first
        (so no index lists a file about to go), then the files are deleted.

        Raises:
            StorageError: the store cannot be read or written.
        """
        if not policy.active:
            return []
        i = self.ident
        index = read_job_index(self.store, i.project_id, i.job_id, i.group_size, team=i.team)
        if index is None:
            return []
        part = self._refresh()
        # Only names this rank uploaded itself (its own part), and valid ones: the key stays below its rank.
        names = [n for n in select_expired(index, policy) if part.get(n) is not None and valid_checkpoint_name(n)]
        if not names:
            return []
        expired = {**part.expired, **{n: c.source_mtime for n in names if (c := part.get(n)) is not None}}
        self._publish(part.without(names).model_copy(update={"expired": expired}))
        for name in names:
            self._uploaded_sig.pop(name, None)
            try:
                self.store.delete_tree(checkpoint_key(i.project_id, i.job_id, i.rank, name, team=i.team))
            except StorageError as exc:
                self.log(i.rank, f"retention: {name} dropped from the index but its files were not all "
                                 f"deleted: {exc}")
        self.log(i.rank, f"retention ({policy.describe()}): deleted {', '.join(names)}")
        return names

    def _upload_file(self, name: str, f: CheckpointFile, prev: FileEntry | None, skipped: list[int]) -> FileEntry:
        i = self.ident
        key = file_key(i.project_id, i.job_id, i.rank, name, f.relpath, team=i.team)
        try:
            # The job may have swapped the file for a FIFO, a device or a symlink since the scan (it can
            # still write its hand-off): such a file is refused, never opened, and never blocks us.
            fd = open_user_file(f.path)
        except UnsafeFile as exc:
            raise StorageError(encode_relpath(str(f.path)), f"not uploaded: {exc.reason}") from exc
        except OSError as exc:
            raise StorageError(encode_relpath(str(f.path)), f"cannot open checkpoint file: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            expect = None
            if prev is not None and prev.size == size:
                from slurm_bt.storage.checksums import sha256_fd

                local = sha256_fd(fd, size)[0]
                expect = local if local == prev.sha256 else None
            result = self.store.upload_file(fd, size, key, expect_sha256=expect)
        finally:
            os.close(fd)
        if result.skipped:
            with self._lock:
                skipped[0] += size
        return FileEntry(path=f.relpath, size=result.size, sha256=result.sha256)

    def _record_progress(self, name: str, completion: str, state: DirState, files: list[FileEntry]) -> None:
        partial = RankCheckpoint(name=name, created=_iso(state.newest_mtime), uploaded=utc_now(),
                                 completion=completion, files=tuple(sorted(files, key=lambda e: e.path)))
        part = self._refresh()
        others = tuple(c for c in _uploading_all(part) if c.name != name)
        updated = part.model_copy(update={"uploading": (*others, partial), "updated": utc_now()})
        i = self.ident
        self.store.write_bytes(rank_index_key(i.project_id, i.job_id, i.rank, team=i.team),
                               updated.model_dump_json(indent=1).encode())
        self._part = updated


def _unchanged_since_upload(prev: RankCheckpoint | None, state: DirState) -> bool:
    """The store already has this checkpoint as it is now: same files and sizes, nothing newer than the upload.

    Lets a restarted uploader (or the final flush, or a hand-off resume) skip checkpoints an earlier
    process uploaded without re-hashing them.
    """
    if prev is None:
        return False
    if {(f.path, f.size) for f in prev.files} != {(f.relpath, f.size) for f in state.files}:
        return False
    return prev.source_mtime > 0 and state.newest_mtime <= prev.source_mtime


def _uploading_all(part: RankIndex) -> tuple[RankCheckpoint, ...]:
    return part.uploading


def _uploading(part: RankIndex, name: str) -> RankCheckpoint | None:
    return next((c for c in part.uploading if c.name == name), None)
