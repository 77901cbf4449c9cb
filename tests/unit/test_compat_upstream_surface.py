"""The upstream surface configs and scripts use beyond the models: to_truss_config(), the rest of
truss.base.truss_config, truss.base.constants, truss_train.loader and truss_train.deployment.

Expected values are upstream truss 0.18.25's own outputs for the same calls (recorded by running
upstream's modules on these inputs), so a difference here is a difference from Baseten.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pydantic
import pytest

from slurm_bt.compat import _truss_train_deployment as deployment
from slurm_bt.compat import _truss_train_loader as upstream_loader
from slurm_bt.compat import definitions as d
from slurm_bt.compat import public_api, truss_constants
from slurm_bt.compat import truss_config as tc
from slurm_bt.compat.overrides import apply_cli_overrides
from slurm_bt.compat.shim import truss_modules

# --- to_truss_config() ---------------------------------------------------------------------------------


def test_compute_to_truss_config_matches_upstream() -> None:
    gpu = d.Compute(node_count=2, cpu_count=4, memory="64Gi",
                    accelerator=tc.AcceleratorSpec(accelerator=tc.Accelerator.H100, count=8))
    resources = gpu.to_truss_config()
    assert isinstance(resources, tc.Resources)
    assert resources.model_dump() == {"cpu": "4", "memory": "64Gi", "accelerator": "H100:8", "node_count": 2,
                                      "use_gpu": True}
    assert d.Compute().to_truss_config().model_dump() == {"cpu": "1", "memory": "2Gi", "accelerator": None,
                                                          "node_count": 1, "use_gpu": False}


def test_checkpoint_list_to_truss_config_matches_upstream() -> None:
    checkpoints = d.CheckpointList(checkpoints=[
        d.FullCheckpoint(training_job_id="j1", checkpoint_name="checkpoint-10"),
        d.LoRACheckpoint(training_job_id="j2", checkpoint_name="c2"),
    ])
    converted = checkpoints.to_truss_config()
    assert isinstance(converted, tc.CheckpointList)
    assert converted.model_dump() == {
        "download_folder": "/tmp/training_checkpoints",
        "artifact_references": [{"training_job_id": "j1", "paths": ["rank-0/checkpoint-10/"]},
                                {"training_job_id": "j2", "paths": ["rank-0/c2/"]}],
        "loops_checkpoint_ids": [],
    }
    ref = d.FullCheckpoint(training_job_id="j", checkpoint_name="c").to_truss_config()
    assert isinstance(ref, tc.TrainingArtifactReference) and ref.paths == ["rank-0/c/"]
    assert d.ModelWeightsFormat.LORA.to_truss_config() is d.ModelWeightsFormat.LORA
    with pytest.raises(pydantic.ValidationError, match="Cannot mix"):
        tc.CheckpointList(artifact_references=[ref], loops_checkpoint_ids=["x"])


# --- truss_config: Resources and constants ---------------------------------------------------------------


def test_resources_validation_and_units_match_upstream() -> None:
    assert tc.Resources(cpu="500m", memory="1.5Gi").memory_in_bytes == 1610612736
    assert tc.Resources(fabric=tc.FabricRequirement(use_rdma=True)).model_dump() == {
        "cpu": "1", "memory": "2Gi", "accelerator": None, "fabric": {"use_rdma": True}, "use_gpu": False}
    for bad, message in [({"cpu": "x"}, "Invalid cpu specification x."),
                         ({"memory": "2GB"}, "Invalid memory unit GB in 2GB"),
                         ({"memory": "abc"}, "Invalid memory unit abc in abc"),
                         ({"node_count": 0}, "greater than or equal to 1")]:
        with pytest.raises(pydantic.ValidationError, match=message):
            tc.Resources(**bad)
    # a dump round-trips (use_gpu is dumped but not accepted as input)
    dumped = tc.Resources(accelerator="A100:2").model_dump()
    assert tc.Resources.model_validate(dumped).accelerator.count == 2


def test_constants_match_upstream() -> None:
    assert (tc.DEFAULT_CPU, tc.DEFAULT_MEMORY) == ("1", "2Gi")
    assert tc.DEFAULT_TRAINING_CHECKPOINT_FOLDER == "/tmp/training_checkpoints"
    assert truss_constants.DEFAULT_TRAINING_CHECKPOINT_FOLDER == "/tmp/loaded_checkpoints"
    assert tc.K8S_RESERVED_ENVIRONMENT_VARIABLES == {"PORT", "HOSTNAME"}
    assert truss_constants.SUPPORTED_PYTHON_VERSIONS == ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14"]
    assert truss_constants.DEFAULT_REMOTE_NAME == "baseten" and truss_constants.INFERENCE_SERVER_PORT == 8080
    assert tc.to_dotted_python_version("py311") == "3.11"
    assert tc.Weights([tc.WeightsSource(source="hf://a/b", mount_location="/m")]).sources[0].source == "hf://a/b"
    with pytest.raises(pydantic.ValidationError, match="Duplicate mount_location"):
        tc.Weights([tc.WeightsSource(source="hf://a/b", mount_location="/m"),
                    tc.WeightsSource(source="hf://a/c", mount_location="/m")])


@pytest.mark.parametrize(("module", "name", "why"), [
    (tc, "TrussConfig", "serving config"),
    (tc, "Build", "serving config"),
    (truss_constants, "TEMPLATES_DIR", "installed truss"),
    (deployment, "prepare_push", "Baseten's API"),
])
def test_serving_and_baseten_only_names_refuse_clearly(module: Any, name: str, why: str) -> None:
    with pytest.raises(AttributeError, match=f"{name} is not available in slurm-bt: .*{why}"):
        getattr(module, name)
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        module.Nope


# --- truss_train.loader (upstream semantics: raises, no extra checks) -----------------------------------


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "config.py"
    path.write_text("from truss_train import definitions\n" + textwrap.dedent(body))
    return path


def test_upstream_loader_mirror(tmp_path: Path) -> None:
    path = _config(tmp_path, """
        project = definitions.TrainingProject(name="p", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x"), compute=definitions.Compute(node_count=0)))
        """)
    with truss_modules(), upstream_loader.import_training_project(path) as project:
        assert project.job.compute.node_count == 0  # upstream accepts it; push() is where slurm-bt refuses
    with pytest.raises(ImportError, match="is not a file"), upstream_loader.import_training_project(tmp_path / "x.py"):
        pass
    empty = _config(tmp_path, "x = 1\n")
    with pytest.raises(ValueError, match=r"No `<class 'truss_train.definitions.TrainingProject'>` was found."), \
            truss_modules(), upstream_loader.import_training_project(empty):
        pass
    deploy = _config(tmp_path, "d = definitions.DeployCheckpointsConfig(model_name='m')\n")
    with truss_modules(), upstream_loader.import_deploy_checkpoints_config(deploy) as config:
        assert config.model_name == "m"


# --- truss_train.deployment: overrides and create_training_job ------------------------------------------


def _project(**compute: Any) -> d.TrainingProject:
    job = d.TrainingJob(image=d.Image(base_image="x"), compute=d.Compute(**compute),
                        runtime=d.Runtime(start_commands=["python a.py"]), priority=1, name="cfg-name")
    return d.TrainingProject(name="p", job=job)


def test_cli_overrides_apply_and_warn_as_upstream() -> None:
    project = _project(node_count=2, accelerator="H100:8")
    warnings: list[str] = []
    apply_cli_overrides(project, interactive_trigger="ON_FAILURE", interactive_timeout_minutes=5,
                        accelerator="A100:2", node_count=3, entrypoint="bash run.sh", priority=7, spot=True,
                        warn=warnings.append)
    job = project.job
    assert job.compute.accelerator == tc.AcceleratorSpec(accelerator=tc.Accelerator.A100, count=2)
    assert (job.compute.node_count, job.priority, job.runtime.start_commands) == (3, 7, ["bash run.sh"])
    assert job.compute.availability_model is d.AvailabilityModel.SPOT
    assert job.interactive_session is not None
    assert job.interactive_session.trigger is d.InteractiveSessionTrigger.ON_FAILURE
    assert job.interactive_session.timeout_minutes == 5
    assert [w.split(" provided in config file")[0] for w in warnings] == [
        "accelerator 'accelerator=<Accelerator.H100: 'H100'> count=8'", "node_count '2'",
        "start_commands ['python a.py']", "priority '1'"]
    assert warnings[1] == "node_count '2' provided in config file will be ignored. Using '3' provided via " \
                          "--node-count flag."
    quiet: list[str] = []
    apply_cli_overrides(_project(), node_count=2, spot=True, warn=quiet.append)  # defaults replaced silently
    assert quiet == []


def test_create_training_job_applies_overrides_and_pushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []

    def fake_push(config: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append((config, kwargs))
        return {"id": "42"}

    monkeypatch.setattr(public_api, "_submitter", fake_push)
    project = _project()
    result = deployment.create_training_job(None, tmp_path / "config.py", project, job_name_from_cli="cli-name",
                                            node_count=2)
    assert result == {"id": "42", "job_object": project.job}
    [(pushed, kwargs)] = calls
    assert pushed is project and project.job.name == "cli-name" and project.job.compute.node_count == 2
    assert kwargs == {"remote": None, "source_dir": tmp_path, "team_id": None}
