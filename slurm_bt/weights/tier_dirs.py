"""Prolog of a weights staging job (root): the cluster-tier directories are made by root, not by users.

Why (issue #8 item 7): the first stager used to create ``<cluster_cache>``, ``teams/`` (both 1777,
owned by that user) and its team directory itself, so any user could create *another* team's
directory first (blocking that team's weights) or the admin-curated ``shared`` tier before an admin
did (which was then taken as a complete, trusted tier). Here, before the staging job runs, root
makes every directory that must belong to someone, under a root-owned parent:

    <cluster_cache>/              root:root 0755   (a legacy 1777 dir a stager made is adopted)
    <cluster_cache>/shared/       root:root 0755   (pre-empts squatting; admins fill it)
    <cluster_cache>/teams/        root:root 0755   (a legacy 1777 dir a stager made is adopted)
    <cluster_cache>/teams/<team>  root:<team gid> 2770

An existing team directory that is not the team's (``cluster_cache.team_tier_problem``: wrong group,
open to others) and a ``shared`` tier not made by root are squats: they are renamed aside, removed
within a small budget, logged, and recorded for ``slurm-bt admin doctor`` (:mod:`slurm_bt.posix.squat_records`);
the victim's staging job then finds its real directory and goes on. A team directory a teammate's
stager created (group = the team's, closed to others) is the team's and is kept.

Where hooks.toml names a ``shared_fs_identity`` (root squashed on the shared filesystem: docs/admin.md),
that account is the layout owner instead of root (:mod:`slurm_bt.posix.layout_owner`): the work runs in
a child dropped to it, ``teams/`` must be its own (``slurm-bt admin install``) and ``teams/<team>`` is
made ``<identity>:<team gid> 2770``; ``shared/`` stays an admin's. The child reports what it did (log
lines, notes, squats) and the prolog logs and records it as root.

All of it is housekeeping for the job's own team: a failure is logged and never fails the job or
the node (the staging job checks the directories again, as the user, and fails with the fix).
Every step works on directory fds (``O_NOFOLLOW``), so a symlink planted anywhere is never followed.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.layout_owner import LayoutOwner, LayoutOwnerError
from slurm_bt.posix.safefs import (
    UnsafeEntry,
    UntrustedPath,
    ensure_dir_at,
    open_dir_at,
    open_trusted_dir,
)
from slurm_bt.posix.squat_records import record_squat, sidestep_squat
from slurm_bt.posix.teams import TeamError, resolve_team
from slurm_bt.site.settings import SiteSettings, expand_path

__all__ = ["STAGING_COMMENT_PREFIX", "HookContext", "provision_cluster_tiers"]


class _Log(Protocol):
    def warning(self, message: str) -> None: ...
    def error(self, message: str) -> None: ...


class _TeamPolicy(Protocol):
    @property
    def team_groups(self) -> Mapping[str, str]: ...
    @property
    def shared_fs_identity(self) -> str | None: ...


class HookContext(Protocol):
    """The part of the prolog's :class:`slurm_bt.jobhost.context.HookContext` this module uses.

    Structural, so that the weights feature does not import the host feature or the hooks.
    """

    @property
    def env(self) -> SlurmHookEnv: ...
    @property
    def settings(self) -> _TeamPolicy: ...
    @property
    def site(self) -> SiteSettings: ...
    @property
    def log(self) -> _Log: ...
    @property
    def deadline(self) -> float: ...
    @property
    def state_root(self) -> str: ...
    @property
    def notes(self) -> list[str]: ...

STAGING_COMMENT_PREFIX = "slurm-bt-staging:"
"""``weights.plan.render_staging_script`` puts ``--comment=slurm-bt-staging:<submit id>`` on staging jobs."""
SQUAT_REMOVAL_BUDGET_S = 10.0
_LEGACY_MODE = 0o1777  # what stagers before this module created for <cluster_cache> and teams/
_OWNER_STEP_S = 30.0  # the identity's child: a few mkdirs on the shared filesystem


@dataclass
class _Run:
    """One provisioning run: the job's facts it needs and what it did, which the hook logs and records.

    Plain data, so that it works the same in-process (root) and in the identity's child, which has
    no descriptor on the hook log and cannot write root's squat records: it returns this as JSON.
    """

    node: str
    victim_uid: int
    job_id: str
    state_root: str
    removal_deadline: float
    owner: LayoutOwner
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    squats: list[dict[str, Any]] = field(default_factory=list)

    def warning(self, message: str) -> None:
        self.warnings.append(message)

    def record(self, node: str, **kwargs: Any) -> None:
        self.squats.append({"node": node, **kwargs})

    def result(self) -> dict[str, Any]:
        return {"warnings": self.warnings, "notes": self.notes, "squats": self.squats}


def _adopt_or_create(run: _Run, parent_fd: int, name: str, path: str) -> int:
    """``name`` in ``parent_fd`` as the layout owner's ``0755`` directory (root's, or the identity's).

    Root adopts a legacy stager-made 1777 one. The identity also accepts a root-owned directory
    nobody else can write (an admin made ``<cluster_cache>`` from a host where root is not squashed).

    Raises:
        UnsafeEntry: it exists and is neither the owner's nor exactly a legacy 1777 directory.
    """
    owner = run.owner
    try:
        # gid -1: an admin's group on an existing dir is left alone; only write access for group
        # and others goes (with the tiers made here, nobody else needs to add entries)
        fd, _ = ensure_dir_at(parent_fd, name, uid=owner.uid, gid=-1, mode=0o755, adopt_modes=False)
    except UnsafeEntry:
        fd = open_dir_at(parent_fd, name)
    else:
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) & 0o022:
                os.fchmod(fd, 0o755)
                run.warning(f"{path} was writable by others; made it {owner.name} 0755 (the tiers are created in it)")
            return fd
        except BaseException:
            os.close(fd)
            raise
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not owner.is_root and st.st_uid == 0 and not mode & 0o022:
            return fd
        if mode != _LEGACY_MODE or not owner.is_root:
            raise UnsafeEntry(name, f"is owned by uid {st.st_uid} with mode {mode:04o}")
        # Made by an older stager: its owner could rename other teams' directories away. Root takes
        # it over; nothing inside changes hands.
        os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o755)
        run.warning(f"took over {path} (made by uid {st.st_uid}, mode 1777) as root:root 0755 so that no user "
                    "can rename or squat the weights tiers in it")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _sidestep(run: _Run, parent_fd: int, parent: str, name: str, why: str) -> None:
    """Rename a squatted ``name`` aside, remove it (bounded), log and record the squat."""
    sidestep_squat(parent_fd, parent, name, aside_tag=name, what="weights tier", why=why, node=run.node,
                   victim_uid=run.victim_uid, job_id=run.job_id, state_root=run.state_root,
                   removal_deadline=run.removal_deadline, warn=run.warning, notes=run.notes,
                   note_label="weights tier", record=run.record)


def _ensure_owned(run: _Run, parent_fd: int, parent: str, name: str, *, gid: int, mode: int,
                  is_ours: bool) -> int:
    """``name`` as the layout owner's dir (group ``gid``); a squat is sidestepped once, then created again."""
    for _ in range(2):
        try:
            fd, _ = ensure_dir_at(parent_fd, name, uid=run.owner.uid, gid=gid, mode=mode, adopt_modes=False)
        except UnsafeEntry as exc:
            if is_ours:
                raise
            _sidestep(run, parent_fd, parent, name, f"where root's directory belongs ({exc.reason})")
            continue
        # an existing dir of ours keeps an admin's mode (e.g. 3770) minus what others must not have:
        # any access to a team tier, write access to the shared tier
        forbidden = 0o007 if gid >= 0 else 0o022
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if current & forbidden:
            os.fchmod(fd, current & ~forbidden)
        return fd
    raise UnsafeEntry(name, "was created again by someone else while being replaced")


