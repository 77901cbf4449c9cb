"""load_training_project: upstream discovery and raising rules, every problem of what escapes reported."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_bt.compat import definitions as d
from slurm_bt.compat import load_training_project
from slurm_bt.compat.truss_config import AcceleratorSpec as AcceleratorSpecT
from slurm_bt.errors import ConfigError, Problem

HEADER = """\
from truss_train import definitions, TrainingProject, TrainingJob, Image, Compute, Runtime, WeightsSource
from truss.base.truss_config import AcceleratorSpec, Accelerator
"""
IMAGE = 'Image(base_image="pytorch/pytorch:2.7.0")'


def _write(tmp_path: Path, body: str, name: str = "config.py", header: bool = True) -> Path:
    path = tmp_path / name
    path.write_text((HEADER if header else "") + textwrap.dedent(body))
    return path


def _problems(path: Path) -> list[Problem]:
    with pytest.raises(ConfigError) as exc:
        load_training_project(path)
    assert exc.value.source == str(path)
    return exc.value.problems


def _lines(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_training_project(path)
    return exc.value.lines()


def _by_loc(path: Path) -> dict[str, str]:
    return {p.loc: p.message for p in _problems(path)}


# --- valid configs -----------------------------------------------------------------------------


def test_valid_config_returns_a_fully_validated_project(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"""
        job = TrainingJob(
            image={IMAGE},
            compute=Compute(
                node_count=2,
                memory="64Gi",
                accelerator=AcceleratorSpec(accelerator=Accelerator.H100, count=8),
            ),
            runtime=Runtime(
                start_commands=["python train.py"],
                environment_variables={{"A": "1", "HF_TOKEN": definitions.SecretReference(name="hf")}},
                enable_cache=True,
                load_checkpoint_config=definitions.LoadCheckpointConfig(
                    checkpoints=[
                        definitions.BasetenCheckpoint.from_named_checkpoint("c", "j"),
                        definitions.LoopsCheckpoint.from_checkpoint("r", "c", target="sampler"),
                    ]
                ),
            ),
            weights=[WeightsSource(source="hf://a/b@main", mount_location="/app/models/b", extra_key=1)],
            interactive_session=definitions.InteractiveSession(trigger=definitions.InteractiveSessionTrigger.ON_FAILURE),
        )
        job.compute.cpu_count = 8
        project = TrainingProject(name="p", job=job)
        """,
    )
    project = load_training_project(path)
    assert isinstance(project, d.TrainingProject)
    job = project.job
    assert job.compute.node_count == 2 and job.compute.cpu_count == 8
    assert job.compute.accelerator is not None and job.compute.accelerator.count == 8
    assert job.runtime.environment_variables["HF_TOKEN"] == d.SecretReference(name="hf")
    assert job.runtime.cache_config == d.CacheConfig(enabled=True, enable_legacy_hf_mount=True)
    assert job.runtime.load_checkpoint_config is not None
    kinds = [type(c).__name__ for c in job.runtime.load_checkpoint_config.checkpoints]
    assert kinds == ["_BasetenNamedCheckpoint", "_LoopsCheckpoint"]
    assert job.weights[0].model_extra == {"extra_key": 1}
    assert job.interactive_session is not None
    assert job.interactive_session.trigger is d.InteractiveSessionTrigger.ON_FAILURE
    # The result passes strict validation again: it is not a model_construct placeholder.
    assert d.TrainingProject.model_validate(project.model_dump() | {"job": job}) is not None


def test_module_is_not_registered_and_dir_not_on_sys_path(tmp_path: Path) -> None:
    _write(tmp_path, "VALUE = 1\n", name="helper.py", header=False)
    path = _write(
        tmp_path, f"project = TrainingProject(name='p', job=TrainingJob(image={IMAGE}))\n", name="mycfg.py"
    )
    before_path = list(sys.path)
    load_training_project(path)
    assert "mycfg" not in sys.modules and sys.path == before_path
    sibling = _write(tmp_path, "import helper\n", name="uses_helper.py")
    [problem] = _problems(sibling)
    assert problem.message == "line 3: ModuleNotFoundError: No module named 'helper'"


def test_module_name_is_the_file_stem(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "assert __name__ == 'stem_name'\n"
        f"project = TrainingProject(name=__name__, job=TrainingJob(image={IMAGE}))\n",
        name="stem_name.py",
    )
    assert load_training_project(path).name == "stem_name"


def test_accepts_pathlike_and_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, f"p = TrainingProject(name='p', job=TrainingJob(image={IMAGE}))\n")
    monkeypatch.chdir(tmp_path)
    assert load_training_project("config.py").name == "p"
    assert load_training_project(Path("config.py")).name == "p"


# --- discovery ---------------------------------------------------------------------------------


def test_not_a_file(tmp_path: Path) -> None:
    for target in (tmp_path, tmp_path / "missing.py"):
        with pytest.raises(ConfigError) as exc:
            load_training_project(target)
        assert exc.value.problems == [
            Problem(
                "",
                f"`{target}` is not a file. You must point to a python file where the training "
                "configuration is defined.",
            )
        ]


def test_no_project(tmp_path: Path) -> None:
    path = _write(
        tmp_path, f"job = TrainingJob(image={IMAGE})\nprojects = [TrainingProject(name='p', job=job)]\n"
    )
    assert _problems(path) == [
        Problem("", "No `<class 'truss_train.definitions.TrainingProject'>` was found.")
    ]


def test_two_projects(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"""
        a = TrainingProject(name="a", job=TrainingJob(image={IMAGE}))
        b = TrainingProject(name="b", job=TrainingJob(image={IMAGE}))
        """,
    )
    assert _problems(path) == [
        Problem("", "Multiple `<class 'truss_train.definitions.TrainingProject'>`s were found.")
    ]


def test_alias_counts_twice(tmp_path: Path) -> None:
    path = _write(tmp_path, f"a = TrainingProject(name='a', job=TrainingJob(image={IMAGE}))\nb = a\n")
    assert [p.message for p in _problems(path)] == [
        "Multiple `<class 'truss_train.definitions.TrainingProject'>`s were found."
    ]


def test_private_and_imported_names_count(tmp_path: Path) -> None:
    path = _write(tmp_path, f"_hidden = TrainingProject(name='h', job=TrainingJob(image={IMAGE}))\n")
    assert load_training_project(path).name == "h"


def test_deploy_checkpoints_config_may_coexist(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"""
        deploy = definitions.DeployCheckpointsConfig(model_name="m")
        project = TrainingProject(name="p", job=TrainingJob(image={IMAGE}))
        """,
    )
    assert load_training_project(path).name == "p"


# --- exceptions raised by the config -----------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("x = undefined_name\n", "line 3: NameError: name 'undefined_name' is not defined"),
        ("x = (\n", "line 3: SyntaxError: '(' was never closed"),
        ("raise RuntimeError('multi\\nline')\n", "line 3: RuntimeError: multi line"),
        ("import sys\nsys.exit(3)\n", "line 4: SystemExit: 3"),
        (
            "definitions.BasetenCheckpoint.from_latest_checkpoint()\n",
            "(BasetenCheckpoint.from_latest_checkpoint() needs project_name or job_id)",
        ),
        (
            "def helper():\n    return 1 / 0\n\nhelper()\n",
            "line 4: ZeroDivisionError: division by zero",
        ),
        (
            "from truss.base.truss_config import TrussConfig\n",
            "line 3: ImportError: truss.base.truss_config.TrussConfig is not available in slurm-bt: part of a "
            "truss model's serving config (Baseten model deployment), not of a training job",
        ),
        (
            "from truss_train.deployment import prepare_push\n",
            "line 3: ImportError: truss_train.deployment.prepare_push is not available in slurm-bt: it talks to "
            "Baseten's API (uploads, project upserts); on Slurm use truss_train.push",
        ),
        (
            "from truss.base import constants\nconstants.TEMPLATES_DIR\n",
            "line 4: AttributeError: truss.base.constants.TEMPLATES_DIR is not available in slurm-bt: a directory "
            "inside an installed truss (serving templates); slurm-bt does not ship truss's files",
        ),
        (
            "import truss_train.restore_from_checkpoint\n",
            "line 3: ModuleNotFoundError: No module named 'truss_train.restore_from_checkpoint' (slurm-bt "
            "provides only truss, truss.base, truss.base.truss_config, truss.base.constants, "
            "truss.base.custom_types, truss_train, truss_train.definitions, truss_train.public_api, "
            "truss_train.loader, truss_train.deployment)",
        ),
        (
            "Compute(accelerator=5)\n",
            "line 3: TypeError: Expected string, dict, AcceleratorSpec, or None; got <class 'int'>",
        ),
    ],
)
def test_config_exception_is_one_line(tmp_path: Path, body: str, expected: str) -> None:
    path = _write(tmp_path, body)
    [problem] = _problems(path)
    assert problem.loc == ""
    if expected.startswith("("):  # the TypeError text itself depends on the pydantic version
        assert problem.message.startswith("line 3: TypeError: ") and problem.message.endswith(expected)
    else:
        assert problem.message == expected


# --- a validation error raises where it happens (upstream), and is reported when it escapes ---------------


def test_config_fallback_on_validation_error_runs(tmp_path: Path) -> None:
    body = f"""
    from pydantic import ValidationError
    try:
        compute = Compute(accelerator=AcceleratorSpec(accelerator="H1000", count=8))
    except ValidationError:
        compute = Compute(accelerator="H100:4")
    job = TrainingJob(image={IMAGE}, compute=compute)
    try:
        job.compute.node_count = "2"
    except ValidationError:
        job.compute.node_count = 2
    p = TrainingProject(name="p", job=job)
    """
    job = load_training_project(_write(tmp_path, body)).job
    assert job.compute.accelerator == AcceleratorSpecT(accelerator=d.truss_config.Accelerator.H100, count=4)
    assert job.compute.node_count == 2


def test_escaped_validation_error_gives_each_error_with_line_and_field(tmp_path: Path) -> None:
    body = """
    job = TrainingJob(
        image={"base_image": 1},
        compute={"node_count": "2", "accelerator": "H1000", "availability_model": "spot"},
    )
    p = TrainingProject(name="p", job=job)
    """
    path = _write(tmp_path, body)
    lines = _lines(path)
    assert lines[0] == f"{path}: TrainingJob.image.base_image: line 4: expected a string, got 1 (int)"
    assert lines[1] == f"{path}: TrainingJob.compute.node_count: line 4: expected an integer, got '2' (str)"
    assert lines[2].startswith(f"{path}: TrainingJob.compute.accelerator: line 4: Unsupported accelerator type")
    assert "B10" in lines[2]  # upstream's own message, kept verbatim
    assert lines[3] == (
        f"{path}: TrainingJob.compute.availability_model: line 4: got the string 'spot'; write "
        "AvailabilityModel.SPOT (this field takes enum members, not strings)"
    )
    assert len(lines) == 4


def test_first_failing_constructor_stops_the_config_as_upstream(tmp_path: Path) -> None:
    path = _write(tmp_path, "c = Compute(node_count='2')\nundefined\n")
    assert _by_loc(path) == {"Compute.node_count": "line 3: expected an integer, got '2' (str)"}


@pytest.mark.parametrize(
    ("body", "loc", "message"),
    [
        ("Compute(nodes_count=2)", "Compute.nodes_count",
         "unknown field 'nodes_count'; did you mean 'node_count'?"),
        ("definitions.CacheConfig(enabled=True, enable_legacy_hf_cache=True)", "CacheConfig.enable_legacy_hf_cache",
         "unknown field 'enable_legacy_hf_cache'; did you mean 'enable_legacy_hf_mount'?"),
        ("definitions.CheckpointingConfig(enabled='yes')", "CheckpointingConfig.enabled",
         "expected a bool (True or False), got 'yes' (str)"),
        ("Image()", "Image.base_image", "required field is missing"),
        ("definitions.InteractiveSession(trigger='bogus')", "InteractiveSession.trigger",
         "expected one of InteractiveSessionTrigger.ON_STARTUP, InteractiveSessionTrigger.ON_FAILURE, "
         "InteractiveSessionTrigger.ON_DEMAND, got 'bogus' (str)"),
        ("Runtime(enable_cache=True, cache_config=definitions.CacheConfig())", "Runtime",
         "Cannot set both 'enable_cache' and 'cache_config'. 'enable_cache' is deprecated. Prefer "
         "migrating to 'cache_config' with `enabled=True` and `enable_legacy_hf_mount=True`."),
        ("WeightsSource(source='hf://a/b', mount_location='/m', auth={'auth_method': 'CUSTOM_SECRET'})",
         "WeightsSource.auth", "auth_secret_name must be provided when auth_method is CUSTOM_SECRET"),
        ("definitions.LoopsCheckpoint.from_checkpoint(run_id=5, checkpoint_name='c')",
         "LoopsCheckpoint.from_checkpoint().run_id",
         "expected a string, got 5 (int)"),
    ],
)
def test_escaped_error_is_located_at_the_raising_class(tmp_path: Path, body: str, loc: str, message: str) -> None:
    assert _by_loc(_write(tmp_path, f"x = {body}\n")) == {loc: f"line 3: {message}"}


def test_unknown_field_without_close_match_lists_fields(tmp_path: Path) -> None:
    path = _write(tmp_path, f"p = TrainingProject(name='p', job=TrainingJob(image={IMAGE}, zzz=1))\n")
    message = _by_loc(path)["TrainingJob.zzz"]
    assert message.startswith("line 3: unknown field 'zzz'; valid fields: image, compute, runtime")


@pytest.mark.parametrize(
    "body",
    [
        "definitions.AWSIAMDockerAuth(access_key_secret_ref='AKIA_VERY_SECRET', "
        "secret_access_key_secret_ref=definitions.SecretReference(name='ok'))",
        "Runtime(environment_variables={'TOKEN': 12345678})",
        "Runtime(environment_variables={'B': {'name': 99999}})",
    ],
)
def test_secret_values_are_never_echoed(tmp_path: Path, body: str) -> None:
    [problem] = _problems(_write(tmp_path, f"x = {body}\n"))
    text = f"{problem.loc}: {problem.message}"
    assert "AKIA_VERY_SECRET" not in text and "12345678" not in text and "99999" not in text
    assert "a value of type" in problem.message or "required" in problem.message


def test_failed_assignment_raises_at_its_line(tmp_path: Path) -> None:
    body = f"""
    job = TrainingJob(image={IMAGE})
    job.compute.node_count = "2"
    job.priority = "high"
    p = TrainingProject(name="p", job=job)
    """
    assert _by_loc(_write(tmp_path, body)) == {"Compute.node_count": "line 5: expected an integer, got '2' (str)"}


def test_the_configs_own_model_error_is_one_line_per_error(tmp_path: Path) -> None:
    body = """
    import pydantic
    class Mine(pydantic.BaseModel):
        a: int
        b: int
    Mine(a="x", b="y")
    """
    problems = _problems(_write(tmp_path, body))
    assert [(p.loc, p.message) for p in problems] == [
        ("Mine.a", "line 8: expected an integer, got 'x' (str)"),
        ("Mine.b", "line 8: expected an integer, got 'y' (str)"),
    ]


# --- the project as found is checked again top-down ------------------------------------------------


def test_mutations_pydantic_does_not_validate_are_found_with_full_paths(tmp_path: Path) -> None:
    body = f"""
    job = TrainingJob(image={IMAGE})
    job.runtime.start_commands.append(5)
    job.weights.append(WeightsSource.model_construct(source="ftp://x", mount_location="/m"))
    p = TrainingProject(name="p", job=job)
    """
    by_loc = _by_loc(_write(tmp_path, body))
    assert by_loc["job.runtime.start_commands[0]"] == "expected a string, got 5 (int)"
    assert by_loc["job.weights[0].source"].startswith("Unsupported source scheme 'ftp://'")


def test_oidc_rejected_for_training_jobs(tmp_path: Path) -> None:
    body = f"""
    w = WeightsSource(source="s3://b/p", mount_location="/data",
                      auth={{"auth_method": "GCP_OIDC", "gcp_oidc_service_account": "a",
                             "gcp_oidc_workload_id_provider": "p"}})
    p = TrainingProject(name="p", job=TrainingJob(image={IMAGE}, weights=[w]))
    """
    assert _by_loc(_write(tmp_path, body)) == {
        "TrainingJob": (
            "line 7: weight s3://b/p: only auth_method CUSTOM_SECRET with auth_secret_name is supported for "
            "training jobs. OIDC (AWS_OIDC, GCP_OIDC) is not supported."
        )
    }


# --- slurm-bt's stricter checks ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("compute", "loc", "fragment"),
    [
        ("Compute(node_count=0)", "job.compute.node_count", "must be at least 1, got 0"),
        ("Compute(node_count=-1)", "job.compute.node_count", "must be at least 1, got -1"),
        ("Compute(memory='bogus')", "job.compute.memory", "'bogus' is not a number with an optional unit"),
        ("Compute(memory='-1Gi')", "job.compute.memory", "is not a number"),
        ("Compute(memory='2GB')", "job.compute.memory", "unknown unit 'GB'"),
        ("Compute(memory='0Gi')", "job.compute.memory", "must be greater than 0"),
        ("Compute(memory='')", "job.compute.memory", "is not a number"),
    ],
)
def test_stricter_compute_checks(tmp_path: Path, compute: str, loc: str, fragment: str) -> None:
    path = _write(
        tmp_path, f"p = TrainingProject(name='p', job=TrainingJob(image={IMAGE}, compute={compute}))\n"
    )
    [problem] = _problems(path)
    assert problem.loc == loc and fragment in problem.message
    assert problem.message.endswith("(slurm-bt is stricter than truss here)")


@pytest.mark.parametrize(
    "mount",
    ["/", "/m/../x", "/m/./x", "//m", "/m//x", "/etc", "/etc/x", "/proc/1", "/usr/lib/x",
     "/var/spool/slurmd/x", "/var/spool/slurm", "/lib64/x", "/m\nx", "/m\x00", "/" + "a" * 4100],
)  # fmt: skip
def test_stricter_mount_location_checks(tmp_path: Path, mount: str) -> None:
    body = f"""
    w = WeightsSource(source="hf://a/b", mount_location={mount!r})
    p = TrainingProject(name="p", job=TrainingJob(image={IMAGE}, weights=[w]))
    """
    [problem] = _problems(_write(tmp_path, body))
    assert problem.loc == "job.weights[0].mount_location"
    assert problem.message.endswith("(slurm-bt is stricter than truss here)")


@pytest.mark.parametrize(
    "mount", ["/app/models/llama", "/app/models/", "/var/spool/other", "/library", "/data"]
)
def test_safe_mount_locations_pass(tmp_path: Path, mount: str) -> None:
    body = f"""
    w = WeightsSource(source="hf://a/b", mount_location={mount!r})
    p = TrainingProject(name="p", job=TrainingJob(image={IMAGE}, weights=[w]))
    """
    assert load_training_project(_write(tmp_path, body)).job.weights[0].mount_location == mount


def test_every_stricter_problem_is_reported(tmp_path: Path) -> None:
    body = f"""
    c = Compute(node_count=0, cpu_count=0, memory="0Gi")
    w = WeightsSource(source="hf://a/b", mount_location="/etc/x")
    p = TrainingProject(name="p", job=TrainingJob(image={IMAGE}, compute=c, weights=[w]))
    """
    assert set(_by_loc(_write(tmp_path, body))) == {
        "job.compute.cpu_count", "job.compute.node_count", "job.compute.memory", "job.weights[0].mount_location"}


def test_models_raise_normally_after_a_failed_load(tmp_path: Path) -> None:
    path = _write(tmp_path, "Compute(node_count='x')\n")
    with pytest.raises(ConfigError):
        load_training_project(path)
    with pytest.raises(ValueError):
        d.Compute(node_count="x")


def test_source_is_the_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "x = 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as exc:
        load_training_project(os.path.join(".", "config.py"))
    assert exc.value.lines() == [
        "./config.py: No `<class 'truss_train.definitions.TrainingProject'>` was found."
    ]
    assert exc.value.exit_code == 2
