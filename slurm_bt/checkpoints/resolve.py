"""Resolve ``LoadCheckpointConfig`` at submit time and pin the result into the job spec.

Why at submit: "latest" moves while jobs run. Resolving once, on the login node and as the
submitting user (so the store's permissions decide what the user may load), turns every reference
into an immutable manifest (job, checkpoint, and per rank the files with size and sha256) that the
nodes download and verify. A reference that matches nothing fails the submission with exit 2 and
names the field (``job.runtime.load_checkpoint_config.checkpoints[0]``); nothing is submitted.

Reference semantics:

* ``from_named_checkpoint(checkpoint_name, job_id)``: that checkpoint of that job; it must be
  complete (every rank of the job uploaded it);
* ``from_latest_checkpoint(job_id=J)``: J's newest complete checkpoint;
* ``from_latest_checkpoint(project_name=P)``: the newest complete checkpoint of P's newest job that
  has one (jobs ordered by Slurm job id, newest first), as upstream documents it. P is the project
  of the submitting team (a project name belongs to a team, as it belongs to an organisation on
  Baseten): ``_teams/<team>/P``; only when no job there has a complete checkpoint, the legacy
  ``P`` of a store written before team namespaces;
* both: the job, checked to belong to the project.
* neither (``LoadCheckpointConfig(enabled=True)``'s default ``checkpoints``, upstream's "latest"):
  the newest complete checkpoint of the job's *own* project (of its team, as above); when the
  project has none yet, the job starts without one (a warning, not an error: a first run starts
  normally).

A job named by id is looked up in the submitting team's namespace, the caller's other teams' and
the legacy location (:func:`find_job`): job ids are unique, so the first match is the job. Where it
was found is pinned with it (``team`` in the manifest), so the nodes download from that place.

On a restart of a requeued job the prepare step may load the job's own newest checkpoint instead
(:mod:`.resume`).

Trust (docs/checkpoints.md §Trust model): an index is accepted only if it describes the very
``<project>/<job>`` it was read from and, in a ``file://`` store, only from a job directory owned by
the user the index names (:func:`read_trusted_index`); the store itself refuses team namespaces and
project directories that are not a team directory of the reader's (:class:`~slurm_bt.checkpoints.store.FileStore`). A
squatted project or a planted job directory fails the submission naming the directory, never
resolves to someone else's bytes.

The pinned form is the upstream dump plus a ``resolved`` key, so the spec stays readable and
``slurm_bt.job_spec`` needs no new model.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_bt.checkpoints.index import CheckpointView, JobIndex
from slurm_bt.checkpoints.locations import (
    TEAMS_DIR,
    file_key,
    job_prefix,
    parse_store_uri,
    project_prefix,
    valid_checkpoint_name,
)
from slurm_bt.checkpoints.store import CheckpointStore, FileStore, caller_teams, credentials_for, open_store
from slurm_bt.checkpoints.upload import read_job_index
from slurm_bt.errors import ConfigError, Problem, StorageError, UntrustedLocation
from slurm_bt.job_spec import JobSpec, slugify
from slurm_bt.posix.teams import is_team_slug
from slurm_bt.site.settings import expand_path

__all__ = ["FoundJob", "find_job", "is_default_latest", "locate_index", "open_user_store", "pin",
           "read_trusted_index", "resolve_load_checkpoints", "safe_relpath"]

LOC = "job.runtime.load_checkpoint_config.checkpoints"


def safe_relpath(path: str) -> bool:
    """A store-relative file path that cannot escape the download folder."""
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and "\0" not in path and all(
        p not in ("", ".", "..") for p in parts)


def open_user_store(storage: dict[str, str]) -> CheckpointStore:
    """The checkpoint store opened with the *current user's* credentials."""
    uri = parse_store_uri(storage["checkpoint_store"])
    pw = pwd.getpwuid(os.getuid())
    secrets = expand_path(storage["secrets"], user=pw.pw_name, uid=pw.pw_uid, home=pw.pw_dir)
    return open_store(uri, credentials=credentials_for(uri, secrets))


