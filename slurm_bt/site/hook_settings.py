"""Hook policy (``/etc/slurm-bt/hooks.toml``) and the site file, loaded only if root controls them.

Why a second file next to ``site.toml``: the site file is what users, login nodes and compute nodes
must agree on (storage roots, partitions); the hook policy is root-only (the account→group map that
decides who shares a team cache, time budgets, the log file). A policy file a user could write would
let them choose their own team, so both files are refused unless they are owned by root and not
writable by group or others: that is a node fault with an exact fix, never a silent default.

Format (all keys optional; unknown keys are errors)::

    deadline_s = 90              # whole-hook budget; keep it below PrologEpilogTimeout (120 on the dev cluster)
    user_step_timeout_s = 15     # reading job.json as the user
    job_json_max_bytes = 1048576
    log_file = "/var/log/slurm-bt/hooks.log"
    scratch_min_free_mib = 1024  # below this the prolog fails the job (not the node)
    flush_budget_s = 45          # epilog: checkpoint flush
    node_cache_budget_s = 10     # epilog: node-cache lease release + LRU
    shared_fs_identity = "slurmbt"  # root-squashed shared filesystems: the service account that creates
                                    # team directories there (docs/admin.md "Root-squashed shared filesystems")
    [team_groups]                # Slurm account -> Unix group that owns the team cache
    ml-research = "mlteam"
    [handoff]                    # checkpoint hand-offs (docs/checkpoints.md): quarantine and bounds
    max_failures = 3
    max_age_s = 259200           # 3 days
    max_bytes_per_user = 107374182400
    child_timeout_s = 1800       # per entry; also child_memory_mib = 4096, child_cpu_s = 1800
    # node stagers (prolog → node copy of a large weights entry, outside the prolog's clock):
    # weights_prolog_wait_s = 5, weights_stage_rate_mib_s = 0 (no cap), weights_stage_memory_mib = 4096,
    # weights_stage_min_rate_mib_s = 10, weights_stage_stall_s = 300
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Annotated, Literal

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as a package
    import tomli as tomllib

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from slurm_bt.site.settings import DEFAULT_SITE_PATH, SiteSettings, load_site_settings

__all__ = ["DEFAULT_HOOKS_PATH", "HandoffPolicy", "HookConfigError", "HookSettings",
           "load_hook_settings", "load_trusted_site"]

DEFAULT_HOOKS_PATH = Path("/etc/slurm-bt/hooks.toml")

_GroupName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")]
_UserName = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")]
_Account = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")]


class HookConfigError(ValueError):
    """The hook policy or site file is untrusted, unreadable or invalid (a node fault)."""

    def __init__(self, path: str, message: str, fix: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.fix = fix


class HandoffPolicy(BaseModel):
    """hooks.toml ``[handoff]``: bounds of checkpoint hand-offs (docs/checkpoints.md §Hand-off).

    Attributes:
        max_failures: an entry whose upload failed the same way this many times in a row is
            quarantined: kept, reported by ``slurm-bt admin doctor``, never retried automatically.
        max_age_s: entries older than this are removed (quarantined ones too), with a log line.
        max_bytes_per_user: disk one user's entries may hold on a node; beyond it the oldest go.
        child_timeout_s: wall-clock bound of one entry's upload child (its process group is killed).
        child_memory_mib: address-space limit (``RLIMIT_AS``) of upload children (epilog flush too).
        child_cpu_s: CPU-time limit (``RLIMIT_CPU``) of upload children.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_failures: int = Field(default=3, ge=1, le=100)
    max_age_s: float = Field(default=3 * 86400.0, gt=0)
    max_bytes_per_user: int = Field(default=100 * 1024**3, ge=0)
    child_timeout_s: float = Field(default=1800.0, gt=0, le=6 * 3600)
    child_memory_mib: int = Field(default=4096, ge=256)
    child_cpu_s: int = Field(default=1800, ge=10)


