"""Issue 10 item 6: every accepted-but-ignored field prints one warning naming the field and why.

Each config goes through the real loader (which rebuilds the models, so "is the field set" must be
judged by value) and through ``bt-sbatch --dry-run`` for the printed form.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_bt.cli.submit_cmd import bt_sbatch_command
from slurm_bt.compat.loader import load_training_project
from slurm_bt.errors import ConfigError
from slurm_bt.job_spec import build_job_spec
from slurm_bt.site.settings import SiteSettings
from tests.spec_helpers import fixed_context

PYXIS = SiteSettings(container_runtime="pyxis", storage={"scratch": "/local/scratch", "node_cache": "/local/weights"})
HEADER = """\
from truss_train import definitions
from truss.base import truss_config
"""


def _config(tmp_path: Path, job_body: str, project_extra: str = "") -> Path:
    path = tmp_path / "config.py"
    path.write_text(HEADER + textwrap.dedent(f"""
        project = definitions.TrainingProject(
            name="silent-drops",{project_extra}
            job=definitions.TrainingJob(
                image=definitions.Image(base_image="nvcr.io/nvidia/pytorch:24.01-py3"),
                {job_body}
            ),
        )
    """))
    return path


def _warnings(path: Path, runtime: str = "none") -> list[str]:
    site = PYXIS if runtime == "pyxis" else SiteSettings()
    spec = build_job_spec(load_training_project(path), site, fixed_context(path))
    return list(spec.warnings)


def _about(warnings: list[str], field: str) -> list[str]:
    return [w for w in warnings if w.startswith(field)]


def test_a_plain_config_warns_only_about_the_image_on_a_host_site(tmp_path: Path) -> None:
    path = _config(tmp_path, 'runtime=definitions.Runtime(start_commands=["true"]),')
    [image] = _warnings(path)
    assert image.startswith("job.image.base_image='nvcr.io/nvidia/pytorch:24.01-py3' is ignored")
    assert 'container_runtime = "none"' in image
    assert _warnings(path, runtime="pyxis") == []  # with containers the image is used


@pytest.mark.parametrize(("body", "extra", "field", "why"), [
    ('runtime=definitions.Runtime(checkpointing_config=definitions.CheckpointingConfig(enabled=True, '
     'volume_size_gib=500)),', "", "job.runtime.checkpointing_config.volume_size_gib=500", "scratch"),
    ('runtime=definitions.Runtime(cache_config=definitions.CacheConfig(enabled=True, '
     'require_cache_affinity=False)),', "", "job.runtime.cache_config.require_cache_affinity=False",
     "shared filesystem"),
    ('runtime=definitions.Runtime(),', ' team_name="ml-research",', "team_name='ml-research'",
     "--account"),
    ('runtime=definitions.Runtime(cache_config=definitions.CacheConfig(enabled=True, '
     'mount_base_path="/cache")),', "", "job.runtime.cache_config.mount_base_path='/cache'", "$BT_RW_CACHE_DIR"),
    ('runtime=definitions.Runtime(load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, '
     'download_folder="/ckpt", checkpoints=[definitions.BasetenCheckpoint.from_named_checkpoint('
     'checkpoint_name="checkpoint-1", job_id="123")])),', "",
     "job.runtime.load_checkpoint_config.download_folder='/ckpt'", "$BT_LOAD_CHECKPOINT_DIR"),
])
def test_each_ignored_field_warns_once_with_its_reason(tmp_path: Path, body: str, extra: str, field: str,
                                                       why: str) -> None:
    """Failed before: volume_size_gib, require_cache_affinity and team_name passed without a word."""
    warnings = _warnings(_config(tmp_path, body, extra))
    [warning] = _about(warnings, field)
    assert "ignored" in warning and why in warning


def test_defaults_are_not_warned_about(tmp_path: Path) -> None:
    """Values the user did not change (even when spelled out) change nothing: no noise."""
    body = ('runtime=definitions.Runtime(cache_config=definitions.CacheConfig(enabled=True, '
            'require_cache_affinity=True, mount_base_path="/root/.cache"), '
            'checkpointing_config=definitions.CheckpointingConfig(enabled=True)),')
    assert [w for w in _warnings(_config(tmp_path, body)) if not w.startswith("job.image.base_image")] == []


def test_registry_auth_is_ignored_without_containers(tmp_path: Path) -> None:
    path = tmp_path / "config.py"
    path.write_text(HEADER + textwrap.dedent("""
        project = definitions.TrainingProject(name="auth", job=definitions.TrainingJob(
            image=definitions.Image(base_image="ghcr.io/acme/t:1", docker_auth=definitions.DockerAuth(
                auth_method=truss_config.DockerAuthType.REGISTRY_SECRET, registry="ghcr.io",
                registry_secret_docker_auth=definitions.RegistrySecretDockerAuth(
                    secret_ref=definitions.SecretReference(name="ghcr-token"))))))
    """))
    project = load_training_project(path)
    host = build_job_spec(project, SiteSettings(), fixed_context(path))
    assert _about(list(host.warnings), "job.image.docker_auth is ignored")
    assert host.docker_auth is None and host.secret_names() == []  # so a missing secret cannot fail it
    pyxis = build_job_spec(project, PYXIS, fixed_context(path))
    assert pyxis.secret_names() == ["ghcr-token"] and not _about(list(pyxis.warnings), "job.image")


def test_oidc_credentials_are_refused_not_dropped(tmp_path: Path) -> None:
    """Registry OIDC is refused by slurm-bt (stricter), weights OIDC by upstream's own validator."""
    image = tmp_path / "image"
    image.mkdir()
    (image / "config.py").write_text(HEADER + textwrap.dedent("""
        project = definitions.TrainingProject(name="auth", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x.dkr.ecr.us-east-1.amazonaws.com/t:1",
                docker_auth=definitions.DockerAuth(auth_method=truss_config.DockerAuthType.AWS_OIDC,
                    registry="x.dkr.ecr.us-east-1.amazonaws.com"))))
    """))
    with pytest.raises(ConfigError) as err:
        build_job_spec(load_training_project(image / "config.py"), SiteSettings(), fixed_context(image))
    assert [p.loc for p in err.value.problems] == ["job.image.docker_auth.auth_method"]
    body = ('weights=[truss_config.WeightsSource(source="s3://bucket/model", mount_location="/models/m", '
            'auth=truss_config.WeightsAuth(auth_method="AWS_OIDC", aws_oidc_role_arn="arn:aws:iam::1:role/r", '
            'aws_oidc_region="us-east-1"))],')
    with pytest.raises(ConfigError, match="OIDC"):
        load_training_project(_config(tmp_path, body))


