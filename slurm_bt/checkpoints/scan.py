"""When is a checkpoint complete? The one rule, applied to ``BT_CHECKPOINT_DIR`` by every uploader.

A *checkpoint* is a top-level subdirectory of ``BT_CHECKPOINT_DIR`` whose name is a valid
checkpoint name (:func:`~slurm_bt.checkpoints.locations.valid_checkpoint_name`: no leading dot, not
``tmp-*`` / ``*.tmp`` / ``*.partial``). It is **complete**, and only then uploaded, when:

1. **marker** (preferred): it contains a top-level file named ``.complete`` or ``COMPLETE``.
   Write the marker last, after every other file of the checkpoint is closed. The marker itself is
   not uploaded;
2. **quiet**: or nothing in it has changed (the set of ``(path, size, mtime)`` of its files) across
   scans spanning at least ``quiet_s`` seconds (``BT_CHECKPOINT_QUIET_S``, default 120), *and* its
   newest mtime is at least ``quiet_s`` old. A heuristic for trainers that cannot write a marker;
3. **final**: or the start commands have ended on this node (the uploader's final flush and the
   epilog), so nothing can still be writing it.

A checkpoint that changes after it was uploaded is uploaded again once it is complete again
(unchanged files are skipped by sha256). Loose files at the top of ``BT_CHECKPOINT_DIR`` are not a
checkpoint and are not uploaded; the uploader says so once.

Walking never follows symlinks: a symlink inside a checkpoint is uploaded only if it resolves to a
regular file inside the same checkpoint (as that file's content); others are skipped and reported.
FIFOs, sockets and devices are skipped and reported too. File names
need not be UTF-8: relative paths are stored percent-encoded where needed
(:func:`~slurm_bt.checkpoints.index.encode_relpath`) and decoded again on download.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from slurm_bt.checkpoints.index import encode_relpath
from slurm_bt.checkpoints.locations import MARKER_NAMES, valid_checkpoint_name

__all__ = ["CheckpointFile", "CompletionTracker", "DirState", "list_files", "scan_dir"]


@dataclass(frozen=True)
class CheckpointFile:
    """One file to upload: ``relpath`` inside the checkpoint, and the path to open (never a symlink)."""

    relpath: str
    path: Path
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class DirState:
    """One scan of one checkpoint directory.

    Attributes:
        name: the directory name.
        marker: the marker file found, or None.
        signature: digest of the sorted ``(relpath, size, mtime_ns)`` of its files.
        newest_mtime: newest mtime (seconds) of anything in it, the directory itself included.
        files: the files that would be uploaded.
        skipped: relative paths left out (symlinks leaving the checkpoint, sockets, FIFOs ...).
    """

    name: str
    marker: str | None
    signature: str
    newest_mtime: float
    files: tuple[CheckpointFile, ...]
    skipped: tuple[str, ...] = ()


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def list_files(root: Path) -> tuple[list[CheckpointFile], list[str], float]:
    """Every uploadable file under ``root`` (sorted), the skipped relative paths and the newest mtime.

    Relative paths are in the :func:`~slurm_bt.checkpoints.index.encode_relpath` form, so a name that
    is not UTF-8 or holds a newline is uploaded like any other. The walk is descriptor-relative and
    opens every directory ``O_NOFOLLOW``: a directory swapped for a symlink mid-walk is skipped,
    never followed out of the checkpoint.
    """
    files: list[CheckpointFile] = []
    skipped: list[str] = []
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return [], [], 0.0
    newest = os.fstat(top).st_mtime
    real_root = os.path.realpath(root)
    # Depth-first with one open descriptor per level (not per directory seen), so a wide tree never
    # exhausts the descriptor limit; a tree deeper than that limit is skipped below it, reported.
    stack: list[tuple[int, Path, bytes, Iterator[str]]] = []

    def enter(dfd: int, directory: Path, rel: bytes) -> None:
        try:
            names = sorted(os.listdir(dfd))
        except OSError:
            skipped.append(encode_relpath(rel or b"."))
            os.close(dfd)
            return
        stack.append((dfd, directory, rel, iter(names)))

    enter(top, root, b"")
    try:
        while stack:
            dfd, directory, rel, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(dfd)
                stack.pop()
                continue
            relraw = rel + b"/" + os.fsencode(name) if rel else os.fsencode(name)
            relpath = encode_relpath(relraw)
            if not rel and name in MARKER_NAMES:
                continue
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                except OSError:
                    skipped.append(relpath)  # swapped for a symlink since the stat, or too deep
                    continue
                enter(sub, directory / name, relraw)
            elif stat.S_ISREG(st.st_mode):
                files.append(CheckpointFile(relpath, directory / name, st.st_size, st.st_mtime_ns))
            elif stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(directory / name)
                try:
                    tst = os.stat(target, follow_symlinks=False)
                except OSError:
                    skipped.append(relpath)
                    continue
                if target.startswith(real_root + os.sep) and stat.S_ISREG(tst.st_mode):
                    files.append(CheckpointFile(relpath, Path(target), tst.st_size, tst.st_mtime_ns))
                    newest = max(newest, tst.st_mtime)
                else:
                    skipped.append(relpath)
            else:
                skipped.append(relpath)
    finally:
        for dfd, *_ in stack:
            os.close(dfd)
    files.sort(key=lambda f: f.relpath)
    return files, sorted(skipped), newest


def _state(path: Path) -> DirState:
    files, skipped, newest = list_files(path)
    marker = next((m for m in MARKER_NAMES if os.path.isfile(path / m) and not os.path.islink(path / m)), None)
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.relpath}\0{f.size}\0{f.mtime_ns}\n".encode())
    return DirState(path.name, marker, h.hexdigest(), newest, tuple(files), tuple(skipped))


def scan_dir(checkpoint_dir: Path) -> tuple[list[DirState], list[str]]:
    """Scan ``BT_CHECKPOINT_DIR``: the candidate checkpoints and the names of loose top-level entries."""
    states: list[DirState] = []
    loose: list[str] = []
    try:
        entries = sorted(os.scandir(checkpoint_dir), key=lambda e: e.name)
    except OSError:
        return [], []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if valid_checkpoint_name(entry.name):
                states.append(_state(Path(entry.path)))
        elif not entry.name.startswith("."):
            loose.append(entry.name)
    return states, loose


@dataclass
class CompletionTracker:
    """Applies the completion rule across successive scans (module docstring).

    Attributes:
        quiet_s: seconds without change after which an unmarked checkpoint counts as complete.
        clock: monotonic clock (injectable for tests).
        wall: wall clock for mtimes (injectable for tests).
    """

    quiet_s: float = 120.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    _seen: dict[str, tuple[str, float]] = field(default_factory=dict)

    def completion(self, state: DirState, *, final: bool = False) -> str | None:
        """``marker``, ``quiet`` or ``final`` when ``state`` is complete, else None."""
        now = self.clock()
        prev = self._seen.get(state.name)
        if prev is None or prev[0] != state.signature:
            self._seen[state.name] = (state.signature, now)
            prev = self._seen[state.name]
        if state.marker is not None:
            return "marker"
        if final:
            return "final"
        stable_for = now - prev[1]
        age = self.wall() - state.newest_mtime
        if state.files and stable_for >= self.quiet_s and age >= self.quiet_s:
            return "quiet"
        return None
