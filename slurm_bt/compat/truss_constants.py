"""``truss.base.constants`` (truss 0.18.25) as configs see it.

Every constant with a plain value is reproduced with upstream's value. The directory constants
(``TEMPLATES_DIR``, ``SERVER_CODE_DIR``...) point into an installed truss's own files, which only
the serving build uses; they do not exist here, and reading one raises ``AttributeError`` saying
so (:data:`NOT_PROVIDED`), instead of a path to nothing.
"""

from __future__ import annotations

import pathlib

__all__ = [
    "BASE_SERVER_REQUIREMENTS_TXT_FILENAME",
    "BEI_MAX_CONCURRENCY_TARGET_REQUESTS",
    "BEI_REQUIRED_MAX_NUM_TOKENS",
    "BEI_TRTLLM_CLIENT_BATCH_SIZE",
    "CONFIG_FILE",
    "CONSTRAINTS_TXT_FILENAME",
    "CUSTOM",
    "DEFAULT_NON_ROOT_USER_ID",
    "DEFAULT_REMOTE_NAME",
    "DEFAULT_REMOTE_URL",
    "DEFAULT_TRAINING_CHECKPOINT_FOLDER",
    "DOCKERFILE",
    "FILENAME_CONSTANTS_MAP",
    "HF_ACCESS_TOKEN_KEY",
    "HF_MODELS_API_URL",
    "HTTP_PUBLIC_BLOB_BACKEND",
    "INFERENCE_SERVER_PORT",
    "MODEL_CACHE_PATH",
    "MODEL_DOCKERFILE_NAME",
    "MODEL_README_NAME",
    "NOT_PROVIDED",
    "NO_BUILD_DOCKERFILE_TEMPLATE_NAME",
    "OPENAI_COMPATIBLE_TAG",
    "OPENAI_NON_COMPATIBLE_TAG",
    "PRODUCTION_ENVIRONMENT_NAME",
    "PYPROJECT_TOML_FILENAME",
    "README_TEMPLATE_NAME",
    "REGISTRY_BUILD_SECRET_PREFIX",
    "REQUIREMENTS_TXT_FILENAME",
    "SERVER_DOCKERFILE_TEMPLATE_NAME",
    "SERVER_REQUIREMENTS_TXT_FILENAME",
    "SHARED_SERVING_AND_TRAINING_CODE_DIR_NAME",
    "SUPPORTED_PYTHON_VERSIONS",
    "SYSTEM_PACKAGES_TXT_FILENAME",
    "TRTLLM_MIN_MEMORY_REQUEST_GI",
    "TRTLLM_PREDICT_CONCURRENCY",
    "TRTLLM_PYTHON_EXECUTABLE",
    "TRUSS",
    "TRUSSLESS_MAX_PAYLOAD_SIZE",
    "TRUSS_BASE_IMAGE_NAME",
    "TRUSS_DIR",
    "TRUSS_HASH",
    "TRUSS_MODIFIED_TIME",
    "USER_SUPPLIED_REQUIREMENTS_TXT_FILENAME",
    "UV_LOCK_FILENAME",
]

CUSTOM = "custom"
SHARED_SERVING_AND_TRAINING_CODE_DIR_NAME = "shared"
# Must be sorted ascendingly (upstream's comment: callers bisect it).
SUPPORTED_PYTHON_VERSIONS = ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14"]

TRTLLM_PREDICT_CONCURRENCY = 512
BEI_TRTLLM_CLIENT_BATCH_SIZE = 128
BEI_MAX_CONCURRENCY_TARGET_REQUESTS = 2048
BEI_REQUIRED_MAX_NUM_TOKENS = 16384

TRTLLM_MIN_MEMORY_REQUEST_GI = 10
HF_MODELS_API_URL = "https://huggingface.co/api/models"
HF_ACCESS_TOKEN_KEY = "hf_access_token"  # noqa: S105 - a secret's name, not a secret
TRUSSLESS_MAX_PAYLOAD_SIZE = "64M"

REQUIREMENTS_TXT_FILENAME = "requirements.txt"
USER_SUPPLIED_REQUIREMENTS_TXT_FILENAME = "user_requirements.txt"
BASE_SERVER_REQUIREMENTS_TXT_FILENAME = "base_server_requirements.txt"
SERVER_REQUIREMENTS_TXT_FILENAME = "server_requirements.txt"
CONSTRAINTS_TXT_FILENAME = "constraints.txt"
SYSTEM_PACKAGES_TXT_FILENAME = "system_packages.txt"
PYPROJECT_TOML_FILENAME = "pyproject.toml"
UV_LOCK_FILENAME = "uv.lock"

