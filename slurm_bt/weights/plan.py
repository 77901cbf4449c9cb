"""Weights at submit time (login node, as the user): pin every source, then decide whether to stage.

Why here: Baseten mirrors declared weights while the job is CREATED, before any GPU is held
(issue 3). On Slurm that means a separate CPU job on the staging partition that the GPU job depends
on (``afterok``, kill on invalid dependency), and *no* such job when everything is already cached.
Deciding that needs the source's pinned file list, which only the login node can fetch cheaply:

* **Pin** (metadata only, no data read): HF ``@main`` becomes its 40-hex commit once, here; object
  stores are listed and pinned by (path, size, ETag/generation) of the selected files. The pin key
  (sha256 of that) is what the staging job compares against, so a source that changed after submit
  fails the staging job with "source changed since submit" instead of mixing versions.
* **Manifest without reading data** when every selected file has a published sha256 (HF LFS oid, S3
  full-object ``ChecksumSHA256``), or when an earlier stager recorded this exact pin in a cluster
  tier's pin index (``<tier>/pins/<pin_key>.json``; trusted only if written by the requesting user
  or root, see :func:`lookup_pin`). With a manifest whose COMPLETE marker is in the user's team tier
  or the shared tier, the source needs no staging at all.
* **Errors the user can fix** (bad URI, 401/403, 404, no file left after the filters) fail the
  submission with exit 2 naming ``job.weights[i].source``; an unreachable origin is exit 1.

The listing is made with the user's own credentials, which is also the authorization check for a
cache hit. Nothing secret is recorded: the plan holds secret *names* only.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from slurm_bt.atomic import write_file_atomic
from slurm_bt.errors import Problem, SourceAccessError, SourceError, SourceNotFoundError, SourceSpecError
from slurm_bt.posix.teams import team_slug  # re-exported: the one spelling lives below the features
from slurm_bt.posix.user_files import read_user_file
from slurm_bt.render.quoting import sbatch_directive_value, shq
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.trusted_files import read_trusted_file
from slurm_bt.weights.manifest import Manifest, ManifestFile, SourceKind

if TYPE_CHECKING:
    from slurm_bt.job_spec import JobSpec, WeightsSpec
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import SiteSettings
    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.storage.base import Listing
    from slurm_bt.weights.cluster_cache import ClusterCache

__all__ = [
    "PLAN_NAME",
    "PinnedFile",
    "SourcePin",
    "WeightsPlan",
    "caller_team_gid",
    "cluster_tiers",
    "default_account",
    "job_manifest_path",
    "list_selected",
    "lookup_pin",
    "pin_key",
    "plan_weights",
    "read_plan",
    "release_staging_job",
    "render_staging_script",
    "select_listing",
    "submit_staging_job",
    "team_for_user",
    "team_slug",
    "write_plan",
]

PLAN_NAME = "plan.json"
#: The largest ``<job_dir>/weights/plan.json`` read: the file is the user's (a swapped ``/dev/zero``
#: must not fill the staging job's memory), and it holds at most a few pinned listings, each
#: bounded like a pin record (:func:`lookup_pin`).
PLAN_MAX_BYTES = 256 << 20


class PinnedFile(BaseModel):
    """One selected file as listed at submit: enough to pin it, maybe not enough to verify it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    size: int = Field(ge=0)
    etag: str | None = None
    sha256: str | None = None


