"""The frozen, validated description of one submission: what the renderer and the nodes work from.

Why a separate model: the truss-compatible classes must stay mutable and lax where upstream is (configs
assign fields after construction), while everything downstream of the login node wants one immutable
value with site decisions already made (GRES type, partition, CPUs, memory in MiB, paths). The spec is
written as ``job.json`` into the job's directory and read back on every node *as the job user*, so it
holds secret *names* only, never values.

:func:`build_job_spec` is pure: no I/O, no clock, no environment. Everything it needs comes in through
:class:`SubmitContext`. :func:`read_job_spec` is the one reader of a ``job.json`` on the nodes and
after the job (the file is the user's: it is read as a file the job controls, bounded).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from slurm_bt.errors import ConfigError, Problem
from slurm_bt.posix.user_files import read_user_file
from slurm_bt.site.settings import RestartSettings, SiteSettings
from slurm_bt.slurm.node_shapes import GpuShare, NodeSizes, gpu_share

if TYPE_CHECKING:  # the compat models are only needed for typing here
    from slurm_bt.compat.definitions import TrainingProject

__all__ = [
    "JOB_SPEC_MAX_BYTES",
    "SPEC_VERSION",
    "CacheSpec",
    "CheckpointSpec",
    "DockerAuthSpec",
    "ImagePin",
    "InteractiveSpec",
    "JobSpec",
    "LoadCheckpointSpec",
    "SubmitContext",
    "WeightsSpec",
    "build_job_spec",
    "read_job_spec",
    "slugify",
    "wants_node_sizes",
]

SPEC_VERSION = 1
JOB_SPEC_MAX_BYTES = 64 * 1024 * 1024
"""The largest ``job.json`` any reader accepts: the hooks' ``job_json_max_bytes`` cannot exceed it."""
_CONTAINER_UNSAFE = re.compile(r"[,:\s]")
# Names bash refuses to assign (export would abort the job under `set -e`).
_BASH_READONLY = frozenset({"BASHOPTS", "BASH_VERSINFO", "EUID", "PPID", "SHELLOPTS", "UID"})
# Linux's limit on one "NAME=value" string (MAX_ARG_STRLEN): longer and every exec in the job fails.
_MAX_ENV_STRING = 131072


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SubmitContext(_Frozen):
    """Facts about this submission that the config does not hold.

    Attributes:
        config_path: absolute path of the config file (for messages and the record).
        source: the config path as the user typed it (prefix of every error line).
        submit_id: unique id of this submission, chosen before sbatch returns a job id.
        user, uid, home: the submitting user (who the job will run as).
        job_dir: absolute path of this submission's directory in the user's workspace.
        python: absolute interpreter that runs slurm-bt on the nodes.
        version: slurm-bt version, recorded in the script header.
    """

    config_path: str
    source: str
    submit_id: str
    user: str
    uid: int
    home: str
    job_dir: str
    python: str
    version: str


class WeightsSpec(_Frozen):
    """One declared weights source (delivered by the weights subsystem; recorded here)."""

    source: str
    mount_location: str
    allow_patterns: tuple[str, ...] | None = None
    ignore_patterns: tuple[str, ...] | None = None
    auth_secret_name: str | None = None


class DockerAuthSpec(_Frozen):
    """Registry credentials by reference: the secret names, resolved on the node at run time."""

    auth_method: Literal["REGISTRY_SECRET", "GCP_SERVICE_ACCOUNT_JSON", "AWS_IAM"]
    registry: str
    secrets: tuple[tuple[str, str], ...]  # (role, secret name), e.g. ("secret_ref", "ghcr-token")


class ImagePin(_Frozen):
    """The job's image pinned at submit to one platform manifest digest (docs/containers.md).

    Attributes:
        reference: the image as written in the config (``job.image.base_image``), e.g. "python:3.11-slim".
        resolved: ``registry/repo@sha256:<hex>`` after the site's registry mirror mapping: what is pulled.
        digest: ``sha256:<hex>`` of the platform manifest's bytes (the job runs this even if the tag moves).
        private: pulled with the image's DockerAuth credentials (the cache entry's audience is the team).
    """

    reference: str
    resolved: str
    digest: str
    private: bool = False