FILENAME_CONSTANTS_MAP = {
    "config_requirements_filename": REQUIREMENTS_TXT_FILENAME,
    "user_supplied_requirements_filename": USER_SUPPLIED_REQUIREMENTS_TXT_FILENAME,
    "pyproject_toml_filename": PYPROJECT_TOML_FILENAME,
    "uv_lock_filename": UV_LOCK_FILENAME,
    "base_server_requirements_filename": BASE_SERVER_REQUIREMENTS_TXT_FILENAME,
    "server_requirements_filename": SERVER_REQUIREMENTS_TXT_FILENAME,
    "system_packages_filename": SYSTEM_PACKAGES_TXT_FILENAME,
    "constraints_filename": CONSTRAINTS_TXT_FILENAME,
}

SERVER_DOCKERFILE_TEMPLATE_NAME = "server.Dockerfile.jinja"
NO_BUILD_DOCKERFILE_TEMPLATE_NAME = "no_build.Dockerfile.jinja"
MODEL_DOCKERFILE_NAME = "Dockerfile"
MODEL_CACHE_PATH = pathlib.PurePosixPath("/app/model_cache")
README_TEMPLATE_NAME = "README.md.jinja"
MODEL_README_NAME = "README.md"

CONFIG_FILE = "config.yaml"
DOCKERFILE = "Dockerfile"
TRUSS = "truss"
TRUSS_MODIFIED_TIME = "truss_modified_time"
TRUSS_DIR = "truss_dir"
TRUSS_HASH = "truss_hash"

INFERENCE_SERVER_PORT = 8080
DEFAULT_NON_ROOT_USER_ID = 60000

HTTP_PUBLIC_BLOB_BACKEND = "http_public"

REGISTRY_BUILD_SECRET_PREFIX = "DOCKER_REGISTRY_"  # noqa: S105 - a name prefix, not a secret

TRTLLM_PYTHON_EXECUTABLE = "/usr/local/briton/venv/bin/python"
OPENAI_COMPATIBLE_TAG = "openai-compatible"
OPENAI_NON_COMPATIBLE_TAG = "force-legacy-api-non-openai-compatible"

PRODUCTION_ENVIRONMENT_NAME = "production"

TRUSS_BASE_IMAGE_NAME = "baseten/truss-server-base"

DEFAULT_REMOTE_NAME = "baseten"
DEFAULT_REMOTE_URL = "https://app.baseten.co"

# Where ``LoadCheckpointConfig`` puts loaded checkpoints; ``truss_config`` has a constant of the same
# name with another value (``/tmp/training_checkpoints``, for deploys), exactly as upstream.
DEFAULT_TRAINING_CHECKPOINT_FOLDER = "/tmp/loaded_checkpoints"

_INSTALL_DIRS = (
    "TEMPLATES_DIR", "TRADITIONAL_CUSTOM_TEMPLATE_DIR", "PYTHON_DX_CUSTOM_TEMPLATE_DIR",
    "DOCKER_SERVER_TEMPLATES_DIR", "SERVER_CODE_DIR", "TRITON_SERVER_CODE_DIR", "TRTLLM_TRUSS_DIR",
    "SHARED_SERVING_AND_TRAINING_CODE_DIR", "CONTROL_SERVER_CODE_DIR", "CHAINS_CODE_DIR", "TRUSS_CODE_DIR",
    "TRAINING_TEMPLATE_DIR", "WORKSTATION_TEMPLATE_DIR", "SERVING_DIR",
)
NOT_PROVIDED: dict[str, str] = {
    name: "a directory inside an installed truss (serving templates); slurm-bt does not ship truss's files"
    for name in _INSTALL_DIRS
}
"""Upstream names this module deliberately lacks, with the reason :func:`__getattr__` gives."""


def __getattr__(name: str) -> object:
    reason = NOT_PROVIDED.get(name)
    if reason is not None:
        raise AttributeError(f"truss.base.constants.{name} is not available in slurm-bt: {reason}")
    raise AttributeError(f"module 'truss.base.constants' has no attribute {name!r}")
