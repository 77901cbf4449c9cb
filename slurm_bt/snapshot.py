"""Freeze a config's folder at submit time, the way ``truss train push`` uploads it.

Baseten archives the config's directory (or its ``Workspace``) when the job is pushed, so editing
the folder afterwards never changes a queued job. On Slurm the job may start hours later and read
the user's files in place, so we copy the same set of files into a private snapshot directory.

The selection follows upstream (``truss-train/truss_train/deployment.py`` and
``truss/util/path.py``):

* the root is ``workspace_root`` (relative to the config's directory) or the config's directory;
  the config's directory must be inside the root;
* ``exclude_dirs`` must each be a direct child of the root and drop that top-level entry;
* ``external_dirs`` are copied to the top level under their basename (name collisions are errors;
  one inside the root is skipped with a warning);
* a ``.truss_ignore`` file in the root *replaces* the built-in ignore list (gitignore syntax,
  matched with ``pathspec``, which is what upstream uses) and applies to the whole snapshot,
  external dirs included;
* symlinks are followed (the snapshot holds regular files and directories only), so a link to a
  file outside the root is copied as that file's content when the user can read it.

Deliberate differences, all stricter or safer than upstream:

* the size limit is checked by a walk that applies the ignore rules *before* anything is copied,
  so an oversized workspace leaves nothing behind; files growing during the copy are caught too;
* so is a limit on the number of files and directories (upstream has none), and that walk stops
  once it has seen ten times as many, so a huge tree costs a bounded walk, not a copy;
* symlink loops, broken symlinks, unreadable files and special files (FIFOs, sockets, devices)
  are reported, all at once, instead of hanging or failing halfway;
* an ``exclude_dirs`` entry that is itself a symlink is matched by its name, not its target;
* the directory holding ``dest`` is never copied into the snapshot (a spool inside the root).

The copy is built in a unique temp directory beside ``dest`` and published with
:func:`slurm_bt.atomic.publish_dir_atomic`; on any error the temp directory is removed.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pathspec

from slurm_bt.atomic import fsync_dir, publish_dir_atomic, temp_name
from slurm_bt.errors import Problem, SnapshotError, StorageError
from slurm_bt.posix.safefs import remove_owned_tree

__all__ = [
    "DEFAULT_IGNORE_PATTERNS",
    "IGNORE_FILE_NAME",
    "MAX_SNAPSHOT_BYTES",
    "MAX_SNAPSHOT_FILES",
    "SnapshotInfo",
    "WorkspaceLike",
    "check_snapshot",
    "snapshot_config_dir",
]

logger = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 5 * 1024**3
"""Upstream's limit on the pushed archive (``MAX_ARCHIVE_SIZE_BYTES``, 5 GiB)."""

MAX_SNAPSHOT_FILES = 20_000
"""Most files and directories a snapshot holds (site ``max_snapshot_files``). Upstream has no such
limit; here every entry is copied, chmodded and fsynced one by one on the shared filesystem, and
100,000 small files took 39 s to submit."""

IGNORE_FILE_NAME = ".truss_ignore"

DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = (
    # Python build and cache files
    "__pycache__/",
    "*.py[cod]",
    ".mypy_cache/",
    ".pytest_cache/",
    ".cache",
    # version control and virtual environments
    ".git/",
    ".venv",
    "venv/",
    "env/",
    ".env",
    # logs, editor and OS files
    "*.log",
    "*.swp",
    ".DS_Store",
    ".idea/",
    ".vscode/",
)
"""Used when the root has no ``.truss_ignore``; a smaller list than upstream's
``truss/util/.truss_ignore``, which also drops ``build/``, ``lib/``, ``dist/`` and similar names
that training code may legitimately use."""

_IGNORE_HINT = f"list it in {IGNORE_FILE_NAME} (which replaces the built-in ignore list)"
_MAX_PROBLEMS = 25  # a tree with thousands of broken links should not print thousands of lines
_WALK_FACTOR = 10  # the walk stops past this many times max_files: the count said, the walk bounded
_CHUNK = 1 << 20
_GIB = 1024**3
_Ident = tuple[int, int]


