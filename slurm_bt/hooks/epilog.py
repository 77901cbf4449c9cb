"""The slurm-bt Epilog (root, every node of the job): flush, release, clean up. Idempotent.

``python -I -m slurm_bt.hooks.epilog [--config hooks.toml] [--site site.toml]``; the contract is
``epilog/README.md``. It also runs after a failed or half-finished prolog, and may run twice, so
every step accepts "already done" and "never started":

1. checkpoint flush (:mod:`slurm_bt.checkpoints.flush`, in a bounded child); unless it confirms
   *every* checkpoint uploaded, the job's ``mnt/checkpoints`` stays on the node as the hand-off directory, recorded in
   ``<scratch root>/.slurm-bt-handoff/<job id>.json`` for an admin (never a drain);
2. node-cache lease release and LRU (:mod:`slurm_bt.weights.node_stage`, bounded children);
3. scratch removal: fd-relative, never following a symlink, never crossing a filesystem or mount
   point, surviving concurrent swaps; leftovers are logged, not drained;
4. removal of the job's notes under ``/run/slurm-bt/<node>/jobs/<id>``.

Before all of these it ends the user's processes that outlived the job on this host, when the user
has no other job here (:mod:`slurm_bt.jobhost.leftovers`: the notes of every node on the host decide, signals go
through pidfds after a start-time check, never to root or system users, bounded), then removes the
job's runtime directory ``<runtime root>/slurm-bt-<uid>/<id>`` (per-node env files with resolved
secrets: also when the job ended between step 1 and step 2) the same fd-relative way as scratch
(:mod:`slurm_bt.jobhost.runtime_dirs`), first so that nothing slow or faulting later can leave the secrets behind.

Only an unusable scratch root (missing after the prolog made it, unsafe ownership, I/O errors)
exits non-zero.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from slurm_bt.checkpoints.locations import CHECKPOINT_REL, HANDOFF_RECORDS_DIR
from slurm_bt.errors import NodeFault
from slurm_bt.hooks.runner import run_hook
from slurm_bt.jobhost.context import HookContext
from slurm_bt.jobhost.leftovers import end_leftover_processes, mark_job_ending, other_jobs_of_user, summary
from slurm_bt.jobhost.runtime_dirs import remove_job_runtime_dir
from slurm_bt.posix.job_notes import STATE_ROOT, JobStateDir
from slurm_bt.posix.mountinfo import mount_points_below
from slurm_bt.posix.privdrop import ChildError, run_in_child
from slurm_bt.posix.safefs import (
    UnsafeEntry,
    UntrustedPath,
    ensure_dir_at,
    open_trusted_dir,
    remove_tree_at,
    walk_dirs,
    write_file_at,
)
from slurm_bt.site.settings import SiteSettings, expand_path

__all__ = ["PROCESS_BUDGET_S", "bounded_call", "checkpoint_flush", "end_processes",
           "epilog_body", "main", "node_cache_lru", "node_cache_release", "remove_scratch"]

PROCESS_BUDGET_S = 10.0
"""At most this much of the epilog ends leftover processes (SIGTERM grace, then SIGKILL rounds)."""


def _has_checkpoints(root_fd: int, job_id: str) -> bool:
    """True if ``<job>/mnt/checkpoints`` is a real, non-empty directory (checked without following)."""
    try:
        fd = walk_dirs("/".join((job_id, *CHECKPOINT_REL)), at=root_fd,
                       flags=os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                       refuse=lambda _shown, why: OSError(errno.ELOOP, why))
    except OSError:
        return False
    try:
        return bool(os.listdir(fd))
    except OSError:
        return False
    finally:
        os.close(fd)


def _write_handoff(ctx: HookContext, root_fd: int, root: str, kept: list[str]) -> None:
    env = ctx.env
    try:
        hfd, _ = ensure_dir_at(root_fd, HANDOFF_RECORDS_DIR, uid=0, gid=0, mode=0o755)
    except UnsafeEntry as exc:
        ctx.log.error(f"hand-off directory {root}/{HANDOFF_RECORDS_DIR} {exc.reason}; not recording hand-off")
        return
    try:
        body = {"job_id": env.job_id, "user": env.user, "uid": env.uid, "node": env.node,
                "paths": [f"{root}/{env.job_id}/{k}" for k in kept], "reason": "checkpoint upload not confirmed",
                "recorded_at": int(time.time())}
        write_file_at(hfd, f"{env.job_id}.json", json.dumps(body, sort_keys=True).encode() + b"\n", mode=0o644)
    finally:
        os.close(hfd)


def remove_scratch(ctx: HookContext, *, keep_checkpoints: bool) -> None:
    """Remove ``<scratch root>/<job id>`` safely, keeping unconfirmed checkpoints if asked."""
    env = ctx.env
    root = expand_path(ctx.site.storage.scratch, user=env.user, uid=env.uid, home=env.home, node=env.node)
    try:
        fd = open_trusted_dir(root, allow_sticky_final=True)
    except FileNotFoundError:
        ctx.notes.append("scratch root absent")
        return
    except UntrustedPath as exc:
        raise NodeFault(f"scratch root is unsafe: {exc}", f"chown root:root and chmod go-w {root}") from None
    try:
        try:
            st = os.stat(env.job_id, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            ctx.notes.append("scratch=absent")
            return
        keep: frozenset[tuple[str, ...]] = frozenset()
        if stat.S_ISDIR(st.st_mode) and keep_checkpoints and _has_checkpoints(fd, env.job_id):
            keep = frozenset({CHECKPOINT_REL})
        path = f"{os.path.realpath(root)}/{env.job_id}"
        report = remove_tree_at(fd, env.job_id, deadline=ctx.deadline - 3.0, keep=keep,
                                mount_points=mount_points_below(path))
        ctx.notes.append(f"scratch removed files={report.files} dirs={report.dirs}")
        if report.kept:
            ctx.notes.append("kept " + ",".join(report.kept))
            _write_handoff(ctx, fd, root, report.kept)
        for rel, reason in report.leftovers[:20]:
            ctx.log.warning(f"scratch leftover {path}/{rel}: {reason}")
        if len(report.leftovers) > 20:
            ctx.log.warning(f"... and {len(report.leftovers) - 20} more leftovers under {path}")
        io_errors = [r for _, r in report.leftovers if r in (os.strerror(errno.EIO), os.strerror(errno.EROFS))]
        if io_errors:
            raise NodeFault(f"cannot remove scratch {path}: {io_errors[0]}", "check the node-local disk")
    finally:
        os.close(fd)


def end_processes(ctx: HookContext) -> None:
    """End the job user's processes that outlived the job here, unless the user has another job on the host.

    First the job's notes get the "epilog started" mark, so that the epilog of another job of the
    same user ending at the same time does not count this job as still running (and vice versa).
    """
    env = ctx.env
    if env.context != "epilog_slurmd" or ctx.state_root != STATE_ROOT:
        # Only slurmd's epilog with the host's notes root sweeps: "no other job on this host" is
        # known only from the notes every prolog here writes (a hand-run epilog, epilog/README.md,
        # or an in-process test with its own notes root cannot vouch for that).
        ctx.notes.append("processes: not swept (not slurmd's epilog)")
        return
    try:
        mark_job_ending(ctx.state_root, env.node, env.job_id, env.gid)
    except OSError as exc:  # only makes a concurrent epilog more careful
        ctx.log.warning(f"cannot mark the job's notes as ending: {exc}")
    report = end_leftover_processes(env.uid, env.job_id, state_root=ctx.state_root, log=ctx.log.warning,
                                    deadline=time.monotonic() + ctx.budget(PROCESS_BUDGET_S, reserve_s=30.0))
    if report.other_jobs or report.terminated or report.killed or report.left:
        ctx.notes.append(summary(report))


# -- the features the epilog calls -------------------------------------------------------------------
# Each runs in a forked child (as root) with a hard time budget, so a hang, a crash or a heavy import
# costs at most that budget and never the epilog's own deadline. The features are imported in the
# child by plain import: a missing or broken module is an error in the hook log, never a silent no-op.
# Every one of them gets the site this hook run loaded (``ctx.site``) and no other.


def checkpoint_flush(environ: Mapping[str, str], deadline_s: float, site: SiteSettings) -> object:
    """Upload what the job left in its checkpoint directory (:mod:`slurm_bt.checkpoints.flush`)."""
    from slurm_bt.checkpoints.flush import flush_job_checkpoints

    return flush_job_checkpoints(environ, deadline_s, site=site)


def node_cache_release(environ: Mapping[str, str], deadline_s: float, site: SiteSettings) -> object:
    """Unlink the job's weights views and drop its node-cache leases (:mod:`slurm_bt.weights.node_stage`)."""
    from slurm_bt.weights.node_stage import epilog_release_leases

    epilog_release_leases(environ, deadline_s, site)
    return None