class CheckpointSpec(_Frozen):
    """CheckpointingConfig, as the nodes need it."""

    enabled: bool = False
    checkpoint_path: str | None = None
    volume_size_gib: int | None = None
    keep_last: int = 0
    """Retention: keep the newest N complete checkpoints in the store (0: all); site default or
    BT_CHECKPOINT_KEEP_LAST."""
    max_bytes: int = 0
    """Retention: size budget of the job's checkpoints in the store (0: none); site default or
    BT_CHECKPOINT_MAX_BYTES."""


class LoadCheckpointSpec(_Frozen):
    """LoadCheckpointConfig: references are kept as upstream dumps them, resolved by later stages."""

    enabled: bool = False
    download_folder: str = "/tmp/loaded_checkpoints"
    checkpoints: tuple[dict[str, Any], ...] = ()
    resume: bool = False
    """On a restart of a requeued job (SLURM_RESTART_COUNT > 0), place the job's own newest complete
    checkpoint in BT_LOAD_CHECKPOINT_DIR instead (slurm_bt/checkpoints/resume.py): checkpointing is on
    and the config either has no LoadCheckpointConfig or only upstream's default "latest" reference."""


class CacheSpec(_Frozen):
    """CacheConfig (read-write project and team caches)."""

    enabled: bool = False
    enable_legacy_hf_mount: bool = False
    require_cache_affinity: bool = True
    mount_base_path: str = "/root/.cache"


class InteractiveSpec(_Frozen):
    """InteractiveSession: when a shell may be opened in the running job (``slurm-bt ssh``).

    ``trigger`` is upstream's: ``on_startup`` prints the attach command in the job's log as soon as
    the start commands begin, ``on_failure`` keeps the allocation ``timeout_minutes`` after they
    fail, ``on_demand`` just allows attaching. For the other two, ``timeout_minutes`` bounds each
    attached shell (its step's time limit). See docs/cli.md §Interactive sessions.
    """

    trigger: Literal["on_startup", "on_failure", "on_demand"] = "on_demand"
    timeout_minutes: int = 480
    #: pyxis with ``container_scope=job`` (site ``pyxis_container_scope_job``): step 2 is a named
    #: container the session enters; otherwise a session starts a new container of the same image.
    enter_container: bool = False


class JobSpec(_Frozen):
    """Everything about one submission that the batch script and the node-side code need."""

    spec_version: int = SPEC_VERSION
    context: SubmitContext
    project_name: str
    project_id: str
    team_name: str | None
    job_name: str
    slurm_job_name: str
    image: str
    docker_auth: DockerAuthSpec | None
    # Set by bt-sbatch after pinning (slurm_bt/images/pin.py); None when the site runtime is "none".
    image_pin: ImagePin | None = None
    container_runtime: Literal["charliecloud", "pyxis", "apptainer", "none"]
    nodes: int
    gpus_per_node: int
    accelerator: str | None
    gres_type: str | None
    partition: str
    cpus_per_task: int
    mem_mib: int
    requeue: bool
    availability_model: str
    priority: int | None
    start_commands: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    secret_env: tuple[tuple[str, str], ...]
    weights: tuple[WeightsSpec, ...]
    checkpointing: CheckpointSpec
    load_checkpoint: LoadCheckpointSpec
    cache: CacheSpec
    enable_baseten_workdir: bool
    master_port_base: int
    storage: dict[str, str]
    warnings: tuple[str, ...] = ()
    # Where --cpus-per-task and --mem came from, one line each (comments in the batch script).
    resource_notes: tuple[str, ...] = ()
    interactive: InteractiveSpec | None = None
    # Stop before the end and requeue by cause (docs/long-runs.md): the site's [restarts], per-job overrides.
    restarts: RestartSettings = RestartSettings()

    @property
    def src_dir(self) -> str:
        """The config-folder snapshot the start commands run from."""
        return f"{self.context.job_dir}/src"

    @property
    def log_dir(self) -> str:
        """Where Slurm writes the batch and per-node output."""
        return f"{self.context.job_dir}/logs"

    @property
    def spec_path(self) -> str:
        """Where this spec is stored as JSON."""
        return f"{self.context.job_dir}/job.json"

    def secret_names(self) -> list[str]:
        """Every secret this job will read at run time, sorted, without duplicates."""
        names = {name for _, name in self.secret_env}
        names.update(w.auth_secret_name for w in self.weights if w.auth_secret_name)
        if self.docker_auth:
            names.update(name for _, name in self.docker_auth.secrets)
        return sorted(names)