class WorkspaceLike(Protocol):
    """The fields of ``truss_train.Workspace`` that the snapshot reads (duck-typed)."""

    @property
    def workspace_root(self) -> str | None: ...

    @property
    def external_dirs(self) -> list[str]: ...

    @property
    def exclude_dirs(self) -> list[str]: ...


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot holds.

    Attributes:
        dest: the published snapshot directory.
        root: the resolved directory whose content forms the snapshot's top level.
        files: number of regular files copied.
        total_bytes: their total size in bytes.
        top_level: sorted names of the snapshot's top-level entries (external dirs included).
        config_subdir: the config file's directory inside the snapshot, as a relative POSIX path
            (``"."`` unless ``workspace_root`` points above it); start commands run from there.
        warnings: one line per thing skipped on purpose (for the CLI to show).
    """

    dest: Path
    root: Path
    files: int
    total_bytes: int
    top_level: tuple[str, ...]
    config_subdir: str = "."
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Entry:
    rel: str  # posix path inside the snapshot
    src: str  # path to read, through any symlinks
    is_dir: bool
    mode: int
    atime_ns: int
    mtime_ns: int
    size: int


@dataclass
class _Layout:
    root: Path
    config_dir: Path
    exclude_names: set[str]
    externals: list[Path]
    warnings: list[str] = field(default_factory=list)


class _SourceProblem(Exception):
    """A source file could not be read during the copy (it changed after the walk)."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def snapshot_config_dir(
    config_path: Path,
    workspace: WorkspaceLike | None,
    dest: Path,
    *,
    max_bytes: int = MAX_SNAPSHOT_BYTES,
    max_files: int = MAX_SNAPSHOT_FILES,
) -> SnapshotInfo:
    """Copy the files a ``truss train push`` of ``config_path`` would upload into ``dest``.

    Args:
        config_path: the config file, as the user gave it (used as the error source).
        workspace: ``TrainingJob.workspace`` or None.
        dest: the snapshot directory to create; it must not exist, its parent must.
        max_bytes: the size limit, checked before copying.
        max_files: the limit on files and directories, checked before copying.

    Returns:
        What was copied.

    Raises:
        SnapshotError: a bad workspace, a file that cannot be copied, or too much data; every
            problem is listed and nothing is left at or beside ``dest``.
        StorageError: ``dest`` exists, or writing the snapshot failed.
    """
    source = str(config_path)
    if os.path.lexists(dest):
        raise StorageError(str(dest), "already exists; refusing to replace it")
    if not dest.parent.is_dir():
        raise StorageError(str(dest.parent), "snapshot parent directory does not exist")
    layout, entries = _plan(config_path, workspace, max_bytes, max_files, _identity(dest.parent))

    for warning in layout.warnings:  # returned to the caller, who shows them; debug log only
        logger.debug("%s: %s", source, warning)
    copied = _build_and_publish(source, entries, dest, max_bytes)
    return SnapshotInfo(
        dest=dest,
        root=layout.root,
        files=sum(1 for e in entries if not e.is_dir),
        total_bytes=copied,
        top_level=tuple(sorted(e.rel for e in entries if "/" not in e.rel)),
        config_subdir=layout.config_dir.relative_to(layout.root).as_posix(),
        warnings=tuple(layout.warnings),
    )


def check_snapshot(config_path: Path, workspace: WorkspaceLike | None, *,
                   max_bytes: int = MAX_SNAPSHOT_BYTES, max_files: int = MAX_SNAPSHOT_FILES) -> SnapshotInfo:
    """Every check :func:`snapshot_config_dir` makes, without copying anything (``--dry-run``).

    Returns:
        What a snapshot would hold (``dest`` is the root: nothing was written).

    Raises:
        SnapshotError: as :func:`snapshot_config_dir`.
    """
    layout, entries = _plan(config_path, workspace, max_bytes, max_files, None)
    return SnapshotInfo(
        dest=layout.root,
        root=layout.root,
        files=sum(1 for e in entries if not e.is_dir),
        total_bytes=sum(e.size for e in entries),
        top_level=tuple(sorted(e.rel for e in entries if "/" not in e.rel)),
        config_subdir=layout.config_dir.relative_to(layout.root).as_posix(),
        warnings=tuple(layout.warnings),
    )


def _plan(config_path: Path, workspace: WorkspaceLike | None, max_bytes: int, max_files: int,
          skip_dir: _Ident | None) -> tuple[_Layout, list[_Entry]]:
    """Resolve the layout and walk it; every problem at once as a SnapshotError.

    Too many entries is the one problem reported alone: the walk stopped early (at ten times the
    limit), so the rest of what it would have found is unknown.
    """
    source = str(config_path)
    layout = _resolve_layout(source, config_path, workspace)
    spec, problems = _load_ignore_spec(layout)
    planner = _Planner(spec, skip_dir, stop_after=_WALK_FACTOR * max_files)
    entries = planner.plan(layout)
    if len(entries) > max_files:
        count = f"more than {len(entries) - 1}" if planner.stopped else str(len(entries))
        raise SnapshotError(source, [Problem("", (
            f"the config folder {layout.root} holds {count} files and directories, over this site's "
            f"limit of {max_files} (max_snapshot_files); use exclude_dirs or a {IGNORE_FILE_NAME} file "
            "to leave some out"))])
    problems += planner.problems
    layout.warnings += planner.warnings
    if planner.total_bytes > max_bytes:
        problems.append(Problem("", _too_big(planner.total_bytes, max_bytes)))
    if len(problems) > _MAX_PROBLEMS:
        more = len(problems) - _MAX_PROBLEMS
        problems = [*problems[:_MAX_PROBLEMS], Problem("", f"... and {more} more problems")]
    if problems:
        raise SnapshotError(source, problems)
    return layout, entries


