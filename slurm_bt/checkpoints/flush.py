"""The final flush: upload what is left of a node's checkpoints, within a time budget, never draining.

Called in two places:

* by the background uploader when the start commands have ended (as the job user, no hard budget);
* by the root epilog (``flush_job_checkpoints(env, deadline_s, site=...)``), where the upload runs in a child
  dropped to the job user (:mod:`slurm_bt.posix.privdrop`). If the budget runs out, or the store is unreachable,
  the child is killed (every upload is resumable) and the checkpoint directory is **handed off**:
  renamed, fd-relative and without following symlinks, from the job's scratch into the root-owned
  hand-off area on the same filesystem (:func:`~slurm_bt.checkpoints.locations.handoff_root`), where
  scratch cleanup never looks. ``slurm-bt checkpoints resume-handoffs`` (root, or a sweeper)
  finishes it later. The epilog returns quickly and exits 0 either way: a slow store or a user's
  20 GiB checkpoint is not a node fault.

The uploader leaves ``.slurm-bt-uploader.json`` at the top of ``BT_CHECKPOINT_DIR`` (a dot file, so
never a checkpoint) naming the job spec and the node rank; it travels with a hand-off.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.atomic import fsync_dir, write_file_atomic
from slurm_bt.checkpoints.locations import handoff_root, host_checkpoint_dir, is_shared_fs, scratch_checkpoint_dir
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import credentials_for, open_store, team_group
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader
from slurm_bt.errors import BtError, DeadlineExceeded, StorageError
from slurm_bt.job_spec import JOB_SPEC_MAX_BYTES, JobSpec, read_job_spec
from slurm_bt.posix.user_files import read_user_file
from slurm_bt.site.settings import SiteSettings, expand_path, load_site_settings
from slurm_bt.trusted_files import check_own_dir

if TYPE_CHECKING:
    from slurm_bt.posix.privdrop import ChildLimits
    from slurm_bt.site.hook_settings import HandoffPolicy

__all__ = ["SPEC_MAX_BYTES", "STATE_NAME", "FlushResult", "build_uploader", "child_limits", "flush_job_checkpoints",
           "prolog_team", "read_spec", "read_state", "write_state"]

STATE_NAME = ".slurm-bt-uploader.json"


@dataclass
class FlushResult:
    """What a flush did (the epilog logs it; it never turns into a non-zero exit).

    Attributes:
        status: ``done`` (everything uploaded), ``nothing`` (no checkpointing on this node),
            ``handed-off`` (the rest moved to the hand-off area), ``incomplete`` (not root: the
            rest stays where it is) or ``error``.
        uploaded: checkpoint names uploaded by this flush.
        handoff: the hand-off entry's path, when one was made.
        message: one line for the log.
        elapsed_s: wall time spent.
    """

    status: str
    uploaded: list[str] = field(default_factory=list)
    handoff: str | None = None
    message: str = ""
    elapsed_s: float = 0.0


def write_state(checkpoint_dir: Path, *, spec_path: str, job_id: str, rank: int, node: str | None) -> None:
    """Record, beside the checkpoints, which job spec and rank they belong to."""
    data = {"spec_path": spec_path, "job_id": job_id, "rank": rank, "node": node}
    write_file_atomic(checkpoint_dir / STATE_NAME, json.dumps(data).encode(), mode=0o600)


STATE_MAX_BYTES = 65536
SPEC_MAX_BYTES = JOB_SPEC_MAX_BYTES
"""The largest ``job.json`` read after the job (:data:`slurm_bt.job_spec.JOB_SPEC_MAX_BYTES`)."""


def read_state(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The uploader state file, or None (also when the job replaced it with a FIFO, device or symlink)."""
    try:
        data = json.loads(read_user_file(checkpoint_dir / STATE_NAME, STATE_MAX_BYTES))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_spec(path: str | Path) -> JobSpec:
    """A job's ``job.json``: :func:`slurm_bt.job_spec.read_job_spec` (the one bounded reader).

    Raises:
        OSError: it cannot be read or is refused (:class:`~slurm_bt.posix.user_files.UnsafeFile`).
        ValueError: it is not a valid job spec.
    """
    return read_job_spec(path)


