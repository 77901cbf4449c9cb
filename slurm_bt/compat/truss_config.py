"""The part of ``truss.base.truss_config`` (truss 0.18.25) that training configs use.

Configs write ``from truss.base import truss_config`` and then ``truss_config.AcceleratorSpec``,
``truss_config.Accelerator.H100``, ``truss_config.DockerAuthType.AWS_IAM``, ``truss_config.WeightsSource``
or ``truss_config.Resources`` (what ``Compute.to_truss_config()`` returns); the import shim maps that
module name here. Class names, fields, defaults, strictness and error messages match upstream, because
a config that loads here must also load on Baseten and vice versa. The serving-only parts of upstream's
module (``TrussConfig``, the serving ``Runtime``, ``Build``...) are deliberately absent: reading one
raises ``AttributeError`` naming the reason (:data:`NOT_PROVIDED`).
"""

from __future__ import annotations

import enum
import math
import re
from typing import Annotated, Any, ClassVar

import pydantic
from pydantic_core import core_schema

from slurm_bt.compat import truss_constants as constants
from slurm_bt.compat._base import ConfigModel

__all__ = [
    "AWS_OIDC_REGION_PARAM",
    "AWS_OIDC_ROLE_ARN_PARAM",
    "DEFAULT_AWS_ACCESS_KEY_SECRET_NAME",
    "DEFAULT_AWS_SECRET_ACCESS_KEY_SECRET_NAME",
    "DEFAULT_BUNDLED_PACKAGES_DIR",
    "DEFAULT_CPU",
    "DEFAULT_DATA_DIRECTORY",
    "DEFAULT_MEMORY",
    "DEFAULT_MODEL_MODULE_DIR",
    "DEFAULT_TRAINING_CHECKPOINT_FOLDER",
    "DOCKER_AUTH_SECRET_NAME_PARAM",
    "GCP_OIDC_SERVICE_ACCOUNT_PARAM",
    "GCP_OIDC_WORKLOAD_ID_PROVIDER_PARAM",
    "K8S_RESERVED_ENVIRONMENT_VARIABLES",
    "NOT_PROVIDED",
    "PYPROJECT_TOML_FILENAME",
    "UV_LOCK_FILENAME",
    "WEIGHTS_AUTH_SECRET_NAME_PARAM",
    "Accelerator",
    "AcceleratorSpec",
    "AuthFieldsMixin",
    "CheckpointList",
    "DockerAuthType",
    "FabricRequirement",
    "RequirementsFileType",
    "Resources",
    "TrainingArtifactReference",
    "Weights",
    "WeightsAuth",
    "WeightsAuthMethod",
    "WeightsSource",
    "constants",
    "to_dotted_python_version",
]

K8S_RESERVED_ENVIRONMENT_VARIABLES = {"PORT", "HOSTNAME"}
PYPROJECT_TOML_FILENAME = constants.PYPROJECT_TOML_FILENAME  # upstream imports these two from constants
UV_LOCK_FILENAME = constants.UV_LOCK_FILENAME
DEFAULT_MODEL_MODULE_DIR = "model"
DEFAULT_BUNDLED_PACKAGES_DIR = "packages"
DEFAULT_DATA_DIRECTORY = "data"
DEFAULT_CPU = "1"
DEFAULT_MEMORY = "2Gi"
DEFAULT_AWS_ACCESS_KEY_SECRET_NAME = "aws_access_key_id"  # noqa: S105 - a secret's name
DEFAULT_AWS_SECRET_ACCESS_KEY_SECRET_NAME = "aws_secret_access_key"  # noqa: S105 - a secret's name

# Where deployed checkpoints land (``CheckpointList``); not the same as
# ``constants.DEFAULT_TRAINING_CHECKPOINT_FOLDER`` (loaded checkpoints), exactly as upstream.
DEFAULT_TRAINING_CHECKPOINT_FOLDER = "/tmp/training_checkpoints"