# --- workspace resolution (upstream semantics) -------------------------------------------------


def _resolve_layout(source: str, config_path: Path, workspace: WorkspaceLike | None) -> _Layout:
    config_dir = Path(os.path.abspath(config_path)).parent.resolve()
    if not config_dir.is_dir():
        raise SnapshotError(source, [Problem("", f"config directory does not exist: {config_dir}")])
    ws_root = workspace.workspace_root if workspace is not None else None
    external_dirs = list(workspace.external_dirs) if workspace is not None else []
    exclude_dirs = list(workspace.exclude_dirs) if workspace is not None else []

    root = config_dir
    if ws_root:
        root = _resolve(ws_root, config_dir)
        if not root.is_dir():
            msg = f"workspace_root is not a directory: {root}"
            raise SnapshotError(source, [Problem("job.workspace.workspace_root", msg)])
        if not config_dir.is_relative_to(root):
            msg = f"source_dir ({config_dir}) must be inside workspace_root ({root})"
            raise SnapshotError(source, [Problem("job.workspace.workspace_root", msg)])

    problems: list[Problem] = []
    exclude_names: set[str] = set()
    for i, raw in enumerate(exclude_dirs):
        resolved = _resolve_keep_name(raw, config_dir)
        loc = f"job.workspace.exclude_dirs[{i}]"
        if not resolved.is_relative_to(root) or resolved == root:
            msg = f"exclude_dir '{raw}' resolves to '{resolved}' which is not inside workspace_root '{root}'."
            problems.append(Problem(loc, msg))
        elif len(resolved.relative_to(root).parts) != 1:
            msg = (
                f"exclude_dir '{raw}' resolves to '{resolved}' which is not a direct child of "
                f"workspace_root '{root}'. Only top-level directories can be excluded."
            )
            problems.append(Problem(loc, msg))
        else:
            exclude_names.add(resolved.name)

    layout = _Layout(root=root, config_dir=config_dir, exclude_names=exclude_names, externals=[])
    try:
        seen = {name for name in os.listdir(root) if name not in exclude_names}
    except OSError as exc:
        raise SnapshotError(source, [Problem("", f"cannot list {root}: {exc.strerror}")]) from exc
    for i, raw in enumerate(external_dirs):
        ext = _resolve(raw, config_dir)
        loc = f"job.workspace.external_dirs[{i}]"
        if ext.is_relative_to(root):
            layout.warnings.append(
                f"external_dir '{ext}' is inside workspace_root. It should be outside workspace_root "
                "or removed from external_dirs. Skipping."
            )
            continue
        if not ext.name:
            problems.append(Problem(loc, f"external_dir has no name to copy it under: {ext}"))
        elif ext.name in seen:
            msg = (
                f"Name collision: '{ext.name}' conflicts with an existing directory or file. "
                "Each external_dir must have a unique name."
            )
            problems.append(Problem(loc, msg))
        elif not ext.exists():
            problems.append(Problem(loc, f"external_dir does not exist: {ext}"))
        elif not ext.is_dir():
            problems.append(Problem(loc, f"external_dir is not a directory: {ext}"))
        else:
            layout.externals.append(ext)
        seen.add(ext.name)
    if problems:
        raise SnapshotError(source, problems)
    return layout


def _resolve(raw: str, base: Path) -> Path:
    """Upstream ``_resolve_path``: relative to the config dir, symlinks resolved."""
    path = Path(raw)
    return (path if path.is_absolute() else base / path).resolve()


def _resolve_keep_name(raw: str, base: Path) -> Path:
    """Like :func:`_resolve` but keep the last component, so a symlinked top-level dir matches."""
    path = Path(raw) if Path(raw).is_absolute() else base / raw
    if path.name in ("", ".", ".."):
        return path.resolve()
    return path.parent.resolve() / path.name


