"""Every config shown in the seed documents (/work/shared/seeds) loads, with the expected values."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from slurm_bt.compat import definitions as d
from slurm_bt.compat import load_training_project, truss_modules
from slurm_bt.compat import truss_config as tc
from slurm_bt.errors import ConfigError

SEEDS = Path(__file__).resolve().parents[1] / "seed_configs"
PROJECT_CONFIGS = sorted(
    p
    for p in SEEDS.glob("*.py")
    if p.stem not in ("seed004_deploy_checkpoints", "seed004_dynamic_runtime_config")
)


def test_seed_directory_is_populated() -> None:
    assert len(list(SEEDS.glob("*.py"))) >= 19


@pytest.mark.parametrize("path", PROJECT_CONFIGS, ids=lambda p: p.stem)
def test_seed_config_loads(path: Path) -> None:
    project = load_training_project(path)
    assert isinstance(project, d.TrainingProject)
    assert project.job.image.base_image


def test_hf_and_s3_weights_seed() -> None:
    job = load_training_project(SEEDS / "seed000_weights_hf_s3.py").job
    assert job.compute.accelerator == tc.AcceleratorSpec(accelerator=tc.Accelerator.H200, count=1)
    assert [(w.source, w.mount_location) for w in job.weights] == [
        ("hf://Qwen/Qwen3-0.6B", "/app/models/Qwen/Qwen3-0.6B"),
        ("s3://my-bucket/training-data", "/app/data/training-data"),
    ]


def test_weights_auth_and_filter_seeds() -> None:
    auth = load_training_project(SEEDS / "seed000_weights_auth.py").job.weights[0].auth
    assert auth == tc.WeightsAuth(
        auth_method=tc.WeightsAuthMethod.CUSTOM_SECRET, auth_secret_name="hf_access_token"
    )
    w = load_training_project(SEEDS / "seed000_weights_filtering.py").job.weights[0]
    assert w.allow_patterns == ["*.safetensors", "config.json", "tokenizer.*"]


def test_docker_auth_seeds() -> None:
    aws = load_training_project(SEEDS / "seed004_docker_auth_aws.py").job.image.docker_auth
    assert aws is not None and aws.auth_method is tc.DockerAuthType.AWS_IAM
    gcp = load_training_project(SEEDS / "seed004_docker_auth_gcp.py").job.image.docker_auth
    assert gcp is not None and gcp.gcp_service_account_json_docker_auth is not None


def test_compute_and_runtime_seeds() -> None:
    compute = load_training_project(SEEDS / "seed004_compute.py").job.compute
    assert (compute.node_count, compute.cpu_count, compute.memory) == (2, 8, "64Gi")
    runtime = load_training_project(SEEDS / "seed004_runtime.py").job.runtime
    assert runtime.environment_variables["BATCH_SIZE"] == "32"
    assert runtime.environment_variables["HF_TOKEN"] == d.SecretReference(name="hf_access_token")
    assert load_training_project(SEEDS / "seed004_project_team.py").team_name == "my-team"


def test_checkpoint_seeds() -> None:
    cfg = load_training_project(
        SEEDS / "seed004_load_checkpoint_config.py"
    ).job.runtime.load_checkpoint_config
    assert cfg is not None and cfg.enabled
    assert [c.typ for c in cfg.checkpoints] == ["baseten_latest_checkpoint", "baseten_named_checkpoint"]


def test_dynamic_runtime_config_seed(tmp_path: Path) -> None:
    shutil.copy(SEEDS / "seed004_dynamic_runtime_config.py", tmp_path / "config.py")
    (tmp_path / "runtime_config.json").write_text(
        json.dumps(
            {"dataset_id": "HuggingFaceH4/Multilingual-Thinking", "model_id": "meta-llama/Llama-3.1-8B"}
        )
    )
    project = load_training_project(tmp_path / "config.py")
    assert project.name == "dynamic-training"
    assert project.job.runtime.environment_variables["MODEL_ID"] == "meta-llama/Llama-3.1-8B"
    assert project.job.compute.accelerator == tc.AcceleratorSpec(accelerator=tc.Accelerator.H100, count=2)


def test_dynamic_runtime_config_seed_without_its_json_is_one_problem(tmp_path: Path) -> None:
    shutil.copy(SEEDS / "seed004_dynamic_runtime_config.py", tmp_path / "config.py")
    with pytest.raises(ConfigError) as exc:
        load_training_project(tmp_path / "config.py")
    [problem] = exc.value.problems
    assert problem.message.startswith("line 12: FileNotFoundError:")


def test_deploy_checkpoints_seed() -> None:
    path = SEEDS / "seed004_deploy_checkpoints.py"
    with pytest.raises(
        ConfigError, match=re.escape("No `<class 'truss_train.definitions.TrainingProject'>` was found.")
    ):
        load_training_project(path)
    namespace: dict[str, object] = {"__file__": str(path)}
    with truss_modules():
        exec(compile(path.read_text(), str(path), "exec"), namespace)
    config = namespace["deploy_config"]
    assert isinstance(config, d.DeployCheckpointsConfig)
    assert config.checkpoint_details is not None
    [ckpt] = config.checkpoint_details.checkpoints
    assert isinstance(ckpt, d.LoRACheckpoint) and ckpt.lora_details.rank == 16