def read_job_spec(path: str | os.PathLike[str]) -> JobSpec:
    """A job's ``job.json``, read as a file the job controls (:mod:`slurm_bt.posix.user_files`: no FIFO,
    device, user symlink or file over :data:`JOB_SPEC_MAX_BYTES` is ever read).

    Why here, below the features: every reader on the compute side (step 1, the staging job, the
    checkpoint agent, the restart helper, the epilog's flush) must refuse the same swapped files the
    same way, and the weights staging job may not import the checkpoints feature.

    Raises:
        OSError: it cannot be read or is refused (:class:`~slurm_bt.posix.user_files.UnsafeFile`).
        ValueError: it is not a valid job spec.
    """
    return JobSpec.model_validate_json(read_user_file(path, JOB_SPEC_MAX_BYTES))


def slugify(name: str, *, default: str, max_len: int = 63) -> str:
    """A Slurm- and path-safe id of a user-chosen name (``[A-Za-z0-9._-]``, no leading dot or dash).

    A name that already is such an id (at most ``max_len`` long, and without ``..``) is its own id,
    so every store, cache and record keyed by one keeps it. Any other name gets its safe form, then
    ``..`` and the first 8 hex digits of the sha256 of the exact name: ``../rt3`` -> ``rt3..9e4a276f``,
    ``rt3-Ω名`` -> ``rt3..bd0b6227``.

    Why: the safe form alone maps different names to one id (both of those were ``rt3``), and with it
    one checkpoint directory, cache and ``--project`` selection (issue 31, item 4). Why not refuse
    such names: upstream takes any project name (``"My finetune"``) and configs load unchanged.
    Why ``..``: the hashed ids must never equal a name kept as its own id, or a project could be
    named after another's hashed id on purpose; no kept id contains ``..`` (a safe name that does is
    hashed too), so two different names share an id only if their sha256 prefixes collide.
    docs/compatibility.md ("Project ids") says what this changed for existing names.

    ``default`` is the id of an empty name (``None`` account, no job name), and the stem of a name
    with nothing safe in it (``///``); with an empty ``default`` such a name comes back ``""`` for the
    caller to refuse.
    """
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    slug = slug[:max_len].rstrip("-.")
    if not name or (slug == name and ".." not in name):
        return slug or default
    base = slug or default
    if not base:
        return ""
    tag = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{base[: max(1, max_len - len(tag) - 2)].rstrip('-.') or default}..{tag}"


def _docker_auth(project: TrainingProject, problems: list[Problem]) -> DockerAuthSpec | None:
    auth = project.job.image.docker_auth
    if auth is None:
        return None
    method = auth.auth_method.value if hasattr(auth.auth_method, "value") else str(auth.auth_method)
    loc = "job.image.docker_auth"
    secrets: list[tuple[str, str]] = []
    if method == "REGISTRY_SECRET" and auth.registry_secret_docker_auth is not None:
        secrets.append(("secret_ref", auth.registry_secret_docker_auth.secret_ref.name))
    elif method == "GCP_SERVICE_ACCOUNT_JSON" and auth.gcp_service_account_json_docker_auth is not None:
        ref = auth.gcp_service_account_json_docker_auth.service_account_json_secret_ref
        secrets.append(("service_account_json_secret_ref", ref.name))
    elif method == "AWS_IAM" and auth.aws_iam_docker_auth is not None:
        sub = auth.aws_iam_docker_auth
        secrets.append(("access_key_secret_ref", sub.access_key_secret_ref.name))
        secrets.append(("secret_access_key_secret_ref", sub.secret_access_key_secret_ref.name))
    elif method in {"AWS_OIDC", "GCP_OIDC"}:
        problems.append(Problem(f"{loc}.auth_method", f"{method} is not available on Slurm clusters; "
                                "use REGISTRY_SECRET, GCP_SERVICE_ACCOUNT_JSON or AWS_IAM"))
        return None
    else:
        problems.append(Problem(loc, f"auth_method {method} needs its matching credentials block"))
        return None
    if not auth.registry or _CONTAINER_UNSAFE.search(auth.registry.replace(":", "")):
        problems.append(Problem(f"{loc}.registry", f"not a registry host: {auth.registry!r}"))
    return DockerAuthSpec(auth_method=method, registry=auth.registry, secrets=tuple(secrets))


