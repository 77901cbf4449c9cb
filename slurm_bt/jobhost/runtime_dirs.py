"""The per-user runtime directory ``<runtime root>/slurm-bt-<uid>`` (tmpfs): created by root, squats sidestepped.

Why root creates it: the runtime root is usually ``/dev/shm``, world-writable with the sticky bit,
so any user can create ``/dev/shm/slurm-bt-<someone else's uid>`` first; step 1 of that user's jobs
(:mod:`slurm_bt.steps.prepare`, running as the user) then cannot use the name and every one of their
jobs on the host fails. The prolog therefore creates the directory itself, fd-relative in the
trusted root, ``0700 <uid>:<gid>``; step 1 adopts it (it is the user's). An entry that is already
there and is not the user's real directory (another owner, a symlink, a file, a FIFO) is a squat:
root renames it aside to an unguessable name in the same root (atomic, nothing followed), creates
the directory, then removes the renamed entry fd-relative (:func:`~slurm_bt.posix.safefs.remove_tree_at`,
bounded; what is left stays under the aside name, owned by the squatter), and reports it in the hook
log and a squat record (:mod:`slurm_bt.posix.squat_records`, shown by ``slurm-bt admin doctor``). A squatter
who re-creates the name faster than root three times in a row fails *that job* (never the node).

The epilog removes the job's directory ``slurm-bt-<uid>/<job id>`` (per-node env files with resolved
secrets, registry credentials, the bubblewrap argv) the same fd-relative way, also when step 2 never
ran, and the per-user directory itself once the user has no other job on the host. Job directories whose
epilog never ran (slurmd crashed without a reboot) are removed by the user's next prolog on the host
(:func:`~slurm_bt.jobhost.stale_sweep.sweep_stale_runtime`).

A runtime root that is missing or that a non-root user could replace is left to step 1 (the no-prolog
behaviour) with a warning: root must not create or delete by name under a path a user controls.
"""

from __future__ import annotations

import errno
import os
import time

from slurm_bt.errors import HookUserError
from slurm_bt.jobhost.context import HookContext
from slurm_bt.jobhost.stale_sweep import sweep_stale_runtime
from slurm_bt.node.job_paths import user_runtime_dir
from slurm_bt.posix.safefs import (
    UnsafeEntry,
    UntrustedPath,
    ensure_dir_at,
    open_dir_at,
    open_trusted_dir,
    remove_tree_at,
)
from slurm_bt.posix.squat_records import sidestep_squat

__all__ = ["SQUAT_ATTEMPTS", "make_user_runtime_dir", "remove_job_runtime_dir"]

SQUAT_ATTEMPTS = 3
SQUAT_REMOVAL_BUDGET_S = 2.0


def _paths(ctx: HookContext) -> tuple[str, str]:
    env = ctx.env
    path = user_runtime_dir(ctx.site.storage.runtime, user=env.user, uid=env.uid, home=env.home)
    root, _, name = path.rpartition("/")
    return root or "/", name


def _open_root(ctx: HookContext, root: str) -> int | None:
    try:
        return open_trusted_dir(root, allow_sticky_final=True)
    except FileNotFoundError:
        ctx.log.warning(f"runtime root {root} does not exist; step 1 creates the runtime directory as the user")
    except UntrustedPath as exc:
        ctx.log.warning(f"runtime root is not safe for root to work in ({exc}); step 1 creates the runtime "
                        "directory as the user (make it root-owned, 1777 or 0755)")
    except OSError as exc:
        ctx.log.warning(f"runtime root {root}: {exc.strerror}; step 1 creates the runtime directory as the user")
    return None


def _sidestep(ctx: HookContext, root_fd: int, root: str, name: str) -> None:
    """Rename a squatted ``name`` aside, remove it (bounded), record and log the squat."""
    env = ctx.env
    sidestep_squat(root_fd, root, name, aside_tag=str(env.uid), what="runtime directory",
                   why=f"where uid {env.uid}'s directory belongs", node=env.node, victim_uid=env.uid,
                   job_id=env.job_id, state_root=ctx.state_root,
                   removal_deadline=min(time.monotonic() + SQUAT_REMOVAL_BUDGET_S, ctx.deadline - 10.0),
                   warn=ctx.log.warning, notes=ctx.notes, note_label="runtime")


def make_user_runtime_dir(ctx: HookContext) -> str | None:
    """Prolog: create (or adopt) ``<runtime root>/slurm-bt-<uid>``, ``0700 <uid>:<gid>``.

    Returns:
        its path, or None when the root is unusable for root (step 1 then does what it always did).

    Raises:
        HookUserError: a squatter kept re-creating the name (the job fails; the node stays up).
    """
    env = ctx.env
    root, name = _paths(ctx)
    path = f"{root}/{name}"
    root_fd = _open_root(ctx, root)
    if root_fd is None:
        return None
    try:
        for _ in range(SQUAT_ATTEMPTS):
            try:
                fd, created = ensure_dir_at(root_fd, name, uid=env.uid, gid=env.gid, mode=0o700)
            except UnsafeEntry:
                _sidestep(ctx, root_fd, root, name)
                continue
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise HookUserError(f"{path}: {exc.strerror}; the node's runtime tmpfs is full") from None
                raise
            try:
                if not created:
                    sweep_stale_runtime(ctx, fd, path)
            except OSError as exc:  # housekeeping: never fails this job or the node
                ctx.log.warning(f"stale runtime sweep of {path} stopped: {exc}")
            finally:
                os.close(fd)
            ctx.notes.append("runtime=" + ("created" if created else "existing"))
            return path
        raise HookUserError(f"another user keeps re-creating {path}, the runtime directory this job needs; "
                            "an admin has been told (slurm-bt admin doctor lists it), retry later")
    finally:
        os.close(root_fd)


def _lexists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def remove_job_runtime_dir(ctx: HookContext, *, user_has_other_jobs: bool) -> None:
    """Epilog: remove ``slurm-bt-<uid>/<job id>``; the per-user directory too when the user has no other job."""
    env = ctx.env
    root, name = _paths(ctx)
    root_fd = _open_root(ctx, root)
    if root_fd is None:
        return
    try:
        try:
            ufd = open_dir_at(root_fd, name)
        except FileNotFoundError:
            ctx.notes.append("runtime=absent")
            return
        except UnsafeEntry as exc:
            ctx.log.warning(f"runtime directory {root}/{name} {exc.reason}; left for the next prolog")
            return
        try:
            st = os.fstat(ufd)
            if st.st_uid != env.uid or st.st_dev != os.fstat(root_fd).st_dev:
                ctx.log.warning(f"runtime directory {root}/{name} is owned by uid {st.st_uid}, not {env.uid}; "
                                "not entered (the next prolog of that user sidesteps it)")
                return
            if not _lexists_at(ufd, env.job_id):
                ctx.notes.append("runtime=absent")
            else:
                report = remove_tree_at(ufd, env.job_id,
                                        deadline=min(ctx.deadline - 5.0, time.monotonic() + 10.0))
                ctx.notes.append(f"runtime removed files={report.files} dirs={report.dirs}")
                for rel, reason in report.leftovers[:10]:
                    ctx.log.warning(f"runtime leftover {root}/{name}/{env.job_id}/{rel}: {reason}")
        finally:
            os.close(ufd)
        if not user_has_other_jobs:
            try:  # only if empty: anything else in it is the user's, and harmless
                os.rmdir(name, dir_fd=root_fd)
            except OSError:
                pass
    finally:
        os.close(root_fd)
