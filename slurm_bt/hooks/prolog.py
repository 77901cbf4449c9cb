"""The slurm-bt Prolog (root, every node of the job): per-job scratch and the team/project caches.

``python -I -m slurm_bt.hooks.prolog [--config hooks.toml] [--site site.toml]``; the contract is
``prolog/README.md``. Steps, each idempotent (a requeued job or a rerun finds its own work done):

1. clear this job's notes on this node (``/run/slurm-bt/<node>/jobs/<id>``) and record the job's
   uid in them (``owner``), for every job: the epilog's leftover-process sweep
   (:mod:`slurm_bt.jobhost.leftovers`) learns from these notes whether a user still has a job on the host;
2. skip jobs that are not slurm-bt jobs (comment ``slurm-bt:...``: a hint only, it selects work
   for the user's own job and nothing else);
3. scratch: ``<scratch root>/<job id>``, ``0700 <uid>:<gid>``, created fd-relative in the root-owned
   scratch root; an entry that already exists and is not the user's is refused; then the
   per-user runtime directory ``<runtime root>/slurm-bt-<uid>`` (``0700 <uid>:<gid>``), created
   root-side so that nobody can squat it; a squat is moved aside, removed and reported
   (:mod:`slurm_bt.jobhost.runtime_dirs`);
4. ``job.json`` from the job's work dir, read **as the user** in a dropped child (bounded size and
   time), then re-validated here: it is the user's file and the child's output is untrusted;
5. with ``cache_config.enabled``: ``<cache>/teams/<group>/{shared,projects/<project>}``,
   ``2770 <owner>:<group>`` with a group default ACL, where ``<group>`` is the job's team
   (:mod:`slurm_bt.posix.teams`) and ``<owner>`` the layout owner: root, or hooks.toml's
   ``shared_fs_identity`` where the shared filesystem squashes root (:mod:`slurm_bt.posix.layout_owner`;
   the work then runs in a child dropped to that account);
6. with ``weights``: the pinned manifests are read from the job dir **as the user**, then a forked
   root child (:func:`slurm_bt.weights.node_stage.stage_for_job`) copies the job's blobs from the
   team's (or the shared) cluster tier into the root-owned node cache (team-tier files opened by a
   child running as the job user, which passes the descriptors), leases them and links
   ``<node_cache>/jobs/<id>/w<i>``; bounded by what is left of the deadline, so a copy that is too
   slow fails the job (never drains the node). Jobs without weights import none of this;
7. with a pinned container image (``image_pin``, a container runtime): the same for the image's
   one-file entry, ``<job dir>/image/manifest.json`` (read as the user, never through a symlink),
   linked as ``<node_cache>/jobs/<id>/img`` (:func:`slurm_bt.weights.node_stage.stage_image_for_job`);
8. a root-owned record of what was prepared, which step 1 of the job trusts.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from slurm_bt.errors import HookUserError, NodeFault
from slurm_bt.hooks.runner import run_hook
from slurm_bt.job_spec import JobSpec
from slurm_bt.jobhost.context import HookContext
from slurm_bt.jobhost.leftovers import write_job_owner
from slurm_bt.jobhost.runtime_dirs import make_user_runtime_dir
from slurm_bt.jobhost.stale_sweep import sweep_stale_scratch
from slurm_bt.posix.job_notes import JobStateDir
from slurm_bt.posix.layout_owner import LayoutOwner, LayoutOwnerError
from slurm_bt.posix.privdrop import ChildError, ChildTimeout, PrivilegeDropError, run_as_job_user, run_in_child
from slurm_bt.posix.safefs import UnsafeEntry, UntrustedPath, ensure_dir_at, open_trusted_dir, set_default_group_acl
from slurm_bt.posix.teams import Team, TeamError, resolve_team
from slurm_bt.site.settings import expand_path
from slurm_bt.weights.tier_dirs import STAGING_COMMENT_PREFIX, provision_cluster_tiers

__all__ = ["COMMENT_PREFIX", "main", "prolog_body", "read_job_spec_as_user", "stage_image", "stage_weights"]

COMMENT_PREFIX = "slurm-bt:"
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_NODE_FAULT_ERRNOS = {errno.EROFS, errno.EIO, errno.ENODEV, errno.ESTALE, errno.ENOTCONN, errno.EUCLEAN}
WEIGHTS_RESERVE_S = 5.0
"""Seconds of the deadline kept back from node staging for the record and the runner's bookkeeping."""
_MANIFEST_MAX = 64 << 20  # slurm_bt.weights.node_stage._MAX_MANIFEST (not imported: jobs without weights)


