"""The ``truss_train`` package as configs see it (mirror of upstream ``truss_train/__init__.py``).

The import shim installs this module under the name ``truss_train``. ``__all__`` keeps upstream's
order on purpose (it is a mirror, not our API). ``InteractiveSession`` and friends are only
reachable through ``truss_train.definitions``, exactly as upstream.
"""

from __future__ import annotations

from slurm_bt.compat import _truss_train_deployment as deployment
from slurm_bt.compat import _truss_train_loader as loader
from slurm_bt.compat import definitions, public_api
from slurm_bt.compat.definitions import (
    AvailabilityModel,
    AWSIAMDockerAuth,
    BasetenCheckpoint,
    CacheConfig,
    CheckpointingConfig,
    CheckpointList,
    Compute,
    DeployCheckpointsConfig,
    DeployCheckpointsRuntime,
    DockerAuth,
    FullCheckpoint,
    GCPServiceAccountJSONDockerAuth,
    Image,
    LoadCheckpointConfig,
    LoopsCheckpoint,
    LoRACheckpoint,
    LoRADetails,
    ModelWeightsFormat,
    RegistrySecretDockerAuth,
    Runtime,
    SecretReference,
    TrainingJob,
    TrainingProject,
    Workspace,
)
from slurm_bt.compat.public_api import push
from slurm_bt.compat.truss_config import WeightsSource

__all__ = [  # noqa: RUF022 - upstream order
    "push",
    "AvailabilityModel",
    "Compute",
    "Runtime",
    "SecretReference",
    "TrainingJob",
    "TrainingProject",
    "FullCheckpoint",
    "LoRACheckpoint",
    "ModelWeightsFormat",
    "CheckpointList",
    "DeployCheckpointsRuntime",
    "DeployCheckpointsConfig",
    "LoRADetails",
    "CheckpointingConfig",
    "CacheConfig",
    "AWSIAMDockerAuth",
    "GCPServiceAccountJSONDockerAuth",
    "RegistrySecretDockerAuth",
    "LoadCheckpointConfig",
    "BasetenCheckpoint",
    "LoopsCheckpoint",
    "DockerAuth",
    "Image",
    "WeightsSource",
    "Workspace",
]

# An empty ``__path__`` makes this a package for the import system: ``import truss_train.foo``
# then fails with a plain ModuleNotFoundError instead of "'truss_train' is not a package".
__path__: list[str] = []

# Submodules are attributes of a package after import (upstream's public_api imports loader and
# deployment); configs rely on it (``import truss_train; truss_train.definitions.Runtime``).
_SUBMODULES = (definitions, public_api, loader, deployment)
