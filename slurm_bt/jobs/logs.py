"""Read and follow a job's output files, every line tagged with the node it came from.

Layout (``slurm_bt/render/batch_script.py``): ``<job_dir>/logs/slurm-<jobid>.out`` is the batch
step and ``slurm-<jobid>.node<rank>.out`` one file per node. Files are read directly from the shared
filesystem: following output costs the controller nothing; only the job's *state* is polled (one
sacct call per poll, with back-off, :mod:`slurm_bt.jobs.poll`) to know when to stop.

Privacy: the job directory comes from the caller's own submission record, and a file is read only
if it is a regular file owned by the caller, opened without following symlinks. So ``slurm-bt logs``
run as root never reads another user's output on their behalf, and a symlink planted in a log
directory cannot make it read something else.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_bt.jobs.poll import FOLLOW_BACKOFF, Backoff, FailureBudget

__all__ = ["LogLine", "LogReader", "follow_logs", "log_sources"]

_CHUNK = 64 * 1024
_MAX_LINE = 1024 * 1024  # a line longer than this is emitted in pieces, never buffered forever


@dataclass(frozen=True)
class LogLine:
    """One line of job output.

    Attributes:
        tag: ``"batch"`` or ``"node <rank>"``.
        node: the node rank, ``None`` for the batch step.
        text: the line without its newline.
    """

    tag: str
    node: int | None
    text: str

    def render(self) -> str:
        """``[node 0] text``: the tagged form the CLI prints."""
        return f"[{self.tag}] {self.text}"


def log_sources(job_dir: Path, job_id: str, node: int | None = None) -> list[tuple[str, int | None, Path]]:
    """The output files of ``job_id`` that exist now: batch first, then nodes by rank.

    Args:
        job_dir: the job directory from the submission record.
        job_id: the Slurm job id (the ``%j`` of the file names).
        node: only this node rank's file (the batch step is then left out).
    """
    logs = job_dir / "logs"
    out: list[tuple[str, int | None, Path]] = []
    try:
        names = os.listdir(logs)
    except OSError:
        return out
    node_re = re.compile(rf"^slurm-{re.escape(job_id)}\.node([0-9]+)\.out$")
    nodes: list[tuple[int, Path]] = []
    for name in names:
        m = node_re.match(name)
        if m:
            nodes.append((int(m.group(1)), logs / name))
    if node is None and f"slurm-{job_id}.out" in names:
        out.append(("batch", None, logs / f"slurm-{job_id}.out"))
    out += [(f"node {rank}", rank, path) for rank, path in sorted(nodes) if node is None or rank == node]
    return out


@dataclass
class _Source:
    tag: str
    node: int | None
    path: Path
    offset: int = 0
    partial: str = ""
    started: bool = False


@dataclass
class LogReader:
    """Incremental reader of all of a job's output files (new files are picked up as they appear).

    Args:
        job_dir: the job directory (from the caller's record).
        job_id: the job id.
        node: only this node rank.
        tail: on first sight of each file, start with its last ``tail`` lines (``None``: all).
        uid: the only owner whose files are read (default: the caller's effective uid).
    """

    job_dir: Path
    job_id: str
    node: int | None = None
    tail: int | None = None
    uid: int = field(default_factory=os.geteuid)
    warnings: list[str] = field(default_factory=list)
    _sources: dict[Path, _Source] = field(default_factory=dict, init=False, repr=False)
    _refused: set[Path] = field(default_factory=set, init=False, repr=False)

    def read(self) -> list[LogLine]:
        """Every complete line written since the last call, file by file."""
        for tag, rank, path in log_sources(self.job_dir, self.job_id, self.node):
            if path not in self._sources:
                self._sources[path] = _Source(tag, rank, path)
        out: list[LogLine] = []
        for src in self._sources.values():
            out += self._read_source(src)
        return out

    def flush(self) -> list[LogLine]:
        """Lines still missing their newline (the job ended mid-line)."""
        out = []
        for src in self._sources.values():
            if src.partial:
                out.append(LogLine(src.tag, src.node, src.partial))
                src.partial = ""
        return out

    def _open(self, path: Path) -> int | None:
        if path in self._refused:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._refuse(path, "is a symlink")
            elif exc.errno != errno.ENOENT:
                self._refuse(path, exc.strerror or "cannot be opened")
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid:
            os.close(fd)
            self._refuse(path, "is not a regular file owned by you")
            return None
        return fd

    def _refuse(self, path: Path, why: str) -> None:
        self._refused.add(path)
        self.warnings.append(f"not reading {path}: {why}")

    def _read_source(self, src: _Source) -> list[LogLine]:
        fd = self._open(src.path)
        if fd is None:
            return []
        try:
            size = os.fstat(fd).st_size
            if size < src.offset:  # truncated (or replaced): start over
                src.offset, src.partial = 0, ""
            if not src.started:
                src.started = True
                if self.tail is not None:
                    src.offset = _tail_offset(fd, size, self.tail)
            if size == src.offset:
                return []
            os.lseek(fd, src.offset, os.SEEK_SET)
            data = b""
            while src.offset + len(data) < size:
                chunk = os.read(fd, min(_CHUNK * 16, size - src.offset - len(data)))
                if not chunk:
                    break
                data += chunk
        finally:
            os.close(fd)
        src.offset += len(data)
        text = src.partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        src.partial = lines.pop()
        if len(src.partial) > _MAX_LINE:
            lines.append(src.partial)
            src.partial = ""
        return [LogLine(src.tag, src.node, line.rstrip("\r")) for line in lines]


def _tail_offset(fd: int, size: int, lines: int) -> int:
    """Offset where the last ``lines`` lines of the file start (reads backwards in chunks)."""
    if lines <= 0:
        return size
    pos, newlines = size, 0
    # A trailing newline ends the last line; it does not start another one.
    skip_last = True
    while pos > 0:
        start = max(0, pos - _CHUNK)
        os.lseek(fd, start, os.SEEK_SET)
        chunk = os.read(fd, pos - start)
        for i in range(len(chunk) - 1, -1, -1):
            if chunk[i] == 0x0A:
                if skip_last and start + i == size - 1:
                    continue
                newlines += 1
                if newlines == lines:
                    return start + i + 1
        skip_last = False
        pos = start
    return 0


def follow_logs(
    reader: LogReader,
    poll_status: Callable[[], tuple[bool, str | None, str]],
    *,
    emit: Callable[[LogLine], None],
    on_warning: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    file_interval_s: float = 0.5,
    backoff: Backoff | None = None,
    budget: FailureBudget | None = None,
    final_grace_s: float = 1.0,
) -> None:
    """Print new lines as they are written until the job is over.

    Args:
        reader: the job's log reader.
        poll_status: one batched status query: returns ``(terminal, error, state)``; ``error`` is
            the failure text when Slurm could not be asked, ``state`` a short text that changes
            when the job's state does. Called on the back-off schedule only.
        emit: prints one line.
        on_warning: prints one warning.
        sleep, clock: injectable for tests.
        file_interval_s: how often the files are read (no Slurm call involved).
        backoff: status poll schedule; default :data:`~slurm_bt.jobs.poll.FOLLOW_BACKOFF`. Reset
            when the state changes (a job that just changed is likely to change again soon), but
            not on output: a chatty job must not make the follower poll the controller faster.
        budget: consecutive status failures tolerated; the last error is raised as
            :class:`~slurm_bt.errors.RuntimeFailure` when exhausted.
        final_grace_s: after the job ends, read once more after this long (output written by the
            last step can reach the shared filesystem after the job's end record).
    """
    from slurm_bt.errors import RuntimeFailure

    backoff = backoff or Backoff(*FOLLOW_BACKOFF)
    budget = budget or FailureBudget()
    next_poll = clock()
    warned = 0
    last_state: str | None = None
    while True:
        got = reader.read()
        for line in got:
            emit(line)
        for warning in reader.warnings[warned:]:
            on_warning(warning)
        warned = len(reader.warnings)
        if clock() >= next_poll:
            terminal, error, state = poll_status()
            if error is not None:
                if not budget.failed(error):
                    raise RuntimeFailure(f"giving up following logs: {error}")
                on_warning(budget.warning())
            else:
                budget.succeeded()
                if last_state is not None and state != last_state:
                    backoff.reset()
                last_state = state
                if terminal:
                    sleep(final_grace_s)
                    for line in reader.read() + reader.flush():
                        emit(line)
                    return
            next_poll = clock() + backoff.next()
        sleep(file_interval_s)