class HookSettings(BaseModel):
    """Root-only hook policy (see the module docstring for the file format).

    Attributes:
        deadline_s: internal deadline of a whole hook run, below Slurm's ``PrologEpilogTimeout``.
        user_step_timeout_s: bound for work done as the job user (reading ``job.json``).
        job_json_max_bytes: larger job specs are refused (the job fails).
        log_file: root-owned log (the hooks print nothing on success).
        scratch_min_free_mib: free space the prolog wants on the scratch filesystem.
        flush_budget_s: time the epilog gives the checkpoint flush.
        node_cache_budget_s: time the epilog gives the node-cache lease release and LRU.
        team_groups: Slurm account → Unix group owning that account's team and project caches;
            accounts not listed use the job's primary group (``SLURM_JOB_GID``).
        stale_scratch_after_s: the prolog removes scratch of jobs that are not active on the node
            (their epilog never ran: node crash) once older than this; ``0`` turns that off.
        resume_handoffs: ``background`` (default): an epilog that hands checkpoints off starts a
            detached, niced sweep that finishes the upload after the node is released; ``off``:
            only the periodic ``slurm-bt checkpoints resume-handoffs`` does.
        handoff: bounds of hand-offs and of their upload children (:class:`HandoffPolicy`).
        shared_fs_identity: the user that creates team and project directories on the shared
            filesystem (``posix.layout_owner``); ``None``: root does. Needed where the shared
            filesystem squashes root; the account must be a member of every team group.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    deadline_s: float = Field(default=90.0, gt=0, le=3600)
    user_step_timeout_s: float = Field(default=15.0, gt=0, le=600)
    job_json_max_bytes: int = Field(default=1024 * 1024, gt=0, le=64 * 1024 * 1024)
    log_file: str = "/var/log/slurm-bt/hooks.log"
    scratch_min_free_mib: int = Field(default=1024, ge=0)
    flush_budget_s: float = Field(default=45.0, ge=0, le=3600)
    node_cache_budget_s: float = Field(default=10.0, ge=0, le=3600)
    team_groups: dict[_Account, _GroupName] = Field(default_factory=dict)
    shared_fs_identity: _UserName | None = None
    stale_scratch_after_s: float = Field(default=3600.0, ge=0)
    resume_handoffs: Literal["background", "off"] = "background"
    handoff: HandoffPolicy = Field(default_factory=HandoffPolicy)
    # Node stagers (slurm_bt/weights/node_stager.py, docs/weights-cache.md §Node misses of any size):
    # how long the prolog waits for a node miss before the job's first step waits instead, and the
    # stager's bounds (rate cap, 0 = none; address space; slowest tolerated rate; stall).
    weights_prolog_wait_s: float = Field(default=5.0, ge=0, le=3600)
    weights_stage_rate_mib_s: float = Field(default=0.0, ge=0)
    weights_stage_memory_mib: int = Field(default=4096, ge=512)
    weights_stage_min_rate_mib_s: float = Field(default=10.0, gt=0)
    weights_stage_stall_s: float = Field(default=300.0, gt=0)


def _read_root_owned(path: Path) -> bytes | None:
    """The file's bytes, or None if absent; refuses files a non-root user could have written."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HookConfigError(str(path), f"cannot open: {exc.strerror}", "check the file and its permissions") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise HookConfigError(str(path), "is not a regular file", f"replace it with a file (chmod 0644 {path})")
        if st.st_uid != 0 or stat.S_IMODE(st.st_mode) & 0o022:
            raise HookConfigError(
                str(path), f"is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; "
                "a user could rewrite hook policy", f"chown root:root {path} && chmod 0644 {path}")
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def load_hook_settings(path: Path | None = None) -> HookSettings:
    """Read the hook policy (``DEFAULT_HOOKS_PATH`` when ``path`` is None; defaults if absent).

    Raises:
        HookConfigError: the file is not root-owned, not TOML, or has invalid keys.
    """
    p = path or DEFAULT_HOOKS_PATH
    raw = _read_root_owned(p)
    if raw is None:
        if path is not None:
            raise HookConfigError(str(p), "does not exist", "create it or drop --config from the hook wrapper")
        return HookSettings()
    try:
        return HookSettings.model_validate(tomllib.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise HookConfigError(str(p), f"not valid TOML: {exc}", "fix the syntax") from exc
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise HookConfigError(str(p), msgs, "fix or remove these keys") from exc


def load_trusted_site(path: Path | None = None) -> SiteSettings:
    """The site settings as the hooks must see them: only from a root-owned file (or defaults).

    ``$SLURM_BT_SITE_CONFIG`` is deliberately ignored: the hook environment does not come from the
    admin, and the wrapper passes ``--site`` instead.

    Raises:
        HookConfigError: the file is untrusted or invalid.
    """
    p = path or DEFAULT_SITE_PATH
    if _read_root_owned(p) is None:
        if path is not None:
            raise HookConfigError(str(p), "does not exist", "create it or drop --site from the hook wrapper")
        return SiteSettings()
    try:
        return load_site_settings(p, environ={})
    except Exception as exc:  # SiteConfigError lists every problem; keep them on one line
        raise HookConfigError(str(p), " ".join(str(exc).split()), "fix the site file") from exc
