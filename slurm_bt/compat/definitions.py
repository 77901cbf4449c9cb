"""Every class of ``truss_train.definitions`` (truss 0.18.25), reproduced field for field.

Configs import this module as ``truss_train.definitions`` (through the import shim), so names,
fields, defaults, strictness, validators and messages follow upstream exactly; a config accepted
here must be accepted by Baseten too. Where slurm-bt is stricter (``node_count >= 1``, memory
syntax, safe mount paths) the check lives in the loader, not here, so that constructing these
objects in plain Python behaves like upstream.

The ``to_truss_config()`` converters return the serving-config objects of
:mod:`slurm_bt.compat.truss_config` exactly as upstream builds them (configs and scripts call them to
inspect or hand on resources); nothing in slurm-bt deploys them.
"""

from __future__ import annotations

import enum
from abc import ABC
from typing import Any, Literal

import pydantic
from pydantic import ValidationError, model_validator

from slurm_bt.compat import _base as custom_types
from slurm_bt.compat import truss_config
from slurm_bt.compat import truss_constants as constants
from slurm_bt.compat._base import ConfigModel, SafeModelNoExtra

__all__ = [
    "DEFAULT_INTERACTIVE_SESSION_TIMEOUT_MINUTES",
    "DEFAULT_LORA_RANK",
    "AWSIAMDockerAuth",
    "AvailabilityModel",
    "BasetenCheckpoint",
    "CacheConfig",
    "Checkpoint",
    "CheckpointList",
    "CheckpointingConfig",
    "Compute",
    "DeployCheckpointsConfig",
    "DeployCheckpointsRuntime",
    "DockerAuth",
    "FullCheckpoint",
    "GCPServiceAccountJSONDockerAuth",
    "Image",
    "InteractiveSession",
    "InteractiveSessionAuthProvider",
    "InteractiveSessionProvider",
    "InteractiveSessionTrigger",
    "LoRACheckpoint",
    "LoRADetails",
    "LoadCheckpointConfig",
    "LoopsCheckpoint",
    "ModelWeightsFormat",
    "RegistrySecretDockerAuth",
    "Runtime",
    "SecretReference",
    "TrainingJob",
    "TrainingProject",
    "WhisperCheckpoint",
    "Workspace",
    "constants",
    "custom_types",
    "truss_config",
]

DEFAULT_LORA_RANK = 16
DEFAULT_INTERACTIVE_SESSION_TIMEOUT_MINUTES = 8 * 60
# Where *loaded* checkpoints land. Not the same as truss_config.DEFAULT_TRAINING_CHECKPOINT_FOLDER
# (deploy), exactly as upstream.
_DEFAULT_LOAD_CHECKPOINT_FOLDER = constants.DEFAULT_TRAINING_CHECKPOINT_FOLDER


class ModelWeightsFormat(str, enum.Enum):
    """Weight formats that ``truss train deploy_checkpoints`` understands."""

    LORA = "lora"
    FULL = "full"
    WHISPER = "whisper"

    def to_truss_config(self) -> ModelWeightsFormat:
        """Upstream maps to the serving enum of the same name; here that is this enum."""
        return ModelWeightsFormat[self.name]


class SecretReference(SafeModelNoExtra):
    """A secret by name; the value never appears in the config or in any slurm-bt output."""

    name: str


class AvailabilityModel(str, enum.Enum):
    """Capacity class: ``DEDICATED`` (on-demand, default) or ``SPOT`` (preemptible)."""

    DEDICATED = "dedicated"
    SPOT = "spot"