class SourcePin(BaseModel):
    """One declared source, pinned at submit.

    Attributes:
        index: position in ``job.weights``.
        declared: the URI as written in the config (for messages).
        kind: ``hf``, ``s3``, ``r2`` or ``gs``.
        source: canonical URI (the Hub's spelling of the repo id).
        revision: HF commit; for object stores the digest of the selected files' listing.
        allow_patterns: as declared.
        ignore_patterns: as declared.
        auth_secret_name: secret name in the user's store (never its value).
        mount_location: where the job sees it.
        pin_key: sha256 of (kind, source, revision, selected (path, size, etag)).
        files: the selected files.
        manifest: the full manifest, when known without reading data.
        cached_in: ``team`` or ``shared`` when that tier held the complete entry at submit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    declared: str
    kind: SourceKind
    source: str
    revision: str
    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None
    auth_secret_name: str | None = None
    mount_location: str
    pin_key: str
    files: tuple[PinnedFile, ...]
    manifest: Manifest | None = None
    cached_in: str | None = None

    @property
    def pinned_uri(self) -> str:
        """The URI the staging job lists: HF pinned to the commit, object stores as they are."""
        return f"{self.source}@{self.revision}" if self.kind == "hf" else self.source

    @property
    def total_bytes(self) -> int:
        """Bytes of the selected files."""
        return sum(f.size for f in self.files)


class WeightsPlan(BaseModel):
    """``<job_dir>/weights/plan.json``: what the staging job and step 1 of the job need to know.

    Written by ``bt-sbatch`` as the user into the user's own job directory: untrusted for root
    (the prolog re-derives team and roots from trusted sources), authoritative for the user's jobs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = 1
    team: str
    cluster_cache: str
    endpoints: StorageEndpoints
    sources: tuple[SourcePin, ...]
    bwrap: str = "/usr/bin/bwrap"

    @property
    def needs_staging(self) -> bool:
        """True when at least one source is not complete in a cluster tier."""
        return any(s.cached_in is None for s in self.sources)


# -- small helpers shared with the staging job and the node side -----------------------------------------


