"""The job-keyed hand-off between the root prolog and the job's step 1 (``slurm_bt.steps.prepare``).

Why a file: a prolog that exits non-zero drains the node and requeues the job held
(docs/footguns.md), so a problem the *user* caused must instead exit 0 and still make the job fail
with a readable reason. Hooks may not call Slurm commands, so the prolog leaves a
root-owned note per node and job, and step 1 of every slurm-bt job reads it before anything else:

    /run/slurm-bt/<node>/jobs/<job_id>/            0750 root:<job gid>
        prolog-error    0640  one line: why the prolog refused this job -> step 1 exits 1 with it
        prolog.json     0640  what the prolog prepared (team group, cache paths): trusted facts
                              that step 1 uses instead of recomputing them from user input

``<node>`` is in the path because a host may run several slurmds (the dev cluster's ``--host-nodes``
layout runs two). ``/run`` is cleared
at boot, which is right: the notes only matter while the job runs. The prolog clears the job's
directory first (a requeued job starts clean) and the epilog removes it.

The reader side (:func:`read_hook_state`) runs as the job user; the writer side (:class:`JobStateDir`,
:func:`open_node_state`) is the prolog's and epilog's (root). Every directory on the way is created
fd-relative from a trusted parent (``/run`` by default) and refused if something other than root made
it, so a user can neither pre-create nor redirect the place where root writes a job's notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.safefs import ensure_dir_at, open_trusted_dir, remove_tree_at, write_file_at
from slurm_bt.trusted_files import read_trusted_file

__all__ = [
    "PROLOG_ERROR",
    "PROLOG_RECORD",
    "STATE_ROOT",
    "HookState",
    "JobStateDir",
    "has_job_note",
    "job_state_path",
    "jobs_on_host",
    "open_node_state",
    "read_hook_state",
]

STATE_ROOT = "/run/slurm-bt"
PROLOG_ERROR = "prolog-error"
PROLOG_RECORD = "prolog.json"
_MAX_NOTE = 64 * 1024


@dataclass(frozen=True)
class HookState:
    """What the prolog left for a job on one node.

    Attributes:
        error: the reason the prolog refused the job, or None.
        record: the prolog's record (``team``, ``project_cache``, ``team_cache``...), or None when
            no prolog prepared this job (then step 1 falls back to preparing everything itself).
    """

    error: str | None
    record: dict[str, Any] | None


def job_state_path(node: str, job_id: str, root: str = STATE_ROOT) -> str:
    """``<root>/<node>/jobs/<job_id>``."""
    return f"{root}/{node}/jobs/{job_id}"


def jobs_on_host(root: str = STATE_ROOT) -> set[str]:
    """Every job with notes under ``root``, on every node of this host: the jobs between their prolog and
    the end of their epilog here. Root-written facts (the state root is root's, module docstring), so
    the hooks may trust them; names that are not job ids are skipped. Never truncated: callers remove
    what is *not* in this set."""
    out: set[str] = set()
    with contextlib.suppress(OSError):
        for node in os.listdir(root):
            with contextlib.suppress(OSError):
                out.update(n for n in os.listdir(f"{root}/{node}/jobs") if n.isascii() and n.isdigit())
    return out


def has_job_note(job_id: str, root: str = STATE_ROOT) -> bool:
    """Whether any node of this host has notes for ``job_id`` now."""
    with contextlib.suppress(OSError):
        return any(os.path.lexists(job_state_path(node, job_id, root)) for node in os.listdir(root))
    return False


def _read_root_note(path: str) -> bytes | None:
    """A small file that only root could have written, or None (absent, or not trustworthy)."""
    return read_trusted_file(path, max_bytes=_MAX_NOTE)


def read_hook_state(node: str, job_id: str, root: str = STATE_ROOT) -> HookState:
    """Read the prolog's notes for ``job_id`` on ``node`` (as the job user)."""
    base = job_state_path(node, job_id, root)
    raw_error = _read_root_note(f"{base}/{PROLOG_ERROR}")
    error = None
    if raw_error is not None:
        error = " ".join(raw_error.decode("utf-8", "replace").split()) or "refused (no reason recorded)"
    record = None
    raw = _read_root_note(f"{base}/{PROLOG_RECORD}")
    if raw is not None:
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        record = value if isinstance(value, dict) else None
    return HookState(error=error, record=record)


# -- root side (prolog, epilog) ----------------------------------------------------------------------


def open_node_state(node: str, root: str = STATE_ROOT) -> int:
    """Descriptor of ``<root>/<node>`` (0755 root), created if missing."""
    parent, _, leaf = root.rstrip("/").rpartition("/")
    pfd = open_trusted_dir(parent or "/")
    try:
        rfd, _ = ensure_dir_at(pfd, leaf, uid=0, gid=0, mode=0o755)
    finally:
        os.close(pfd)
    try:
        nfd, _ = ensure_dir_at(rfd, node, uid=0, gid=0, mode=0o755)
    finally:
        os.close(rfd)
    return nfd


class JobStateDir:
    """``<root>/<node>/jobs/<job_id>`` for one job (module docstring)."""

    def __init__(self, env: SlurmHookEnv, root: str = STATE_ROOT) -> None:
        self.env = env
        self.root = root

    @contextlib.contextmanager
    def _jobs_fd(self) -> Any:
        nfd = open_node_state(self.env.node, self.root)
        try:
            jfd, _ = ensure_dir_at(nfd, "jobs", uid=0, gid=0, mode=0o755)
        finally:
            os.close(nfd)
        try:
            yield jfd
        finally:
            os.close(jfd)

    def _job_fd(self, jobs_fd: int) -> int:
        fd, _ = ensure_dir_at(jobs_fd, self.env.job_id, uid=0, gid=self.env.gid, mode=0o750)
        return fd

    def reset(self) -> None:
        """Start clean: a requeued job must not see the notes of its previous run on this node."""
        self.remove()
        with self._jobs_fd() as jfd:
            os.close(self._job_fd(jfd))

    def _write(self, name: str, data: bytes) -> None:
        with self._jobs_fd() as jfd:
            fd = self._job_fd(jfd)
            try:
                write_file_at(fd, name, data, uid=0, gid=self.env.gid, mode=0o640)
            finally:
                os.close(fd)

    def write_error(self, reason: str) -> None:
        """Record why the prolog refused the job (one line, read and printed by step 1)."""
        self._write(PROLOG_ERROR, (" ".join(reason.split())[:4000] + "\n").encode())

    def write_record(self, record: dict[str, Any]) -> None:
        """Record what the prolog prepared (trusted facts for step 1)."""
        body = {"job_id": self.env.job_id, "node": self.env.node, "uid": self.env.uid,
                "written_at": int(time.time()), **record}
        self._write(PROLOG_RECORD, json.dumps(body, sort_keys=True).encode())

    def remove(self, deadline: float | None = None) -> None:
        """Remove the job's notes (epilog; idempotent)."""
        try:
            with self._jobs_fd() as jfd:
                remove_tree_at(jfd, self.env.job_id, deadline=deadline)
        except FileNotFoundError:
            pass