def _truss_default(compute: Any, name: str) -> Any:
    return type(compute).model_fields[name].default


def _requested_gpus(project: TrainingProject) -> int:
    spec = project.job.compute.accelerator
    return spec.count if spec is not None and spec.accelerator is not None and spec.count > 0 else 0


def wants_node_sizes(project: TrainingProject, site: SiteSettings) -> bool:
    """Whether :func:`build_job_spec` would size this job from the nodes (so the caller asks Slurm).

    True for a GPU job that leaves ``cpu_count`` or ``memory`` at truss's default (written out or
    not) while the site file does not give the per-GPU amount.
    """
    from slurm_bt.compat import memory_to_mib

    compute = project.job.compute
    if not _requested_gpus(project):
        return False
    cpus_open = compute.cpu_count == _truss_default(compute, "cpu_count") and not site.cpus_per_gpu
    try:
        mem_open = memory_to_mib(compute.memory) == memory_to_mib(_truss_default(compute, "memory"))
    except ValueError:
        mem_open = False
    return cpus_open or (mem_open and site.mem_per_gpu is None)


def _size_resources(compute: Any, gpus: int, gres_type: str | None, partition: str, site: SiteSettings,
                    nodes: NodeSizes | None, warnings: list[str]) -> tuple[int, int, list[str]]:
    """``--cpus-per-task`` and ``--mem`` (MiB) for one node of the job, and where each came from.

    Why: on Baseten the node shape follows the GPUs, so configs written for it name 8 GPUs and leave
    ``cpu_count=1``/``memory="2Gi"`` at truss's defaults (some spell them out). A GPU job whose value
    equals the default gets the GPUs' share instead: the site file's ``cpus_per_gpu``/``mem_per_gpu``
    when set, else the share of the partition's nodes (:func:`slurm_bt.slurm.node_shapes.gpu_share`).
    Any other value is the user's own choice (more, or less to pack small jobs) and is used as
    written. CPU-only jobs get what they wrote.
    """
    from slurm_bt.compat import memory_to_mib

    cpus: int = compute.cpu_count
    mem_mib = memory_to_mib(compute.memory)
    cpu_default: int = _truss_default(compute, "cpu_count")
    mem_default = memory_to_mib(_truss_default(compute, "memory"))
    # By value, not model_fields_set: the loader rebuilds the models, which marks every field as set.
    cpu_src = f"job.compute.cpu_count={cpus}" + (" (truss's default)" if cpus == cpu_default else "")
    mem_src = f"job.compute.memory={compute.memory!r}" + (" (truss's default)" if mem_mib == mem_default else "")
    if not gpus:
        return cpus, mem_mib, [f"--cpus-per-task={cpus} is {cpu_src}", f"--mem={mem_mib}M is {mem_src}"]

    share: GpuShare | str | None = None
    cpu_open = cpus == cpu_default
    mem_open = mem_mib == mem_default
    if (cpu_open and not site.cpus_per_gpu) or (mem_open and site.mem_per_gpu is None):
        if nodes is None:
            share = "the node sizes were not read from Slurm"
        elif nodes.error is not None:
            share = f"could not read the node sizes from Slurm ({nodes.error})"
        else:
            share = gpu_share(nodes.shapes, partition=partition, gres_type=gres_type, gpus=gpus)
    gpu_words = f"{gpus} GPU{'s' if gpus != 1 else ''}"
    unsized: list[str] = []
    reasons: list[str] = []

    if not cpu_open:
        cpu_note = f"{cpu_src}, used as written (not truss's default of {cpu_default})"
    elif site.cpus_per_gpu:
        cpus = gpus * site.cpus_per_gpu
        cpu_note = f"{gpu_words} x site cpus_per_gpu={site.cpus_per_gpu}"
    elif isinstance(share, GpuShare):
        cpus = share.cpus
        cpu_note = f"the GPUs' share, {share.cpus_basis}"
    else:
        cpu_note = f"{cpu_src}; no GPU share: {share}"
        unsized.append(f"cpu_count={cpus}")
        reasons.append(str(share))

    if not mem_open:
        mem_note = f"{mem_src}, used as written (not truss's default of {mem_default}M)"
    elif site.mem_per_gpu is not None:
        mem_mib = gpus * memory_to_mib(site.mem_per_gpu)
        mem_note = f"{gpu_words} x site mem_per_gpu={site.mem_per_gpu!r}"
    elif isinstance(share, GpuShare) and share.mem_mib is not None:
        mem_mib = share.mem_mib
        mem_note = f"the GPUs' share, {share.mem_basis}"
    else:
        why = share.mem_basis if isinstance(share, GpuShare) else str(share)
        mem_note = f"{mem_src}; no GPU share: {why}"
        unsized.append(f"memory={compute.memory!r}")
        if why not in reasons:
            reasons.append(why)
    if unsized:
        # Not an error: sbatch may still place the job (another partition on the command line...),
        # but the user must know the job is not sized like on Baseten.
        warnings.append(f"job.compute: {gpu_words} with {' and '.join(unsized)} as written, not sized to "
                        f"the GPUs: {'; '.join(reasons)}. Set cpu_count/memory in the config, or ask the "
                        "admin for cpus_per_gpu/mem_per_gpu in the site file")
    return cpus, mem_mib, [f"--cpus-per-task={cpus} is {cpu_note}", f"--mem={mem_mib}M is {mem_note}"]


