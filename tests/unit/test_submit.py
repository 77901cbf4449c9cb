"""Submission end to end against FakeSlurm: what is written, what sbatch sees, what is left on failure."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_bt.errors import SecretError, SlurmCommandError, UserError
from slurm_bt.secrets_store import SecretStore
from slurm_bt.site.settings import load_site_settings
from slurm_bt.submit import submit_config
from tests.fakes.fake_slurm import FakeSlurm

CANARY = "canary-7f3e9c1d-never-show-me"

CONFIG = """
from truss_train import definitions
project = definitions.TrainingProject(
    name="demo",
    job=definitions.TrainingJob(
        name="first",
        image=definitions.Image(base_image="python:3.11"),
        runtime=definitions.Runtime(
            start_commands=["python train.py"],
            environment_variables={"TOKEN": definitions.SecretReference(name="tok"), "MODE": "fast"},
        ),
    ),
)
"""


@pytest.fixture()
def project_dir(tmp_path: Path) -> Path:
    d = tmp_path / "proj"
    d.mkdir()
    (d / "config.py").write_text(CONFIG)
    (d / "train.py").write_text("print('hi')\n")
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / "x.pyc").write_bytes(b"\0")
    return d


@pytest.fixture()
def site_env(isolated_home: Path) -> dict[str, str]:
    site = isolated_home / "site.toml"
    site.write_text(site.read_text() + f'secrets = "{isolated_home}/secrets"\n')
    return {"SLURM_BT_SITE_CONFIG": str(site), "PATH": os.environ["PATH"], "MY_SECRET_ENV": CANARY}


def _store(home: Path) -> SecretStore:
    return SecretStore(home / "secrets")


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_submit_writes_job_dir_record_and_calls_sbatch_once(project_dir: Path, isolated_home: Path,
                                                             site_env: dict[str, str]) -> None:
    _store(isolated_home).set("tok", CANARY)
    slurm = FakeSlurm()
    result = submit_config(project_dir / "config.py", sbatch_args=["--time=10"], runner=slurm,
                           site=load_site_settings(environ=site_env), environ=site_env)
    assert result.job_id is not None
    [call] = slurm.calls_to("sbatch")
    assert call.argv[:2] == ("sbatch", "--parsable") and "--time=10" in call.argv
    assert call.stdin == result.script
    job_dir = Path(result.spec.context.job_dir)
    assert (job_dir / "src" / "train.py").read_text() == "print('hi')\n"
    assert not (job_dir / "src" / "__pycache__").exists()  # default ignore list
    assert (job_dir / "job.sbatch").read_text() == result.script
    assert os.access(job_dir / "node_entry.sh", os.X_OK)
    record = json.loads(Path(result.record_path or "").read_text())
    assert record["job_id"] == result.job_id and record["project_name"] == "demo"
    assert record["job_dir"] == str(job_dir)
    # the secret's value is nowhere: not in what sbatch got (argv, stdin, env) nor in any written file
    assert CANARY not in " ".join(call.argv) + (call.stdin or "") + json.dumps(call.env or {})
    for path in job_dir.rglob("*"):
        if path.is_file():
            assert CANARY not in path.read_text(errors="replace"), path
    assert "MY_SECRET_ENV" not in (call.env or {})


def test_editing_the_folder_after_submit_does_not_change_the_snapshot(
        project_dir: Path, isolated_home: Path, site_env: dict[str, str]) -> None:
    _store(isolated_home).set("tok", "x")
    result = submit_config(project_dir / "config.py", runner=FakeSlurm(),
                           site=load_site_settings(environ=site_env), environ=site_env)
    (project_dir / "train.py").write_text("print('changed')\n")
    assert (Path(result.spec.context.job_dir) / "src" / "train.py").read_text() == "print('hi')\n"


def test_missing_secret_fails_before_anything_is_written(project_dir: Path, isolated_home: Path,
                                                          site_env: dict[str, str]) -> None:
    slurm = FakeSlurm()
    with pytest.raises(SecretError) as info:
        submit_config(project_dir / "config.py", runner=slurm, site=load_site_settings(environ=site_env),
                      environ=site_env)
    assert "'tok'" in str(info.value) and "slurm-bt secrets set tok" in str(info.value)
    assert slurm.calls == []
    assert _tree(isolated_home / "ws") == []


def test_sbatch_failure_removes_the_job_dir(project_dir: Path, isolated_home: Path,
                                            site_env: dict[str, str]) -> None:
    _store(isolated_home).set("tok", "x")
    slurm = FakeSlurm()
    slurm.fail_next("sbatch", stderr="sbatch: error: Batch job submission failed: Invalid account")
    with pytest.raises(SlurmCommandError) as info:
        submit_config(project_dir / "config.py", runner=slurm, site=load_site_settings(environ=site_env),
                      environ=site_env)
    assert "Invalid account" in str(info.value)
    jobs = isolated_home / "ws" / "projects" / "demo" / "jobs"
    assert list(jobs.iterdir()) == []
    assert not (isolated_home / "ws" / "records").exists()


@pytest.mark.parametrize("arg", ["--export=ALL", "--export", "--get-user-env", "--wrap=echo"])
def test_pass_through_that_would_leak_the_environment_is_refused(
        arg: str, project_dir: Path, isolated_home: Path, site_env: dict[str, str]) -> None:
    _store(isolated_home).set("tok", "x")
    slurm = FakeSlurm()
    with pytest.raises(UserError) as info:
        submit_config(project_dir / "config.py", sbatch_args=[arg], runner=slurm,
                      site=load_site_settings(environ=site_env), environ=site_env)
    assert "not allowed" in str(info.value)
    assert slurm.calls == []


def test_dry_run_needs_no_slurm_and_writes_nothing(project_dir: Path, isolated_home: Path,
                                                   site_env: dict[str, str]) -> None:
    _store(isolated_home).set("tok", "x")
    slurm = FakeSlurm()
    result = submit_config(project_dir / "config.py", dry_run=True, runner=slurm,
                           site=load_site_settings(environ=site_env), environ=site_env)
    assert result.job_id is None and result.script.startswith("#!/bin/bash\n")
    assert slurm.calls == []
    assert _tree(isolated_home / "ws") == []
    # it says what it could not check without Slurm
    assert result.warnings[-1].startswith("dry run: checked the config, secrets, 0 weights source(s) and the "
                                          "snapshot (2 files); not checked: whether Slurm accepts the job")


def test_dry_run_fails_on_a_missing_secret_as_a_submit_does(project_dir: Path, isolated_home: Path,
                                                            site_env: dict[str, str]) -> None:
    slurm = FakeSlurm()
    with pytest.raises(SecretError, match="slurm-bt secrets set tok"):
        submit_config(project_dir / "config.py", dry_run=True, runner=slurm,
                      site=load_site_settings(environ=site_env), environ=site_env)
    assert slurm.calls == [] and _tree(isolated_home / "ws") == []


def test_dry_run_makes_the_snapshot_checks_without_copying(project_dir: Path, isolated_home: Path,
                                                           site_env: dict[str, str]) -> None:
    from slurm_bt.errors import SnapshotError

    _store(isolated_home).set("tok", "x")
    os.mkfifo(project_dir / "a.fifo")  # a real submit refuses to snapshot a FIFO (it would hang reading it)
    with pytest.raises(SnapshotError, match=r"a\.fifo: not a regular file"):
        submit_config(project_dir / "config.py", dry_run=True, runner=FakeSlurm(),
                      site=load_site_settings(environ=site_env), environ=site_env)
    assert _tree(isolated_home / "ws") == []


def test_dry_run_checks_the_job_dir_can_be_made(project_dir: Path, isolated_home: Path,
                                                site_env: dict[str, str]) -> None:
    from slurm_bt.errors import StorageError

    _store(isolated_home).set("tok", "x")
    (isolated_home / "ws").write_text("a file where the workspace should be\n")
    with pytest.raises(StorageError, match="ws is not a directory"):
        submit_config(project_dir / "config.py", dry_run=True, runner=FakeSlurm(),
                      site=load_site_settings(environ=site_env), environ=site_env)