def provision_cluster_tiers(ctx: HookContext) -> None:
    """Create the staging job's cluster-tier directories as the layout owner (module docstring); never raises."""
    try:
        _provision_for(ctx)
    except Exception as exc:  # housekeeping must never fail the job or drain the node
        ctx.log.error(f"weights tiers not provisioned: {type(exc).__name__}: {exc}")


def _provision_for(ctx: HookContext) -> None:
    from slurm_bt.weights.plan import team_slug

    env = ctx.env
    try:
        team = resolve_team(env, ctx.settings.team_groups)
        owner = LayoutOwner.resolve(ctx.settings.shared_fs_identity)
    except (TeamError, LayoutOwnerError) as exc:
        ctx.log.warning(f"weights tiers: {exc}")
        return
    problem = owner.group_problem(team.gid)
    if problem is not None:
        ctx.log.warning(f"weights tiers: {problem}")
        return
    base = expand_path(ctx.site.storage.cluster_cache, user=env.user, uid=env.uid, home=env.home,
                       node=env.node).rstrip("/")
    run = _Run(env.node, env.uid, env.job_id, ctx.state_root,
               min(time.monotonic() + SQUAT_REMOVAL_BUDGET_S, ctx.deadline - 10.0), owner)
    slug = team_slug(team.name)
    timeout = max(1.0, min(_OWNER_STEP_S, ctx.deadline - time.monotonic() - 10.0))
    out = owner.run(lambda: _provision(run, base, slug, team.name, team.gid), timeout_s=timeout)
    for line in out.get("warnings") or []:
        ctx.log.warning(str(line)[:1000])
    ctx.notes.extend(str(n)[:200] for n in out.get("notes") or [])
    for squat in out.get("squats") or []:
        try:
            record_squat(**squat)
        except (OSError, TypeError) as exc:  # a report only: the hook log has the squat
            ctx.log.warning(f"cannot record a squat: {exc}")