def _container_path(value: str, loc: str, runtime: str, problems: list[Problem]) -> None:
    """Paths that become container bind mounts must be expressible in pyxis/apptainer syntax."""
    if runtime != "none" and _CONTAINER_UNSAFE.search(value):
        problems.append(Problem(loc, f"{value!r} contains ',', ':' or whitespace, which container bind "
                                "mounts cannot express (slurm-bt is stricter than truss here)"))


def _retention(env: dict[str, str], site: SiteSettings, problems: list[Problem]) -> dict[str, int]:
    """Checkpoint retention (docs/checkpoints.md §Retention): the site's default, overridden per job."""
    out = {"keep_last": site.checkpoints.keep_last, "max_bytes": site.checkpoints.max_bytes}
    for name, key in (("BT_CHECKPOINT_KEEP_LAST", "keep_last"), ("BT_CHECKPOINT_MAX_BYTES", "max_bytes")):
        if name in env:
            value = env[name].strip()
            if not value.isdigit():
                problems.append(Problem(f"job.runtime.environment_variables.{name}",
                                        f"must be a whole number >= 0 (0: no limit), not {env[name]!r}"))
                continue
            out[key] = int(value)
    return out


# Per-job overrides of the site's [restarts] (docs/long-runs.md), as environment variables in the config.
_RESTART_ENV = {"BT_MAX_RESTARTS": "max_restarts", "BT_RETRY_ON_FAILURE": "retry_on_failure",
                "BT_STOP_SIGNAL": "stop_signal", "BT_STOP_GRACE_S": "stop_grace_s"}


def _restarts(env: dict[str, str], site: SiteSettings, problems: list[Problem]) -> RestartSettings:
    """The job's restart policy: the site's ``[restarts]`` with the config's ``BT_*`` overrides."""
    from pydantic import ValidationError

    defaults = site.restarts.job_defaults()
    values: dict[str, object] = defaults.model_dump()
    for name, key in _RESTART_ENV.items():
        if name in env:
            raw = env[name].strip()
            values[key] = raw.upper().removeprefix("SIG") if key == "stop_signal" else raw
    by_key = {v: k for k, v in _RESTART_ENV.items()}
    try:
        policy = RestartSettings.model_validate(values)
    except ValidationError as exc:
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            problems.append(Problem(f"job.runtime.environment_variables.{by_key.get(key, key)}",
                                    str(err["msg"]).removeprefix("Value error, ")))
        return defaults
    # Every run holds the job's nodes again: the site bounds what a config may ask for.
    ceiling = site.restarts.ceiling
    for key in ("max_restarts", "retry_on_failure"):
        value = getattr(policy, key)
        if by_key[key] in env and value > ceiling:
            problems.append(Problem(f"job.runtime.environment_variables.{by_key[key]}",
                                    f"{value} is above this site's ceiling of {ceiling} "
                                    "([restarts] ceiling in the site file)"))
    return policy