class Compute(SafeModelNoExtra):
    """Per-node resources and node count.

    Upstream does not range-check ``node_count`` or parse ``memory`` here; the loader adds those
    checks for slurm-bt (see ``stricter.py``).
    """

    node_count: int = 1
    cpu_count: int = 1
    memory: str = "2Gi"
    accelerator: truss_config.AcceleratorSpec | None = None
    availability_model: AvailabilityModel = AvailabilityModel.DEDICATED

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Dump with the accelerator as ``{"accelerator", "count"}``, the shape the API expects."""
        data: dict[str, Any] = super().model_dump(*args, **kwargs)
        if self.accelerator and self.accelerator.accelerator:
            data["accelerator"] = {
                "accelerator": self.accelerator.accelerator.value,
                "count": self.accelerator.count,
            }
        data["availability_model"] = self.availability_model.value
        return data

    def to_truss_config(self) -> truss_config.Resources:
        """The serving ``Resources`` of these values (``cpu`` as a string, as upstream)."""
        if self.accelerator:
            return truss_config.Resources(
                cpu=str(self.cpu_count),
                memory=self.memory,
                accelerator=self.accelerator,
                node_count=self.node_count,
            )
        return truss_config.Resources(cpu=str(self.cpu_count), memory=self.memory, node_count=self.node_count)


class _CheckpointBase(SafeModelNoExtra):
    typ: str


class _BasetenLatestCheckpoint(_CheckpointBase):
    job_id: str | None = None
    project_name: str | None = None
    typ: Literal["baseten_latest_checkpoint"] = "baseten_latest_checkpoint"


class _BasetenNamedCheckpoint(_CheckpointBase):
    checkpoint_name: str
    job_id: str
    typ: Literal["baseten_named_checkpoint"] = "baseten_named_checkpoint"


class _LoopsCheckpoint(_CheckpointBase):
    run_id: str
    checkpoint_name: str
    target: Literal["trainer", "sampler"] = "trainer"
    typ: Literal["loops_checkpoint"] = "loops_checkpoint"


class BasetenCheckpoint:
    """Factories for references to checkpoints of earlier Baseten jobs."""

    @staticmethod
    def from_latest_checkpoint(
        project_name: str | None = None, job_id: str | None = None
    ) -> _BasetenLatestCheckpoint:
        """The newest checkpoint of a job, or of the project's newest job.

        With both arguments falsy upstream tries to raise a ``ValidationError`` that pydantic
        cannot build, so callers get ``TypeError: No constructor defined``; kept identical (the
        loader adds a hint when it reports it).
        """
        if not job_id and not project_name:
            raise ValidationError("job_id or project_name is required")
        return _BasetenLatestCheckpoint(project_name=project_name, job_id=job_id)

    @classmethod
    def from_named_checkpoint(cls, checkpoint_name: str, job_id: str) -> _BasetenNamedCheckpoint:
        """A checkpoint by name within one job."""
        return _BasetenNamedCheckpoint(checkpoint_name=checkpoint_name, job_id=job_id)


class LoopsCheckpoint:
    """Factory for references to checkpoints of Loops runs."""

    @staticmethod
    def from_checkpoint(
        run_id: str,
        checkpoint_name: str,
        target: Literal["trainer", "sampler"] = "trainer",
    ) -> _LoopsCheckpoint:
        """``target`` selects 'trainer' (full training state, default) or 'sampler' (weights)."""
        return _LoopsCheckpoint(run_id=run_id, checkpoint_name=checkpoint_name, target=target)


class LoadCheckpointConfig(SafeModelNoExtra):
    """Checkpoints to download into ``download_folder`` before the job starts.

    ``checkpoints`` is a smart union: a dict without ``typ`` is matched by its shape.
    """

    enabled: bool = False
    checkpoints: list[_BasetenLatestCheckpoint | _BasetenNamedCheckpoint | _LoopsCheckpoint] = [
        _BasetenLatestCheckpoint()
    ]
    download_folder: str = _DEFAULT_LOAD_CHECKPOINT_FOLDER


class CheckpointingConfig(SafeModelNoExtra):
    """Whether the job gets a checkpoint directory (``$BT_CHECKPOINT_DIR``) that is kept."""

    enabled: bool = False
    checkpoint_path: str | None = None
    volume_size_gib: int | None = None


class CacheConfig(SafeModelNoExtra):
    """The read-write cache shared between jobs of a project and of a team."""

    enabled: bool = False
    enable_legacy_hf_mount: bool = False
    require_cache_affinity: bool = True
    mount_base_path: str = "/root/.cache"


class InteractiveSessionTrigger(str, enum.Enum):
    """When an interactive session is opened."""

    ON_STARTUP = "on_startup"
    ON_FAILURE = "on_failure"
    ON_DEMAND = "on_demand"


class InteractiveSessionProvider(str, enum.Enum):
    """Which client the interactive session is for."""

    VS_CODE = "vs_code"
    CURSOR = "cursor"
    SSH = "ssh"


class InteractiveSessionAuthProvider(str, enum.Enum):
    """Identity provider for the tunnel (ignored for SSH)."""

    GITHUB = "github"
    MICROSOFT = "microsoft"


class InteractiveSession(SafeModelNoExtra):
    """Interactive access to a running job; enum members required (strings are rejected)."""

    trigger: InteractiveSessionTrigger = InteractiveSessionTrigger.ON_DEMAND
    timeout_minutes: int = DEFAULT_INTERACTIVE_SESSION_TIMEOUT_MINUTES
    session_provider: InteractiveSessionProvider = InteractiveSessionProvider.VS_CODE
    auth_provider: InteractiveSessionAuthProvider = InteractiveSessionAuthProvider.MICROSOFT


class Runtime(SafeModelNoExtra):
    """What runs in the container: commands, environment, checkpoint and cache settings."""

    start_commands: list[str] = []
    environment_variables: dict[str, str | SecretReference] = {}
    enable_cache: bool | None = None
    checkpointing_config: CheckpointingConfig = CheckpointingConfig()
    load_checkpoint_config: LoadCheckpointConfig | None = None
    cache_config: CacheConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def validate_cache_config(cls, values: Any) -> Any:
        """Migrate the deprecated ``enable_cache`` into ``cache_config`` and drop it.

        One deliberate difference: a non-bool ``enable_cache`` is left for the field check, so the
        error names ``enable_cache`` instead of upstream's confusing ``enabled``.
        """
        if not isinstance(values, dict):
            return values
        enable_cache = values.get("enable_cache")
        cache_config = values.get("cache_config")
        if enable_cache is not None and cache_config is not None:
            raise ValueError(
                "Cannot set both 'enable_cache' and 'cache_config'. "
                "'enable_cache' is deprecated. Prefer migrating to 'cache_config' with "
                "`enabled=True` and `enable_legacy_hf_mount=True`."
            )
        if enable_cache is not None and not isinstance(enable_cache, bool):
            return values
        if enable_cache is not None and cache_config is None:
            values["cache_config"] = CacheConfig(enabled=enable_cache, enable_legacy_hf_mount=enable_cache)
        values.pop("enable_cache", None)
        return values


class AWSIAMDockerAuth(SafeModelNoExtra):
    """ECR credentials, both held in secrets."""

    access_key_secret_ref: SecretReference
    secret_access_key_secret_ref: SecretReference


class GCPServiceAccountJSONDockerAuth(SafeModelNoExtra):
    """A GCP service-account JSON key held in a secret."""

    service_account_json_secret_ref: SecretReference


class RegistrySecretDockerAuth(SafeModelNoExtra):
    """A secret holding ``username:password`` for a generic registry."""

    secret_ref: SecretReference


class DockerAuth(SafeModelNoExtra):
    """Registry login for a private base image; upstream has no cross-field check."""

    auth_method: truss_config.DockerAuthType
    registry: str
    aws_iam_docker_auth: AWSIAMDockerAuth | None = None
    gcp_service_account_json_docker_auth: GCPServiceAccountJSONDockerAuth | None = None
    registry_secret_docker_auth: RegistrySecretDockerAuth | None = None


class Image(SafeModelNoExtra):
    """The container image the job runs in."""

    base_image: str
    docker_auth: DockerAuth | None = None


class Workspace(SafeModelNoExtra):
    """Which directories are packaged with the job (paths relative to the config's directory)."""

    workspace_root: str | None = None
    external_dirs: list[str] = []
    exclude_dirs: list[str] = []


class TrainingJob(SafeModelNoExtra):
    """One execution: image, compute, runtime, weights and packaging."""

    image: Image
    compute: Compute = Compute()
    runtime: Runtime = Runtime()
    interactive_session: InteractiveSession | None = None
    name: str | None = None
    priority: int | None = None
    workspace: Workspace | None = None
    weights: list[truss_config.WeightsSource] = []
    """Weight sources mounted read-only in the container before the start commands run."""
    enable_baseten_workdir: bool = True

    @model_validator(mode="after")
    def _validate_weights_auth_only_custom_secret(self) -> TrainingJob:
        """Training jobs only support CUSTOM_SECRET weights auth (upstream rule)."""
        for w in self.weights:
            if w.auth is not None and w.auth.auth_method != truss_config.WeightsAuthMethod.CUSTOM_SECRET:
                raise ValueError(
                    f"weight {w.source}: only auth_method CUSTOM_SECRET with auth_secret_name is "
                    "supported for training jobs. OIDC (AWS_OIDC, GCP_OIDC) is not supported."
                )
        return self

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Dump with ``compute`` in the API shape (see :meth:`Compute.model_dump`)."""
        data: dict[str, Any] = super().model_dump(*args, **kwargs)
        data["compute"] = self.compute.model_dump()
        return data


class TrainingProject(SafeModelNoExtra):
    """The object a config.py must define exactly once; ``job`` is excluded from dumps."""

    name: str
    job: TrainingJob = pydantic.Field(exclude=True)
    team_name: str | None = None


class Checkpoint(ConfigModel, ABC):
    """A checkpoint of an earlier job to deploy (lax, extras allowed, instantiable)."""

    training_job_id: str
    checkpoint_name: str
    model_weight_format: ModelWeightsFormat

    def to_truss_config(self) -> truss_config.TrainingArtifactReference:
        """Rank 0's directory of this checkpoint in the job's artifacts (upstream's layout)."""
        return truss_config.TrainingArtifactReference(
            training_job_id=self.training_job_id, paths=[f"rank-0/{self.checkpoint_name}/"]
        )


class LoRADetails(ConfigModel):
    """LoRA adapter settings; any rank is accepted (no allowed-set check since v0.15.1)."""

    rank: int = DEFAULT_LORA_RANK


class FullCheckpoint(Checkpoint):
    """A full fine-tune checkpoint."""

    model_weight_format: ModelWeightsFormat = ModelWeightsFormat.FULL


class WhisperCheckpoint(Checkpoint):
    """A Whisper checkpoint."""

    model_weight_format: ModelWeightsFormat = ModelWeightsFormat.WHISPER


class LoRACheckpoint(Checkpoint):
    """A LoRA adapter checkpoint."""

    lora_details: LoRADetails = LoRADetails()
    model_weight_format: ModelWeightsFormat = ModelWeightsFormat.LORA


class CheckpointList(SafeModelNoExtra):
    """Checkpoints to deploy: job checkpoints or Loops checkpoint ids, never both."""

    download_folder: str = truss_config.DEFAULT_TRAINING_CHECKPOINT_FOLDER
    base_model_id: str | None = None
    checkpoints: list[Checkpoint] = []
    loops_checkpoint_ids: list[str] = []

    @model_validator(mode="after")
    def _no_mixing(self) -> CheckpointList:
        if self.checkpoints and self.loops_checkpoint_ids:
            raise ValueError(
                "Cannot mix training job checkpoints and loops checkpoints in "
                "the same deploy. Use either checkpoints or "
                "loops_checkpoint_ids, not both."
            )
        return self

    def to_truss_config(self) -> truss_config.CheckpointList:
        """The serving ``CheckpointList``: one artifact reference per checkpoint."""
        artifact_references = [checkpoint.to_truss_config() for checkpoint in self.checkpoints]
        return truss_config.CheckpointList(
            download_folder=self.download_folder,
            artifact_references=artifact_references,
            loops_checkpoint_ids=self.loops_checkpoint_ids,
        )


class DeployCheckpointsRuntime(SafeModelNoExtra):
    """Environment for a deployment made from checkpoints."""

    environment_variables: dict[str, str | SecretReference] = {}


class DeployCheckpointsConfig(SafeModelNoExtra):
    """Input of ``truss train deploy_checkpoints --config``; may sit next to a TrainingProject."""

    checkpoint_details: CheckpointList | None = None
    model_name: str | None = None
    runtime: DeployCheckpointsRuntime | None = None
    compute: Compute | None = None