@dataclass(frozen=True)
class FoundJob:
    """A job's index and where it was read: ``team``'s namespace ``_teams/<team>/``, or the legacy location (None).

    Keys of the job's files must be built from where the index was found, not from the caller's
    team: a job read through the legacy fallback has its files at the legacy location.
    """

    index: JobIndex
    team: str | None

    def file_key(self, rank: int, checkpoint: str, relpath: str) -> str:
        """The store key of one file of one of this job's checkpoints."""
        return file_key(self.index.project_id, self.index.job_id, rank, checkpoint, relpath, team=self.team)

    def describe(self) -> str:
        """Where the job is, for a listing: its team namespace, or the legacy location."""
        return f"team {self.team}" if self.team is not None else "legacy location (before team namespaces)"


def read_trusted_index(store: CheckpointStore, project_id: str, job_id: str, *, team: str | None) -> JobIndex | None:
    """A job's index in ``team``'s namespace (None: the legacy location), or None; accepted only from where it belongs.

    Why: in a shared ``file://`` store anybody who can write a directory can write an index naming
    any user. So the index must name the ``<project>/<job>`` it was read from (not a copy of
    someone's index), and in a ``file://`` store the job directory must belong to the user the index
    names: only that user can create files in it (``2750``), so its content is theirs.

    Raises:
        UntrustedLocation: the index does not belong where it was found (the message names the
            directory and the fix), or the store refused the directory itself.
    """
    if team is None and project_id == TEAMS_DIR:
        return None  # no legacy project has that name: it is where the team namespaces live
    index = read_job_index(store, project_id, job_id, team=team)
    if index is None:
        return None
    prefix = job_prefix(project_id, job_id, team=team)
    where = f"{store.uri.display()}/{prefix}"
    if index.project_id != project_id or index.job_id != job_id:
        raise UntrustedLocation(where, f"holds the index of {index.project_id}/{index.job_id} (copied or forged); "
                                "refusing to load from it")
    if isinstance(store, FileStore):
        owner = store.job_owner(project_id, job_id, team=team)
        try:
            named: int | None = pwd.getpwnam(index.user).pw_uid
        except KeyError:
            named = None
        if owner is None or named != owner:
            try:
                who = pwd.getpwuid(owner).pw_name if owner is not None else "nobody"
            except KeyError:
                who = f"uid {owner}"
            raise UntrustedLocation(where, f"its index names user {index.user!r} but the job directory belongs to "
                                    f"{who}: a forged or copied index, refusing to load it (an admin must remove "
                                    f"it: rm -rf {store.root / prefix})")
    return index


def locate_index(store: CheckpointStore, project_id: str, job_id: str, *,
                 teams: Sequence[str]) -> FoundJob | None:
    """A job of ``project_id``: looked up in each of ``teams``' namespaces in order, then at the legacy location.

    The legacy fallback reads stores written before team namespaces (docs/checkpoints.md,
    "Migrating a store from before team namespaces") under their old rules.

    Raises:
        UntrustedLocation: the job was found only where it does not belong (:func:`read_trusted_index`);
            a trusted match in another place wins.
        StorageError: a place could not be read (an object store's ``AccessDenied`` for a team
            namespace the caller's credentials do not cover) and the job was in no other.
    """
    return _first_found(store, job_id, ((project_id, team) for team in (*dict.fromkeys(teams), None)))


def _first_found(store: CheckpointStore, job_id: str, places: Iterable[tuple[str, str | None]],
                 refused: StorageError | None = None) -> FoundJob | None:
    """The job's index in the first of ``places`` (``(project, team)``) that has a trusted one.

    Job ids are unique, so a match in another place is the job: a place that is refused or unreadable
    is skipped, and its error (or ``refused``, met earlier) raised only when the job is nowhere.
    """
    for project, team in places:
        try:
            index = read_trusted_index(store, project, job_id, team=team)
        except StorageError as exc:
            refused = refused or exc
            continue
        if index is not None:
            return FoundJob(index, team)
    if refused is not None:
        raise refused
    return None


def _namespaces(store: CheckpointStore, teams: Sequence[str]) -> list[str]:
    """The team namespaces a search by job id looks in: ``teams`` first, then every team of the caller's.

    Why the caller's groups and not a listing of ``_teams/``: on an object store the listing would
    name every team's prefix, which scoped credentials may not read; the caller's teams are the
    ones it can read anyway. Root (an admin) reads every team's, so it searches the listing too.
    """
    out = [*teams, *caller_teams()]
    if os.geteuid() == 0:
        with contextlib.suppress(StorageError):
            out += store.list_dirs(TEAMS_DIR)
    return [t for t in dict.fromkeys(out) if is_team_slug(t)]


