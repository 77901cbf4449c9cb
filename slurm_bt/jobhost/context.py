"""What a root hook step gets and may raise: the trusted job, the policy, the site, the log, the deadline.

The prolog and epilog (:mod:`slurm_bt.hooks.runner`) build one :class:`HookContext` per run and
hand it to the host features they call (:mod:`slurm_bt.jobhost.runtime_dirs`,
:mod:`slurm_bt.jobhost.stale_sweep`, :mod:`slurm_bt.weights.tier_dirs`...). It lives below the hooks
so that those features never import the entry points. What they raise is in :mod:`slurm_bt.errors`:
:class:`~slurm_bt.errors.HookUserError` fails the job (prolog exit 0), :class:`~slurm_bt.errors.NodeFault`
drains the node, as the runner's exit policy says.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.job_notes import STATE_ROOT
from slurm_bt.posix.safefs import ensure_dir_at, open_trusted_dir
from slurm_bt.site.hook_settings import HookSettings
from slurm_bt.site.settings import SiteSettings

__all__ = ["HookContext", "HookLog"]


class HookLog:
    """Append-only, root-owned log: one ``os.write`` per record, so concurrent hooks do not interleave.

    If the log cannot be opened the records go to stderr, which slurmd keeps only at debug level on
    success but at error level on failure (docs/footguns.md).
    """

    def __init__(self, path: str, tag: str) -> None:
        self.tag = tag
        self.fd = 2
        try:
            self.fd = _open_log(path)
        except OSError as exc:
            self.fd = 2
            self.write("WARN", f"cannot open log {path}: {exc}; logging to stderr")

    def write(self, level: str, message: str) -> None:
        """Write one record (multi-line messages stay one write)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        line = f"{stamp} {level} {self.tag} {message}".rstrip() + "\n"
        try:
            os.write(self.fd, line.encode("utf-8", "replace"))
        except OSError:
            pass

    def info(self, message: str) -> None:
        """An INFO record."""
        self.write("INFO", message)

    def warning(self, message: str) -> None:
        """A WARN record."""
        self.write("WARN", message)

    def error(self, message: str) -> None:
        """An ERROR record."""
        self.write("ERROR", message)

    def close(self) -> None:
        """Close the log file (not stderr)."""
        if self.fd > 2:
            os.close(self.fd)
            self.fd = 2


def _open_log(path: str) -> int:
    parent, _, name = path.rpartition("/")
    grand, _, leaf = parent.rpartition("/")
    gfd = open_trusted_dir(grand or "/")
    try:
        dfd, _ = ensure_dir_at(gfd, leaf, uid=0, gid=0, mode=0o700)
    finally:
        os.close(gfd)
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(name, flags, 0o600, dir_fd=dfd)
    finally:
        os.close(dfd)


@dataclass
class HookContext:
    """What a hook body gets.

    Attributes:
        env: the trusted job identity.
        settings: the hook policy.
        site: the site settings (storage roots).
        log: the hook log.
        started: ``time.monotonic()`` at start.
        deadline: ``time.monotonic()`` value of the internal deadline.
        state_root: root of the job-keyed notes (``/run/slurm-bt``; tests override it).
        site_path: the ``--site`` file the wrapper named (``None``: the default site file); passed
            on to the features the hook calls so that they read the same storage roots as the hook itself.
        phase: the current phase, named in deadline and crash reports.
        notes: short facts logged in the final line (``scratch=created`` ...).
    """

    env: SlurmHookEnv
    settings: HookSettings
    site: SiteSettings
    log: HookLog
    started: float
    deadline: float
    state_root: str = STATE_ROOT
    site_path: str | None = None
    phase: str = "start"
    notes: list[str] = field(default_factory=list)

    def remaining(self) -> float:
        """Seconds left before the internal deadline."""
        return self.deadline - time.monotonic()

    def budget(self, want_s: float, reserve_s: float = 5.0) -> float:
        """``want_s`` capped so that ``reserve_s`` stays for the rest of the hook (never negative)."""
        return max(0.0, min(want_s, self.remaining() - reserve_s))