def _load_ignore_spec(layout: _Layout) -> tuple[pathspec.GitIgnoreSpec, list[Problem]]:
    """The root's ``.truss_ignore`` if present (it replaces the defaults), else the defaults."""
    lines: Sequence[str] = DEFAULT_IGNORE_PATTERNS
    ignore_file = layout.root / IGNORE_FILE_NAME
    if IGNORE_FILE_NAME not in layout.exclude_names and ignore_file.is_file():
        try:
            text = ignore_file.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError as exc:
            return _empty_spec(), [Problem("", f"cannot read {ignore_file}: {exc.strerror}")]
        # Upstream strips each line and drops blanks and comments before handing them to pathspec.
        lines = [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines), []
    except (ValueError, TypeError) as exc:
        return _empty_spec(), [Problem("", f"invalid pattern in {ignore_file}: {exc}")]


def _empty_spec() -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines([])


# --- pre-copy walk ---------------------------------------------------------------------------


def _identity(path: Path) -> _Ident | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class _Planner:
    """Walks the sources once, following symlinks, and lists exactly what will be copied."""

    def __init__(self, spec: pathspec.GitIgnoreSpec, skip_dir: _Ident | None, stop_after: int) -> None:
        self.spec = spec
        self.skip_dir = skip_dir
        self.stop_after = stop_after
        self.stopped = False  # the walk ended at stop_after entries, with more left
        self.problems: list[Problem] = []
        self.warnings: list[str] = []
        self.total_bytes = 0

    def plan(self, layout: _Layout) -> list[_Entry]:
        """Entries in pre-order (every directory before its content), sorted by name."""
        root_id = _identity(layout.root)
        ancestors = frozenset({root_id} if root_id else set())
        top: list[tuple[str, str]] = []
        for name in self._list(str(layout.root), "."):
            if name not in layout.exclude_names:
                top.append((name, os.path.join(layout.root, name)))
        top += [(ext.name, str(ext)) for ext in layout.externals]
        stack = [(rel, src, ancestors) for rel, src in sorted(top, reverse=True)]
        entries: list[_Entry] = []
        while stack:
            rel, src, parents = stack.pop()
            entry, ident = self._visit(rel, src, parents)
            if entry is None:
                continue
            entries.append(entry)
            if len(entries) > self.stop_after:
                self.stopped = True
                break
            if entry.is_dir and ident is not None:
                children = sorted(self._list(src, rel), reverse=True)
                inner = parents | {ident}
                stack += [(f"{rel}/{name}", os.path.join(src, name), inner) for name in children]
        return entries

    def _list(self, src: str, rel: str) -> list[str]:
        try:
            return os.listdir(src)
        except OSError as exc:
            self.problems.append(Problem("", f"cannot read directory {rel}: {exc.strerror}"))
            return []

    def _visit(self, rel: str, src: str, parents: frozenset[_Ident]) -> tuple[_Entry | None, _Ident | None]:
        try:
            st = os.stat(src)  # follows symlinks, as upstream's copytree does
        except OSError as exc:
            if self.spec.match_file(rel):
                return None, None
            if exc.errno == errno.ELOOP:
                self.problems.append(Problem("", f"{rel}: symlink loop; {_IGNORE_HINT}"))
            elif exc.errno == errno.ENOENT and os.path.islink(src):
                self.problems.append(
                    Problem("", f"{rel}: broken symlink to {os.readlink(src)}; {_IGNORE_HINT}")
                )
            elif exc.errno != errno.ENOENT:  # vanished since listing: nothing to copy
                self.problems.append(Problem("", f"cannot read {rel}: {exc.strerror}"))
            return None, None
        ident = (st.st_dev, st.st_ino)
        if stat.S_ISDIR(st.st_mode):
            if self.spec.match_file(rel + "/"):
                return None, None
            if ident in parents:
                self.problems.append(
                    Problem(
                        "",
                        f"{rel}: symlink loop (leads back to a parent directory); {_IGNORE_HINT}",
                    )
                )
                return None, None
            if ident == self.skip_dir:
                self.warnings.append(f"{rel}: holds the snapshot destination; not copied")
                return None, None
            return _Entry(rel, src, True, st.st_mode, st.st_atime_ns, st.st_mtime_ns, 0), ident
        if self.spec.match_file(rel):
            return None, None
        if not stat.S_ISREG(st.st_mode):
            self.problems.append(Problem("", f"{rel}: not a regular file or directory; {_IGNORE_HINT}"))
            return None, None
        if not os.access(src, os.R_OK):
            self.problems.append(Problem("", f"{rel}: not readable (permission denied)"))
            return None, None
        self.total_bytes += st.st_size
        return _Entry(rel, src, False, st.st_mode, st.st_atime_ns, st.st_mtime_ns, st.st_size), ident


