"""Names, keys and paths of the checkpoint subsystem: pure functions, no I/O.

Why one module: the uploader (node), the flush (epilog), the resolver (login node) and the CLI must
agree on where a checkpoint lives in the store and on the node, so the rules live here once.

Store URI (``storage.checkpoint_store`` in the site config), parsed by
:func:`slurm_bt.storage.url.parse_store_url` (the one URL parser; the query options are listed there)::

    file:///shared/checkpoints
    s3://bucket/prefix?endpoint_url=http://127.0.0.1:8333&region=us-east-1&secret=ckpt-store
    r2://<account_id>.<bucket>/prefix?secret=ckpt-store
    gs://bucket/prefix?secret=ckpt-store-gcs&endpoint_url=http://127.0.0.1:4443

Keys (docs/checkpoints.md, "Where things are")::

    _teams/<team>/<project_id>/<job_id>/...     every upload: the project name belongs to the team
    <project_id>/<job_id>/...                   legacy (before team namespaces): read, never written

``<team>`` is the team's slug (:func:`slurm_bt.posix.teams.team_slug` of its Unix group), the same
spelling as the weights cache's ``teams/<team>``. A legacy project called ``_teams`` is never read
(the prolog refuses project ids that do not start with a letter or a digit), so the two layouts
never collide. Every key function takes ``team``: a slug for a team namespace, ``None`` for the
legacy location, and no default, so no caller writes to the legacy location by omission.
"""

from __future__ import annotations

import os
import re

from slurm_bt.job_spec import JobSpec
from slurm_bt.node.job_paths import CHECKPOINT_REL, HANDOFF_RECORDS_DIR, job_layout
from slurm_bt.posix.mountinfo import MOUNTINFO, filesystem_type
from slurm_bt.posix.teams import is_team_slug
from slurm_bt.site.settings import expand_path
from slurm_bt.storage.url import StoreUrl, parse_store_url

__all__ = [
    "CHECKPOINT_NAME",
    "CHECKPOINT_REL",
    "HANDOFF_RECORDS_DIR",
    "MARKER_NAMES",
    "TEAMS_DIR",
    "checkpoint_key",
    "file_key",
    "handoff_root",
    "host_checkpoint_dir",
    "index_key",
    "is_shared_fs",
    "job_prefix",
    "parse_store_uri",
    "project_prefix",
    "rank_index_key",
    "scratch_checkpoint_dir",
    "valid_checkpoint_name",
]

CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}")
"""A checkpoint is a top-level directory of BT_CHECKPOINT_DIR with a name like this.

Names starting with a dot (``.tmp-x``, ``.staging``) are never checkpoints: that is where trainers
and copy tools keep work in progress.
"""

MARKER_NAMES = (".complete", "COMPLETE")
"""Files whose presence at the top of a checkpoint directory declares it complete (never uploaded)."""

_IN_PROGRESS = re.compile(r"(^tmp[-_.]|[-_.](tmp|partial|inprogress|incomplete)$)", re.IGNORECASE)


def valid_checkpoint_name(name: str) -> bool:
    """Whether ``name`` can be a checkpoint (also rejects obvious in-progress names like ``tmp-*``)."""
    return bool(CHECKPOINT_NAME.fullmatch(name)) and not _IN_PROGRESS.search(name) and ".." not in name


def parse_store_uri(uri: str) -> StoreUrl:
    """Parse ``storage.checkpoint_store`` (:func:`slurm_bt.storage.url.parse_store_url`).

    Raises:
        StorageError: unknown scheme or option, relative ``file`` path, ``..`` anywhere.
    """
    return parse_store_url(uri)


TEAMS_DIR = "_teams"
"""The top-level directory (key prefix) of the team namespaces: ``_teams/<team>/<project_id>/...``."""