def build_uploader(spec: JobSpec, *, job_id: str, rank: int, checkpoint_dir: Path, account: str | None = None,
                   quiet_s: float | None = None) -> RankUploader:
    """A :class:`RankUploader` for this process's user (credentials from the user's secret store).

    ``account``: the team group the root prolog resolved (:func:`prolog_team`), else the job's Slurm
    account; it decides the team namespace ``_teams/<team>/`` the checkpoints go to and, for a
    ``file://`` store, the group they are shared with (:func:`~slurm_bt.checkpoints.store.team_group`).
    Never a value from the job's own files: the job spec is the user's.
    """
    from slurm_bt.checkpoints.locations import parse_store_uri

    uri = parse_store_uri(spec.storage["checkpoint_store"])
    pw = pwd.getpwuid(os.getuid())
    secrets_root = expand_path(spec.storage["secrets"], user=pw.pw_name, uid=pw.pw_uid, home=pw.pw_dir)
    team, gid = team_group(account)
    store = open_store(uri, credentials=credentials_for(uri, secrets_root), gid=gid)
    # A shared BT_CHECKPOINT_DIR (same directory on every node) is one copy: rank 0 uploads it alone.
    group = 1 if spec.nodes > 1 and is_shared_fs(checkpoint_dir) else spec.nodes
    ident = JobIdentity(project_name=spec.project_name, project_id=spec.project_id, job_id=job_id,
                        user=spec.context.user, rank=rank, group_size=group, team=team)
    if quiet_s is None:
        quiet_s = float(os.environ.get("BT_CHECKPOINT_QUIET_S", "120"))
    return RankUploader(store=store, ident=ident, checkpoint_dir=checkpoint_dir,
                        tracker=CompletionTracker(quiet_s=quiet_s))


def _trusted_site() -> SiteSettings:
    """Root reads only the admin's file (``$SLURM_BT_SITE_CONFIG`` comes from the job's world)."""
    return load_site_settings(environ={}) if os.geteuid() == 0 else load_site_settings()


def _scratch_checkpoints(env: Mapping[str, str], job_id: str, node: str | None, site: SiteSettings) -> Path:
    """The fixed, trusted place of a job's checkpoints under scratch (from site settings only)."""
    user = env.get("SLURM_JOB_USER", "")
    try:
        pw = pwd.getpwnam(user) if user else pwd.getpwuid(int(env.get("SLURM_JOB_UID", os.getuid())))
        home, uid, user = pw.pw_dir, pw.pw_uid, pw.pw_name
    except (KeyError, ValueError):
        home, uid = "", -1
    root = expand_path(site.storage.scratch, user=user, uid=uid, home=home, node=node)
    return Path(scratch_checkpoint_dir(root, job_id))


def _locate(env: Mapping[str, str], job_id: str, node: str | None,
            site: SiteSettings) -> tuple[JobSpec, int, Path, str] | None:
    """Find this node's checkpoint dir, the job spec and the rank (run as the job user)."""
    fixed = _scratch_checkpoints(env, job_id, node, site)
    state = read_state(fixed)
    spec_path = (state or {}).get("spec_path") or (
        f"{env['SLURM_JOB_WORK_DIR']}/job.json" if env.get("SLURM_JOB_WORK_DIR") else None)
    if not spec_path:
        return None
    try:
        spec = read_spec(str(spec_path))
    except (OSError, ValueError) as exc:
        if _has_entries(fixed):
            # Checkpoints are there but the job made its spec unreadable (a FIFO, /dev/zero...):
            # fail, so they are handed off, where age and size bounds apply, instead of being
            # kept in scratch with nothing to remove them.
            raise StorageError(str(spec_path), f"job spec unreadable, checkpoints not uploaded: {exc}") from exc
        return None
    if not spec.checkpointing.enabled:
        return None
    host = host_checkpoint_dir(spec, job_id, node)
    if host and Path(host) != fixed:
        try:
            # Step 1 refuses a checkpoint_path another user created first; nothing of this job is in it,
            # and the flush must not write its state file there or upload what the squatter put there.
            check_own_dir(Path(host))
        except StorageError:
            return None
    ckpt_dir = Path(host) if host else fixed
    state = read_state(ckpt_dir) or state
    if state is not None and str(state.get("job_id")) == job_id and isinstance(state.get("rank"), int):
        rank = int(state["rank"])
    elif env.get("SLURM_NODEID", "").isdigit():
        rank = int(env["SLURM_NODEID"])
    elif spec.nodes == 1:
        rank = 0
    elif _has_entries(ckpt_dir):
        # A multi-node job whose uploader never started: the rank is unknown. Handing off (bounded by
        # age and size) beats keeping the checkpoints in scratch with nothing to remove them.
        raise StorageError(str(ckpt_dir), "no uploader state file: cannot tell this node's rank")
    else:
        return None
    return spec, rank, ckpt_dir, str(spec_path)


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as it:
            return any(not e.name.startswith(".") for e in it)
    except OSError:
        return False