def _read_as_job_user(ctx: HookContext, read: Callable[[], Any], what: str, *, max_result_bytes: int) -> Any:
    """``read()`` in a child dropped to the job user, within the hook's budget; the result is untrusted.

    Why as the user: the job's files are the user's, and root must not open user-named paths. A
    failed privilege drop is the node's fault (NSS); anything else about the user's files fails the
    job, never the node.
    """
    env = ctx.env
    try:
        return run_as_job_user(read, env, timeout_s=ctx.budget(ctx.settings.user_step_timeout_s),
                               max_result_bytes=max_result_bytes)
    except PrivilegeDropError as exc:
        raise NodeFault(f"cannot become user {env.user} (uid {env.uid}): {exc}",
                        "check NSS (passwd/group lookups) on this node") from None
    except ChildTimeout:
        raise HookUserError(f"reading {what} as {env.user} did not finish in time (slow home filesystem?)") from None
    except ChildError as exc:
        raise HookUserError(f"cannot read {what} as {env.user}: {exc}") from None


def _root(ctx: HookContext, template: str) -> str:
    env = ctx.env
    return expand_path(template, user=env.user, uid=env.uid, home=env.home, node=env.node)


def _open_root(path: str, what: str, *, allow_sticky: bool = False) -> int:
    """Open an admin root; a missing or unsafe root is the node's problem, not the user's."""
    try:
        return open_trusted_dir(path, allow_sticky_final=allow_sticky)
    except FileNotFoundError:
        raise NodeFault(f"{what} {path} does not exist", "create it (root:root 0755) or mount it; "
                        "`slurm-bt admin install` creates local roots") from None
    except UntrustedPath as exc:
        raise NodeFault(f"{what} is unsafe: {exc}",
                        f"chown root:root and chmod go-w every component of {path}") from None
    except OSError as exc:
        raise NodeFault(f"{what} {path} is unusable: {exc.strerror}",
                        "check the disk / shared filesystem mount") from None


def _storage_error(exc: OSError, path: str) -> Exception:
    if exc.errno in _NODE_FAULT_ERRNOS:
        return NodeFault(f"{path}: {exc.strerror}", "check the disk or filesystem, then resume the node")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return HookUserError(f"{path}: {exc.strerror}; the filesystem is full, retry later or ask an admin")
    return HookUserError(f"{path}: {exc.strerror}")


def make_scratch(ctx: HookContext) -> str:
    """Create the job's scratch directory (0700, the job's uid:gid) and return its path."""
    env = ctx.env
    root = _root(ctx, ctx.site.storage.scratch)
    path = f"{root}/{env.job_id}"
    fd = _open_root(root, "scratch root", allow_sticky=True)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o002:
            ctx.log.warning(f"scratch root {root} is world-writable; make it root:root 0755 "
                            "(users could pre-create job directories)")
        vfs = os.fstatvfs(fd)
        if vfs.f_flag & os.ST_RDONLY:
            raise NodeFault(f"scratch root {root} is read-only", "remount the node-local disk read-write")
        free_mib = vfs.f_bavail * vfs.f_frsize // (1024 * 1024)
        if free_mib < ctx.settings.scratch_min_free_mib:
            raise HookUserError(f"node-local scratch on {env.node} has {free_mib} MiB free, less than the "
                                f"{ctx.settings.scratch_min_free_mib} MiB this site requires; retry later")
        try:
            sweep_stale_scratch(ctx, fd, root)
        except OSError as exc:  # housekeeping: never fails this job or the node
            ctx.log.warning(f"stale scratch sweep of {root} stopped: {exc}")
        try:
            sfd, created = ensure_dir_at(fd, env.job_id, uid=env.uid, gid=env.gid, mode=0o700)
        except UnsafeEntry as exc:
            raise HookUserError(f"scratch directory {path} {exc.reason}; refusing to use it") from None
        except OSError as exc:
            raise _storage_error(exc, path) from None
        os.close(sfd)
        ctx.notes.append("scratch=" + ("created" if created else "existing"))
        return path
    finally:
        os.close(fd)


