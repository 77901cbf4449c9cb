"""Where a job's files live on a node, and what its processes see: one pure function for both sides.

The batch-script renderer (login node) needs the container bind mounts, and the node-side prepare
step needs the host directories and the ``BT_*`` values. Both come from :func:`job_layout`, so the two
can never disagree. Nothing here touches the filesystem.

Host paths are built from the site's storage roots. Per-job parts are keyed by the Slurm job id, and
node-local roots may carry ``%n`` (the node name), which lets the dev cluster's two slurmd daemons share
one host. With a container runtime, user-chosen container paths (``checkpoint_path``,
``download_folder``, ``mount_base_path``, ``mount_location``) are bind mounts of per-job host
directories under the job's scratch; without one they cannot be created (an unprivileged job cannot
make ``/mnt/ckpts``), so the ``BT_*`` variables point at the host directories instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_bt.job_spec import JobSpec, slugify
from slurm_bt.site.settings import expand_path

__all__ = ["CHECKPOINT_REL", "HANDOFF_RECORDS_DIR", "IMAGE_FILE", "IMAGE_LINK", "RUNTIME_PREFIX", "BindMount",
           "JobLayout", "image_path", "job_layout", "runtime_dir", "user_runtime_dir"]

BASETEN_WORKDIR = "/b10/workspace"
RUNTIME_PREFIX = "slurm-bt-"
"""``<runtime root>/slurm-bt-<uid>``: each user's directory of per-job runtime dirs."""
CHECKPOINT_REL = ("mnt", "checkpoints")
"""The per-job host checkpoint dir, relative to ``<scratch root>/<job id>``.

Spelled here because :func:`job_layout` builds it; ``slurm_bt.checkpoints.locations`` derives every
other use (the flush, the epilog's keep-on-removal) from it, so the parts never disagree.
"""
IMAGE_LINK = "img"
"""``<node_cache>/jobs/<job id>/img``: the prolog's root-owned link to the job's staged image entry
(slurm_bt/weights/node_stage.py ``stage_image_for_job``), beside the weights' ``w<i>`` links."""
IMAGE_FILE = "image.sqfs"
"""The one file of an image's cache entry (docs/containers.md): the flattened root filesystem."""
HANDOFF_RECORDS_DIR = ".slurm-bt-handoff"
"""Where the epilog records scratch it kept for a checkpoint hand-off, under the scratch root
(one ``<job id>.json`` each); read by the stale-scratch sweep and ``admin doctor``."""


@dataclass(frozen=True)
class BindMount:
    """A host directory shown at ``target`` inside the container."""

    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class JobLayout:
    """The host directories of one job on one node and the environment that describes them.

    Attributes:
        scratch: per-job node-local scratch (``BT_SCRATCH_DIR`` on the host).
        runtime: per-job private tmpfs dir (0700) holding the per-node env files.
        make_dirs: host directories the prepare step creates (as the job user), in order.
        links: (link path, target) symlinks the prepare step creates inside the job's scratch.
        env: ``BT_*`` values as the job's processes see them (container paths under a runtime).
        binds: bind mounts for a container runtime (empty for host jobs).
        workdir: where start_commands run, as the job's processes see it.
    """

    scratch: str
    runtime: str
    make_dirs: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    binds: tuple[BindMount, ...]
    workdir: str

    def host_path(self, variable: str) -> str | None:
        """The host path behind a ``BT_*`` directory variable (None when the job does not set it).

        Inside a container the variable names the container path; host-side code (uploaders,
        downloaders) follows the bind mount that shows it back to its source.
        """
        value = dict(self.env).get(variable)
        if value is None:
            return None
        return next((b.source for b in self.binds if b.target == value), value)


def user_runtime_dir(template: str, *, user: str, uid: int, home: str) -> str:
    """``<runtime root>/slurm-bt-<uid>``: the user's directory of per-job runtime dirs (tmpfs).

    One definition for step 1 (which creates the job's directory in it) and the root hooks (the
    prolog creates this directory root-side so nobody else can take the name first; the epilog
    removes the job's directory). ``%n`` is not expanded: the path is the same on every node.
    """
    return f"{expand_path(template, user=user, uid=uid, home=home)}/{RUNTIME_PREFIX}{uid}"


def runtime_dir(spec: JobSpec, job_id: str) -> str:
    """The per-job private runtime directory (tmpfs), the same path on every node."""
    ctx = spec.context
    return f"{user_runtime_dir(spec.storage['runtime'], user=ctx.user, uid=ctx.uid, home=ctx.home)}/{job_id}"


def image_path(spec: JobSpec, job_id: str, node: str | None) -> str:
    """The squashfs the container runtime starts: ``<node_cache>/jobs/<job id>/img/image.sqfs``.

    The link is root's (the prolog made it after checking the entry), so the runtime, started as the
    user, opens a file the user can neither swap nor write. With ``node=None`` a ``%n`` in the node
    cache root stays unexpanded (the renderer turns it into ``$SLURMD_NODENAME``).
    """
    ctx = spec.context
    root = expand_path(spec.storage["node_cache"], user=ctx.user, uid=ctx.uid, home=ctx.home, node=node)
    return f"{root}/jobs/{job_id}/{IMAGE_LINK}/{IMAGE_FILE}"