WEIGHTS_AUTH_SECRET_NAME_PARAM = "auth_secret_name"  # noqa: S105 - a field name, not a secret
DOCKER_AUTH_SECRET_NAME_PARAM = "secret_name"  # noqa: S105 - a field name, not a secret
AWS_OIDC_ROLE_ARN_PARAM = "aws_oidc_role_arn"
AWS_OIDC_REGION_PARAM = "aws_oidc_region"
GCP_OIDC_SERVICE_ACCOUNT_PARAM = "gcp_oidc_service_account"
GCP_OIDC_WORKLOAD_ID_PROVIDER_PARAM = "gcp_oidc_workload_id_provider"


def _is_numeric(number_like: str) -> bool:
    try:
        float(number_like)
        return True
    except ValueError:
        return False


class RequirementsFileType(str, enum.Enum):
    """Which kind of requirements file a serving build reads (kept for the enum's values)."""

    NOT_PROVIDED = "not_provided"
    PIP = "pip"
    PYPROJECT = "pyproject"
    UV_LOCK = "uv_lock"


class Accelerator(str, enum.Enum):
    """GPU types; values equal names and are case-sensitive (``"h100"`` is rejected).

    ``_B10`` is private upstream but still a valid value (``"B10"``), so it is kept; error
    messages in slurm-bt leave it out of the "valid values" lists.
    """

    _B10 = "B10"
    T4 = "T4"
    L4 = "L4"
    A10G = "A10G"
    V100 = "V100"
    A100 = "A100"
    A100_40GB = "A100_40GB"
    H100 = "H100"
    H200 = "H200"
    H100_40GB = "H100_40GB"
    B200 = "B200"
    L40S = "L40S"
    RTX_PRO_6000 = "RTX_PRO_6000"
    B300 = "B300"
    GB300 = "GB300"


class AcceleratorSpec(ConfigModel):
    """GPU type and count per node; also accepts ``"H100"``, ``"H100:8"``, a dict or None.

    Lax like upstream: ``count="2"`` is coerced. Serialised as ``"H100:8"`` (or ``"H100"``, or
    None when no type is set or the count is 0).
    """

    model_config = pydantic.ConfigDict(validate_assignment=True)

    accelerator: Accelerator | None = None
    count: int = pydantic.Field(default=1, ge=0)

    @classmethod
    def _from_string_spec(cls, value: str) -> dict[str, Any]:
        parts = value.strip().split(":")
        if not parts[0]:
            raise ValueError("Accelerator type cannot be empty.")
        try:
            accelerator = Accelerator(parts[0])
        except ValueError:
            available = ", ".join(a.value for a in Accelerator)
            raise ValueError(
                f"Unsupported accelerator type: `{parts[0]}`. Available types: {available}."
            ) from None
        count = 1
        # Upstream quirk kept on purpose: three or more parts silently mean count 1.
        if len(parts) == 2:
            if not parts[1].isdigit() or int(parts[1]) <= 0:
                raise ValueError(f"Invalid count: '{parts[1]}'. Must be positive integer.")
            count = int(parts[1])
        return {"accelerator": accelerator, "count": count}

    @pydantic.model_validator(mode="before")
    @classmethod
    def _parse_combined_spec(cls, value: object) -> object:
        if isinstance(value, str):
            return cls._from_string_spec(value)
        if isinstance(value, AcceleratorSpec):
            # Upstream calls ``value.dict()``, which goes through the string serializer; the
            # field values are what it means.
            return {"accelerator": value.accelerator, "count": value.count}
        if isinstance(value, dict):
            return value
        if value is None:
            return {}
        raise TypeError(f"Expected string, dict, AcceleratorSpec, or None; got {type(value)}")

    @pydantic.model_serializer(mode="plain")
    def _to_string_spec(self) -> str | None:
        if self.accelerator is None or self.count <= 0:
            return None
        if self.count > 1:
            return f"{self.accelerator.value}:{self.count}"
        return self.accelerator.value


class WeightsAuthMethod(str, enum.Enum):
    """How a weights source authenticates; strings are upper-cased before matching."""

    CUSTOM_SECRET = "CUSTOM_SECRET"  # noqa: S105 - a method name
    AWS_OIDC = "AWS_OIDC"
    GCP_OIDC = "GCP_OIDC"