def _provision(run: _Run, base: str, slug: str, team_name: str, team_gid: int) -> dict[str, Any]:
    """The directories, as the layout owner (in-process for root, else in the identity's child)."""
    from slurm_bt.weights.cluster_cache import team_tier_problem

    parent, _, leaf = base.rpartition("/")
    opened: list[int] = []
    try:
        pfd = open_trusted_dir(parent or "/", allow_sticky_final=True)
        opened.append(pfd)
        bfd = _adopt_or_create(run, pfd, leaf, base)
        opened.append(bfd)
        if run.owner.is_root:  # the identity cannot and need not: the shared tier is an admin's, made once
            # gid -1: an admin's group on an existing shared tier is left alone
            os.close(_ensure_owned(run, bfd, base, "shared", gid=-1, mode=0o755, is_ours=False))
        tfd = _adopt_or_create(run, bfd, "teams", f"{base}/teams")
        opened.append(tfd)
        path = f"{base}/teams/{slug}"
        problem = team_tier_problem(_fd_path(tfd, slug), team_gid)
        if problem is not None:
            _sidestep(run, tfd, f"{base}/teams", slug, f"where team {team_name}'s directory belongs ({problem})")
        try:
            os.close(_ensure_owned(run, tfd, f"{base}/teams", slug, gid=team_gid, mode=0o2770, is_ours=True))
        except UnsafeEntry:
            if team_tier_problem(_fd_path(tfd, slug), team_gid) is not None:
                raise
            # root, an admin or a teammate's stager made it (the team's group, closed to others): the team's
        run.notes.append(f"weights tier {path}")
    except (UntrustedPath, FileNotFoundError) as exc:
        run.warning(f"weights tiers under {base} not provisioned ({exc}); the staging job creates and checks "
                    "them as the user (admins: make the parent root-owned)")
    except (UnsafeEntry, OSError) as exc:
        hint = "" if run.owner.is_root else f" ({run.owner.name} must own {base}/teams: slurm-bt admin install)"
        run.warning(f"weights tiers under {base} not provisioned: {exc}{hint}; the staging job checks them as "
                    "the user")
    finally:
        for fd in reversed(opened):
            os.close(fd)
    return run.result()


def _fd_path(dir_fd: int, name: str) -> Path:
    """A path for ``name`` in ``dir_fd`` that the ``lstat``-based checks can use without re-resolving parents."""
    return Path(f"/proc/self/fd/{dir_fd}/{name}")