def job_layout(spec: JobSpec, *, job_id: str, node: str | None, account: str | None = None,
               team: str | None = None) -> JobLayout:
    """Compute the layout of job ``job_id`` on node ``node``.

    Args:
        spec: the job.
        job_id: the Slurm job id, or a shell reference such as ``${SLURM_JOB_ID}`` when rendering.
        node: the Slurm node name, or ``None`` when rendering (then ``%n`` stays unexpanded).
        account: the Slurm account; names the team directory only when ``team`` is not given
            (clusters without the slurm-bt prolog; ``default`` when unset).
        team: the team group the root prolog resolved and recorded for this job (trusted; see
            ``slurm_bt.posix.teams``). It wins over ``account``.
    """
    ctx = spec.context

    def root(key: str) -> str:
        return expand_path(spec.storage[key], user=ctx.user, uid=ctx.uid, home=ctx.home, node=node)

    in_container = spec.container_runtime != "none"
    scratch = f"{root('scratch')}/{job_id}"
    mnt = f"{scratch}/{CHECKPOINT_REL[0]}"
    make_dirs: list[str] = [scratch]
    links: list[tuple[str, str]] = []
    env: list[tuple[str, str]] = [("BT_SCRATCH_DIR", scratch)]
    binds: list[BindMount] = []

    workdir = spec.src_dir
    if spec.container_runtime == "charliecloud":
        # ch-run binds nothing of the host's but /dev, /proc, /sys and /tmp: the entry script and
        # job.json must be shown to the container (node_entry.sh binds $HOME before these, which
        # usually holds the job dir). First, so that binds inside the job dir land on a path that exists.
        binds.append(BindMount(ctx.job_dir, ctx.job_dir))
    if in_container:
        workdir = BASETEN_WORKDIR if spec.enable_baseten_workdir else spec.src_dir
        binds.append(BindMount(spec.src_dir, workdir))
        # Read-write: the entry script deletes the node's env file as soon as it has read it.
        user_runtime = runtime_dir(spec, job_id).rsplit("/", 1)[0]
        binds.append(BindMount(user_runtime, user_runtime))
        binds.append(BindMount(root("scratch"), root("scratch")))
    if spec.enable_baseten_workdir:
        env.append(("BT_WORKING_DIR", workdir))

    if spec.checkpointing.enabled:
        host = f"{scratch}/{'/'.join(CHECKPOINT_REL)}"
        target = spec.checkpointing.checkpoint_path
        if in_container and target:
            binds.append(BindMount(host, target))
            make_dirs.append(host)
            env.append(("BT_CHECKPOINT_DIR", target))
        else:
            path = target if (target and target.startswith("/")) else host
            make_dirs.append(path)
            env.append(("BT_CHECKPOINT_DIR", path))

    if spec.load_checkpoint.enabled or spec.load_checkpoint.resume:  # resume: slurm_bt/checkpoints/resume.py
        host = f"{mnt}/loaded_checkpoints"
        make_dirs.append(host)
        if in_container:
            binds.append(BindMount(host, spec.load_checkpoint.download_folder))
            env.append(("BT_LOAD_CHECKPOINT_DIR", spec.load_checkpoint.download_folder))
        else:
            env.append(("BT_LOAD_CHECKPOINT_DIR", host))

    if spec.cache.enabled:
        team_dir = team if team else slugify(account or "", default="default")
        project_cache = f"{root('cache')}/teams/{team_dir}/projects/{spec.project_id}"
        team_cache = f"{root('cache')}/teams/{team_dir}/shared"
        host_rw = f"{mnt}/cache"
        make_dirs.extend([project_cache, team_cache, host_rw])
        links.extend([(f"{host_rw}/user_artifacts", project_cache), (f"{host_rw}/team_artifacts", team_cache)])
        rw = host_rw
        if in_container:
            binds.append(BindMount(root("cache"), root("cache")))
            binds.append(BindMount(host_rw, spec.cache.mount_base_path))
            rw = spec.cache.mount_base_path
        env.extend([("BT_RW_CACHE_DIR", rw), ("BT_PROJECT_CACHE_DIR", f"{rw}/user_artifacts"),
                    ("BT_TEAM_CACHE_DIR", f"{rw}/team_artifacts")])
        if spec.cache.enable_legacy_hf_mount:
            # Baseten's legacy mount is a persistent Hugging Face cache, so it lives in the
            # project cache (shared by the project's jobs), shown at <mount_base_path>/huggingface.
            hf = f"{project_cache}/huggingface"
            make_dirs.append(hf)
            links.append((f"{host_rw}/huggingface", hf))
            env.append(("HF_HOME", f"{rw}/huggingface"))

    if in_container:
        node_weights = f"{root('node_cache')}/jobs/{job_id}"
        for i, w in enumerate(spec.weights):
            binds.append(BindMount(f"{node_weights}/w{i}", w.mount_location, read_only=True))

    return JobLayout(scratch=scratch, runtime=runtime_dir(spec, job_id), make_dirs=tuple(make_dirs),
                     links=tuple(links), env=tuple(env), binds=tuple(binds), workdir=workdir)