class AuthFieldsMixin(ConfigModel):
    """OIDC fields shared by weights and registry auth, with the required/forbidden checks."""

    aws_oidc_role_arn: str | None = pydantic.Field(
        default=None, description="AWS IAM role ARN for OIDC authentication."
    )
    aws_oidc_region: str | None = pydantic.Field(
        default=None, description="AWS region for OIDC authentication."
    )
    gcp_oidc_service_account: str | None = pydantic.Field(
        default=None, description="GCP service account name for OIDC authentication."
    )
    gcp_oidc_workload_id_provider: str | None = pydantic.Field(
        default=None, description="GCP workload identity provider for OIDC authentication."
    )

    def _require_fields(self, auth_method: str, *fields: str) -> None:
        """None and ``""`` both count as absent, as upstream."""
        missing = [f for f in fields if getattr(self, f) in (None, "")]
        if missing:
            raise ValueError(f"{', '.join(missing)} must be provided when auth_method is {auth_method}")

    def _forbid_fields(self, auth_method: str, *fields: str) -> None:
        present = [f for f in fields if getattr(self, f) not in (None, "")]
        if present:
            raise ValueError(f"{', '.join(present)} cannot be specified when auth_method is {auth_method}")

    def _validate_fields(self, auth_method: str, required: list[str], forbidden: list[str]) -> None:
        self._require_fields(auth_method, *required)
        self._forbid_fields(auth_method, *forbidden)