def build_job_spec(project: TrainingProject, site: SiteSettings, ctx: SubmitContext, *,
                   nodes: NodeSizes | None = None) -> JobSpec:
    """Translate a validated TrainingProject into a JobSpec using the site's decisions.

    ``nodes`` is what the submission read from Slurm about the nodes (see :func:`wants_node_sizes`):
    without it a GPU job left at truss's CPU/memory defaults is sized by the site file alone.

    Raises:
        ConfigError: the config is valid for truss but cannot run on this site (an accelerator the
            site does not map, an unsupported registry auth method, ...). Every problem at once.
    """
    problems: list[Problem] = []
    warnings: list[str] = []
    job = project.job
    compute = job.compute
    runtime = job.runtime

    accel_value: str | None = None
    gpus = 0
    spec = compute.accelerator
    if spec is not None and spec.accelerator is not None and spec.count > 0:
        accel_value = spec.accelerator.value
        gpus = spec.count
    gres_type: str | None = None
    partition = site.default_partition
    if accel_value is not None:
        mapping = site.accelerators.get(accel_value)
        if mapping is None:
            offered = ", ".join(sorted(site.accelerators)) or "none"
            problems.append(Problem("job.compute.accelerator.accelerator",
                                    f"{accel_value} is not offered by this cluster (offered: {offered})"))
        else:
            gres_type = mapping.gres_type
            partition = mapping.partition or site.default_partition

    share_partition = nodes.partition if nodes is not None and nodes.partition else partition
    cpus, mem_mib, resource_notes = _size_resources(compute, gpus, gres_type, share_partition, site, nodes,
                                                    warnings)

    env: list[tuple[str, str]] = []
    secret_env: list[tuple[str, str]] = []
    for key, value in runtime.environment_variables.items():
        loc = f"job.runtime.environment_variables.{key}"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            problems.append(Problem(loc, "not a valid environment variable name"))
            continue
        if key in _BASH_READONLY or key.startswith("bt_"):
            why = "read-only in bash" if key in _BASH_READONLY else "names starting with bt_ are reserved by slurm-bt"
            problems.append(Problem(loc, f"cannot be set: {why}"))
            continue
        if isinstance(value, str) and len(key) + 1 + len(value.encode()) >= _MAX_ENV_STRING:
            problems.append(Problem(loc, f"value is too long for an environment variable "
                                         f"({len(value.encode())} bytes; Linux allows {_MAX_ENV_STRING - 1} "
                                         "per NAME=value): put it in a file in the config folder"))
            continue
        if isinstance(value, str):
            env.append((key, value))
        else:
            secret_env.append((key, value.name))

    rt = site.container_runtime
    weights = []
    for i, w in enumerate(job.weights):
        _container_path(w.mount_location, f"job.weights[{i}].mount_location", rt, problems)
        secret = w.auth_secret_name or (w.auth.auth_secret_name if w.auth is not None else None)
        weights.append(WeightsSpec(
            source=w.source, mount_location=w.mount_location,
            allow_patterns=tuple(w.allow_patterns) if w.allow_patterns is not None else None,
            ignore_patterns=tuple(w.ignore_patterns) if w.ignore_patterns is not None else None,
            auth_secret_name=secret or None,
        ))

    ckpt = runtime.checkpointing_config
    if ckpt.checkpoint_path:
        _container_path(ckpt.checkpoint_path, "job.runtime.checkpointing_config.checkpoint_path", rt, problems)
    load = runtime.load_checkpoint_config
    load_spec = LoadCheckpointSpec(resume=ckpt.enabled)
    if load is not None:
        refs = tuple(c.model_dump(mode="json") for c in load.checkpoints)
        # Explicit references or an explicit enabled=False ask for something else than resuming.
        default_latest = all(r.get("typ") == "baseten_latest_checkpoint" and not r.get("job_id")
                             and not r.get("project_name") for r in refs)
        load_spec = LoadCheckpointSpec(
            enabled=load.enabled, download_folder=load.download_folder, checkpoints=refs,
            resume=ckpt.enabled and load.enabled and default_latest,
        )
        if load.enabled:
            _container_path(load.download_folder, "job.runtime.load_checkpoint_config.download_folder",
                            rt, problems)
    cache = runtime.cache_config
    cache_spec = CacheSpec()
    if cache is not None:
        cache_spec = CacheSpec(enabled=cache.enabled, enable_legacy_hf_mount=cache.enable_legacy_hf_mount,
                               require_cache_affinity=cache.require_cache_affinity,
                               mount_base_path=cache.mount_base_path)
        if cache.enabled:
            _container_path(cache.mount_base_path, "job.runtime.cache_config.mount_base_path", rt, problems)

    docker_auth = _docker_auth(project, problems)
    from slurm_bt.compat.ignored_fields import ignored_field_warnings

    # Accepted-but-ignored fields: one warning each, never a silent drop (docs/compatibility.md).
    warnings += ignored_field_warnings(project, container_runtime=rt)
    if rt == "none":
        docker_auth = None  # no image is pulled, so its registry secrets are not needed (warned above)
    interactive: InteractiveSpec | None = None
    if job.interactive_session is not None:
        session = job.interactive_session
        trigger = getattr(session.trigger, "value", str(session.trigger))
        if session.timeout_minutes < 1:
            problems.append(Problem("job.interactive_session.timeout_minutes",
                                    f"must be at least 1 minute (got {session.timeout_minutes})"))
        else:
            interactive = InteractiveSpec(trigger=trigger, timeout_minutes=session.timeout_minutes,
                                          enter_container=site.container_runtime == "pyxis"
                                          and site.pyxis_container_scope_job)
        provider = getattr(session.session_provider, "value", str(session.session_provider))
        if provider != "ssh":  # upstream's default is vs_code: say once what the user gets instead
            warnings.append(f"interactive_session.session_provider={provider} (and auth_provider) are ignored: "
                            "no VS Code/Cursor tunnel on Slurm; the session is a shell in the job: "
                            "`slurm-bt ssh <job id> [--node RANK]`")
    if job.priority is not None:
        warnings.append("priority is recorded but not mapped to Slurm; pass `-- --qos=...` or "
                        "`-- --nice=...` to bt-sbatch instead")
    availability = getattr(compute.availability_model, "value", str(compute.availability_model))
    retention = _retention(dict(env), site, problems)
    restarts = _restarts(dict(env), site, problems)
    if problems:
        raise ConfigError(ctx.source, problems)

    project_id = slugify(project.name, default="project")
    job_name = job.name or ""
    slurm_name = project_id if not job_name else f"{project_id}.{slugify(job_name, default='job')}"
    return JobSpec(
        context=ctx,
        project_name=project.name,
        project_id=project_id,
        team_name=project.team_name,
        job_name=job_name,
        slurm_job_name=slurm_name[:120],
        image=job.image.base_image,
        docker_auth=docker_auth,
        container_runtime=rt,
        nodes=compute.node_count,
        gpus_per_node=gpus,
        accelerator=accel_value,
        gres_type=gres_type,
        partition=partition,
        cpus_per_task=cpus,
        mem_mib=mem_mib,
        # Spot capacity is preemptible: requeueing is what a spot user expects after preemption.
        # Requeueable whenever a restart may follow (docs/long-runs.md): Slurm requeues preempted and
        # node-failed jobs only with --requeue, and `scontrol requeue` refuses a --no-requeue job.
        requeue=(site.requeue or availability == "spot" or restarts.max_restarts > 0
                 or restarts.retry_on_failure > 0),
        availability_model=availability,
        priority=job.priority,
        start_commands=tuple(runtime.start_commands),
        env=tuple(env),
        secret_env=tuple(secret_env),
        weights=tuple(weights),
        checkpointing=CheckpointSpec(enabled=ckpt.enabled, checkpoint_path=ckpt.checkpoint_path,
                                     volume_size_gib=ckpt.volume_size_gib,
                                     **retention),
        load_checkpoint=load_spec,
        cache=cache_spec,
        enable_baseten_workdir=job.enable_baseten_workdir,
        master_port_base=site.master_port_base,
        storage=site.storage.model_dump(),
        warnings=tuple(warnings),
        resource_notes=tuple(resource_notes),
        interactive=interactive,
        restarts=restarts,
    )