def find_job(store: CheckpointStore, job_id: str, *, project_id: str | None = None,
             workspace: str | None = None, teams: Sequence[str] = ()) -> FoundJob | None:
    """A job's index and where it is: in the given project, the user's own submission record's, then all projects.

    Each project is looked up in ``teams``' namespaces (the caller's team first), the caller's other
    teams' and the legacy location (:func:`locate_index`); job ids are unique, so the first match is
    the job, and a job present both in a namespace and at the legacy location is found once.

    Raises:
        UntrustedLocation: the job was found only where it does not belong (:func:`read_trusted_index`);
            in the search over all projects a trusted match elsewhere wins.
        StorageError: the store could not be read where the job might be, and it was nowhere else.
    """
    spaces = _namespaces(store, teams)
    if project_id is not None:
        return locate_index(store, project_id, job_id, teams=spaces)
    if workspace is not None:
        from slurm_bt.records import read_record

        record = read_record(Path(workspace), job_id)
        if record is not None:
            found = locate_index(store, record.project_id, job_id, teams=spaces)
            if found is not None:
                return found
    # Every project the caller may read: the team namespaces first, then the legacy projects. A
    # namespace or project that is refused (a squat) or unreadable (another team's prefix) is
    # skipped; its error is raised only when the job is nowhere else.
    listing_refused: list[StorageError] = []

    def places() -> Iterator[tuple[str, str | None]]:
        for team in (*spaces, None):
            try:
                projects = store.list_dirs(TEAMS_DIR + "/" + team if team is not None else "")
            except StorageError as exc:
                listing_refused.append(exc)
                continue
            yield from ((project, team) for project in projects)

    found = _first_found(store, job_id, places())
    if found is None and listing_refused:
        raise listing_refused[0]
    return found


def _job_sort_key(job_id: str) -> tuple[int, str]:
    head = job_id.split("_")[0].split("+")[0]
    return (int(head) if head.isdigit() else -1, job_id)


def pin(index: JobIndex, view: CheckpointView, *, team: str | None) -> dict[str, Any]:
    """The immutable manifest of one checkpoint (what the nodes download and verify).

    ``team``: where the index was found (:class:`FoundJob`); a manifest without it (pinned by an
    older version) means the legacy location.
    """
    return {
        "project_id": index.project_id,
        "project_name": index.project_name,
        "team": team,
        "job_id": index.job_id,
        "checkpoint_name": view.name,
        "created": view.created,
        "ranks": {str(rank): [[f.path, f.size, f.sha256] for f in files] for rank, files in view.ranks.items()},
    }


def is_default_latest(ref: dict[str, Any]) -> bool:
    """``from_latest_checkpoint()`` with neither a job nor a project: upstream's default reference."""
    return ref.get("typ") == "baseten_latest_checkpoint" and not ref.get("job_id") and not ref.get("project_name")


def _latest_of_project(store: CheckpointStore, project_id: str, team: str | None) -> tuple[bool, FoundJob | None]:
    """(whether the project has any job there, its newest job with a complete checkpoint) in one location."""
    if team is None and project_id == TEAMS_DIR:
        return False, None
    jobs = sorted(store.list_dirs(project_prefix(project_id, team=team)), key=_job_sort_key, reverse=True)
    for job in jobs:
        index = read_trusted_index(store, project_id, job, team=team)
        if index is not None and index.latest() is not None:
            return True, FoundJob(index, team)
    return bool(jobs), None


