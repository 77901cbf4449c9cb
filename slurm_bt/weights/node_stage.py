"""Node side of weights delivery: cluster cache → node cache → the job's read-only views.

Two callers, one per privilege domain:

* **The root prolog** calls :func:`stage_for_job` on every node of the job (hooks engineer:
  ``slurm_bt.hooks.prolog``). It copies the job's blobs from the cluster cache into the root-owned
  node cache (hashed as written, unless the site trusts the root-owned shared tier), takes a lease
  per entry, links ``<node_cache>/jobs/<job_id>/w<i>`` (what container runtimes bind) and leaves a
  root-owned ``jobs/<job_id>/weights.json`` saying which tier served what, in how long. The
  manifests come from the user's job dir, so the prolog reads them *as the user*
  (:func:`load_job_manifests` in a dropped child) and this function re-validates them.
  Authorization: an entry is staged only if it is complete in the requester's team tier or the
  shared tier; nothing reaches those without a staging job that listed the source with the
  requester's (or a teammate's) credentials, and whoever published it held the bytes anyway.
  Audience (issue #8 item 2): an entry that needed credentials is staged into the team's private
  node subtree (``private/<team>``, readable by the team's group only), so the node tier gives it
  the audience of the team tier it came from; only public entries (the shared tier's, and ``hf://``
  sources declared without credentials) go to the node-wide public layout.
* **Step 1 of the job** (``slurm_bt.node.prepare``, as the user) calls :func:`prepare_job_weights`.
  With the prolog's record it uses the node-cache snapshots. Without it (a cluster whose prolog does
  not stage weights yet) it falls back to the **cluster cache snapshot** itself: the user cannot
  write the root-owned node cache, so there is no node tier, and each start reads from the shared
  filesystem (``cluster-direct``). Files in that snapshot written by anyone but root or the user are
  re-hashed first (a teammate could rewrite a blob they own); extra or missing entries are refused.

Host jobs (``container_runtime = "none"``) get a per-job private mount namespace: step 1 writes the
bubblewrap argv (:func:`slurm_bt.weights.job_view.bwrap_argv`) to the job's private runtime dir and
``node_entry.sh`` re-executes itself under it, so each snapshot is ``--ro-bind``-mounted at its
``mount_location`` for this job only. Without a usable bwrap, ``BT_WEIGHTS_<i>`` points at the
snapshot path (read-only by permissions, not at ``mount_location``) and the log says so.
Every job also gets ``BT_WEIGHTS_<i>`` = where source ``i`` is visible.

A container job's image is one more entry of the same kind (docs/containers.md): the prolog stages
``<job_dir>/image/manifest.json`` with :func:`stage_image_for_job` (same tiers, authorization, leases
and node stager) and links ``jobs/<job_id>/img``; step 1 waits for it with :func:`prepare_job_image`.

Multi-node jobs: every node stages the same pinned manifests (they come from the job dir, written
once by the staging job); with ``PrologFlags=DeferBatch`` the batch step starts only after every
node's prolog, and in the fallback step 2 starts only after step 1 succeeded on every node.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from slurm_bt.atomic import write_file_atomic
from slurm_bt.errors import WeightsJobError
from slurm_bt.storage.checksums import sha256_fd
from slurm_bt.trusted_files import read_trusted_file
from slurm_bt.weights.manifest import Manifest

if TYPE_CHECKING:
    from slurm_bt.job_spec import JobSpec, WeightsSpec
    from slurm_bt.site.settings import SiteSettings
    from slurm_bt.weights.cluster_cache import ClusterCache
    from slurm_bt.weights.node_cache import NodeAudience, NodeCache
    from slurm_bt.weights.node_stager import StagerPolicy
    from slurm_bt.weights.plan import WeightsPlan

__all__ = [
    "IMAGE_RECORD",
    "NODE_RECORD",
    "PreparedWeights",
    "WeightsJobError",
    "epilog_enforce_lru",
    "epilog_release_leases",
    "load_job_image_manifest",
    "load_job_manifests",
    "prepare_job_image",
    "prepare_job_weights",
    "read_node_image_record",
    "read_node_record",
    "stage_for_job",
    "stage_image_for_job",
]

NODE_RECORD = "weights.json"
_MAX_MANIFEST = 64 << 20


# -- helpers --------------------------------------------------------------------------------------------


def _trusted_site() -> SiteSettings:
    """The default site file as root hooks read it (root-owned only), for callers that pass no site.

    The prolog and epilog always pass the site their run loaded (``--site`` or the default), so
    that every step of one hook run reads the same file.
    """
    from slurm_bt.site.hook_settings import load_trusted_site

    return load_trusted_site()


def _node_cache(site: SiteSettings, environ: Mapping[str, str], audience: NodeAudience | None = None) -> NodeCache:
    from slurm_bt.site.settings import expand_path
    from slurm_bt.weights.node_cache import NodeCache

    uid = int(environ.get("SLURM_JOB_UID", os.getuid()))
    user = environ.get("SLURM_JOB_USER") or pwd.getpwuid(uid).pw_name
    root = expand_path(site.storage.node_cache, user=user, uid=uid, home=_home(uid),
                       node=environ["SLURMD_NODENAME"])
    return NodeCache(Path(root), site.weights.node_cache_max_bytes, reserve_bytes=site.weights.node_cache_reserve_bytes,
                     audience=audience)


def _home(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/nonexistent"


def _tiers_for_node(site: SiteSettings, base: str, team: str) -> tuple[ClusterCache, ClusterCache]:
    """(shared, team): the shared tier first (curated, may be trusted to copy without hashing).

    A shared tier that an admin did not make (:func:`~slurm_bt.weights.cluster_cache.shared_tier_problem`)
    comes back ``refused``: it serves nothing, so a user who created it cannot decide what jobs load.
    """
    from slurm_bt.weights.cluster_cache import ClusterCache

    shared = ClusterCache.shared(Path(base))
    shared.trusted_copy = (site.weights.verify_node_copy == "team" and shared.refused is None
                           and shared.root.is_dir())
    return shared, ClusterCache.for_team(Path(base), team)


def _is_public(w: WeightsSpec, m: Manifest, shared: ClusterCache) -> bool:
    """Whether an entry may be shared with every user of the node (else: the team's subtree).

    Public: the shared tier holds it (admins curate public models there), or it is an ``hf://``
    source declared without credentials (anonymous Hub access worked at submit). Everything else,
    credentialed or from an object store (whose anonymous-looking access may rest on bucket
    policies or ambient credentials), keeps the audience of the team tier it came from.
    """
    if shared.has(m):
        return True
    return m.kind == "hf" and not w.auth_secret_name


def _source_matches(declared: str, manifest: Manifest) -> bool:
    """The manifest belongs to the declared source (the Hub may re-case ids; one-object prefixes re-root)."""
    from slurm_bt.storage.url import parse_source_uri

    want = parse_source_uri(declared).canonical
    got = manifest.source
    if manifest.kind == "hf":
        return want.lower() == got.lower()
    return want == got or want.startswith(got + "/")


def _read_root_json(path: Path) -> Any:
    """JSON from a regular file only root could have written, else None."""
    raw = read_trusted_file(path, max_bytes=1 << 20)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def read_node_record(node_root: str | Path, job_id: str) -> list[dict[str, Any]] | None:
    """The prolog's root-owned record of what it staged for ``job_id`` on this node, or None."""
    data = _read_root_json(Path(node_root) / "jobs" / job_id / NODE_RECORD)
    if isinstance(data, dict) and isinstance(data.get("weights"), list):
        return [e for e in data["weights"] if isinstance(e, dict)]
    return None


# -- root: the prolog ------------------------------------------------------------------------------------


def load_job_manifests(job_dir: str, count: int) -> list[str]:
    """Read ``<job_dir>/weights/<i>.json`` for ``i < count``; run this **as the job user**.

    Returns the raw texts (JSON-able, for a privilege-dropped child's result pipe); the root side
    validates them in :func:`stage_for_job`.

    Raises:
        WeightsJobError: a manifest is missing (the staging job did not finish), too big or unreadable.
    """
    from slurm_bt.weights.plan import job_manifest_path

    return [_read_user_manifest(job_manifest_path(job_dir, i), f"the weights of job.weights[{i}]")
            for i in range(count)]


def _read_user_manifest(path: str | Path, what: str, *, follow: bool = True) -> str:
    """One manifest from the user's job dir (as the user): a regular file (a FIFO does not block
    us: O_NONBLOCK), at most ``_MAX_MANIFEST`` bytes; a symlink is followed (with the user's rights)
    unless ``follow`` is False."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    except OSError as exc:
        raise WeightsJobError(f"{path}: {exc.strerror}: {what} were not staged (did the staging job finish?)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WeightsJobError(f"{path}: not a regular file")
        raw = os.read(fd, _MAX_MANIFEST + 1)
    finally:
        os.close(fd)
    if len(raw) > _MAX_MANIFEST:
        raise WeightsJobError(f"{path}: larger than {_MAX_MANIFEST} bytes")
    return raw.decode("utf-8", "replace")


def stage_for_job(
    environ: Mapping[str, str],
    spec: JobSpec,
    manifests: Sequence[str | bytes],
    *,
    team: str,
    team_gid: int | None = None,
    site: SiteSettings | None = None,
    log: Callable[[str], None] | None = None,
    stager: StagerPolicy | None = None,
    wait_s: float | None = None,
) -> list[dict[str, Any]]:
    """The prolog's weights step on one node (as root); idempotent (a rerun or requeue hits).

    With ``stager`` (the prolog always passes it) a node miss is not copied here: the entry is
    leased to the job, a node stager copies it (:mod:`slurm_bt.weights.node_stager`, one per entry
    on the node) and this waits at most ``wait_s`` (default ``stager.prolog_wait_s``) for it. An
    entry not ready by then is recorded with tier ``node-staging`` and the key of its stager; the
    job's first step waits for it (:func:`prepare_job_weights`). Without ``stager`` the copy runs
    here, bounded by the caller (the behaviour before node stagers).

    Args:
        environ: the validated hook variables (``SlurmHookEnv.to_environ()``): ``SLURM_JOB_ID``,
            ``SLURM_JOB_UID``, ``SLURM_JOB_USER``, ``SLURMD_NODENAME``.
        spec: the job spec, as the prolog read and re-validated it (as the user).
        manifests: :func:`load_job_manifests`' result, obtained in a child running as the user.
        team: the job's team as :func:`slurm_bt.hooks.teams.resolve_team` decided (trusted); it
            names the cluster tier ``<cluster_cache>/teams/<team>``.
        team_gid: that team's Unix group (trusted, from the same decision): the group the team tier
            must have, and the audience of credentialed entries on the node. Default: the job's gid.
        site: trusted site settings (default: the root-owned site file).
        log: where to send one line per source (default: nowhere).

    Returns:
        One entry per source (index, source, manifest_id, mount_location, tier ``node-hit`` or
        ``cluster-hit``, bytes, seconds, path); also written to the root-owned record.

    Raises:
        WeightsJobError: a manifest is invalid, belongs to another source, or is not complete in the
            job's team tier or the shared tier: **fail the job, not the node** (HookUserError).
        CacheFullError, CacheIntegrityError, CacheLockTimeout: also job failures (the cache is left
            as it was; a corrupt cluster blob is never served).
        StorageError / OSError: I/O on the node cache; EIO/EROFS/ENOSPC-class errors there are node
            faults, the prolog's classification applies.
    """

    site = site or _trusted_site()
    job_id = environ["SLURM_JOB_ID"]
    if len(manifests) != len(spec.weights):
        raise WeightsJobError(f"job declares {len(spec.weights)} weights sources but {len(manifests)} manifests "
                              "were found")
    nodes = _NodeTiers.open(environ, site, team, team_gid, log)
    try:
        return _stage_weights(environ, spec, manifests, nodes, job_id, log, stager, wait_s)
    finally:
        nodes.close()


def _stage_weights(environ: Mapping[str, str], spec: JobSpec, manifests: Sequence[str | bytes], nodes: _NodeTiers,
                   job_id: str, log: Callable[[str], None] | None, stager: StagerPolicy | None,
                   wait_s: float | None) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    waiting: list[tuple[dict[str, Any], NodeCache, Manifest]] = []
    t_start = time.monotonic()
    for i, (w, raw) in enumerate(zip(spec.weights, manifests, strict=True)):
        try:
            m = Manifest.model_validate_json(raw)
        except ValueError as exc:
            raise WeightsJobError(f"job.weights[{i}]: invalid manifest ({type(exc).__name__})") from None
        if not _source_matches(w.source, m):
            raise WeightsJobError(f"job.weights[{i}]: the staged manifest is for {m.source}, not {w.source}")
        entry, node = nodes.stage_entry(m, job_id, _is_public(w, m, nodes.shared), stager, index=i)
        entry["mount_location"] = w.mount_location
        if entry["tier"] == "node-staging":
            waiting.append((entry, node, m))
        entries.append(entry)
    if waiting and stager is not None:
        _short_wait(waiting, t_start + (stager.prolog_wait_s if wait_s is None else wait_s))
    for entry in entries:
        if log is not None:
            log(_line(entry))
    nodes.write_record(environ, job_id, NODE_RECORD, {"job_id": job_id, "weights": entries})
    return entries


def _short_wait(waiting: list[tuple[dict[str, Any], NodeCache, Manifest]], limit: float) -> None:
    """A short wait keeps small node misses looking as before (ready when the prolog ends)."""
    t_start = time.monotonic()
    while waiting and time.monotonic() < limit:
        time.sleep(0.2)
        for item in list(waiting):
            if item[1].is_ready(item[2]):
                item[0].update(tier="cluster-hit", seconds=round(float(item[0]["seconds"]) + time.monotonic()
                                                                 - t_start, 4))
                item[0].pop("stager", None)
                waiting.remove(item)


def _record_entry(m: Manifest, *, index: int, tier: str, audience: str, t0: float, link: Path) -> dict[str, Any]:
    """One staged entry as the node record, the prolog's log line and ``slurm-bt status`` show it."""
    return {"index": index, "source": f"{m.source}@{m.revision[:12]}", "manifest_id": m.manifest_id,
            "tier": tier, "audience": audience, "bytes": m.total_bytes,
            "seconds": round(time.monotonic() - t0, 4), "path": str(link)}


@dataclass
class _NodeTiers:
    """One job's view of the cluster tiers (shared, its team's) and of this node's cache (the node-wide
    public layout and the team's private subtree): what the weights and the image staging share."""

    base: str
    team: str
    shared: ClusterCache
    team_tier: ClusterCache
    public_node: NodeCache
    team_node: NodeCache
    site: SiteSettings
    log: Callable[[str], None] | None = None
    #: ``(uid, gid)`` of the job user who reads the team tier (also for the node stager it starts)
    reader: tuple[int, int] | None = None

    @classmethod
    def open(cls, environ: Mapping[str, str], site: SiteSettings, team: str, team_gid: int | None,
             log: Callable[[str], None] | None) -> _NodeTiers:
        from slurm_bt.site.settings import expand_path
        from slurm_bt.weights.cluster_cache import team_tier_problem
        from slurm_bt.weights.node_cache import NodeAudience

        uid = int(environ.get("SLURM_JOB_UID", "0"))
        gid = team_gid if team_gid is not None else int(environ.get("SLURM_JOB_GID", os.getgid()))
        base = expand_path(site.storage.cluster_cache, user=environ.get("SLURM_JOB_USER", ""), uid=uid,
                           home=_home(uid))
        shared, team_tier = _tiers_for_node(site, base, team)
        if shared.refused is not None and log is not None:
            log(f"slurm-bt weights: warning: shared tier {shared.refused}")
        problem = team_tier_problem(team_tier.root, gid)
        if problem is not None:
            raise WeightsJobError(f"the team cache directory {team_tier.root} {problem}; refusing to use it (someone "
                                  f"else created it first). Fix: an admin removes it (rm -rf {team_tier.root}), then "
                                  "resubmit; the next staging job recreates it for your team")
        public_node = _node_cache(site, environ)
        team_node = _node_cache(site, environ, NodeAudience(team, gid))
        public_node.root.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        job_gid = int(environ.get("SLURM_JOB_GID", gid))
        tiers = cls(base, team, shared, team_tier, public_node, team_node, site, log, reader=(uid, job_gid))
        # Root never opens the team tier itself: the job user does and passes descriptors
        # (a root-squashed filesystem would refuse root anyway; docs/weights-cache.md §2).
        team_tier.read_as_user(uid, job_gid)
        return tiers

    def close(self) -> None:
        """End the job user's opener of the team tier, if any."""
        self.team_tier.close_reader()

    def authorize(self, m: Manifest) -> None:
        if not (self.team_tier.has(m) or self.shared.has(m)):
            what = "image" if m.kind == "oci" else "weights"
            raise WeightsJobError(f"{m.source}@{m.revision[:12]} is not complete in the cluster cache of team "
                                  f"{self.team!r} or the shared tier; only {what} staged for your team are served")

    def stage_entry(self, m: Manifest, job_id: str, public: bool, stager: StagerPolicy | None, *,
                    index: int, link_name: str | None = None) -> tuple[dict[str, Any], NodeCache]:
        """Lease ``m`` to the job on this node (copying it now, or through its node stager) and link it."""
        from slurm_bt.weights.job_view import link_job_weights

        t0 = time.monotonic()
        node = self.public_node if public else self.team_node
        hit = node.is_ready(m)
        key = None
        if stager is None or hit:
            node.stage(m, [self.shared, self.team_tier], job_id, authorize=self.authorize)
        elif not node.join(m, job_id, authorize=self.authorize):
            key = _start_stager(node, m, stager, base=self.base, team=self.team, shared=self.shared, site=self.site,
                                reader=self.reader)
        if not public and self.public_node.withdraw(m) and self.log is not None:  # left world-readable before
            self.log(f"slurm-bt weights: withdrew {m.source}@{m.revision[:12]} from the node-wide layout "
                     f"(credentialed entries are team {self.team}'s only)")
        link = link_job_weights(node, job_id, index, m, pending=key is not None, name=link_name)
        entry = _record_entry(m, index=index, tier="node-hit" if hit else "cluster-hit",
                              audience="public" if public else f"team {self.team}", t0=t0, link=link)
        if key is not None:
            entry.update(tier="node-staging", stager=key)
        return entry, node

    def write_record(self, environ: Mapping[str, str], job_id: str, name: str, data: dict[str, Any]) -> None:
        """The root-owned record of what was staged for the job (``jobs/<id>/<name>``), which step 1 trusts."""
        from slurm_bt.weights.node_cache import set_dir_owner_mode

        job_dir = self.public_node.base.jobs / job_id
        job_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        write_file_atomic(job_dir / name, json.dumps(data).encode(), mode=0o644)
        # The record and links name the job's sources (a private repo's name, its manifest id): only the
        # job's user (and its primary group) may look inside; the container runtime and bwrap resolve the
        # links as that user.
        job_gid = int(environ.get("SLURM_JOB_GID", "-1"))
        if job_gid >= 0:
            set_dir_owner_mode(job_dir, job_gid, 0o750)


# -- the job's container image (docs/containers.md): a one-file entry, staged like weights ----------------

IMAGE_RECORD = "image.json"
IMAGE_MANIFEST_REL = "image/manifest.json"
"""``<job_dir>/image/manifest.json``: the staging job's (or bt-sbatch's) one-file image Manifest
(slurm_bt/images/entry.py writes it; spelled here because weights may not import images)."""


def load_job_image_manifest(job_dir: str) -> str:
    """Read ``<job_dir>/image/manifest.json``; run this **as the job user** (the job dir is theirs).

    Not followed if it is a symlink: the contract is a regular file the staging job wrote, and a link
    is either a mistake or an attempt to make the prolog read something else.
    """
    return _read_user_manifest(f"{job_dir}/{IMAGE_MANIFEST_REL}", "the job's image (job.image)", follow=False)


def image_manifest_for_job(spec: JobSpec, raw: str | bytes) -> Manifest:
    """The image Manifest from the job dir, checked against the job's pinned image.

    The pin (in job.json) and the manifest are both the user's files; what makes this safe is the
    authorization (the entry must be complete in the user's team tier or the shared tier) and the
    node copy's hashing, as for weights. These checks only turn a mismatch into a clear job failure.
    """
    from slurm_bt.node.job_paths import IMAGE_FILE

    pin = spec.image_pin
    if pin is None:
        raise WeightsJobError("job.image: the job has no pinned image (resubmit with bt-sbatch)")
    try:
        m = Manifest.model_validate_json(raw)
    except ValueError as exc:
        raise WeightsJobError(f"job.image: invalid image manifest ({type(exc).__name__})") from None
    if (m.kind != "oci" or m.source != f"oci://{pin.resolved}" or m.revision != pin.digest
            or [f.path for f in m.files] != [IMAGE_FILE]):
        raise WeightsJobError(f"job.image: the staged image manifest is for {m.source}@{m.revision[:19]}, not the "
                              f"pinned {pin.resolved}; resubmit with bt-sbatch")
    return m


def stage_image_for_job(
    environ: Mapping[str, str],
    spec: JobSpec,
    raw: str | bytes,
    *,
    team: str,
    team_gid: int | None = None,
    site: SiteSettings | None = None,
    log: Callable[[str], None] | None = None,
    stager: StagerPolicy | None = None,
    wait_s: float | None = None,
) -> dict[str, Any]:
    """The prolog's image step on one node (as root): :func:`stage_for_job` for the job's one image entry.

    The entry goes to this node's cache with a lease and LRU like weights (the team's private subtree
    unless the root-owned shared tier holds it: a squashfs a teammate built is not everyone's), and
    ``<node_cache>/jobs/<id>/img`` links it for the runtime (slurm_bt/node/job_paths.py ``image_path``).
    With ``[containers] node_copy = false`` an image in the trusted shared tier is linked in place
    (``shared-direct``); a team-tier image is always copied and re-hashed (its blobs are a teammate's).

    Returns:
        The record entry (also written to ``jobs/<id>/image.json``): source, tier, bytes, seconds, path.

    Raises:
        WeightsJobError and the other exceptions of :func:`stage_for_job`, classified the same way.
    """
    site = site or _trusted_site()
    job_id = environ["SLURM_JOB_ID"]
    m = image_manifest_for_job(spec, raw)
    nodes = _NodeTiers.open(environ, site, team, team_gid, log)
    try:
        return _stage_image(environ, spec, m, nodes, job_id, log, stager, wait_s)
    finally:
        nodes.close()


def _stage_image(environ: Mapping[str, str], spec: JobSpec, m: Manifest, nodes: _NodeTiers, job_id: str,
                 log: Callable[[str], None] | None, stager: StagerPolicy | None,
                 wait_s: float | None) -> dict[str, Any]:
    from slurm_bt.node.job_paths import IMAGE_LINK

    pin = spec.image_pin
    reference = pin.reference if pin is not None else spec.image
    t0 = time.monotonic()
    if not nodes.site.containers.node_copy and nodes.shared.trusted_copy and nodes.shared.has(m) \
            and nodes.shared.snapshot_path(m).is_dir():
        from slurm_bt.weights.job_view import link_job_weights

        nodes.authorize(m)
        link = link_job_weights(nodes.public_node, job_id, 0, m, name=IMAGE_LINK,
                                snapshot=nodes.shared.snapshot_path(m))
        entry = _record_entry(m, index=0, tier="shared-direct", audience="public", t0=t0, link=link)
    else:
        entry, node = nodes.stage_entry(m, job_id, nodes.shared.has(m), stager, index=0, link_name=IMAGE_LINK)
        if entry["tier"] == "node-staging" and stager is not None:
            _short_wait([(entry, node, m)], t0 + (stager.prolog_wait_s if wait_s is None else wait_s))
    entry.update(kind="image", link=IMAGE_LINK, source=f"{reference}@{m.revision[:19]}")
    if log is not None:
        log(_line(entry))
    nodes.write_record(environ, job_id, IMAGE_RECORD, {"job_id": job_id, "image": entry})
    return entry


def read_node_image_record(node_root: str | Path, job_id: str) -> dict[str, Any] | None:
    """The prolog's root-owned record of the image it staged for ``job_id`` on this node, or None."""
    data = _read_root_json(Path(node_root) / "jobs" / job_id / IMAGE_RECORD)
    if isinstance(data, dict) and isinstance(data.get("image"), dict):
        return dict(data["image"])
    return None


def prepare_job_image(spec: JobSpec, environ: Mapping[str, str], out: IO[str] | None = None) -> dict[str, Any]:
    """Step 1 (as the user): wait for the node copy of the job's image when a node stager still runs.

    Returns the node's image entry for the delivery report (``slurm-bt status``).

    Raises:
        WeightsJobError: the prolog staged no image for this job here, or its node copy stopped.
    """
    from slurm_bt.site.settings import expand_path

    out = out or sys.stderr
    node = environ.get("SLURMD_NODENAME", "node")
    job_id = environ["SLURM_JOB_ID"]
    ctx = spec.context
    node_root = expand_path(spec.storage["node_cache"], user=ctx.user, uid=ctx.uid, home=ctx.home, node=node)
    entry = read_node_image_record(node_root, job_id)
    if entry is None:
        raise WeightsJobError(f"the slurm-bt prolog staged no image for this job on {node} (container jobs run the "
                              "node's copy of the pinned image; ask an admin to check the prolog's log)")
    entry["node"] = node
    if entry.get("tier") == "node-staging":
        wait_for_node_copies([entry], node_root, job_id, ctx.job_dir, node, out)
    print(_line(entry) + f" on {node}", file=out, flush=True)
    return entry


def _start_stager(node: NodeCache, m: Manifest, policy: StagerPolicy, *, base: str, team: str,
                  shared: ClusterCache, site: SiteSettings, reader: tuple[int, int] | None = None) -> str:
    """Start (or join) the node stager of ``m``; returns its key (the job's first step waits on it)."""
    from slurm_bt.weights.node_stager import spawn, stager_key

    aud = node.audience
    key = stager_key(m.manifest_id, aud.team if aud is not None else None)
    request = {"manifest": m.canonical_json().decode(), "node_root": str(node.root),
               "audience": {"team": aud.team, "gid": aud.gid} if aud is not None else None,
               "cluster_base": str(base), "team": team, "shared_trusted": shared.trusted_copy,
               "max_bytes": node.max_bytes, "reserve_bytes": node.reserve_bytes,
               "reader": {"uid": reader[0], "gid": reader[1]} if reader is not None else None}
    spawn(node.root, key, request, policy)
    return key


def _line(e: Mapping[str, Any]) -> str:
    from slurm_bt.units import format_bytes

    what = "image" if e.get("kind") == "image" else "weights"
    return f"slurm-bt {what}: {e['source']} {e['tier']} {format_bytes(e['bytes'])} in {e['seconds']:.2f} s"


def epilog_release_leases(environ: Mapping[str, str], deadline_s: float, site: SiteSettings | None = None) -> None:
    """Epilog: unlink the job's views and drop its leases on this node (idempotent)."""
    from slurm_bt.weights.job_view import unlink_job_weights

    node = _node_cache(site or _trusted_site(), environ)
    job_id = environ["SLURM_JOB_ID"]
    if not node.root.is_dir():
        return
    unlink_job_weights(node, job_id)
    node.release(job_id)


#: A lease younger than this is never pruned as a crashed job's: a prolog writes its job's note before
#: it leases, so only a race (a requeued job's note being rewritten) can show a young lease without one.
LEASE_PRUNE_MIN_AGE_S = 600.0


def epilog_enforce_lru(environ: Mapping[str, str], deadline_s: float, site: SiteSettings | None = None, *,
                       state_root: str | None = None) -> list[tuple[str, str]]:
    """Epilog: drop the leases of jobs whose epilog never ran (a node crash or reboot: no note of theirs
    is left on this host, posix/job_notes.py), then evict lease-free entries LRU until blob usage is
    under the site's cap. Returns the pruned ``(entry, job)`` leases."""
    from slurm_bt.posix.job_notes import STATE_ROOT, has_job_note, jobs_on_host

    site = site or _trusted_site()
    node = _node_cache(site, environ)
    if not node.root.is_dir():
        return []
    root = state_root or STATE_ROOT
    pruned = node.prune_leases(jobs_on_host(root) | {environ["SLURM_JOB_ID"]}, min_age_s=LEASE_PRUNE_MIN_AGE_S,
                               still_inactive=lambda job: not has_job_note(job, root))
    node.gc_temp()
    cap = node.cap_bytes()
    if node.usage_bytes() > cap:
        node.execute(node.plan_eviction(cap))
    return pruned


# -- user: step 1 of the job -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedWeights:
    """What step 1 hands on: extra environment and, for host jobs, the bubblewrap argv file."""

    env: list[tuple[str, str]]
    bwrap_file: Path | None
    entries: list[dict[str, Any]]


def _verify_snapshot_for_user(cache: ClusterCache, m: Manifest) -> None:
    """Refuse a cluster snapshot that is not exactly the manifest (fallback path, as the user).

    Every path must be a regular file of the pinned size and nothing else may be in the tree; files
    owned by neither root nor the user (a teammate could rewrite a blob they own) are re-hashed.
    """
    snap = cache.snapshot_path(m)
    want = {f.path: f for f in m.files}
    me = os.getuid()
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(snap):
        rel_dir = os.path.relpath(dirpath, snap)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            f = want.get(rel)
            st = os.lstat(os.path.join(dirpath, name))
            if f is None or not stat.S_ISREG(st.st_mode) or st.st_size != f.size:
                raise WeightsJobError(f"{snap}: {rel} does not match the manifest of {m.source}; refusing the "
                                      "cluster cache entry (ask an admin to remove it)")
            if st.st_uid not in (0, me):
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    actual, _ = sha256_fd(fd)
                finally:
                    os.close(fd)
                if actual != f.sha256:
                    raise WeightsJobError(f"{snap}: {rel}: sha256 {actual} differs from the pinned {f.sha256}; "
                                          "refusing the corrupted cluster cache entry")
            seen.add(rel)
    if seen != set(want):
        missing = sorted(set(want) - seen)[:3]
        raise WeightsJobError(f"{snap}: incomplete snapshot of {m.source} (missing {', '.join(missing)})")


def _fallback_entries(spec: JobSpec, plan: WeightsPlan, node_name: str) -> list[dict[str, Any]]:
    from slurm_bt.weights.plan import cluster_tiers, job_manifest_path

    team, shared = cluster_tiers(plan.cluster_cache, plan.team)
    entries = []
    for i, w in enumerate(spec.weights):
        t0 = time.monotonic()
        path = job_manifest_path(spec.context.job_dir, i)
        try:
            m = Manifest.model_validate_json(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise WeightsJobError(f"{path}: {exc}: the weights of job.weights[{i}] were not staged") from None
        tier = next((c for c in (team, shared) if c.has(m) and c.snapshot_path(m).is_dir()), None)
        if tier is None:
            raise WeightsJobError(f"job.weights[{i}] {m.source}: not in the cluster cache (team {plan.team!r} "
                                  "or shared); was it evicted? resubmit to stage it again")
        _verify_snapshot_for_user(tier, m)
        entries.append({"index": i, "source": f"{m.source}@{m.revision[:12]}", "manifest_id": m.manifest_id,
                        "mount_location": w.mount_location, "tier": "cluster-direct", "bytes": m.total_bytes,
                        "seconds": round(time.monotonic() - t0, 4), "path": str(tier.snapshot_path(m)),
                        "node": node_name})
    return entries


def prepare_job_weights(
    spec: JobSpec,
    environ: Mapping[str, str],
    *,
    runtime_dir: str,
    workdir: str,
    out: IO[str] | None = None,
    extra_status: Sequence[Mapping[str, Any]] = (),
) -> PreparedWeights:
    """Step 1's weights work on this node (as the user); see the module docstring.

    Raises:
        WeightsJobError: nothing usable was staged for this job (the job fails with this reason).
    """
    from slurm_bt.site.settings import expand_path
    from slurm_bt.weights.delivery_report import write_node_status
    from slurm_bt.weights.job_view import bwrap_argv, bwrap_usable
    from slurm_bt.weights.plan import read_plan

    out = out or sys.stderr
    if not spec.weights:
        return PreparedWeights([], None, [])
    node = environ.get("SLURMD_NODENAME", "node")
    job_id = environ["SLURM_JOB_ID"]
    ctx = spec.context
    node_root = expand_path(spec.storage["node_cache"], user=ctx.user, uid=ctx.uid, home=ctx.home, node=node)
    record = read_node_record(node_root, job_id)
    entries: list[dict[str, Any]]
    if record is not None and len(record) == len(spec.weights):
        entries = [dict(e, node=node) for e in record]
        if any(e.get("tier") == "node-staging" for e in entries):
            wait_for_node_copies(entries, node_root, job_id, ctx.job_dir, node, out)
        for e in entries:
            # the link lives in a root-owned dir; resolve it so bwrap binds the snapshot itself
            e["path"] = os.path.realpath(str(Path(node_root) / "jobs" / job_id / f"w{e['index']}"))
    else:
        try:
            plan = read_plan(ctx.job_dir)
        except (OSError, ValueError) as exc:
            raise WeightsJobError(f"{ctx.job_dir}/weights/plan.json: {exc}") from None
        entries = _fallback_entries(spec, plan, node)
        if spec.container_runtime != "none":
            raise WeightsJobError("container jobs get their weights from the node cache, which only the "
                                  "slurm-bt prolog can fill; it did not stage this job on "
                                  f"{node} (ask an admin to enable weights staging in the prolog)")
    env: list[tuple[str, str]] = []
    bwrap_file: Path | None = None
    if spec.container_runtime == "none":
        plan_bwrap = _plan_bwrap(ctx.job_dir)
        if bwrap_usable(plan_bwrap):
            mounts = [(e["path"], e["mount_location"]) for e in entries]
            argv = bwrap_argv(mounts, ["/bin/bash", f"{ctx.job_dir}/node_entry.sh", "--in-container"],
                              bwrap=plan_bwrap, cwd=workdir)
            bwrap_file = Path(runtime_dir) / f"node-{environ.get('SLURM_NODEID', '0')}.bwrap"
            write_file_atomic(bwrap_file, b"".join(a.encode() + b"\0" for a in argv), mode=0o600)
            for e in entries:
                e["view"] = "bwrap"
            env += [(f"BT_WEIGHTS_{e['index']}", e["mount_location"]) for e in entries]
        else:
            print(f"slurm-bt weights: bubblewrap ({plan_bwrap}) is not usable on {node}: the weights are NOT at "
                  "their mount_location; read them from $BT_WEIGHTS_<i> (read-only by permissions)",
                  file=out, flush=True)
            for e in entries:
                e["view"] = "path"
            env += [(f"BT_WEIGHTS_{e['index']}", e["path"]) for e in entries]
    else:
        for e in entries:
            e["view"] = "bind"
        env += [(f"BT_WEIGHTS_{e['index']}", e["mount_location"]) for e in entries]
    # extra_status: the job's image entry (prepare_job_image), reported in the same node file
    write_node_status(ctx.job_dir, node, entries + [dict(e) for e in extra_status])
    for e in entries:
        print(_line(e) + f" on {node}", file=out, flush=True)
    return PreparedWeights(env, bwrap_file, entries)


def _progress_text(rec: Mapping[str, Any] | None) -> str:
    from slurm_bt.weights.delivery_report import progress_text

    return "starting" if rec is None else progress_text(rec)


def wait_for_node_copies(entries: list[dict[str, Any]], node_root: str, job_id: str, job_dir: str, node: str,
                         out: IO[str], *,
                         poll_s: float = 1.0, log_every_s: float = 10.0) -> None:
    """Step 1 (as the user): wait until every ``node-staging`` entry's snapshot is on this node.

    The job is DEPLOYING meanwhile: the stager's progress (bytes done/total, rate, ETA) goes to the
    job log every ``log_every_s`` and into ``<job_dir>/weights/status-<node>.json`` for ``slurm-bt
    status``. The wait ends with the job's time limit at the latest; it fails the job at once when
    the stager reports a failure or is gone (killed, its node rebooted): what it copied stays on the
    node and the next job's stager resumes from there.

    Raises:
        WeightsJobError: the copy stopped before the snapshot was complete.
    """
    from slurm_bt.weights.delivery_report import write_node_status
    from slurm_bt.weights.node_stager import STALE_AFTER_S, read_progress

    t0 = time.monotonic()
    next_log = t0
    next_status = t0
    gone_since: dict[str, float] = {}
    pending = [e for e in entries if e.get("tier") == "node-staging"]
    while pending:
        now = time.monotonic()
        for e in list(pending):
            # The snapshot is renamed into place whole (cache_layout.build_snapshot): once the
            # root-owned link resolves to a directory, every file is there and verified.
            if os.path.isdir(Path(node_root) / "jobs" / job_id / str(e.get("link") or f"w{e['index']}")):
                e.update(tier="cluster-hit", seconds=round(float(e.get("seconds") or 0) + now - t0, 4))
                for k in ("stager", "progress"):
                    e.pop(k, None)
                pending.remove(e)
                continue
            key = str(e.get("stager", ""))
            rec = read_progress(node_root, key)
            e["progress"] = {k: rec.get(k) for k in ("state", "done_bytes", "total_bytes", "rate_bytes_s", "eta_s")
                             } if rec is not None else {"state": "starting"}
            state = rec.get("state") if rec is not None else None
            if state in ("failed", "cancelled"):
                raise WeightsJobError(f"the node copy of {e.get('source')} on {node} stopped: "
                                      f"{str(rec.get('message', ''))[:500] if rec else ''}; what was copied is "
                                      "kept on the node, so a resubmitted job continues from there")
            updated = rec.get("updated") if rec is not None else None
            stale = not isinstance(updated, (int, float)) or time.time() - updated > STALE_AFTER_S
            if state == "done" or stale or (rec is not None and not _writer_alive(rec)):
                gone_since.setdefault(key, now)
                if now - gone_since[key] > 5.0:  # the snapshot did not appear: the stager died
                    raise WeightsJobError(f"the node copy of {e.get('source')} on {node} stopped (its stager is "
                                          "gone); what was copied is kept on the node, so a resubmitted job "
                                          "continues from there")
            else:
                gone_since.pop(key, None)
        if not pending:
            break
        if now >= next_log:
            for e in pending:
                print(f"slurm-bt weights: waiting for the node copy of {e.get('source')} on {node}: "
                      f"{_progress_text(read_progress(node_root, str(e.get('stager', ''))))}", file=out, flush=True)
            next_log = now + log_every_s
        if now >= next_status:
            with contextlib.suppress(OSError):
                write_node_status(job_dir, node, entries)
            next_status = now + max(poll_s, 2.0)
        time.sleep(poll_s)


def _writer_alive(rec: Mapping[str, Any]) -> bool:
    """The stager named by a progress record still runs (pid and start time match; /proc is readable)."""
    from slurm_bt.weights.node_stager import process_running

    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not os.path.exists("/proc/1/stat"):  # /proc mounted with hidepid: only the heartbeat tells
        return True
    return process_running(pid, rec.get("start_time"))


def _plan_bwrap(job_dir: str) -> str:
    from slurm_bt.posix.user_files import read_user_file
    from slurm_bt.weights.plan import PLAN_MAX_BYTES, PLAN_NAME

    with contextlib.suppress(OSError, ValueError):  # a swapped plan.json is refused, never read unbounded
        data = json.loads(read_user_file(Path(job_dir) / "weights" / PLAN_NAME, PLAN_MAX_BYTES))
        value = data.get("bwrap")
        if isinstance(value, str) and value.startswith("/"):
            return value
    return "/usr/bin/bwrap"