def read_job_spec_as_user(ctx: HookContext) -> JobSpec:
    """Read ``<work dir>/job.json`` as the job user and validate it for this job.

    Raises:
        HookUserError: unreadable, too large, slow, invalid, or written for another user.
        NodeFault: becoming the user failed (NSS or kernel problem on this node).
    """
    env = ctx.env
    work = env.untrusted_work_dir
    if not work.startswith("/") or "\n" in work:
        raise HookUserError(f"the job's work directory {work!r} is not an absolute path")
    path = work.rstrip("/") + "/job.json"
    limit = ctx.settings.job_json_max_bytes

    def read() -> str:
        import stat as _stat

        # O_NONBLOCK: a FIFO planted as job.json must not hang us. Following symlinks is fine:
        # this runs as the user, who can only read what they could read anyway.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise ValueError(exc.strerror) from None
        try:
            st = os.fstat(fd)
            if not _stat.S_ISREG(st.st_mode):
                raise ValueError("is not a regular file")
            if st.st_size > limit:
                raise ValueError(f"is {st.st_size} bytes, more than the {limit}-byte limit")
            data = os.read(fd, limit + 1)
            if len(data) > limit:
                raise ValueError(f"is larger than the {limit}-byte limit")
            return data.decode("utf-8")
        finally:
            os.close(fd)

    text = _read_as_job_user(ctx, read, str(path), max_result_bytes=2 * limit + 4096)
    if not isinstance(text, str) or len(text.encode()) > limit:
        raise HookUserError(f"{path} is not a readable job spec")
    try:
        spec = JobSpec.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise HookUserError(f"{path} is not a valid slurm-bt job spec ({exc.error_count()} problems, "
                            f"first: {loc}: {first['msg']}); resubmit with bt-sbatch") from None
    if spec.context.uid != env.uid or spec.context.user != env.user:
        raise HookUserError(f"{path} was written for {spec.context.user!r} (uid {spec.context.uid}) but the "
                            f"job runs as {env.user!r} (uid {env.uid}); refusing it")
    if not _PROJECT.match(spec.project_id) or spec.project_id in (".", ".."):
        raise HookUserError(f"{path}: project id {spec.project_id!r} is not a safe directory name")
    return spec


def job_team(ctx: HookContext) -> Team:
    """The job's team (a Unix group the user belongs to); a user error if it cannot be used."""
    try:
        return resolve_team(ctx.env, ctx.settings.team_groups)
    except TeamError as exc:
        raise HookUserError(str(exc)) from None


def layout_owner(ctx: HookContext) -> LayoutOwner:
    """Who creates team and project directories on the shared filesystem (``shared_fs_identity``)."""
    try:
        return LayoutOwner.resolve(ctx.settings.shared_fs_identity)
    except LayoutOwnerError as exc:
        raise NodeFault(str(exc), "create the account on every node (the same uid as on the file servers) or "
                        "fix shared_fs_identity in hooks.toml") from None


def _as_layout_owner(ctx: HookContext, owner: LayoutOwner, work: Callable[[], dict[str, Any]],
                     what: str) -> dict[str, Any]:
    """Run ``work`` as the layout owner; its result carries either ``fields`` or a ``user``/``node`` failure.

    Why results and not exceptions: as the identity, ``work`` runs in a child whose exceptions come
    back as text; the parent re-raises them as the hook's classes.
    """
    try:
        out = owner.run(work, timeout_s=ctx.budget(ctx.settings.user_step_timeout_s))
    except PrivilegeDropError as exc:
        raise NodeFault(f"cannot become {owner.name} (shared_fs_identity) to create {what}: {exc}",
                        "check NSS (passwd/group lookups) on this node") from None
    except ChildTimeout:
        raise HookUserError(f"creating {what} as {owner.name} did not finish in time "
                            "(slow shared filesystem?)") from None
    except ChildError as exc:
        ctx.log.error(f"creating {what} as {owner.name}: {exc.exc_type}: {exc}")
        raise HookUserError(f"cannot create {what} as {owner.name}: {exc}") from None
    if not isinstance(out, dict):
        raise HookUserError(f"cannot create {what}: no result")
    if "node" in out:
        raise NodeFault(str(out["node"]), str(out.get("fix", "")))
    if "user" in out:
        raise HookUserError(str(out["user"]))
    fields = out.get("fields")
    return dict(fields) if isinstance(fields, dict) else {}