def test_dry_run_prints_each_warning_once(tmp_path: Path) -> None:
    path = _config(tmp_path, 'runtime=definitions.Runtime(checkpointing_config=definitions.CheckpointingConfig('
                             'enabled=True, volume_size_gib=100)),', ' team_name="t1",')
    result = CliRunner().invoke(bt_sbatch_command, ["--dry-run", str(path)])
    assert result.exit_code == 0, result.output
    err = result.stderr
    for field in ("team_name='t1' is ignored", "volume_size_gib=100 is ignored", "base_image="):
        assert err.count(field) == 1, err


def test_unknown_keys_the_lax_models_keep_are_warned_about(tmp_path: Path) -> None:
    """WeightsSource/AcceleratorSpec keep extra keys as upstream does; nothing here reads them."""
    body = ('compute=definitions.Compute(accelerator={"accelerator": "H100", "count": 1, "shape": "big"}),\n'
            '                weights=[truss_config.WeightsSource(source="hf://Qwen/Qwen3-0.6B", '
            'mount_location="/models/m", revison="abc")],')
    warnings = _warnings(_config(tmp_path, body))
    assert len(_about(warnings, "job.compute.accelerator.shape is ignored")) == 1
    assert len(_about(warnings, "job.weights[0].revison is ignored")) == 1
