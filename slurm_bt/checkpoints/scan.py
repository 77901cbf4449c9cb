"""When is a checkpoint complete? The one rule, applied to ``BT_CHECKPOINT_DIR`` by every uploader.

A *checkpoint* is a top-level subdirectory of ``BT_CHECKPOINT_DIR`` whose name is a valid
checkpoint name (:func:`~slurm_bt.checkpoints.layout.valid_checkpoint_name`: no leading dot, not
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
regular file inside the same checkpoint (as that file's content); others are skipped and reported
(threats-and-faults.md E05).
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_bt.checkpoints.layout import MARKER_NAMES, valid_checkpoint_name

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


def list_files(root: Path) -> tuple[list[CheckpointFile], list[str], float]:
    """Every uploadable file under ``root`` (sorted), the skipped relative paths and the newest mtime."""
    files: list[CheckpointFile] = []
    skipped: list[str] = []
    try:
        newest = os.lstat(root).st_mtime
    except OSError:
        return [], [], 0.0
    real_root = os.path.realpath(root)
    stack = [(root, "")]
    while stack:
        directory, rel = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            skipped.append(rel or ".")
            continue
        for entry in entries:
            relpath = f"{rel}/{entry.name}" if rel else entry.name
            if not rel and entry.name in MARKER_NAMES:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISDIR(st.st_mode):
                stack.append((Path(entry.path), relpath))
            elif stat.S_ISREG(st.st_mode):
                files.append(CheckpointFile(relpath, Path(entry.path), st.st_size, st.st_mtime_ns))
            elif stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(entry.path)
                try:
                    tst = os.stat(target)
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