def _resolve_one(store: CheckpointStore, ref: dict[str, Any], workspace: str | None,
                 own_project: str | None = None, *, team: str) -> tuple[FoundJob, CheckpointView]:
    typ = ref.get("typ")
    where = store.uri.display()
    if typ == "loops_checkpoint":
        raise LookupError("Loops checkpoints are not available on Slurm clusters")
    if typ == "baseten_named_checkpoint":
        job_id, name = str(ref.get("job_id")), str(ref.get("checkpoint_name"))
        found = find_job(store, job_id, workspace=workspace, teams=(team,))
        if found is None:
            raise LookupError(f"job {job_id!r} has no checkpoints in {where} (or they are not readable by you)")
        index = found.index
        view = index.get(name)
        if view is None:
            names = ", ".join(c.name for c in index.checkpoints[-5:]) or "none"
            raise LookupError(f"job {job_id!r} has no checkpoint named {name!r} (latest: {names})")
        if not view.complete:
            raise LookupError(f"checkpoint {name!r} of job {job_id!r} is not complete on every node "
                              f"(ranks {sorted(view.ranks)} of {index.group_size})")
        return found, view
    latest_job, project_name = ref.get("job_id"), ref.get("project_name") or (
        own_project if is_default_latest(ref) else None)
    project_id = slugify(str(project_name), default="project") if project_name else None
    if latest_job:
        found = find_job(store, str(latest_job), project_id=project_id, workspace=workspace, teams=(team,))
        if found is None:
            scope = f" in project {project_name!r}" if project_name else ""
            raise LookupError(f"job {str(latest_job)!r}{scope} has no checkpoints in {where} "
                              "(or they are not readable by you)")
        latest = found.index.latest()
        if latest is None:
            raise LookupError(f"job {str(latest_job)!r} has no complete checkpoint yet")
        return found, latest
    if project_id is None:
        raise LookupError("from_latest_checkpoint needs project_name or job_id")
    # The project of the caller's team (a project name belongs to a team, as on Baseten); only when
    # none of its jobs there has a complete checkpoint, the legacy location of a store from before
    # team namespaces.
    any_jobs = False
    for space in (team, None):
        has_jobs, found = _latest_of_project(store, project_id, space)
        any_jobs = any_jobs or has_jobs
        if found is not None:
            latest = found.index.latest()
            assert latest is not None
            return found, latest
    if not any_jobs:
        raise LookupError(f"project {project_name!r} has no checkpoints in {where} for team {team} "
                          "(or they are not readable by you)")
    raise LookupError(f"no job of project {project_name!r} has a complete checkpoint yet")


def resolve_load_checkpoints(spec: JobSpec, *, workspace: str | None = None,
                             store: CheckpointStore | None = None, team: str | None = None) -> JobSpec:
    """Pin every checkpoint reference of ``spec`` (a new spec; unchanged when loading is off).

    ``team``: the slug of the team the job is submitted for (``weights.plan.team_for_user``, what the
    prolog will resolve on the nodes); ``from_latest_checkpoint(project_name=...)`` and the default
    reference mean that team's project. Default: the caller's own group's.

    Raises:
        ConfigError: a reference matches nothing, is not complete, is a Loops checkpoint, or two
            references would download to the same folder; every problem, each with its field path.
        StorageError: the store cannot be reached or read.
    """
    load = spec.load_checkpoint
    if not load.enabled or not load.checkpoints:
        return spec
    team = team if team is not None else caller_teams()[0]
    own = store is None
    store = store or open_user_store(spec.storage)
    problems: list[Problem] = []
    pinned: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    warnings: list[str] = []
    try:
        for i, ref in enumerate(load.checkpoints):
            loc = f"{LOC}[{i}]"
            try:
                found, view = _resolve_one(store, dict(ref), workspace, spec.project_name, team=team)
            except LookupError as exc:
                if is_default_latest(dict(ref)):
                    # Upstream's default reference on a project without a checkpoint yet: the first
                    # job of a project must be able to use the same config as the later ones.
                    warnings.append(f"{loc}: no complete checkpoint of project {spec.project_name!r} yet "
                                    f"({exc}); the job starts without one")
                    continue
                problems.append(Problem(loc, str(exc)))
                continue
            except UntrustedLocation as exc:  # a squat or a planted index: this reference fails
                problems.append(Problem(loc, str(exc)))
                continue
            index = found.index
            bad = [f.path for files in view.ranks.values() for f in files if not safe_relpath(f.path)]
            if bad or not valid_checkpoint_name(view.name):
                problems.append(Problem(loc, f"checkpoint {view.name!r} of job {index.job_id} has unsafe paths "
                                        "in its index; refusing to load it"))
                continue
            if view.name in seen:
                problems.append(Problem(loc, f"checkpoint name {view.name!r} is also loaded by checkpoints"
                                        f"[{seen[view.name]}]; both would land in "
                                        f"<download_folder>/rank-N/{view.name}"))
                continue
            seen[view.name] = i
            pinned.append({**ref, "resolved": pin(index, view, team=found.team)})
    except StorageError:
        raise
    finally:
        if own:
            store.close()
    if problems:
        raise ConfigError(spec.context.source, problems)
    new_load = load.model_copy(update={"checkpoints": tuple(pinned)})
    return spec.model_copy(update={"load_checkpoint": new_load, "warnings": (*spec.warnings, *warnings)})
