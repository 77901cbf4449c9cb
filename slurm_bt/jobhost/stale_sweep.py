"""Remove scratch left by jobs whose epilog never ran (compute node, root, called by the prolog).

Why: when a node crashes or is rebooted mid-job, Slurm never runs that job's epilog, and its
``<scratch root>/<job id>`` stays on the node-local disk for ever (docs/footguns.md, "Scratch of a crashed node").
The next prolog on the node removes such directories, bounded in time, and never an active job's.

"Active" is decided from facts root wrote itself, never from anything a user controls:

* the prolog's first step creates ``<state root>/<node>/jobs/<job id>`` (:mod:`slurm_bt.posix.job_notes`) and the
  epilog removes it only after scratch, so every job between its prolog and the end of its epilog
  has that note; the state root is on tmpfs (``/run``), so a reboot clears the notes of exactly the
  jobs whose epilog never ran;
* the directory must also be older than ``stale_scratch_after_s`` (hooks.toml, default one hour;
  ``0`` turns the sweep off), which covers the instant between a requeued job's note reset and its
  new scratch;
* directories whose checkpoints the epilog kept for a hand-off (``.slurm-bt-handoff/<job>.json``)
  are left alone until that record is older than hooks.toml ``[handoff] max_age_s`` (then they and
  the record go: a hand-off that never completes must not hold the node's disk for ever), as are
  the current job, names that are not job ids, and anything not a directory.

Removal is the epilog's (:func:`~slurm_bt.posix.safefs.remove_tree_at`): fd-relative, never follows
a symlink, never crosses a mount point, stops at its deadline (the rest goes on the next prolog).

The same goes for the job user's runtime directories ``<runtime root>/slurm-bt-<uid>/<job id>``
(:func:`sweep_stale_runtime`, per-node env files with resolved secrets): tmpfs, so only a slurmd
crash without a reboot leaves them; "active" there means a note on *any* node of the host, because
the runtime root is per host (the dev cluster's n1 and n2 share one ``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Iterator

from slurm_bt.jobhost.context import HookContext
from slurm_bt.node.job_paths import HANDOFF_RECORDS_DIR
from slurm_bt.posix.job_notes import jobs_on_host
from slurm_bt.posix.mountinfo import mount_points_below
from slurm_bt.posix.safefs import remove_tree_at

__all__ = ["sweep_stale_runtime", "sweep_stale_scratch"]

#: Most of a prolog's time belongs to the job it prepares: the sweep gets at most this much.
SWEEP_BUDGET_S = 5.0


def _mtime(path: str, default: float) -> float:
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except OSError:
        return default


def _names(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return set()


def _stale_dirs(ctx: HookContext, dir_fd: int, names: list[str], skip: set[str], min_age: float, now: float,
                deadline: float) -> Iterator[str]:
    """The entries of ``dir_fd`` named like a job id (not this job's, not in ``skip``) that are real
    directories unchanged for ``min_age`` seconds, until ``deadline`` (logged when it cuts the sweep)."""
    for name in names:
        if not (name.isascii() and name.isdigit()) or name == ctx.env.job_id or name in skip:
            continue
        if time.monotonic() >= deadline:
            ctx.log.info("stale directory sweep: out of time, the next prolog continues")
            return
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and now - st.st_mtime >= min_age:
            yield name


def sweep_stale_scratch(ctx: HookContext, root_fd: int, root: str) -> list[str]:
    """Remove stale job directories under the scratch root open at ``root_fd``; return their names."""
    min_age = ctx.settings.stale_scratch_after_s
    if min_age <= 0:
        return []
    active = _names(f"{ctx.state_root}/{ctx.env.node}/jobs")
    now = time.time()
    records = f"{root}/{HANDOFF_RECORDS_DIR}"
    # Kept checkpoints are bounded like the hand-off area's (hooks.toml [handoff] max_age_s): a
    # hand-off that never completes must not hold the job's data on the node for ever.
    expired = {n.removesuffix(".json") for n in _names(records)
               if _mtime(f"{records}/{n}", now) < now - ctx.settings.handoff.max_age_s}
    kept = {n.removesuffix(".json") for n in _names(records)} - expired
    deadline = min(time.monotonic() + SWEEP_BUDGET_S, ctx.deadline - 5.0)
    swept: list[str] = []
    for name in _stale_dirs(ctx, root_fd, sorted(os.listdir(root_fd)), active | kept, min_age, now, deadline):
        report = remove_tree_at(root_fd, name, deadline=deadline, mount_points=mount_points_below(f"{root}/{name}"))
        swept.append(name)
        if name in expired:
            with contextlib.suppress(OSError):
                os.unlink(f"{records}/{name}.json")
        why = "kept for a hand-off past max_age_s" if name in expired else "no job on this node, epilog never ran"
        ctx.log.info(f"stale scratch {root}/{name} ({why}): removed "
                     f"files={report.files} dirs={report.dirs}"
                     + (f", {len(report.leftovers)} left" if report.leftovers else ""))
    return swept


def sweep_stale_runtime(ctx: HookContext, user_fd: int, path: str) -> list[str]:
    """Remove stale job directories in the job user's runtime directory (open at ``user_fd``); return them.

    ``user_fd`` must be the user's own real directory (the prolog just created or adopted it).
    """
    min_age = ctx.settings.stale_scratch_after_s
    if min_age <= 0:
        return []
    active = jobs_on_host(ctx.state_root)
    deadline = min(time.monotonic() + SWEEP_BUDGET_S / 2, ctx.deadline - 5.0)
    now = time.time()
    swept: list[str] = []
    for name in _stale_dirs(ctx, user_fd, sorted(os.listdir(user_fd))[:10000], active, min_age, now, deadline):
        report = remove_tree_at(user_fd, name, deadline=deadline)
        swept.append(name)
        ctx.log.info(f"stale runtime directory {path}/{name} (no job on this host, epilog never ran): removed "
                     f"files={report.files} dirs={report.dirs}"
                     + (f", {len(report.leftovers)} left" if report.leftovers else ""))
    return swept