class WeightsAuth(AuthFieldsMixin):
    """Credentials for one weights source: a secret name (CUSTOM_SECRET) or OIDC fields."""

    auth_method: Annotated[
        WeightsAuthMethod,
        pydantic.Field(..., description="Authentication method for downloading weights from the source."),
    ]
    auth_secret_name: str | None = pydantic.Field(
        default=None,
        description="Baseten secret name containing credentials for accessing the source.",
    )

    @pydantic.field_validator("auth_method", mode="before")
    @classmethod
    def _normalize_auth_method(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    @pydantic.model_validator(mode="after")
    def _validate_auth_fields(self) -> WeightsAuth:
        if self.auth_method == WeightsAuthMethod.CUSTOM_SECRET:
            self._validate_fields(
                self.auth_method.value,
                required=[WEIGHTS_AUTH_SECRET_NAME_PARAM],
                forbidden=[
                    AWS_OIDC_ROLE_ARN_PARAM,
                    AWS_OIDC_REGION_PARAM,
                    GCP_OIDC_SERVICE_ACCOUNT_PARAM,
                    GCP_OIDC_WORKLOAD_ID_PROVIDER_PARAM,
                ],
            )
        elif self.auth_method == WeightsAuthMethod.AWS_OIDC:
            self._validate_fields(
                self.auth_method.value,
                required=[AWS_OIDC_ROLE_ARN_PARAM, AWS_OIDC_REGION_PARAM],
                forbidden=[
                    WEIGHTS_AUTH_SECRET_NAME_PARAM,
                    GCP_OIDC_SERVICE_ACCOUNT_PARAM,
                    GCP_OIDC_WORKLOAD_ID_PROVIDER_PARAM,
                ],
            )
        elif self.auth_method == WeightsAuthMethod.GCP_OIDC:
            self._validate_fields(
                self.auth_method.value,
                required=[GCP_OIDC_SERVICE_ACCOUNT_PARAM, GCP_OIDC_WORKLOAD_ID_PROVIDER_PARAM],
                forbidden=[WEIGHTS_AUTH_SECRET_NAME_PARAM, AWS_OIDC_ROLE_ARN_PARAM, AWS_OIDC_REGION_PARAM],
            )
        return self


_CLOUD_STORAGE_PREFIXES = frozenset({"s3://", "gs://", "azure://", "r2://", "cw://"})
_HF_PREFIX = "hf://"
_HTTPS_PREFIX = "https://"
_SUPPORTED_SCHEMES = _CLOUD_STORAGE_PREFIXES | {_HF_PREFIX, _HTTPS_PREFIX}


class WeightsSource(ConfigModel):
    """A remote source mounted read-only at ``mount_location`` before the job starts.

    Schemes: ``hf://`` (with optional ``@revision``), ``s3://``, ``gs://``, ``azure://``, ``r2://``,
    ``cw://`` (no ``@``), ``https://``. Lax with extras allowed, like upstream.
    """

    source: Annotated[str, pydantic.StringConstraints(min_length=1)] = pydantic.Field(
        ...,
        description="URI with scheme prefix. Use hf://, s3://, gs://, azure://, r2://, cw://, or https://. "
        "For HuggingFace, use @revision suffix (e.g., hf://owner/repo@main).",
    )
    mount_location: Annotated[str, pydantic.StringConstraints(min_length=1)] = pydantic.Field(
        ..., description="Absolute path where weights will be mounted at runtime."
    )
    auth: WeightsAuth | None = pydantic.Field(
        default=None, description="Authentication configuration for accessing the weights source."
    )
    auth_secret_name: str | None = pydantic.Field(
        default=None,
        description="Baseten secret name containing credentials. "
        "Can also be specified in auth.auth_secret_name.",
    )
    allow_patterns: list[str] | None = pydantic.Field(
        default=None, description="File patterns to include (e.g., ['*.safetensors'])."
    )
    ignore_patterns: list[str] | None = pydantic.Field(
        default=None, description="File patterns to exclude (e.g., ['*.md'])."
    )

    @property
    def is_huggingface(self) -> bool:
        """Whether the source is a Hugging Face repository (``hf://``)."""
        return self.source.startswith(_HF_PREFIX)

    @pydantic.field_validator("source")
    @classmethod
    def _validate_source(cls, v: str) -> str:
        supported_schemes_str = ", ".join(sorted(_SUPPORTED_SCHEMES))
        if "://" not in v:
            raise ValueError(
                f"Source '{v}' is missing a URI scheme. Supported schemes: {supported_schemes_str}"
            )
        scheme = v.split("://")[0] + "://"
        if scheme not in _SUPPORTED_SCHEMES:
            raise ValueError(
                f"Unsupported source scheme '{scheme}'. Supported schemes: {supported_schemes_str}"
            )
        if scheme in _CLOUD_STORAGE_PREFIXES:
            path_part = v[len(scheme) :]
            if not path_part or path_part.startswith("/"):
                raise ValueError(
                    f"Invalid {scheme[:-3].upper()} URI format: '{v}'. Expected format: {scheme}bucket/path"
                )
            if "@" in path_part:
                raise ValueError(
                    f"The @ revision syntax is only valid for HuggingFace sources (hf://). "
                    f"Source '{v}' uses {scheme[:-3].upper()} which does not support revisions."
                )
        if scheme == _HTTPS_PREFIX:
            url_part = v[len(_HTTPS_PREFIX) :]
            if not url_part or url_part.startswith("/"):
                raise ValueError(f"Invalid HTTPS URL format: '{v}'. Expected format: https://hostname/path")
        if scheme == _HF_PREFIX:
            repo_part = v[len(_HF_PREFIX) :]
            if not repo_part or repo_part.startswith("/"):
                raise ValueError(f"Invalid HuggingFace URI format: '{v}'. Expected format: hf://owner/repo")
        return v

    @pydantic.field_validator("mount_location")
    @classmethod
    def _validate_mount_location(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"mount_location must be an absolute path (start with /), got: {v}")
        return v

    @pydantic.model_validator(mode="after")
    def _validate_auth_secret_name(self) -> WeightsSource:
        if self.auth_secret_name and (self.auth and self.auth.auth_secret_name):
            raise ValueError(
                "auth_secret_name cannot be specified both at the top level and in auth section. "
                "Please use only one location."
            )
        return self


class DockerAuthType(str, enum.Enum):
    """Registry authentication kinds for private base images."""

    GCP_SERVICE_ACCOUNT_JSON = "GCP_SERVICE_ACCOUNT_JSON"
    AWS_IAM = "AWS_IAM"
    AWS_OIDC = "AWS_OIDC"
    GCP_OIDC = "GCP_OIDC"
    REGISTRY_SECRET = "REGISTRY_SECRET"  # noqa: S105 - a method name


class Weights(pydantic.RootModel[list[WeightsSource]]):
    """A list of weights sources whose mount locations are unique."""

    @property
    def sources(self) -> list[WeightsSource]:
        """The sources, in order."""
        return self.root

    @pydantic.model_validator(mode="after")
    def _validate_unique_mount_locations(self) -> Weights:
        mount_locations: list[str] = []
        for source in self.root:
            if source.mount_location in mount_locations:
                raise ValueError(
                    f"Duplicate mount_location '{source.mount_location}' - "
                    f"each weights source must have a unique mount path."
                )
            mount_locations.append(source.mount_location)
        return self


class FabricRequirement(ConfigModel):
    """Network fabric requirements (serving; part of :class:`Resources`)."""

    use_rdma: bool | None = pydantic.Field(
        default=None, description="Whether to use RDMA with any supported fabric."
    )
    preferences: list[str] | None = pydantic.Field(
        default=None,
        description=(
            "Exhaustive list of acceptable network fabrics, in preference order. "
            "An empty list requires no fabric."
        ),
        examples=[["infiniband"]],
    )

    @pydantic.model_serializer(mode="wrap")
    def _serialize(
        self, handler: core_schema.SerializerFunctionWrapHandler, info: core_schema.SerializationInfo
    ) -> dict[str, Any]:
        result: dict[str, Any] = handler(self)
        if self.use_rdma is None:
            result.pop("use_rdma", None)
        if self.preferences is None:
            result.pop("preferences", None)
        return result


class Resources(ConfigModel):
    """Serving-style resources; what ``Compute.to_truss_config()`` returns.

    ``cpu`` is a number or millicpus (``"500m"``), ``memory`` a number with an optional unit, as
    upstream validates them (looser than slurm-bt's ``Compute.memory`` check, which is the loader's).
    """

    cpu: str = pydantic.Field(
        default=DEFAULT_CPU,
        description="CPU resources needed, expressed as either a raw number or millicpus.",
        examples=["1", "500m", "4"],
    )
    memory: str = pydantic.Field(
        default=DEFAULT_MEMORY,
        description="CPU RAM needed, expressed as a number with units (Gi, G, Mi, M...).",
        examples=["2Gi", "512Mi"],
    )
    accelerator: AcceleratorSpec = pydantic.Field(
        default_factory=AcceleratorSpec,
        description="The GPU type; use the ':' operator for several (e.g. L4:4).",
        examples=["A100", "T4:2", "H100:8"],
    )
    instance_type: str | None = pydantic.Field(
        default=None,
        description="The full SKU name for the instance type; cpu, memory and accelerator are then ignored.",
        examples=["L4:4x16"],
    )
    node_count: Annotated[int, pydantic.Field(ge=1, strict=True)] | None = pydantic.Field(
        default=None, description="Number of nodes for multi-node deployments."
    )
    fabric: FabricRequirement | None = pydantic.Field(
        default=None, description="Network fabric requirements for this deployment."
    )

    _MILLI_CPU_REGEX: ClassVar[re.Pattern[str]] = re.compile(r"^[0-9.]*m$")
    _MEMORY_REGEX: ClassVar[re.Pattern[str]] = re.compile(r"^[0-9.]*([a-zA-Z]+)?$")
    _MEMORY_UNITS: ClassVar[dict[str, int]] = {
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
        "P": 10**15,
        "E": 10**18,
        "Ki": 1024,
        "Mi": 1024**2,
        "Gi": 1024**3,
        "Ti": 1024**4,
        "Pi": 1024**5,
        "Ei": 1024**6,
    }

    @pydantic.computed_field(return_type=bool)  # type: ignore[prop-decorator]
    @property
    def use_gpu(self) -> bool:
        """Whether an accelerator type is set."""
        return self.accelerator.accelerator is not None

    @property
    def memory_in_bytes(self) -> int:
        """``memory`` in bytes, rounded up (upstream's float arithmetic, kept)."""
        if _is_numeric(self.memory):
            return math.ceil(float(self.memory))
        match = self._MEMORY_REGEX.search(self.memory)
        assert match
        unit = match.group(1)
        return math.ceil(float(self.memory.strip(unit)) * self._MEMORY_UNITS[unit])

    @pydantic.model_validator(mode="before")
    @classmethod
    def strip_use_gpu(cls, data: Any) -> Any:
        """``use_gpu`` is dumped but not accepted as input; drop it so dumps round-trip."""
        if isinstance(data, dict):
            data = data.copy()
            data.pop("use_gpu", None)
        return data

    @pydantic.field_validator("cpu")
    @classmethod
    def _validate_cpu(cls, cpu_spec: str) -> str:
        if _is_numeric(cpu_spec):
            return cpu_spec
        if not cls._MILLI_CPU_REGEX.fullmatch(cpu_spec):
            raise ValueError(f"Invalid cpu specification {cpu_spec}.")
        return cpu_spec

    @pydantic.field_validator("memory")
    @classmethod
    def _validate_memory(cls, mem_spec: str) -> str:
        if _is_numeric(mem_spec):
            return mem_spec
        match = cls._MEMORY_REGEX.fullmatch(mem_spec)
        if not match:
            raise ValueError(f"Invalid memory specification {mem_spec}")
        unit = match.group(1)
        if unit not in cls._MEMORY_UNITS:
            raise ValueError(f"Invalid memory unit {unit} in {mem_spec}")
        return mem_spec

    @pydantic.model_serializer(mode="wrap")
    def _serialize(
        self, handler: core_schema.SerializerFunctionWrapHandler, info: core_schema.SerializationInfo
    ) -> dict[str, Any]:
        result: dict[str, Any] = handler(self)
        if not self.node_count:
            result.pop("node_count", None)
        if not self.instance_type:
            result.pop("instance_type", None)
        if self.fabric is None:
            result.pop("fabric", None)
        return result


class TrainingArtifactReference(ConfigModel):
    """Files of one training job to download for a deploy (``Checkpoint.to_truss_config()``)."""

    training_job_id: str = pydantic.Field(
        ..., description="The training job id that the artifact reference belongs to."
    )
    paths: list[str] = pydantic.Field(
        default_factory=list, description="The paths of the files to download which can contain * or ?."
    )


class CheckpointList(ConfigModel):
    """The serving side of ``truss_train.CheckpointList`` (what its ``to_truss_config()`` returns)."""

    download_folder: str = pydantic.Field(
        default=DEFAULT_TRAINING_CHECKPOINT_FOLDER,
        description="The folder to download the checkpoints to.",
        examples=["/tmp/training_checkpoints"],
    )
    artifact_references: list[TrainingArtifactReference] = pydantic.Field(default_factory=list)
    loops_checkpoint_ids: list[str] = pydantic.Field(
        default_factory=list,
        description="Loops checkpoint IDs to deploy. Mutually exclusive with artifact_references.",
    )

    @pydantic.model_validator(mode="after")
    def _no_mixing(self) -> CheckpointList:
        if self.artifact_references and self.loops_checkpoint_ids:
            raise ValueError(
                "Cannot mix training job checkpoints and loops checkpoints in "
                "the same deploy. Use either artifact_references / checkpoints "
                "or loops_checkpoint_ids, not both."
            )
        return self


def to_dotted_python_version(truss_python_version: str) -> str:
    """``"py39"`` -> ``"3.9"`` (upstream's helper, same arithmetic)."""
    return f"{truss_python_version[2]}.{truss_python_version[3:]}"


_SERVING = "part of a truss model's serving config (Baseten model deployment), not of a training job"
NOT_PROVIDED: dict[str, str] = {
    **{
        name: _SERVING
        for name in (
            "TrussConfig", "Runtime", "Build", "ModelServer", "ModelRepo", "ModelRepoSourceKind", "ModelCache",
            "ModelRepoCacheInternal", "CacheInternal", "AutoscalingMetric", "AdditionalAutoscalingConfig",
            "BISLLM", "HealthChecks", "TransportKind", "HTTPOptions", "WebsocketOptions", "GRPCOptions",
            "Transport", "OIDC", "RequestBackpressure", "RemoteSSH", "EgressRestrictions", "ExternalDataItem",
            "ExternalData", "DockerAuthSettings", "BaseImage", "DockerServer", "TRTLLMConfiguration",
            "map_local_to_supported_python_version",
        )
    },
}
"""Upstream names this module deliberately lacks, with the reason :func:`__getattr__` gives."""


def __getattr__(name: str) -> object:
    reason = NOT_PROVIDED.get(name)
    if reason is not None:
        raise AttributeError(f"truss.base.truss_config.{name} is not available in slurm-bt: {reason}")
    raise AttributeError(f"module 'truss.base.truss_config' has no attribute {name!r}")