def _too_big(total: int, limit: int) -> str:
    return (
        f"Workspace size ({_human(total)}) exceeds maximum allowed size ({_human(limit)}). "
        f"Use exclude_dirs or a {IGNORE_FILE_NAME} file to leave out large files or directories."
    )


def _human(n_bytes: int) -> str:
    # Not slurm_bt.units.format_bytes on purpose: this is the upstream truss push message's own
    # wording ("5GB", "5.50GB"), which users and scripts already match on.
    if n_bytes >= _GIB and n_bytes % _GIB == 0:
        return f"{n_bytes // _GIB}GB"
    if n_bytes >= _GIB // 100:
        return f"{n_bytes / _GIB:.2f}GB"
    return f"{n_bytes} bytes"


# --- copy and publish ------------------------------------------------------------------------


def _build_and_publish(source: str, entries: list[_Entry], dest: Path, max_bytes: int) -> int:
    tmp = temp_name(dest)
    try:
        os.mkdir(tmp, 0o700)
    except OSError as exc:
        raise StorageError(str(dest), f"cannot create temp snapshot dir: {exc.strerror}") from exc
    try:
        copied = 0
        for entry in entries:
            target = os.path.join(tmp, entry.rel)
            if entry.is_dir:
                _guard_write(dest, os.mkdir, target, 0o700)
            else:
                copied += _copy_file(entry, target, dest, max_bytes - copied)
        for entry in reversed(entries):  # children before parents, so mtimes stick
            if entry.is_dir:
                target = os.path.join(tmp, entry.rel)
                # Keep the owner's rwx so the snapshot can always be cleaned up later.
                _guard_write(dest, os.chmod, target, (stat.S_IMODE(entry.mode) & 0o777) | 0o700)
                _guard_write(dest, os.utime, target, ns=(entry.atime_ns, entry.mtime_ns))
                fsync_dir(Path(target))
        publish_dir_atomic(tmp, dest)
    except _SourceProblem as exc:
        remove_owned_tree(tmp)
        raise SnapshotError(source, [exc.problem]) from exc
    except BaseException:
        remove_owned_tree(tmp)
        raise
    return copied


def _guard_write(dest: Path, func: Callable[..., object], *args: object, **kwargs: object) -> None:
    """Run one write to the snapshot, turning OSError into StorageError naming ``dest``."""
    try:
        func(*args, **kwargs)
    except OSError as exc:
        raise StorageError(str(dest), f"cannot write snapshot: {exc.strerror}") from exc


def _copy_file(entry: _Entry, target: str, dest: Path, budget: int) -> int:
    """Copy one file with its mode and times; the budget catches files that grew since the walk."""
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO since the walk, open must not hang.
        src_fd = os.open(entry.src, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise _SourceProblem(Problem("", f"cannot read {entry.rel}: {exc.strerror}")) from exc
    try:
        st = os.fstat(src_fd)
        if not stat.S_ISREG(st.st_mode):
            raise _SourceProblem(Problem("", f"{entry.rel}: changed into a non-regular file during the copy"))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            dst_fd = os.open(target, flags, 0o600)
        except OSError as exc:
            raise StorageError(str(dest), f"cannot write snapshot: {exc.strerror}") from exc
        try:
            copied = _pump(entry.rel, src_fd, dst_fd, dest, budget)
            try:
                os.fchmod(dst_fd, stat.S_IMODE(st.st_mode) & 0o777)  # exec bits kept; no setuid
                os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
                os.fsync(dst_fd)
            except OSError as exc:
                raise StorageError(str(dest), f"cannot write snapshot: {exc.strerror}") from exc
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)
    return copied


def _pump(rel: str, src_fd: int, dst_fd: int, dest: Path, budget: int) -> int:
    copied = 0
    while True:
        try:
            chunk = os.read(src_fd, _CHUNK)
        except OSError as exc:
            raise _SourceProblem(Problem("", f"cannot read {rel}: {exc.strerror}")) from exc
        if not chunk:
            return copied
        copied += len(chunk)
        if copied > budget:
            raise _SourceProblem(
                Problem("", f"{rel}: grew during the copy; the snapshot went over the limit")
            )
        view = memoryview(chunk)
        while view:
            try:
                view = view[os.write(dst_fd, view) :]
            except OSError as exc:
                raise StorageError(str(dest), f"cannot write snapshot: {exc.strerror}") from exc


