"""Root side of the prolog → step 1 hand-off (format and reader: :mod:`slurm_bt.hooks.status`).

Every directory on the way is created fd-relative from a trusted parent (``/run`` by default) and
refused if something other than root made it, so a user can neither pre-create nor redirect the
place where root writes a job's notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from slurm_bt.hooks.env import SlurmHookEnv
from slurm_bt.hooks.safefs import ensure_dir_at, open_trusted_dir, remove_tree_at, write_file_at
from slurm_bt.hooks.status import PROLOG_ERROR, PROLOG_RECORD, STATE_ROOT

__all__ = ["JobStateDir", "open_node_state"]


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
    """``<root>/<node>/jobs/<job_id>`` for one job (see :mod:`slurm_bt.hooks.status`)."""

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