def prolog_team(node: str | None, job_id: str) -> str | None:
    """The team group the root prolog resolved for the job (root-written notes), if it ran.

    The flush and a hand-off open the store with the same team as the job's uploader did, so a
    project directory created (or repaired by an admin) for that team is the one they accept.
    """
    if not node:
        return None
    try:
        from slurm_bt.posix.job_notes import read_hook_state

        record = read_hook_state(node, job_id).record or {}
    except (ImportError, OSError, ValueError):
        return None
    team = record.get("team")
    return team if isinstance(team, str) and team else None


def child_limits() -> ChildLimits:
    """Memory and CPU limits of an upload child, from hooks.toml ``[handoff]`` (defaults if unreadable)."""
    from slurm_bt.posix.privdrop import ChildLimits

    policy = handoff_policy()
    return ChildLimits(memory_bytes=policy.child_memory_mib * 1024 * 1024, cpu_s=policy.child_cpu_s)


def handoff_policy() -> HandoffPolicy:
    """hooks.toml ``[handoff]`` (root-owned file only), or the defaults when it is absent or invalid."""
    from slurm_bt.site.hook_settings import HandoffPolicy, HookConfigError, load_hook_settings

    try:
        return load_hook_settings().handoff
    except (HookConfigError, OSError):
        return HandoffPolicy()


def _upload_all(env: dict[str, str], job_id: str, node: str | None, budget_s: float,
                site: SiteSettings, team: str | None = None) -> dict[str, Any]:
    located = _locate(env, job_id, node, site)
    if located is None:
        return {"status": "nothing", "uploaded": [], "checkpoint_dir": None}
    spec, rank, ckpt_dir, spec_path = located
    if not ckpt_dir.is_dir():
        return {"status": "nothing", "uploaded": [], "checkpoint_dir": str(ckpt_dir)}
    if read_state(ckpt_dir) is None:
        # The job's uploader never ran (e.g. its store location was squatted): record spec and rank
        # now, so that a hand-off can still be finished once the cause is repaired.
        try:
            write_state(ckpt_dir, spec_path=spec_path, job_id=job_id, rank=rank, node=node)
        except OSError:
            pass
    # The same team as the job's own uploader (slurm_bt.steps.checkpoint_agent): the prolog's, else the
    # Slurm account, so every pass of the job writes one namespace, _teams/<team>/.
    uploader = build_uploader(spec, job_id=job_id, rank=rank, checkpoint_dir=ckpt_dir,
                              account=team or env.get("SLURM_JOB_ACCOUNT"))
    try:
        done = uploader.run_once(final=True, deadline=time.monotonic() + budget_s)
        # Everything of this node is in the store: its last pass is done (the rank-0-only rule of
        # slurm_bt/checkpoints/index.py needs it when the job's own uploader was killed first).
        try:
            uploader.report(final=True)
        except (BtError, OSError) as exc:  # everything is uploaded: no reason to hand anything off
            print(f"slurm-bt checkpoints: job {job_id} on {node}: cannot record the final pass: {exc}",
                  file=sys.stderr, flush=True)
    finally:
        uploader.store.close()
    return {"status": "done", "uploaded": done, "checkpoint_dir": str(ckpt_dir)}