def _caught(work: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """``work()`` with the hook's failures turned into the result :func:`_as_layout_owner` reads."""
    def run() -> dict[str, Any]:
        try:
            return {"fields": work()}
        except HookUserError as exc:
            return {"user": exc.reason}
        except NodeFault as exc:
            return {"node": exc.what, "fix": exc.fix}
    return run


def make_caches(ctx: HookContext, spec: JobSpec, team: Team) -> dict[str, object]:
    """Create the team and project caches (2770 <layout owner>:<team group>); returns the record fields.

    The layout owner is root, or the site's ``shared_fs_identity`` where the shared filesystem
    squashes root (:mod:`slurm_bt.posix.layout_owner`).
    """
    root = _root(ctx, ctx.site.storage.cache)
    owner = layout_owner(ctx)
    problem = owner.group_problem(team.gid)
    if problem is not None:
        raise HookUserError(f"cannot create the caches of team {team.name}: {problem}")
    fields = _as_layout_owner(ctx, owner, _caught(lambda: _make_caches(root, team, spec.project_id, owner)),
                              f"the caches of team {team.name} in {root}")
    if not fields.get("group_acl", True):
        ctx.log.warning(f"{root} has no POSIX ACL support: team members must use umask 0007 to share files")
    ctx.notes.append(f"team={team.name}")
    return fields


def _make_caches(root: str, team: Team, project_id: str, owner: LayoutOwner) -> dict[str, Any]:
    """The work of :func:`make_caches`, as the layout owner (in-process for root, else in its child)."""
    fd = _open_root(root, "shared cache root")
    acl = True
    opened: list[int] = [fd]
    where = root
    uid = owner.uid
    try:
        def step(parent: int, name: str, uid: int, gid: int, mode: int) -> int:
            nonlocal where
            where = f"{where}/{name}"
            try:
                child, _ = ensure_dir_at(parent, name, uid=uid, gid=gid, mode=mode)
            except UnsafeEntry as exc:
                fix = "an admin must remove or fix it"
                if not owner.is_root and name == "teams":
                    fix = (f"it must belong to {owner.name}, the shared_fs_identity: "
                           "an admin runs slurm-bt admin install")
                raise HookUserError(f"cache directory {where} {exc.reason}; refusing to use it ({fix})") from None
            except PermissionError as exc:
                fix = ("root is squashed on this filesystem? set shared_fs_identity in hooks.toml "
                       "(docs/admin.md \"Root-squashed shared filesystems\")" if owner.is_root
                       else f"{owner.name} must own {root}/teams: an admin runs slurm-bt admin install")
                raise HookUserError(f"{where}: {exc.strerror} ({fix})") from None
            except OSError as exc:
                raise _storage_error(exc, where) from None
            opened.append(child)
            return child

        # root's teams/ keeps group root; the identity leaves the group alone (it is not in root's group)
        teams = step(fd, "teams", uid, 0 if owner.is_root else -1, 0o755)
        team_fd = step(teams, team.name, uid, team.gid, 0o2750)
        shared = step(team_fd, "shared", uid, team.gid, 0o2770)
        team_cache = where
        acl = set_default_group_acl(shared) and acl
        where = f"{root}/teams/{team.name}"
        projects = step(team_fd, "projects", uid, team.gid, 0o2750)
        project = step(projects, project_id, uid, team.gid, 0o2770)
        acl = set_default_group_acl(project) and acl
        os.utime(project)  # "last used" for `slurm-bt cache summarize` (atime is unreliable)
        project_cache = where
    finally:
        for o in reversed(opened):
            os.close(o)
    return {"team": team.name, "team_gid": team.gid, "cache_root": root, "team_cache": team_cache,
            "project_cache": project_cache, "group_acl": acl}


def make_store_team_dir(ctx: HookContext, spec: JobSpec, team: Team) -> None:
    """``<store>/_teams/<team>`` of the site's ``file://`` checkpoint store, as the layout owner; never raises.

    Why here: a team's namespace in the store (docs/checkpoints.md) must be the team's before its first
    upload, and only the layout owner (root, or ``shared_fs_identity`` where root is squashed) may
    create entries in ``_teams`` (a user who did could rename other teams' directories away). Root
    creates a missing ``_teams`` (``root:root 0755``) in the admin's store root; the identity needs it
    made by ``slurm-bt admin install``. Housekeeping: a failure is logged, and the job's prepare step
    then fails with the directory and the fix.
    """
    from slurm_bt.posix.teams import team_slug
    from slurm_bt.storage.url import parse_store_url

    store = ctx.site.storage.checkpoint_store
    if not store.startswith("file://") or not (spec.checkpointing.enabled or spec.load_checkpoint.enabled):
        return
    try:
        root = parse_store_url(store).prefix
        owner = layout_owner(ctx)
        problem = owner.group_problem(team.gid)
        if problem is not None:
            ctx.log.warning(f"checkpoint store team directory: {problem}")
            return
        slug = team_slug(team.name)
        fields = _as_layout_owner(ctx, owner, _caught(lambda: _make_store_team_dir(root, slug, team.gid, owner)),
                                  f"{root}/_teams/{slug}")
        if fields.get("created"):
            ctx.notes.append(f"store team dir {root}/_teams/{slug}")
    except (HookUserError, NodeFault) as exc:
        ctx.log.warning(f"checkpoint store team directory not made: {exc}")
    except Exception as exc:  # housekeeping: the prepare step reports what is wrong
        ctx.log.error(f"checkpoint store team directory not made: {type(exc).__name__}: {exc}")


def _make_store_team_dir(root: str, slug: str, gid: int, owner: LayoutOwner) -> dict[str, Any]:
    """The work of :func:`make_store_team_dir`, as the layout owner."""
    from slurm_bt.trusted_files import is_team_dir

    where = f"{root}/_teams"
    try:
        rfd = open_trusted_dir(root, allow_sticky_final=True)
    except (OSError, UntrustedPath) as exc:
        raise HookUserError(f"checkpoint store {root} cannot be used: {exc}") from None
    opened = [rfd]
    try:
        try:
            tfd, _ = ensure_dir_at(rfd, "_teams", uid=owner.uid, gid=-1, mode=0o755, adopt_modes=False)
        except UnsafeEntry as exc:
            try:
                tfd = os.open("_teams", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=rfd)
            except FileNotFoundError:  # made as nobody and taken back: root is squashed here
                raise HookUserError(f"{where} {exc.reason}; set shared_fs_identity in hooks.toml and run "
                                    "slurm-bt admin install") from None
            opened.append(tfd)
            st = os.fstat(tfd)
            # an admin's (root) or legacy 1777 _teams is fine; anything else the store refuses too
            if st.st_uid != 0 or (stat.S_IMODE(st.st_mode) & 0o002 and not st.st_mode & stat.S_ISVTX):
                raise HookUserError(f"{where} belongs to uid {st.st_uid} (mode {stat.S_IMODE(st.st_mode):04o}), "
                                    "not to root or the shared_fs_identity: an admin removes it, then runs "
                                    "slurm-bt admin install") from None
        except PermissionError as exc:
            raise HookUserError(f"{where}: {exc.strerror} (an admin runs slurm-bt admin install)") from None
        else:
            opened.append(tfd)
        try:
            fd, created = ensure_dir_at(tfd, slug, uid=owner.uid, gid=gid, mode=0o2770, adopt_modes=False)
            os.close(fd)
        except UnsafeEntry:
            st = os.stat(slug, dir_fd=tfd, follow_symlinks=False)
            if not is_team_dir(st, gid):  # a teammate's upload made it in a legacy 1777 _teams: the team's
                raise HookUserError(f"{where}/{slug} is not a directory of team group {gid} (uid {st.st_uid}, gid "
                                    f"{st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}): an admin removes it") from None
            created = False
        except PermissionError as exc:
            raise HookUserError(f"{where}/{slug}: {exc.strerror} (an admin runs slurm-bt admin install)") from None
        return {"created": created}
    finally:
        for o in reversed(opened):
            os.close(o)


def _read_manifests_as_user(ctx: HookContext, spec: JobSpec) -> list[str]:
    """The job's pinned manifests (``<job dir>/weights/<i>.json``), read in a child dropped to the user.

    Why as the user: the job dir is the user's; root must not open user-named paths. The
    texts are untrusted here; :func:`~slurm_bt.weights.node_stage.stage_for_job` re-validates them.
    """
    from slurm_bt.weights.node_stage import load_job_manifests

    job_dir, count = spec.context.job_dir, len(spec.weights)
    raw = _read_as_job_user(ctx, lambda: load_job_manifests(job_dir, count),
                            f"the weights manifests in {job_dir}/weights",
                            max_result_bytes=2 * _MANIFEST_MAX * count + 65536)
    if not isinstance(raw, list) or len(raw) != count or not all(isinstance(r, str) for r in raw):
        raise HookUserError(f"{job_dir}/weights holds no readable manifests for this job's {count} weights sources")
    return raw


def _node_cache_root(ctx: HookContext) -> str:
    """Make sure the node cache root exists as a root-owned directory under a trusted parent.

    Its parent must already be root-owned and not writable by others all the way up (like the scratch
    root): otherwise a user could redirect where root copies weights. The root itself is created
    fd-relative if missing (``root:root 0755``), so provisioning only the parent is enough.
    """
    root = _root(ctx, ctx.site.storage.node_cache).rstrip("/")
    parent, _, leaf = root.rpartition("/")
    pfd = _open_root(parent or "/", "parent of the node weights cache")
    try:
        try:
            fd, _ = ensure_dir_at(pfd, leaf, uid=0, gid=0, mode=0o755)
        except UnsafeEntry as exc:  # only root can create entries in a trusted parent
            raise NodeFault(f"node weights cache {root} {exc.reason}",
                            f"make {root} a root:root 0755 directory (or remove it)") from None
        except OSError as exc:
            raise _storage_error(exc, root) from None
        try:
            if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
                raise NodeFault(f"node weights cache {root} is read-only", "remount the node-local disk read-write")
        finally:
            os.close(fd)
    finally:
        os.close(pfd)
    return root


def _node_cache_healthy(root: str) -> bool:
    """Can root still write and fsync a file in the node cache root? (Tells a node fault from a bad source.)"""
    probe = f"{root}/.probe-{os.getpid()}"
    try:
        if os.statvfs(root).f_flag & os.ST_RDONLY:
            return False
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(probe)
    except OSError:
        return False
    return True


def _stage_child(ctx: HookContext, spec: JobSpec, raw: list[str], team: str, root: str,
                 team_gid: int | None = None, budget: float | None = None,
                 image: str | None = None) -> dict[str, Any]:
    """Run in a forked root child: stage the job's weights (or, with ``image``, its image's entry),
    return a JSON-able, classified outcome.

    Why classify here and not in the parent: only the child has the real exception (class, ``errno``,
    the ``OSError`` behind a :class:`~slurm_bt.errors.StorageError`) and can probe the node cache
    before deciding that an I/O error is the node's fault rather than the cluster tier's.
    """
    from slurm_bt.errors import BtError, CacheFullError, CacheIntegrityError, CacheLockTimeout, WeightsJobError
    from slurm_bt.weights.node_stage import stage_for_job

    os.umask(0o022)  # the job user must traverse jobs/<id> and read weights.json (run_in_child sets 077)
    lines: list[str] = []

    def text(exc: BaseException) -> str:
        msg = " ".join(exc.lines()) if isinstance(exc, BtError) else str(exc)
        return " ".join(msg.split())[:1500]

    try:
        # A node miss is copied by a node stager outside this hook's clock (docs/weights-cache.md
        # §Node misses of any size); this only waits briefly, well inside the child's budget.
        from slurm_bt.weights.node_stager import policy_from_settings

        policy = policy_from_settings(ctx.settings)
        wait_s = min(policy.prolog_wait_s, max(0.0, (budget or policy.prolog_wait_s + 5) - 5.0))
        if image is not None:
            from slurm_bt.weights.node_stage import stage_image_for_job

            entries = [stage_image_for_job(ctx.env.to_environ(), spec, image, team=team, team_gid=team_gid,
                                           site=ctx.site, log=lines.append, stager=policy, wait_s=wait_s)]
        else:
            entries = stage_for_job(ctx.env.to_environ(), spec, raw, team=team, team_gid=team_gid, site=ctx.site,
                                    log=lines.append, stager=policy, wait_s=wait_s)
    except (WeightsJobError, CacheFullError, CacheIntegrityError, CacheLockTimeout) as exc:
        return {"outcome": "job", "message": text(exc), "lines": lines}
    except OSError as exc:  # StorageError included: a blob in no tier, cluster-tier I/O, the node cache
        err = exc.errno
        cause = exc.__cause__
        if err is None and isinstance(cause, OSError):
            err = cause.errno
        if err in _NODE_FAULT_ERRNOS and not _node_cache_healthy(root):
            return {"outcome": "node", "message": f"node weights cache {root}: {text(exc)}", "lines": lines}
        if err in (errno.ENOSPC, errno.EDQUOT):
            return {"outcome": "job", "message": f"the node weights cache {root} is full: {text(exc)}",
                    "lines": lines}
        return {"outcome": "job", "message": text(exc), "lines": lines}
    return {"outcome": "ok", "entries": entries, "lines": lines}


def stage_weights(ctx: HookContext, spec: JobSpec, team: Team) -> dict[str, object]:
    """Copy the job's declared weights into this node's cache and link them for the job.

    The work runs in a forked root child bounded by what is left of the hook's deadline (minus
    :data:`WEIGHTS_RESERVE_S`). A node miss is not copied there: the child leases the entry, starts
    its node stager and waits at most ``weights_prolog_wait_s``; the job's first step waits for the
    rest (docs/weights-cache.md §3.1), so the model's size never meets the deadline. A child that
    still overruns (a hung cluster filesystem) fails *the job* with a reason, never the node. Only an
    unusable node cache (missing or unsafe parent, read-only, ``EIO`` confirmed by a probe write) is a
    node fault.

    Returns:
        The record fields (``weights``: source and tier per declared source).
    """
    ctx.phase = "weights-manifests"
    raw = _read_manifests_as_user(ctx, spec)
    entries = _stage_on_node(ctx, spec, team, raw, None, "weights")
    ctx.notes.append("weights=" + ",".join(str(e.get("tier")) for e in entries))
    return {"weights": [{"source": e.get("source"), "tier": e.get("tier")} for e in entries]}


def _read_image_manifest_as_user(ctx: HookContext, spec: JobSpec) -> str:
    """``<job dir>/image/manifest.json``, read in a child dropped to the user (like the weights manifests)."""
    from slurm_bt.weights.node_stage import load_job_image_manifest

    job_dir = spec.context.job_dir
    raw = _read_as_job_user(ctx, lambda: load_job_image_manifest(job_dir), f"the image manifest in {job_dir}/image",
                            max_result_bytes=2 * _MANIFEST_MAX + 65536)
    if not isinstance(raw, str):
        raise HookUserError(f"{job_dir}/image/manifest.json is not a readable image manifest")
    return raw


def stage_image(ctx: HookContext, spec: JobSpec, team: Team) -> dict[str, object]:
    """Place the job's pinned image on this node (node tier) and link it for the runtime.

    The same bounds and classification as :func:`stage_weights`: a bad, forged or missing image
    entry fails the job with a reason; only an unusable node cache is a node fault.

    Returns:
        The record fields (``image``: source and tier).
    """
    ctx.phase = "image-manifest"
    raw = _read_image_manifest_as_user(ctx, spec)
    entries = _stage_on_node(ctx, spec, team, [], raw, "image")
    ctx.notes.append("image=" + ",".join(str(e.get("tier")) for e in entries))
    first = entries[0] if entries else {}
    return {"image": {"source": first.get("source"), "tier": first.get("tier")}}


def _stage_on_node(ctx: HookContext, spec: JobSpec, team: Team, raw: list[str], image: str | None,
                   what: str) -> list[dict[str, Any]]:
    """Run :func:`_stage_child` for ``what`` (``weights`` or ``image``) in a bounded root child."""
    from slurm_bt.weights.plan import team_slug

    env = ctx.env
    ctx.phase = f"{what}-node-cache"
    root = _node_cache_root(ctx)
    ctx.phase = f"{what}-stage"
    budget = ctx.budget(ctx.remaining(), reserve_s=WEIGHTS_RESERVE_S)
    if budget < 1.0:
        raise HookUserError(f"no time left in the slurm-bt prolog on {env.node} to stage this job's {what} "
                            f"(deadline_s={ctx.settings.deadline_s:.0f}); retry, or ask an admin to raise deadline_s")
    slug = team_slug(team.name)
    try:
        # team.gid: the audience of credentialed entries on the node and the group the team tier must have
        result = run_in_child(lambda: _stage_child(ctx, spec, raw, slug, root, team.gid, budget, image),
                              timeout_s=budget)
    except ChildTimeout:
        raise HookUserError(
            f"copying this job's {what} into the node cache on {env.node} did not finish within {budget:.0f} s "
            f"(the slurm-bt prolog's limit, deadline_s={ctx.settings.deadline_s:.0f}); what was copied is kept, so a "
            "resubmitted job continues from there; the node copy itself runs outside the prolog, so this points at "
            "a slow or hung cluster cache filesystem (an admin can check the hook log)") from None
    except ChildError as exc:
        ctx.log.error(f"{what} staging child failed: {exc.kind}: {exc.exc_type} {exc}")
        raise HookUserError(f"internal error while staging {what} on {env.node} ({exc.exc_type or exc.kind}); an "
                            f"admin can find details in {ctx.settings.log_file}") from None
    if not isinstance(result, dict):
        raise HookUserError(f"internal error while staging {what} on {env.node} (no result)")
    for line in result.get("lines") or []:
        ctx.log.info(str(line)[:500])
    outcome, message = result.get("outcome"), str(result.get("message", ""))
    if outcome == "node":
        raise NodeFault(message, f"check the node-local disk holding {root}, then resume the node")
    if outcome != "ok":
        raise HookUserError(f"cannot stage this job's {what} on {env.node}: {message}")
    return [e for e in result.get("entries") or [] if isinstance(e, dict)]


def prolog_body(ctx: HookContext) -> None:
    """The prolog's work (see the module docstring); raises the runner's exception classes."""
    env = ctx.env
    ctx.phase = "reset-notes"
    state = JobStateDir(env, ctx.state_root)
    state.reset()
    write_job_owner(ctx.state_root, env.node, env.job_id, env.uid, env.gid)
    if not env.untrusted_comment.startswith(COMMENT_PREFIX):
        if env.untrusted_comment.startswith(STAGING_COMMENT_PREFIX):
            # a weights staging job: root makes its team's cluster-tier dirs first (no squats)
            ctx.phase = "weights-tiers"
            provision_cluster_tiers(ctx)
        ctx.notes.append("not a slurm-bt job")
        return
    ctx.phase = "scratch"
    scratch = make_scratch(ctx)
    record: dict[str, object] = {"scratch": scratch}
    ctx.phase = "runtime"
    runtime = make_user_runtime_dir(ctx)
    if runtime is not None:
        record["runtime"] = runtime
    ctx.phase = "job-spec"
    spec = read_job_spec_as_user(ctx)
    record["project_id"] = spec.project_id
    # A container job runs the node's copy of its pinned image (docs/containers.md); "none" runs none.
    image = spec.image_pin is not None and spec.container_runtime != "none"
    team = job_team(ctx) if spec.cache.enabled or spec.weights or image else None
    if spec.cache.enabled and team is not None:
        ctx.phase = "caches"
        record.update(make_caches(ctx, spec, team))
    if spec.checkpointing.enabled or spec.load_checkpoint.enabled:
        ctx.phase = "store-team-dir"
        try:
            store_team = team if team is not None else job_team(ctx)
        except HookUserError as exc:  # the store falls back to the user's own group (checkpoints/store.py)
            ctx.log.warning(f"checkpoint store team directory: {exc}")
        else:
            make_store_team_dir(ctx, spec, store_team)
    if spec.weights and team is not None:
        record.update(stage_weights(ctx, spec, team))
    if image and team is not None:
        record.update(stage_image(ctx, spec, team))
    ctx.phase = "record"
    state.write_record(record)


def _record_user_error(ctx: HookContext, reason: str) -> None:
    JobStateDir(ctx.env, ctx.state_root).write_error(reason)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -I -m slurm_bt.hooks.prolog``."""
    return run_hook("prolog", prolog_body, _record_user_error, argv)


if __name__ == "__main__":
    sys.exit(main())
