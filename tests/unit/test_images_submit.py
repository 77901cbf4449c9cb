"""bt-sbatch with an image (FakeSlurm, real registries on 127.0.0.1): pin, staging decision, job-dir contract."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from slurm_bt.errors import ConfigError
from slurm_bt.images.entry import job_image_manifest_path
from slurm_bt.images.stage import image_plan_path
from slurm_bt.site.settings import load_site_settings
from slurm_bt.submit import submit_config
from tests.fakes.fake_slurm import FakeSlurm
from tests.servers.oci_registry import OciRegistries

CONFIG = """
from truss_train import definitions
project = definitions.TrainingProject(name="imgdemo", job=definitions.TrainingJob(
    image=definitions.Image(base_image={image!r}),
    runtime=definitions.Runtime(start_commands=["python -c 'print(1)'"])))
"""


@pytest.fixture()
def env(isolated_home: Path, oci_registries: OciRegistries) -> dict[str, str]:
    site = isolated_home / "site.toml"
    site.write_text('container_runtime = "apptainer"\n' + site.read_text()
                    + f'secrets = "{isolated_home}/secrets"\ncluster_cache = "{isolated_home}/cc"\n'
                    + oci_registries.site_toml())
    return {"SLURM_BT_SITE_CONFIG": str(site), "PATH": os.environ["PATH"]}


def _project(tmp: Path, image: str) -> Path:
    d = tmp / f"proj-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    (d / "config.py").write_text(CONFIG.format(image=image))
    return d / "config.py"


def test_cold_image_is_pinned_and_staged_before_the_job(env: dict[str, str], oci_registries: OciRegistries,
                                                        tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-submit", tag, {"etc/t": tag.encode()})
    slurm = FakeSlurm()
    result = submit_config(_project(tmp_path, f"pytest-submit:{tag}"), runner=slurm,
                           site=load_site_settings(environ=env), environ=env)
    pin = result.spec.image_pin
    assert pin is not None and pin.digest == digest and pin.reference == f"pytest-submit:{tag}"
    job_dir = Path(result.spec.context.job_dir)
    assert json.loads((job_dir / "job.json").read_text())["image_pin"]["digest"] == digest
    assert result.as_dict()["image"]["resolved"] == f"{oci_registries.public.host}/library/pytest-submit@{digest}"
    staging, training = slurm.calls_to("sbatch")
    assert "--hold" in staging.argv and "slurm_bt.steps.stage_weights" in (staging.stdin or "")
    assert f"--dependency=afterok:{result.staging_job_id}" in training.argv
    assert image_plan_path(job_dir).is_file() and not job_image_manifest_path(job_dir).exists()
    # the staging step (run here as this user) mirrors it and writes the job's manifest
    from slurm_bt.steps.stage_weights import main

    assert main([str(job_dir)]) == 0
    m = json.loads(job_image_manifest_path(job_dir).read_text())
    assert m["kind"] == "oci" and m["revision"] == digest and m["files"][0]["path"] == "image.sqfs"
    # the next submission of the same digest: no staging job, the manifest written at submit
    slurm2 = FakeSlurm()
    again = submit_config(_project(tmp_path, f"pytest-submit:{tag}"), runner=slurm2,
                          site=load_site_settings(environ=env), environ=env)
    assert again.staging_job_id is None and len(slurm2.calls_to("sbatch")) == 1
    assert json.loads(job_image_manifest_path(again.spec.context.job_dir).read_text()) == m
    # status --json's image field (slurm_bt/images/status.py)
    from slurm_bt.images.status import image_status
    from slurm_bt.records import read_record

    rec = read_record(Path(again.spec.storage["workspace"]), again.job_id or "")
    shown = image_status(rec)
    assert shown is not None and shown["digest"] == digest and shown["in_cluster_cache"] is True


def test_missing_tag_fails_the_submission_with_nothing_written(env: dict[str, str], isolated_home: Path,
                                                                tmp_path: Path) -> None:
    slurm = FakeSlurm()
    with pytest.raises(ConfigError) as err:
        submit_config(_project(tmp_path, "pytest-submit:never-pushed"), runner=slurm,
                      site=load_site_settings(environ=env), environ=env)
    assert err.value.exit_code == 2 and "job.image.base_image" in str(err.value)
    assert slurm.calls == []
    assert not list((isolated_home / "ws").rglob("job.json"))


def test_dry_run_shows_the_pin(env: dict[str, str], oci_registries: OciRegistries, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-dry", tag, {})
    slurm = FakeSlurm()
    result = submit_config(_project(tmp_path, f"pytest-dry:{tag}"), runner=slurm, dry_run=True,
                           site=load_site_settings(environ=env), environ=env)
    assert result.spec.image_pin is not None and result.spec.image_pin.digest == digest
    assert slurm.calls_to("sbatch") == []


def test_cache_warm_shared_makes_every_teams_submission_skip_staging(env: dict[str, str],
                                                                      oci_registries: OciRegistries,
                                                                      tmp_path: Path) -> None:
    """An admin warms a public image into the shared tier; a job then needs no staging job for it."""
    from click.testing import CliRunner

    from slurm_bt.cli.main import cli

    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-warm", tag, {})
    run = CliRunner().invoke(cli, ["cache", "warm", "--shared", f"docker://pytest-warm:{tag}"], env=env)
    assert run.exit_code == 0, run.output
    assert f"@{digest}" in run.output and "mirrored into the cluster cache" in run.output
    again = CliRunner().invoke(cli, ["cache", "warm", "--shared", f"docker://pytest-warm:{tag}"], env=env)
    assert "already in the cluster cache" in again.output
    slurm = FakeSlurm()
    result = submit_config(_project(tmp_path, f"pytest-warm:{tag}"), runner=slurm,
                           site=load_site_settings(environ=env), environ=env)
    assert result.staging_job_id is None and len(slurm.calls_to("sbatch")) == 1
    m = json.loads(job_image_manifest_path(result.spec.context.job_dir).read_text())
    assert m["revision"] == digest
    ls = CliRunner().invoke(cli, ["cache", "ls"], env=env)
    assert f"image {oci_registries.public.host}/library/pytest-warm@{digest}" in ls.output