def node_cache_lru(environ: Mapping[str, str], deadline_s: float, site: SiteSettings) -> object:
    """Drop crashed jobs' leases, then evict lease-free node-cache entries, least recently used first
    (:mod:`slurm_bt.weights.node_stage`); the pruned leases go to the hook log."""
    from slurm_bt.weights.node_stage import epilog_enforce_lru

    pruned = epilog_enforce_lru(environ, deadline_s, site)
    if not pruned:
        return None
    return f"{len(pruned)} lease(s) of jobs whose epilog never ran dropped: " + " ".join(
        f"{entry}:{job}" for entry, job in pruned[:20])


def bounded_call(ctx: HookContext, what: str, fn: Callable[[Mapping[str, str], float, SiteSettings], object],
                 budget_s: float) -> tuple[bool, Any]:
    """Call ``fn(environ, deadline_s, site)`` in a bounded child (see above); ``what`` names it in the log.

    Returns:
        ``(called, result)``: ``called`` is False when it got no time; ``result`` is
        ``{"status": ..., "message": ...}`` for results with a ``status`` attribute, else the plain
        JSON value (None on failure, which is logged).
    """
    if budget_s <= 1:
        ctx.log.warning(f"{what}: skipped, no time left")
        return False, None
    env, site = ctx.env, ctx.site

    def call() -> Any:
        result = fn(env.to_environ(), budget_s - 1, site)
        if result is None or isinstance(result, (bool, int, float, str)):
            return {"value": result}
        return {"status": str(getattr(result, "status", "")), "message": str(getattr(result, "message", ""))[:500]}

    try:
        result = run_in_child(call, timeout_s=budget_s)
    except ChildError as exc:
        ctx.log.error(f"{what}: {exc.kind}: {exc.exc_type or ''} {exc}".rstrip())
        return True, None
    if not isinstance(result, dict):
        return True, None
    if result.get("status"):
        ctx.log.info(f"{what}: {result['status']}: {result.get('message', '')}".rstrip(": "))
        return True, result
    return True, result.get("value")


