"""The compat models behave like truss 0.18.25 outside the loader."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from slurm_bt.compat import definitions as d
from slurm_bt.compat import truss_config as tc


def _job(**kw: Any) -> d.TrainingJob:
    return d.TrainingJob(image=d.Image(base_image="img"), **kw)


def _err(exc: pytest.ExceptionInfo[pydantic.ValidationError]) -> str:
    return str(exc.value)


# --- strictness table (notes §2) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (d.Compute, {"nodes": 2}),
        (d.Runtime, {"start_command": ["x"]}),
        (d.TrainingProject, {"name": "p", "job": {"image": {"base_image": "i"}}, "extra": 1}),
        (d.CacheConfig, {"enable_legacy_hf_cache": True}),  # the docs' name (DOC≠CODE)
        (d.SecretReference, {"name": "a", "value": "b"}),
        (d.Workspace, {"root": "x"}),
    ],
)
def test_unknown_keyword_on_strict_class_is_rejected(
    cls: type[pydantic.BaseModel], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
        cls(**kwargs)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (d.Compute, {"availability_model": "spot"}),
        (d.InteractiveSession, {"trigger": "on_startup"}),
        (d.InteractiveSession, {"session_provider": "ssh"}),
        (d.InteractiveSession, {"auth_provider": "github"}),
        (d.DockerAuth, {"auth_method": "AWS_IAM", "registry": "r"}),
        (d.TrainingJob, {"image": {"base_image": "i"}, "interactive_session": {"trigger": "on_startup"}}),
    ],
)
def test_plain_string_for_enum_on_strict_class_is_rejected(
    cls: type[pydantic.BaseModel], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(pydantic.ValidationError):
        cls(**kwargs)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (d.Compute, {"cpu_count": "4"}),
        (d.Compute, {"cpu_count": 4.0}),
        (d.Compute, {"node_count": True}),
        (d.Compute, {"memory": 2}),
        (d.TrainingJob, {"image": {"base_image": "i"}, "priority": "1"}),
        (d.SecretReference, {"name": 1}),
        (d.Runtime, {"start_commands": ("a",)}),
        (d.Runtime, {"start_commands": "a"}),
        (d.Workspace, {"external_dirs": ("a",)}),
        (d.Workspace, {"external_dirs": "a"}),
        (d.Runtime, {"environment_variables": {"A": 1}}),
    ],
)
def test_wrong_scalar_or_container_type_is_rejected(
    cls: type[pydantic.BaseModel], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(pydantic.ValidationError):
        cls(**kwargs)


def test_dicts_are_coerced_into_nested_models() -> None:
    job = d.TrainingJob(
        image={"base_image": "i"},
        runtime={"environment_variables": {"T": {"name": "tok"}}},
    )
    assert isinstance(job.image, d.Image)
    assert job.runtime.environment_variables["T"] == d.SecretReference(name="tok")
    project = d.TrainingProject(name="p", job={"image": {"base_image": "i"}})
    assert isinstance(project.job, d.TrainingJob)


def test_assignment_is_validated_and_models_are_not_frozen() -> None:
    compute = d.Compute()
    compute.node_count = 2
    assert compute.node_count == 2
    with pytest.raises(pydantic.ValidationError):
        compute.node_count = "2"  # type: ignore[assignment]


def test_lax_classes_coerce() -> None:
    spec = tc.AcceleratorSpec(accelerator="H200", count="2")
    assert spec.accelerator is tc.Accelerator.H200 and spec.count == 2
    assert d.LoRADetails(rank="8").rank == 8


def test_lax_classes_keep_extras_and_forbid_them_on_request() -> None:
    w = tc.WeightsSource(source="hf://a/b", mount_location="/m", future_field=1)
    assert w.model_dump()["future_field"] == 1
    with pytest.raises(pydantic.ValidationError, match=r"Extra fields not allowed: \[future_field\]"):
        w.validate_forbid_extra()
    assert d.FullCheckpoint(training_job_id="j", checkpoint_name="c", x=1).model_extra == {"x": 1}


def test_defaults() -> None:
    job = _job()
    assert job.compute == d.Compute(node_count=1, cpu_count=1, memory="2Gi")
    assert job.compute.availability_model is d.AvailabilityModel.DEDICATED
    assert job.enable_baseten_workdir is True
    assert job.weights == [] and job.runtime.start_commands == []
    assert d.CacheConfig().require_cache_affinity is True
    assert d.CacheConfig().mount_base_path == "/root/.cache"
    assert d.InteractiveSession().timeout_minutes == 480 == d.DEFAULT_INTERACTIVE_SESSION_TIMEOUT_MINUTES
    assert d.LoRADetails().rank == 16 == d.DEFAULT_LORA_RANK
    assert d.LoadCheckpointConfig().download_folder == "/tmp/loaded_checkpoints"
    assert d.CheckpointList().download_folder == "/tmp/training_checkpoints"
    assert d.LoadCheckpointConfig().checkpoints == [d._BasetenLatestCheckpoint()]
    with pytest.raises(pydantic.ValidationError):
        _job(weights=None)


def test_no_range_checks_upstream() -> None:
    assert d.Compute(node_count=0).node_count == 0
    assert d.Compute(node_count=-1, memory="bogus").memory == "bogus"
    assert d.TrainingProject(name="", job=_job()).name == ""
    assert d.CheckpointingConfig(volume_size_gib=0).volume_size_gib == 0


# --- accelerators ------------------------------------------------------------------------------


def test_every_accelerator_value() -> None:
    assert [a.value for a in tc.Accelerator] == [
        "B10", "T4", "L4", "A10G", "V100", "A100", "A100_40GB", "H100", "H200",
        "H100_40GB", "B200", "L40S", "RTX_PRO_6000", "B300", "GB300",
    ]  # fmt: skip
    assert tc.Accelerator._B10.value == "B10"
    for acc in tc.Accelerator:
        assert acc.value == acc.name.lstrip("_")
        assert tc.AcceleratorSpec(accelerator=acc.value).accelerator is acc
        assert d.Compute(accelerator=f"{acc.value}:2").accelerator == tc.AcceleratorSpec(
            accelerator=acc, count=2
        )


@pytest.mark.parametrize(
    ("spec", "acc", "count"),
    [("H100", "H100", 1), ("H100:8", "H100", 8), ("  H100:8 ", "H100", 8), ("H100:2:3", "H100", 1)],
)
def test_accelerator_string_forms(spec: str, acc: str, count: int) -> None:
    compute = d.Compute(accelerator=spec)
    assert compute.accelerator is not None
    assert compute.accelerator.accelerator == tc.Accelerator(acc) and compute.accelerator.count == count


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "Accelerator type cannot be empty."),
        ("H1000", "Unsupported accelerator type: `H1000`. Available types: B10, T4, L4"),
        ("h200", "Unsupported accelerator type: `h200`"),
        ("H100:0", "Invalid count: '0'. Must be positive integer."),
        ("H100:x", "Invalid count: 'x'. Must be positive integer."),
    ],
)
def test_accelerator_string_errors(spec: str, message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as exc:
        d.Compute(accelerator=spec)
    assert message in _err(exc)


def test_accelerator_other_inputs() -> None:
    assert d.Compute(accelerator={"accelerator": "A10G", "count": 2}).accelerator == tc.AcceleratorSpec(
        accelerator=tc.Accelerator.A10G, count=2
    )
    assert d.Compute(accelerator=None).accelerator is None
    assert tc.AcceleratorSpec(count=0).count == 0
    with pytest.raises(pydantic.ValidationError):
        tc.AcceleratorSpec(count=-1)
    with pytest.raises(pydantic.ValidationError):
        tc.AcceleratorSpec(accelerator="h200")
    with pytest.raises(TypeError, match="Expected string, dict, AcceleratorSpec, or None"):
        d.Compute(accelerator=5)


def test_accelerator_serialisation_and_compute_dump() -> None:
    dumped: object = tc.AcceleratorSpec(accelerator=tc.Accelerator.H100, count=8).model_dump()
    assert dumped == "H100:8"
    single: object = tc.AcceleratorSpec(accelerator=tc.Accelerator.H100).model_dump()
    assert single == "H100"
    assert tc.AcceleratorSpec(accelerator=tc.Accelerator.H100, count=0).model_dump() is None
    assert tc.AcceleratorSpec().model_dump() is None
    zero = tc.AcceleratorSpec(accelerator=tc.Accelerator.H100, count=0)
    dump = d.Compute(accelerator=zero, availability_model=d.AvailabilityModel.SPOT).model_dump()
    assert dump["accelerator"] == {"accelerator": "H100", "count": 0}
    assert dump["availability_model"] == "spot"
    assert d.Compute().model_dump()["accelerator"] is None
    job_dump = _job(compute=d.Compute(accelerator="L4:2")).model_dump()
    assert job_dump["compute"]["accelerator"] == {"accelerator": "L4", "count": 2}
    assert "job" not in d.TrainingProject(name="p", job=_job()).model_dump()


# --- weights -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    ["hf://gpt2", "hf://owner/repo", "hf://owner/repo@main", "hf://a/b@c@d", "s3://bucket", "s3://b/p",
     "gs://b/p", "azure://acct/c/p", "r2://account_id.bucket/path", "cw://b/p", "https://example.com/m.bin"],
)  # fmt: skip
def test_weights_sources_accepted(source: str) -> None:
    assert tc.WeightsSource(source=source, mount_location="/m").source == source


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("bucket/path", "Source 'bucket/path' is missing a URI scheme. Supported schemes: azure://, cw://"),
        ("http://x/y", "Unsupported source scheme 'http://'."),
        ("ftp://x/y", "Unsupported source scheme 'ftp://'."),
        ("HF://a/b", "Unsupported source scheme 'HF://'."),
        ("s3://", "Invalid S3 URI format: 's3://'. Expected format: s3://bucket/path"),
        ("s3:///b", "Invalid S3 URI format"),
        ("gs://", "Invalid GS URI format"),
        ("azure://", "Invalid AZURE URI format"),
        ("r2://", "Invalid R2 URI format"),
        ("cw://", "Invalid CW URI format"),
        ("hf://", "Invalid HuggingFace URI format: 'hf://'. Expected format: hf://owner/repo"),
        ("hf:///x", "Invalid HuggingFace URI format"),
        ("https://", "Invalid HTTPS URL format: 'https://'. Expected format: https://hostname/path"),
        (
            "s3://b/p@v1",
            "The @ revision syntax is only valid for HuggingFace sources (hf://). "
            "Source 's3://b/p@v1' uses S3 which does not support revisions.",
        ),
        ("gs://b@x", "uses GS which does not support revisions"),
        ("", "at least 1 character"),
    ],
)
def test_weights_source_errors(source: str, message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as exc:
        tc.WeightsSource(source=source, mount_location="/m")
    assert message in _err(exc)


def test_weights_mount_location_and_patterns() -> None:
    with pytest.raises(pydantic.ValidationError, match="mount_location must be an absolute path"):
        tc.WeightsSource(source="hf://a/b", mount_location="rel")
    assert tc.WeightsSource(source="hf://a/b", mount_location="/m/../x/").mount_location == "/m/../x/"
    with pytest.raises(pydantic.ValidationError):
        tc.WeightsSource(source="hf://a/b", mount_location="/m", allow_patterns="*.md")
    assert tc.WeightsSource(source="hf://a/b", mount_location="/m").is_huggingface


def test_weights_auth_rules() -> None:
    ok = tc.WeightsAuth(auth_method="custom_secret", auth_secret_name="s")
    assert ok.auth_method is tc.WeightsAuthMethod.CUSTOM_SECRET
    cases = [
        (
            {"auth_method": "CUSTOM_SECRET"},
            "auth_secret_name must be provided when auth_method is CUSTOM_SECRET",
        ),
        ({"auth_method": "CUSTOM_SECRET", "auth_secret_name": ""}, "auth_secret_name must be provided"),
        (
            {"auth_method": "CUSTOM_SECRET", "auth_secret_name": "s", "aws_oidc_region": "r"},
            "aws_oidc_region cannot be specified when auth_method is CUSTOM_SECRET",
        ),
        (
            {"auth_method": "AWS_OIDC"},
            "aws_oidc_role_arn, aws_oidc_region must be provided when auth_method is AWS_OIDC",
        ),
        (
            {
                "auth_method": "AWS_OIDC",
                "aws_oidc_role_arn": "a",
                "aws_oidc_region": "r",
                "auth_secret_name": "s",
            },
            "auth_secret_name cannot be specified when auth_method is AWS_OIDC",
        ),
        (
            {"auth_method": "GCP_OIDC", "gcp_oidc_service_account": "a"},
            "gcp_oidc_workload_id_provider must be provided when auth_method is GCP_OIDC",
        ),
        ({"auth_method": "BOGUS"}, "Input should be 'CUSTOM_SECRET', 'AWS_OIDC' or 'GCP_OIDC'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(pydantic.ValidationError) as exc:
            tc.WeightsAuth(**kwargs)
        assert message in _err(exc), kwargs
    assert tc.WeightsAuth(
        auth_method="AWS_OIDC", aws_oidc_role_arn="a", aws_oidc_region="r", auth_secret_name=""
    )


def test_weights_secret_name_in_one_place_only() -> None:
    with pytest.raises(
        pydantic.ValidationError, match="cannot be specified both at the top level and in auth"
    ):
        tc.WeightsSource(
            source="hf://a/b",
            mount_location="/m",
            auth_secret_name="x",
            auth={"auth_method": "CUSTOM_SECRET", "auth_secret_name": "y"},
        )
    assert tc.WeightsSource(source="s3://b/p", mount_location="/m", auth_secret_name="x").auth is None


def test_training_job_rejects_oidc_weights_and_accepts_duplicates() -> None:
    oidc = tc.WeightsSource(
        source="s3://b/p",
        mount_location="/m",
        auth={"auth_method": "AWS_OIDC", "aws_oidc_role_arn": "a", "aws_oidc_region": "r"},
    )
    with pytest.raises(pydantic.ValidationError, match="weight s3://b/p: only auth_method CUSTOM_SECRET"):
        _job(weights=[oidc])
    dup = [tc.WeightsSource(source="hf://a/b", mount_location="/m")] * 2
    assert len(_job(weights=dup).weights) == 2


# --- runtime, sessions, images, workspace ------------------------------------------------------


def test_enable_cache_migrates_to_cache_config() -> None:
    rt = d.Runtime(enable_cache=True)
    assert rt.enable_cache is None
    assert rt.cache_config == d.CacheConfig(enabled=True, enable_legacy_hf_mount=True)
    assert d.Runtime(enable_cache=False).cache_config == d.CacheConfig()
    assert rt.model_dump()["enable_cache"] is None
    with pytest.raises(pydantic.ValidationError, match="Cannot set both 'enable_cache' and 'cache_config'"):
        d.Runtime(enable_cache=True, cache_config=d.CacheConfig())
    with pytest.raises(pydantic.ValidationError, match="enable_cache"):
        d.Runtime(enable_cache="yes")


def test_interactive_session_enums() -> None:
    assert [t.value for t in d.InteractiveSessionTrigger] == ["on_startup", "on_failure", "on_demand"]
    assert [p.value for p in d.InteractiveSessionProvider] == ["vs_code", "cursor", "ssh"]
    assert [p.value for p in d.InteractiveSessionAuthProvider] == ["github", "microsoft"]
    s = d.InteractiveSession(trigger=d.InteractiveSessionTrigger.ON_STARTUP, timeout_minutes=-1)
    assert s.session_provider is d.InteractiveSessionProvider.VS_CODE
    assert s.auth_provider is d.InteractiveSessionAuthProvider.MICROSOFT


def test_docker_auth() -> None:
    assert [t.value for t in tc.DockerAuthType] == [
        "GCP_SERVICE_ACCOUNT_JSON", "AWS_IAM", "AWS_OIDC", "GCP_OIDC", "REGISTRY_SECRET",
    ]  # fmt: skip
    # No cross-field check upstream.
    assert d.DockerAuth(auth_method=tc.DockerAuthType.AWS_IAM, registry="r").aws_iam_docker_auth is None
    with pytest.raises(pydantic.ValidationError):
        d.DockerAuth(auth_method=tc.DockerAuthType.AWS_IAM)  # type: ignore[call-arg]
    reg = d.RegistrySecretDockerAuth(secret_ref=d.SecretReference(name="dockerhub"))
    auth = d.DockerAuth(
        auth_method=tc.DockerAuthType.REGISTRY_SECRET, registry="docker.io", registry_secret_docker_auth=reg
    )
    assert auth.registry_secret_docker_auth == reg
    assert d.SecretReference(name="").model_dump() == {"name": ""}


def test_workspace() -> None:
    ws = d.Workspace(workspace_root="..", external_dirs=["../shared"], exclude_dirs=["data"])
    assert ws.external_dirs == ["../shared"]
    assert d.Workspace() == d.Workspace(workspace_root=None, external_dirs=[], exclude_dirs=[])


# --- checkpoints -------------------------------------------------------------------------------


def test_load_checkpoint_smart_union() -> None:
    cfg = d.LoadCheckpointConfig(
        checkpoints=[
            {"checkpoint_name": "c", "job_id": "j"},
            {"job_id": "j"},
            {"run_id": "r", "checkpoint_name": "c"},
        ]
    )
    assert [type(c).__name__ for c in cfg.checkpoints] == [
        "_BasetenNamedCheckpoint", "_BasetenLatestCheckpoint", "_LoopsCheckpoint",
    ]  # fmt: skip
    assert d.LoadCheckpointConfig(checkpoints=[]).checkpoints == []
    assert next(iter(cfg.checkpoints[0].model_dump())) == "typ"


def test_checkpoint_factories() -> None:
    latest = d.BasetenCheckpoint.from_latest_checkpoint(project_name="p")
    assert latest.typ == "baseten_latest_checkpoint" and latest.job_id is None
    named = d.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="c", job_id="j")
    assert named.typ == "baseten_named_checkpoint"
    loops = d.LoopsCheckpoint.from_checkpoint("r", "c")
    assert (loops.typ, loops.target) == ("loops_checkpoint", "trainer")
    assert d.LoopsCheckpoint.from_checkpoint("r", "c", target="sampler").target == "sampler"
    with pytest.raises(pydantic.ValidationError):
        d.LoopsCheckpoint.from_checkpoint("r", "c", target="other")  # type: ignore[arg-type]
    with pytest.raises(TypeError):  # upstream quirk: an unbuildable ValidationError
        d.BasetenCheckpoint.from_latest_checkpoint()
    with pytest.raises(pydantic.ValidationError):
        d.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="c", job_id=None)  # type: ignore[arg-type]


def test_deploy_checkpoint_classes() -> None:
    assert [f.value for f in d.ModelWeightsFormat] == ["lora", "full", "whisper"]
    assert (
        d.FullCheckpoint(training_job_id="j", checkpoint_name="c").model_weight_format
        is d.ModelWeightsFormat.FULL
    )
    assert (
        d.WhisperCheckpoint(training_job_id="j", checkpoint_name="c").model_weight_format.value == "whisper"
    )
    lora = d.LoRACheckpoint(training_job_id="j", checkpoint_name="c")
    assert lora.lora_details.rank == 16 and lora.model_weight_format is d.ModelWeightsFormat.LORA
    assert (
        d.FullCheckpoint(
            training_job_id="j", checkpoint_name="c", model_weight_format="lora"
        ).model_weight_format
        == "lora"
    )
    assert d.Checkpoint(
        training_job_id="j", checkpoint_name="c", model_weight_format=d.ModelWeightsFormat.FULL
    )
    lst = d.CheckpointList(checkpoints=[lora])
    assert "lora_details" not in lst.model_dump()["checkpoints"][0]
    with pytest.raises(
        pydantic.ValidationError, match="Cannot mix training job checkpoints and loops checkpoints"
    ):
        d.CheckpointList(checkpoints=[lora], loops_checkpoint_ids=["x"])
    cfg = d.DeployCheckpointsConfig(runtime=d.DeployCheckpointsRuntime(environment_variables={"A": "b"}))
    assert cfg.compute is None and cfg.model_name is None


def test_definitions_module_surface() -> None:
    for name in (
        "InteractiveSession",
        "WhisperCheckpoint",
        "Checkpoint",
        "truss_config",
        "DEFAULT_LORA_RANK",
    ):
        assert hasattr(d, name)
    assert d.truss_config is tc
    assert all(hasattr(d, n) for n in d.__all__)