def project_prefix(project_id: str, *, team: str | None) -> str:
    """``_teams/<team>/<project_id>``, or the legacy ``<project_id>`` when ``team`` is None.

    Raises:
        ValueError: ``team`` is not a team slug (a value from a user-writable file, e.g. a pinned
            manifest, that could otherwise name ``..`` or another level).
    """
    if team is None:
        return project_id
    if not is_team_slug(team):
        raise ValueError(f"invalid team name {team!r}")
    return f"{TEAMS_DIR}/{team}/{project_id}"


def job_prefix(project_id: str, job_id: str, *, team: str | None) -> str:
    """``<project prefix>/<job_id>``: everything one job stored (:func:`project_prefix`)."""
    return f"{project_prefix(project_id, team=team)}/{job_id}"


def index_key(project_id: str, job_id: str, *, team: str | None) -> str:
    """The merged per-job index."""
    return f"{job_prefix(project_id, job_id, team=team)}/index.json"


def rank_index_key(project_id: str, job_id: str, rank: int, *, team: str | None) -> str:
    """One rank's authoritative index part (single writer: that rank's uploader)."""
    return f"{job_prefix(project_id, job_id, team=team)}/ranks/rank-{rank}.json"


def checkpoint_key(project_id: str, job_id: str, rank: int, checkpoint: str, *, team: str | None) -> str:
    """Where one rank's copy of a checkpoint lives: mirrors ``<download_folder>/rank-<n>/<name>``."""
    return f"{job_prefix(project_id, job_id, team=team)}/rank-{rank}/{checkpoint}"


def file_key(project_id: str, job_id: str, rank: int, checkpoint: str, relpath: str, *, team: str | None) -> str:
    """The object key of one file of a checkpoint."""
    return f"{checkpoint_key(project_id, job_id, rank, checkpoint, team=team)}/{relpath}"


def host_checkpoint_dir(spec: JobSpec, job_id: str, node: str | None) -> str | None:
    """The host path of ``BT_CHECKPOINT_DIR`` on ``node`` (None when checkpointing is off).

    Inside a container the variable names the container path; the uploader runs on the host, so the
    bind mount that shows it is followed back to its source.
    """
    if not spec.checkpointing.enabled:
        return None
    return job_layout(spec, job_id=job_id, node=node).host_path("BT_CHECKPOINT_DIR")


def scratch_checkpoint_dir(scratch_root: str, job_id: str) -> str:
    """``<scratch root>/<job id>/mnt/checkpoints``: the host checkpoint dir a job gets when it names none.

    The epilog's flush looks here first (from site settings only, never from the job's world), and
    the epilog keeps this subtree when the upload is not confirmed. The relative part is
    :data:`CHECKPOINT_REL` (``slurm_bt.node.job_paths``, which builds it for the prepare step).
    """
    return "/".join((scratch_root.rstrip("/"), job_id, *CHECKPOINT_REL))


def handoff_root(spec_storage: dict[str, str], node: str | None) -> str:
    """The root-owned hand-off area on a node: a sibling of the scratch root (same filesystem).

    Why a sibling: moving a checkpoint there must be a ``rename`` (O(1), no copy) and it must
    survive scratch cleanup, so it sits next to scratch, never under it.
    """
    scratch_root = expand_path(spec_storage["scratch"], user="", uid=0, home="", node=node)
    parent = scratch_root.rstrip("/").rsplit("/", 1)[0] or "/"
    return f"{parent}/checkpoint-handoff"


SHARED_FS_TYPES = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "cifs",
                             "smb3", "smbfs", "pvfs2", "orangefs", "wekafs", "9p", "virtiofs"})


def is_shared_fs(path: str | os.PathLike[str], mountinfo: str = MOUNTINFO) -> bool:
    """Whether ``path`` lives on a network/cluster filesystem (so every node sees the same directory).

    Why: a multi-node job whose ``BT_CHECKPOINT_DIR`` is shared must be uploaded once (by rank 0),
    not once per node; a node-local one (the default: scratch) by every rank. The answer comes from
    the filesystem type of the longest mount point containing ``path``; FUSE counts as shared.
    """
    fstype = filesystem_type(path, mountinfo)
    return fstype in SHARED_FS_TYPES or fstype.startswith("fuse")