def flush_checkpoints(ctx: HookContext, budget_s: float) -> str:
    """The flush's status: ``"done"`` only if it confirmed every checkpoint of the job uploaded.

    ``"handed-off"`` means the rest was moved to the hand-off area (to be finished by a sweep);
    anything else (``"nothing"``, ``"error"``, ``"skipped"``...) is "not confirmed".
    """
    called, result = bounded_call(ctx, "checkpoint flush (slurm_bt.checkpoints.flush.flush_job_checkpoints)",
                                  checkpoint_flush, budget_s)
    if isinstance(result, dict):
        # "nothing" is not a confirmation: a flush that could not find the job's rank reports it
        # too. Without "done", whatever is still in the checkpoint directory is kept.
        status = result.get("status")
        return status if isinstance(status, str) else "error"
    if not called:
        return "skipped"
    return "done" if result is True else "error"


def epilog_body(ctx: HookContext) -> None:
    """The epilog's work (see the module docstring)."""
    env = ctx.env
    ctx.phase = "processes"
    end_processes(ctx)
    # The env files hold resolved secrets: gone before anything slow (or faulting) can stop the epilog.
    ctx.phase = "runtime"
    others = other_jobs_of_user(ctx.state_root, env.uid, env.job_id)
    remove_job_runtime_dir(ctx, user_has_other_jobs=bool(others))
    ctx.phase = "checkpoint-flush"
    flushed = flush_checkpoints(ctx, ctx.budget(ctx.settings.flush_budget_s, reserve_s=20.0))
    ctx.phase = "node-cache"
    bounded_call(ctx, "node-cache lease release (slurm_bt.weights.node_stage.epilog_release_leases)",
                 node_cache_release,
                 ctx.budget(ctx.settings.node_cache_budget_s / 2, reserve_s=15.0))
    _, pruned = bounded_call(ctx, "node-cache LRU (slurm_bt.weights.node_stage.epilog_enforce_lru)", node_cache_lru,
                             ctx.budget(ctx.settings.node_cache_budget_s / 2, reserve_s=15.0))
    if isinstance(pruned, str):
        ctx.log.info(f"node cache: {pruned}")
    ctx.phase = "scratch"
    remove_scratch(ctx, keep_checkpoints=flushed != "done")
    ctx.phase = "notes"
    JobStateDir(env, ctx.state_root).remove(deadline=ctx.deadline - 1.0)
    if flushed == "handed-off" and ctx.settings.resume_handoffs == "background":
        ctx.phase = "handoff-sweep"
        _start_handoff_sweep(ctx)


def _start_handoff_sweep(ctx: HookContext) -> None:
    """Finish the hand-off now, detached, so the node is released while the upload completes."""
    from slurm_bt.checkpoints.handoff import start_background_sweep

    try:
        pid = start_background_sweep(ctx.env.node, site_path=ctx.site_path, log_path=ctx.settings.log_file).pid
    except OSError as exc:  # the periodic sweep (docs/admin.md) still finishes it
        ctx.log.warning(f"could not start the hand-off sweep: {exc}")
        return
    ctx.notes.append(f"handoff-sweep pid={pid}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -I -m slurm_bt.hooks.epilog``."""
    return run_hook("epilog", epilog_body, None, argv)


if __name__ == "__main__":
    sys.exit(main())