def pin_key(kind: str, source: str, revision: str, files: Sequence[PinnedFile]) -> str:
    """sha256 over the pin: the same selected files at the same versions give the same key."""
    body = json.dumps({"kind": kind, "source": source, "revision": revision,
                       "files": sorted([f.path, f.size, f.etag or ""] for f in files)},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def default_account(client: SlurmClient | None = None) -> str | None:
    """The submitting user's default Slurm account (``sacctmgr``), or None when it cannot be told.

    The job's ``SLURM_JOB_ACCOUNT`` (what the prolog maps to a team) is this account when the user
    passes no ``--account``.
    """
    import pwd

    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.slurm.runner import SubprocessRunner

    user = pwd.getpwuid(os.getuid()).pw_name
    try:
        return (client or SlurmClient(SubprocessRunner(), timeout_s=20)).default_account(user)
    except Exception:
        return None


def team_for_user(sbatch_args: Sequence[str] = (),
                  account_lookup: Callable[[], str | None] = default_account) -> str:
    """The team namespace of the cluster cache for the submitting user.

    The hooks' team model (``slurm_bt.hooks.teams``): the Slurm account's mapped Unix group when the
    root-owned ``hooks.toml`` maps the job's account, else the user's primary group. The account is
    the ``--account`` given to bt-sbatch or, when the site maps accounts at all, the user's default
    account (``account_lookup``), so that staging publishes into the very tier the prolog authorizes.
    Lower-cased and reduced to a slug because cache directory names must be (``ClusterCache.for_team``).
    """
    group = grp.getgrgid(os.getgid()).gr_name
    account = next((a.split("=", 1)[1] for a in sbatch_args if a.startswith("--account=")), None)
    try:
        from slurm_bt.site.hook_settings import load_hook_settings

        team_groups = load_hook_settings().team_groups
    except Exception:
        team_groups = {}
    if team_groups:
        account = account or account_lookup()
        if account:
            group = team_groups.get(account, group)
    return team_slug(group)


def caller_team_gid(team: str) -> int | None:
    """The gid of the calling user's group whose slug is ``team``, or None when they have none."""
    for gid in (os.getgid(), *os.getgroups()):
        try:
            name = grp.getgrgid(gid).gr_name
        except KeyError:
            continue
        if team_slug(name) == team:
            return gid
    return None


def cluster_tiers(base: str, team: str, *, dir_mode: int = 0o2770) -> tuple[ClusterCache, ClusterCache]:
    """(team tier, shared tier) under the cluster-cache base, as the calling user may trust them.

    A team directory that is not the team's (``cluster_cache.team_tier_problem``: a squat) or a
    shared tier not made by root comes back ``refused``: it holds no entries, so a squatter's
    planted marker can neither skip the staging job (whose root prolog then sidesteps the squat)
    nor be served.
    """
    from slurm_bt.weights.cluster_cache import ClusterCache, team_tier_problem

    tier = ClusterCache.for_team(Path(base), team, dir_mode=dir_mode)
    gid = caller_team_gid(team)
    problem = team_tier_problem(tier.root, gid) if gid is not None else None
    if problem is not None:
        tier.refused = (f"team cache directory {tier.root} {problem}; refusing to use it (an admin must remove it: "
                        f"rm -rf {tier.root})")
    return tier, ClusterCache.shared(Path(base))


def _trusted_owner(st: os.stat_result) -> bool:
    """Written by root or by the requesting user (``read_trusted_file`` adds: not writable by others)."""
    return st.st_uid in (0, os.getuid())


def lookup_pin(cache: ClusterCache, key: str) -> Manifest | None:
    """The manifest an earlier stager recorded for pin ``key`` in ``cache``, if complete there.

    A pin file maps listing metadata to content hashes, so a forged one could substitute bytes for
    files that have no published sha256. It is therefore trusted only when root or the requesting
    user wrote it (a teammate's pin is ignored and the source is re-streamed and re-hashed).
    """
    path = cache.root / "pins" / f"{key}.json"
    raw = read_trusted_file(path, max_bytes=256 << 20, owner_ok=_trusted_owner)
    if raw is None:
        return None
    try:
        m = Manifest.model_validate_json(raw)
    except ValueError:
        return None
    return m if cache.has(m) else None


def job_manifest_path(job_dir: str | Path, index: int) -> Path:
    """``<job_dir>/weights/<index>.json``: the final manifest of ``job.weights[index]``."""
    return Path(job_dir) / "weights" / f"{index}.json"


def write_plan(job_dir: str | Path, plan: WeightsPlan) -> Path:
    """Write the plan, plus the final manifest of every source already complete in a cluster tier."""
    folder = Path(job_dir) / "weights"
    folder.mkdir(mode=0o700, exist_ok=True)
    for s in plan.sources:
        if s.cached_in is not None and s.manifest is not None:
            write_file_atomic(job_manifest_path(job_dir, s.index), s.manifest.canonical_json(), mode=0o600)
    path = folder / PLAN_NAME
    write_file_atomic(path, plan.model_dump_json(indent=2).encode(), mode=0o600)
    return path


def read_plan(job_dir: str | Path) -> WeightsPlan:
    """Read ``<job_dir>/weights/plan.json`` (as the user) as a file the job controls: no FIFO, device or
    user symlink, at most :data:`PLAN_MAX_BYTES` (:mod:`slurm_bt.posix.user_files`).

    Raises:
        OSError: it cannot be read or is refused (:class:`~slurm_bt.posix.user_files.UnsafeFile`).
        ValueError: it is not a valid plan.
    """
    return WeightsPlan.model_validate_json(read_user_file(Path(job_dir) / "weights" / PLAN_NAME, PLAN_MAX_BYTES))


# -- listing ---------------------------------------------------------------------------------------------


def select_listing(
    listing: Listing, allow: Sequence[str] | None, ignore: Sequence[str] | None
) -> tuple[list[PinnedFile], str]:
    """The files ``allow``/``ignore`` keep from ``listing``, and the revision that pins them.

    The revision is the HF commit, or for object stores the digest of the *selected* files (a
    change outside the filters does not invalidate a pin).

    Raises:
        SourceSpecError: no file is left.
    """
    from slurm_bt.storage.base import listing_digest
    from slurm_bt.weights.patterns import select_paths

    by_path = {f.path: f for f in listing.files}
    kept = select_paths(listing.uri.canonical, list(by_path), allow, ignore)
    selected = [by_path[p] for p in kept]
    revision = listing.revision if listing.uri.kind == "hf" else listing_digest(selected)
    return [PinnedFile(path=f.path, size=f.size, etag=f.etag, sha256=f.sha256) for f in selected], revision


def list_selected(
    uri_text: str,
    *,
    allow: Sequence[str] | None,
    ignore: Sequence[str] | None,
    credentials: Credentials | None,
    endpoints: StorageEndpoints,
) -> tuple[Listing, list[PinnedFile], str]:
    """List a source (metadata only, with the user's credentials) and select its files.

    Returns:
        (listing, selected files, revision), see :func:`select_listing`.
    """
    from slurm_bt.storage.registry import open_backend
    from slurm_bt.storage.url import parse_source_uri

    backend = open_backend(parse_source_uri(uri_text), credentials=credentials, endpoints=endpoints)
    try:
        listing = backend.list_files()
    finally:
        backend.close()
    files, revision = select_listing(listing, allow, ignore)
    return listing, files, revision


def _pin_one(
    i: int, w: WeightsSpec, creds: Credentials | None, endpoints: StorageEndpoints,
    tiers: Sequence[tuple[str, ClusterCache]],
) -> SourcePin:
    listing, files, revision = list_selected(w.source, allow=w.allow_patterns, ignore=w.ignore_patterns,
                                             credentials=creds, endpoints=endpoints)
    source = listing.uri.canonical
    key = pin_key(listing.uri.kind, source, revision, files)
    manifest: Manifest | None = None
    if all(f.sha256 is not None for f in files):
        manifest = Manifest(kind=listing.uri.kind, source=source, revision=revision, files=tuple(
            ManifestFile(path=f.path, size=f.size, sha256=f.sha256 or "", etag=f.etag) for f in files))
    cached_in = None
    for name, cache in tiers:
        m = manifest if manifest is not None else lookup_pin(cache, key)
        if m is not None and cache.has(m):
            manifest, cached_in = m, name
            break
    return SourcePin(index=i, declared=w.source, kind=listing.uri.kind, source=source, revision=revision,
                     allow_patterns=w.allow_patterns, ignore_patterns=w.ignore_patterns,
                     auth_secret_name=w.auth_secret_name, mount_location=w.mount_location, pin_key=key,
                     files=tuple(files), manifest=manifest, cached_in=cached_in)


def plan_weights(spec: JobSpec, site: SiteSettings, store: SecretStore, *, team: str) -> WeightsPlan:
    """Pin every declared source and find what is already cached (network I/O: listings only).

    Raises:
        SourceSpecError: exit 2; one problem per bad source, located at ``job.weights[i].source``
            (bad URI or secret format, 401/403, 404, nothing selected by the patterns).
        SourceError: exit 1; the origin was unreachable after bounded retries.
    """
    from slurm_bt.site.settings import user_path
    from slurm_bt.storage.credentials import credentials_from_store

    base = user_path(site.storage.cluster_cache)
    team_tier, shared_tier = cluster_tiers(base, team)
    tiers = [("team", team_tier), ("shared", shared_tier)]
    endpoints = site.weights.endpoints
    problems: list[Problem] = []
    pins: list[SourcePin] = []
    for i, w in enumerate(spec.weights):
        loc = f"job.weights[{i}].source"
        try:
            from slurm_bt.storage.url import parse_source_uri

            kind = parse_source_uri(w.source).kind
            creds = credentials_from_store(store, w.auth_secret_name, kind, source=w.source)
            pins.append(_pin_one(i, w, creds, endpoints, tiers))
        except SourceSpecError as exc:
            problems += [Problem(loc, f"{w.source}: {p.message}") for p in exc.problems]
        except (SourceAccessError, SourceNotFoundError) as exc:
            problems.append(Problem(loc, f"{w.source}: {exc}"))
        except SourceError as exc:
            if exc.transient:
                raise
            problems.append(Problem(loc, f"{w.source}: {exc}"))
    if problems:
        raise SourceSpecError(spec.context.source, problems)
    return WeightsPlan(team=team, cluster_cache=base, endpoints=endpoints, sources=tuple(pins),
                       bwrap=site.weights.bwrap)


# -- the staging job's script (pure) ---------------------------------------------------------------------


def render_staging_script(spec: JobSpec, site: SiteSettings) -> str:
    """The staging job: one task on the staging partition, as the user, running ``stage_job``.

    Partition and ``--export=NONE`` are passed as sbatch argv by the submitter (so they cannot be
    overridden by anything in here); this script carries the rest.
    """
    ctx = spec.context
    w = site.weights
    name = f"bt-stage-{spec.slurm_job_name}"[:120]
    opts = [f"--job-name={name}", "--nodes=1", "--ntasks=1", f"--cpus-per-task={w.staging_cpus}",
            f"--mem={w.staging_mem}", f"--time={w.staging_time}", f"--chdir={ctx.job_dir}",
            f"--output={spec.log_dir}/staging-%j.out", "--open-mode=append", "--no-requeue",
            f"--comment=slurm-bt-staging:{ctx.submit_id}"]
    lines = ["#!/bin/bash",
             f"# Generated by slurm-bt {ctx.version}: mirrors the weights and image of submission {ctx.submit_id}",
             "# into the cluster cache before the training job (which depends on this job) may start.",
             *(f"#SBATCH {sbatch_directive_value(o)}" for o in opts),
             "",
             "set -euo pipefail",
             "umask 0007  # team tiers are shared with the team group",
             "export PATH=/usr/local/bin:/usr/bin:/bin",
             f"exec {shq(ctx.python)} -I -m slurm_bt.steps.stage_weights {shq(ctx.job_dir)}",
             ""]
    return "\n".join(lines)


# -- submission hooks (called from slurm_bt.submit) -------------------------------------------------------


def submit_staging_job(
    client: SlurmClient, spec: JobSpec, site: SiteSettings, plan: WeightsPlan | None, job_dir: Path,
    env: Mapping[str, str] | None, *, image_staging: bool = False,
) -> str | None:
    """Write the plan into the job dir and, when something is not cached, submit the staging job *held*.

    Held, so that a staging job failing within a second cannot make the training job's
    ``--dependency=afterok`` invalid before it is even submitted (sbatch would then refuse it);
    :func:`release_staging_job` lets it run once the training job exists.

    ``plan`` is None for a job without weights; ``image_staging``: the job's image must be mirrored too
    (slurm_bt/images/stage.py wrote ``<job_dir>/image/plan.json``), by the same staging job.

    Returns:
        The staging job id, or None when every source (and the image) is already in a cluster tier.
    """
    if plan is not None:
        write_plan(job_dir, plan)
    if not image_staging and (plan is None or not plan.needs_staging):
        return None
    script = render_staging_script(spec, site)
    folder = job_dir / "weights"
    folder.mkdir(mode=0o700, exist_ok=True)
    write_file_atomic(folder / "staging.sbatch", script.encode(), mode=0o600)
    return client.submit(script, [f"--partition={site.staging_partition}", "--export=NONE", "--hold"], env=env)


def release_staging_job(client: SlurmClient, staging_id: str, env: Mapping[str, str] | None) -> None:
    """``scontrol release <staging_id>`` (through the same scrubbed environment as sbatch).

    Raises:
        SlurmCommandError: the release failed (the caller cancels both jobs).
    """
    client.release(staging_id, env=env)
