"""Site configuration: the one file an admin writes to describe the cluster to slurm-bt.

Why a file and not flags: every user on the login node and every hook on every compute node must
agree on the same partitions, GRES names and storage roots. The file is TOML, strictly validated
(unknown keys are errors, so a typo never silently falls back to a default), and read *when called*,
never at import time.

Lookup order: an explicit path, then ``$SLURM_BT_SITE_CONFIG``, then ``/etc/slurm-bt/site.toml``.
When no file exists at the default location the built-in defaults apply; they match the embedded
dev cluster (``devcluster/devcluster.py``). A path given explicitly or through the environment must
exist.

Path templates: storage roots may contain ``{user}``, ``{uid}`` and ``{home}`` (expanded for the
job's user) and ``%n`` (the Slurm node name, expanded on the compute node). ``%n`` lets several
slurmd daemons share one host, as in the dev cluster, while still having "node-local" directories.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from slurm_bt.errors import Problem, SiteConfigError
from slurm_bt.site.site_file import (
    DEFAULT_SITE_PATH,
    SITE_ENV_VAR,
    STORAGE_DEFAULTS,
    check_storage_path,
    expand_path,
    read_site_table,
    user_path,
)
from slurm_bt.storage.endpoints import StorageEndpoints

__all__ = [
    "DEFAULT_SITE_PATH",
    "SITE_ENV_VAR",
    "STOP_SIGNALS",
    "AcceleratorMapping",
    "ContainerSettings",
    "RestartSettings",
    "SiteRestartSettings",
    "SiteSettings",
    "StorageRoots",
    "SubmitSettings",
    "WeightsSettings",
    "expand_path",
    "load_site_settings",
    "user_path",
]

SlurmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AcceleratorMapping(_Strict):
    """How one truss ``Accelerator`` value maps onto this cluster.

    Attributes:
        gres_type: the gres.conf ``Type=`` for these GPUs (``--gres=gpu:<gres_type>:<count>``).
        partition: the partition that holds them; ``None`` uses the site's default partition.
    """

    gres_type: SlurmName
    partition: SlurmName | None = None


class StorageRoots(_Strict):
    """Where slurm-bt keeps data. Shared roots must be visible from every node.

    Attributes:
        cluster_cache: shared filesystem (e.g. Lustre) holding mirrored weights.
        node_cache: node-local NVMe cache for weights.
        scratch: node-local root of per-job scratch (``BT_SCRATCH_DIR``).
        cache: shared root of the read-write project and team caches.
        checkpoint_store: URI of the checkpoint store (``file://``, ``s3://``, ``gs://``, ``r2://``).
        workspace: per-user job workspace on a shared filesystem: config snapshots, job specs,
            logs and submission records.
        runtime: node-local tmpfs for per-job private runtime files (resolved secrets).
        secrets: each user's secret store (read on the nodes as the user at run time).
    """

    cluster_cache: str = STORAGE_DEFAULTS["cluster_cache"]
    node_cache: str = STORAGE_DEFAULTS["node_cache"]
    scratch: str = STORAGE_DEFAULTS["scratch"]
    cache: str = STORAGE_DEFAULTS["cache"]
    checkpoint_store: str = STORAGE_DEFAULTS["checkpoint_store"]
    workspace: str = STORAGE_DEFAULTS["workspace"]
    runtime: str = STORAGE_DEFAULTS["runtime"]
    secrets: str = STORAGE_DEFAULTS["secrets"]

    @field_validator("cluster_cache", "node_cache", "scratch", "cache", "workspace", "runtime", "secrets")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return check_storage_path(v)

    @field_validator("checkpoint_store")
    @classmethod
    def _uri(cls, v: str) -> str:
        scheme, sep, rest = v.partition("://")
        if not sep or scheme not in {"file", "s3", "gs", "r2"} or not rest:
            raise ValueError("must be a file://, s3://, gs:// or r2:// URI")
        return v


# -- weights delivery (slurm_bt.weights.plan / stage_job / node_stage) -------------------------------
def _source_endpoints() -> StorageEndpoints:
    return StorageEndpoints()


class WeightsSettings(_Strict):
    """``[weights]``: where weights sources live and how the node tier trusts the cluster tier.

    Attributes:
        endpoints: per-backend endpoints (``[weights.endpoints]``: ``hf_endpoint``,
            ``s3_endpoint_url``...); recorded in each job's plan so the staging job uses the same.
        node_cache_max_bytes: cap on the node cache's blob bytes (LRU eviction of lease-free entries);
            0 (default): 90% of the node-cache filesystem, so a 1 TB model needs no setting where it fits.
        node_cache_reserve_bytes: free space on the node-cache filesystem never used.
        verify_node_copy: ``team`` (default) re-hashes every blob copied from a team tier (users
            write it) but copies from the root-owned, admin-curated shared tier at kernel-copy speed;
            ``all`` re-hashes every copy (also catches storage rot on the shared filesystem).
        staging_cpus: CPUs of a staging job (downloads are I/O bound; two threads hash).
        staging_mem: memory of a staging job (Slurm syntax).
        staging_time: time limit of a staging job (Slurm syntax).
        bwrap: absolute path of bubblewrap on the compute nodes (host jobs' private views).
    """

    endpoints: StorageEndpoints = Field(default_factory=_source_endpoints)
    node_cache_max_bytes: int = Field(default=0, ge=0)
    node_cache_reserve_bytes: int = Field(default=1024**3, ge=0)
    verify_node_copy: Literal["team", "all"] = "team"
    staging_cpus: int = Field(default=1, ge=1, le=256)
    staging_mem: str = Field(default="1G", pattern=r"^[0-9]+[KMGT]?$")
    staging_time: str = Field(default="6:00:00", pattern=r"^[0-9:-]+$")
    bwrap: str = "/usr/bin/bwrap"

    @field_validator("bwrap")
    @classmethod
    def _abs_bwrap(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be an absolute path (jobs run with a minimal PATH)")
        return v
# -- end weights ---------------------------------------------------------------------------------------


# -- containers (docs/containers.md) --------------------------------------------------------------------

_REGISTRY_HOST = r"^[A-Za-z0-9.-]+(:[0-9]{1,5})?$"


class ContainerSettings(_Strict):
    """``[containers]``: where job images are pulled from (images are pinned at submit, mirrored before
    the GPUs are held and delivered through the weights cache tiers; docs/containers.md).

    Attributes:
        registry_mirrors: registry host → the host to pull from instead, e.g.
            ``{"docker.io" = "mirror.example:5000"}`` (an internal pull-through mirror). Applied before
            pinning, so the pinned reference names what is really pulled.
        ca_bundle: a CA file the registry clients trust besides the system's (an internal registry
            with its own CA); None, or a file that does not exist: the system's CAs only.
        node_copy: place images on node-local storage (the node tier) before the job starts; False lets
            the runtime read an image that sits in the root-owned shared tier in place.
        platform: the nodes' platform, ``os/arch[/variant]``: what a multi-platform image is pinned to.
        max_image_bytes: largest image (sum of compressed layers, and the squashfs) the staging job
            mirrors; bounds its temp space. It also caps the unpacked image, as it always did: an admin
            who lowers it alone still bounds what a stager writes.
        max_unpacked_bytes: largest unpacked image (its layers' tar streams: file contents and their
            headers, counted before anything is unpacked); the bound is the smaller of this and
            ``max_image_bytes``. What the staging job writes into the team tier's temp space and every
            job into node scratch scales with it, not with the compressed size.
        max_unpacked_ratio: the unpacked image may be at most this many times its compressed layers
            (a decompression bomb: a 10 MB gzip layer can hold 10 GiB of zeros).
    """

    # Like [storage], the defaults describe the dev cluster (devcluster/devcluster.py runs its registry
    # there): a real site sets registry_mirrors (``{}`` for none) and ca_bundle in its site file.
    registry_mirrors: dict[str, str] = Field(default_factory=lambda: {"docker.io": "127.0.0.1:5443"})
    ca_bundle: str | None = "/var/lib/slurm-bt-dev/registry/tls/ca.crt"
    node_copy: bool = True
    platform: str = Field(default="linux/amd64", pattern=r"^[a-z0-9]+/[a-z0-9_]+(/[a-z0-9]+)?$")
    max_image_bytes: int = Field(default=200 * 1024**3, gt=0)
    # 100 GiB: several times the largest CUDA/PyTorch training images (~20 GiB unpacked), far below
    # what a team tier or a node's scratch holds.
    max_unpacked_bytes: int = Field(default=100 * 1024**3, gt=0)
    # 20: real images compress 2-5x (binaries, wheels, text); 20 leaves a wide margin for a legitimate
    # image while a bomb (gzip of zeros reaches ~1000x) is refused after reading at most 20x its size.
    max_unpacked_ratio: float = Field(default=20.0, ge=1.0)

    @field_validator("registry_mirrors")
    @classmethod
    def _hosts(cls, v: dict[str, str]) -> dict[str, str]:
        import re

        for k, m in v.items():
            for host in (k, m):
                if not re.match(_REGISTRY_HOST, host):
                    raise ValueError(f"{host!r} is not a registry host[:port]")
        return v

    @field_validator("ca_bundle")
    @classmethod
    def _abs_ca(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path")
        return v
# -- end containers -------------------------------------------------------------------------------------


class CheckpointSettings(_Strict):
    """``[checkpoints]``: the default retention of each job's checkpoints in the store (docs/checkpoints.md).

    Attributes:
        keep_last: keep the newest N complete checkpoints of a job (0: keep all).
        max_bytes: keep a job's checkpoints under this many bytes in the store (0: no budget).

    A job overrides either with ``BT_CHECKPOINT_KEEP_LAST`` / ``BT_CHECKPOINT_MAX_BYTES`` in its
    ``environment_variables``. The newest complete checkpoint is never deleted.
    """

    keep_last: int = Field(default=0, ge=0, le=1_000_000)
    max_bytes: int = Field(default=0, ge=0)


# -- restarts (docs/long-runs.md; slurm_bt/steps/restart.py) -----------------------------------------

StopSignal = Literal["TERM", "INT", "HUP", "USR2", "QUIT"]
#: The signals a job may be stopped with (``stop_signal``, and ``--signal`` after ``--``); never ``USR1``:
#: NCCL and several launchers use it, so receiving it would not mean "save and stop".
STOP_SIGNALS: tuple[str, ...] = get_args(StopSignal)


class RestartSettings(_Strict):
    """``[restarts]``: how a job stops before its end and when it is requeued (docs/long-runs.md).

    A job can override each value with an environment variable in its config (``BT_MAX_RESTARTS``,
    ``BT_RETRY_ON_FAILURE``, ``BT_STOP_SIGNAL``, ``BT_STOP_GRACE_S``): upstream configs have no field
    for it, and an unknown environment variable is harmless on Baseten.

    Attributes:
        max_restarts: requeues after a time limit, a preemption or a node failure (0: never).
        retry_on_failure: requeues after the start commands failed (0: an application error fails).
        stop_signal: what the start commands receive on every node before the time limit (never
            ``USR1``: NCCL and several launchers use it).
        stop_grace_s: seconds before the time limit the stop signal is sent; the start commands have
            this long to save a checkpoint and the uploader to ship it.
    """

    max_restarts: int = Field(default=3, ge=0, le=1000)
    retry_on_failure: int = Field(default=0, ge=0, le=1000)
    stop_signal: StopSignal = "TERM"
    stop_grace_s: int = Field(default=120, ge=10, le=86400)


class SiteRestartSettings(RestartSettings):
    """``[restarts]`` in the site file: the defaults of :class:`RestartSettings` and the ceiling.

    A job's own policy (``JobSpec.restarts``, in job.json) is a plain :class:`RestartSettings`: the
    ceiling is the site's bound on what a config may ask for, checked at submission
    (``slurm_bt.job_spec``), not part of the job.

    Attributes:
        ceiling: the most ``max_restarts`` and ``retry_on_failure`` may each be, in this file or per
            job (``BT_MAX_RESTARTS``, ``BT_RETRY_ON_FAILURE``): every run holds the job's nodes again.
    """

    ceiling: int = Field(default=10, ge=0, le=1000)

    @model_validator(mode="after")
    def _within_ceiling(self) -> SiteRestartSettings:
        for key in ("max_restarts", "retry_on_failure"):
            if getattr(self, key) > self.ceiling:
                raise ValueError(f"{key} = {getattr(self, key)} is above ceiling = {self.ceiling}")
        return self

    def job_defaults(self) -> RestartSettings:
        """The job's policy before its overrides: these settings without the ceiling."""
        return RestartSettings.model_validate(self.model_dump(exclude={"ceiling"}))
# -- end restarts ---------------------------------------------------------------------------------------


class SubmitSettings(_Strict):
    """``[submit]``: bounds on what ``bt-sbatch`` does with a config on the (shared) login node.

    Attributes:
        config_load_timeout_s: wall-clock seconds the config.py may take to load (it runs in a child
            process, killed at the bound).
        config_load_memory_bytes: address space (``RLIMIT_AS``) of that child. Address space, not
            resident memory: libraries reserve more than they touch, hence the room above the
            ~50 MB slurm-bt itself maps.
    """

    config_load_timeout_s: int = Field(default=60, ge=1, le=3600)
    config_load_memory_bytes: int = Field(default=4 * 1024**3, ge=256 * 1024**2)


class SiteSettings(_Strict):
    """The validated site configuration (see the module docstring for the file format).

    Attributes:
        default_partition: partition for jobs without an accelerator mapping of their own.
        staging_partition: CPU partition that runs weight-mirroring jobs before GPUs are held.
        accelerators: truss ``Accelerator`` value (``H100``) → GRES type and partition.
        cpus_per_gpu: CPUs per GPU when a GPU config leaves ``cpu_count`` at truss's default (0: the
            share of the partition's nodes, read from Slurm; docs/compatibility.md).
        mem_per_gpu: memory per GPU (``"32Gi"``) when a GPU config leaves ``memory`` at truss's
            default (unset: the share of the partition's nodes).
        container_runtime: ``charliecloud`` (``ch-run`` on the node's copy of the image's squashfs),
            ``pyxis`` (``srun --container-image``), ``apptainer`` (``apptainer exec``) or ``none``
            (docs/containers.md §Runtimes).
        python: absolute interpreter with slurm-bt installed on every node; ``None`` uses the one
            running the submission (right when the install is on a shared path).
        requeue: whether jobs are requeued by Slurm after node failure or preemption.
        max_snapshot_bytes: size limit of a config-folder snapshot (Baseten's is 5 GB).
        max_snapshot_files: most files and directories a config-folder snapshot may hold (each is
            copied and synced one by one: 100,000 small files took 39 s to submit).
        master_port_base: torchrun's ``MASTER_PORT`` is this plus the job id modulo 10000.
        storage: storage roots.
        weights: weights delivery (``[weights]``, :class:`WeightsSettings`).
        restarts: stop before the end and requeue (``[restarts]``, :class:`SiteRestartSettings`).
        submit: bounds on loading the config at submission (``[submit]``, :class:`SubmitSettings`).
        containers: image registries and placement (``[containers]``, :class:`ContainerSettings`).
        pyxis_container_scope_job: pyxis runs with ``container_scope=job`` (its epilog removes a job's
            named containers): only then is a session job's step 2 a named container that ``slurm-bt ssh``
            enters; with pyxis's default ``global`` scope a named container would outlive the job, so
            sessions start a new container of the job's image instead (docs/cli.md §Interactive sessions).
    """

    default_partition: SlurmName = "gpu"
    staging_partition: SlurmName = "staging"
    accelerators: dict[str, AcceleratorMapping] = Field(
        default_factory=lambda: {"H100": AcceleratorMapping(gres_type="h100", partition="gpu")}
    )
    cpus_per_gpu: int = Field(default=0, ge=0, le=1024)
    mem_per_gpu: str | None = None
    container_runtime: Literal["charliecloud", "pyxis", "apptainer", "none"] = "none"
    python: str | None = None
    requeue: bool = False
    max_snapshot_bytes: int = Field(default=5 * 1024**3, gt=0)
    max_snapshot_files: int = Field(default=20_000, gt=0)
    master_port_base: int = Field(default=20000, ge=1024, le=55000)
    storage: StorageRoots = Field(default_factory=StorageRoots)
    weights: WeightsSettings = Field(default_factory=WeightsSettings)
    restarts: SiteRestartSettings = Field(default_factory=SiteRestartSettings)
    checkpoints: CheckpointSettings = Field(default_factory=CheckpointSettings)
    containers: ContainerSettings = Field(default_factory=ContainerSettings)
    submit: SubmitSettings = Field(default_factory=SubmitSettings)
    pyxis_container_scope_job: bool = False

    @model_validator(mode="after")
    def _containers_need_uniform_paths(self) -> SiteSettings:
        """pyxis takes its bind mounts and image on the ``srun`` line of the batch script, one string for
        every node, so it cannot expand ``%n``; charliecloud and apptainer are started by the per-node
        entry script, which expands ``%n`` to ``$SLURMD_NODENAME`` (slurm_bt/render/batch_script.py)."""
        if self.container_runtime == "pyxis":
            for key, value in self.storage.model_dump().items():
                if "%n" in value:
                    raise ValueError(f"storage.{key} uses %n, which pyxis cannot expand (its mounts are on the "
                                     "srun line); use a path that is the same on every node")
        return self

    @field_validator("restarts", mode="before")
    @classmethod
    def _restarts_from_policy(cls, v: object) -> object:
        """A job's :class:`RestartSettings` given in code (tests, tools) is the site's, default ceiling."""
        if isinstance(v, RestartSettings) and not isinstance(v, SiteRestartSettings):
            return v.model_dump()
        return v

    @field_validator("accelerators")
    @classmethod
    def _known_accelerators(cls, v: dict[str, AcceleratorMapping]) -> dict[str, AcceleratorMapping]:
        from slurm_bt.compat.truss_config import Accelerator  # lazy: keep this module light

        known = {a.value for a in Accelerator}
        for name in v:
            if name not in known:
                raise ValueError(f"unknown accelerator {name!r}; expected one of {', '.join(sorted(known))}")
        return v

    @field_validator("python")
    @classmethod
    def _abs_python(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path (hooks and jobs have no PATH)")
        return v

    @field_validator("mem_per_gpu")
    @classmethod
    def _mem(cls, v: str | None) -> str | None:
        if v is not None:
            from slurm_bt.compat import memory_to_mib

            memory_to_mib(v)
        return v


def load_site_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> SiteSettings:
    """Read and validate the site configuration.

    Args:
        path: explicit file; otherwise ``$SLURM_BT_SITE_CONFIG``, then ``/etc/slurm-bt/site.toml``.
        environ: environment to consult (defaults to ``os.environ``); passed explicitly for tests.

    Raises:
        SiteConfigError: the file was named but is missing, is unreadable, is not TOML, or has an
            invalid or unknown key. Every problem is reported, one line each.
    """
    source, data = read_site_table(path, environ)
    if data is None:
        return SiteSettings()
    try:
        return SiteSettings.model_validate(data)
    except ValidationError as exc:
        problems = [
            Problem(".".join(str(p) for p in err["loc"]), _site_message(err)) for err in exc.errors()
        ]
        raise SiteConfigError(source, problems) from exc


def _site_message(err: Mapping[str, object]) -> str:
    if err.get("type") == "extra_forbidden":
        return "unknown setting"
    msg = str(err.get("msg", "invalid"))
    return msg.removeprefix("Value error, ")