def flush_job_checkpoints(env: Mapping[str, str], deadline_s: float, *,
                          site: SiteSettings | None = None) -> FlushResult:
    """Upload this node's remaining checkpoints of ``env['SLURM_JOB_ID']`` within ``deadline_s`` seconds.

    Args:
        env: the hook's (or the job's) environment: ``SLURM_JOB_ID``, ``SLURMD_NODENAME``, and for
            root ``SLURM_JOB_UID``/``SLURM_JOB_GID``/``SLURM_JOB_USER`` (trusted, from slurmd).
        deadline_s: the whole budget, hand-off included. Keep it well below ``PrologEpilogTimeout``.
        site: the site settings (tests); default: the admin's file when root, else the usual lookup.

    Never raises for store, user or budget problems: the result says what happened.
    """
    started = time.monotonic()
    env = dict(env)
    job_id = env.get("SLURM_JOB_ID", "")
    node = env.get("SLURMD_NODENAME")
    if not job_id.replace("_", "").isdigit():
        return FlushResult("error", message=f"bad SLURM_JOB_ID {job_id!r}")
    as_root = os.geteuid() == 0
    uid = int(env.get("SLURM_JOB_UID", os.getuid()))
    gid = int(env.get("SLURM_JOB_GID", os.getgid()))
    reserve = min(15.0, max(deadline_s * 0.2, 1.0))
    budget = max(deadline_s - reserve, 0.5)
    site = site or _trusted_site()
    try:
        if as_root:
            from slurm_bt.posix.privdrop import ChildError, ChildTimeout, run_as_uid

            child_env = {"PATH": "/usr/bin:/bin", **{k: v for k, v in env.items() if k.startswith("SLURM")}}
            if os.environ.get("SLURM_BT_SITE_CONFIG"):
                child_env["SLURM_BT_SITE_CONFIG"] = os.environ["SLURM_BT_SITE_CONFIG"]
            team = prolog_team(node, job_id)
            try:
                res = run_as_uid(lambda: _upload_all(child_env, job_id, node, budget, site, team), uid=uid, gid=gid,
                                 timeout_s=budget, extra_env=child_env, limits=child_limits())
            except ChildTimeout:
                return _handoff(env, job_id, node, uid, gid, started, "time budget ran out", site, team)
            except ChildError as exc:
                if exc.exc_type == DeadlineExceeded.__name__:
                    return _handoff(env, job_id, node, uid, gid, started, "time budget ran out", site, team)
                return _handoff(env, job_id, node, uid, gid, started, f"upload failed: {exc}", site, team)
        else:
            try:
                res = _upload_all(env, job_id, node, budget, site)
            except DeadlineExceeded:
                return FlushResult("incomplete", message="time budget ran out; the rest stays in BT_CHECKPOINT_DIR "
                                   "(only root can hand it off)", elapsed_s=time.monotonic() - started)
    except (BtError, OSError, ValueError) as exc:
        return FlushResult("error", message=str(exc), elapsed_s=time.monotonic() - started)
    return FlushResult(str(res.get("status", "done")), uploaded=list(res.get("uploaded", [])),
                       message=f"uploaded {len(res.get('uploaded', []))} checkpoint(s)",
                       elapsed_s=time.monotonic() - started)


def _open_beneath(root: Path, parts: list[str]) -> int:
    """Open ``root/parts...`` as a directory fd without following a symlink in any component."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in parts:
            nxt = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _has_payload(src: Path) -> bool:
    """Whether the checkpoint directory ``src`` holds anything but the uploader's state file.

    Unknown (not a real directory, unreadable) counts as payload: the hand-off then decides as before.
    """
    try:
        fd = _open_beneath(src.parents[2], [src.parent.parent.name, src.parent.name, src.name])
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        return any(name != STATE_NAME for name in os.listdir(fd))
    finally:
        os.close(fd)


def ensure_handoff_root(path: Path) -> int:
    """Create (or adopt, if root-owned and a real directory) the hand-off area; returns its fd (0711)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o711)
    except FileExistsError:
        pass
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode):
        os.close(fd)
        raise StorageError(str(path), "hand-off area must be a root-owned directory")
    os.fchmod(fd, 0o711)
    return fd


def _handoff(env: Mapping[str, str], job_id: str, node: str | None, uid: int, gid: int, started: float,
             why: str, site: SiteSettings, team: str | None = None) -> FlushResult:
    """Root only: move the job's scratch checkpoints into the hand-off area and record them."""
    if not _has_payload(_scratch_checkpoints(env, job_id, node, site)):
        # Only the uploader's state file (e.g. the store refused the job before it wrote anything):
        # every checkpoint is accounted for, and an entry would be retried and quarantined for nothing.
        return FlushResult("done", message=f"{why}; no checkpoint to upload", elapsed_s=time.monotonic() - started)
    hroot = Path(handoff_root(site.storage.model_dump(), node))
    entry_name = f"{job_id}.{(node or 'node').replace('/', '_')}"
    try:
        hfd = ensure_handoff_root(hroot)
    except (OSError, BtError) as exc:
        return FlushResult("error", message=f"{why}; cannot prepare the hand-off area: {exc}",
                           elapsed_s=time.monotonic() - started)
    try:
        try:
            os.mkdir(entry_name, 0o700, dir_fd=hfd)
        except FileExistsError:
            pass
        efd = os.open(entry_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=hfd)
        try:
            est = os.fstat(efd)
            if est.st_uid != 0:
                raise OSError(errno.EPERM, f"{hroot}/{entry_name} is owned by uid {est.st_uid}")
            # 0711 set explicitly: mkdir's mode passes through the epilog's umask (077), and a 0700
            # entry made every resume fail with "Permission denied" in the child that runs as the user.
            os.fchmod(efd, 0o711)
            src = _scratch_checkpoints(env, job_id, node, site)
            moved = os.path.lexists(f"{hroot}/{entry_name}/data")  # an earlier epilog run moved it
            try:
                parent_fd = _open_beneath(src.parents[2], [src.parent.parent.name, src.parent.name])
                try:
                    kind = os.stat(src.name, dir_fd=parent_fd, follow_symlinks=False).st_mode
                    # Only a real directory is handed off: a symlink the job left there would make
                    # every later sweep read wherever it points.
                    if stat.S_ISDIR(kind) and not os.path.lexists(f"{hroot}/{entry_name}/data"):
                        os.rename(src.name, "data", src_dir_fd=parent_fd, dst_dir_fd=efd)
                        moved = True
                finally:
                    os.close(parent_fd)
            except FileNotFoundError:
                pass  # checkpoints outside scratch (checkpoint_path) are not deleted with it
            record = {"job_id": job_id, "node": node, "uid": uid, "gid": gid, "user": env.get("SLURM_JOB_USER"),
                      "moved": moved, "source": None if moved else str(src), "reason": why, "team": team,
                      "account": env.get("SLURM_JOB_ACCOUNT"), "created": time.time(),
                      "work_dir": env.get("SLURM_JOB_WORK_DIR")}
            data = json.dumps(record).encode()
            tmp = f".handoff.json.tmp-{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=efd)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, "handoff.json", src_dir_fd=efd, dst_dir_fd=efd)
            os.fsync(efd)
        finally:
            os.close(efd)
        fsync_dir(hroot)
    except OSError as exc:
        return FlushResult("error", message=f"{why}; hand-off failed: {exc}", elapsed_s=time.monotonic() - started)
    finally:
        os.close(hfd)
    print(f"slurm-bt checkpoints: job {job_id} on {node}: {why}; handed off to {hroot}/{entry_name}",
          file=sys.stderr, flush=True)
    return FlushResult("handed-off", handoff=f"{hroot}/{entry_name}", message=why,
                       elapsed_s=time.monotonic() - started)
