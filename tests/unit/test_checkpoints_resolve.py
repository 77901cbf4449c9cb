"""LoadCheckpointConfig: resolved and pinned at submit (exit 2 naming the field), downloaded and verified on nodes;
the ``slurm-bt checkpoints`` CLI."""

from __future__ import annotations

import json
import os
import pwd
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_bt.checkpoints.download import VERIFIED_NAME, download_pinned
from slurm_bt.checkpoints.resolve import resolve_load_checkpoints
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import open_store, team_group
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader
from slurm_bt.cli.main import cli
from slurm_bt.errors import ConfigError, StorageError
from slurm_bt.site.settings import SiteSettings
from tests.fakes.fake_slurm import FakeSlurm
from tests.spec_helpers import spec_for

TEAM = team_group(None)[0]
"""The namespace this process's uploads go to and its submissions resolve in (its primary group's slug)."""


def _publish(store_uri: str, tmp: Path, project: str, job: str, ckpts: dict[str, bytes]) -> None:
    from slurm_bt.job_spec import slugify

    src = tmp / f"src-{job}"
    for name, data in ckpts.items():
        (src / name).mkdir(parents=True)
        (src / name / "model.bin").write_bytes(data)
        (src / name / "nested").mkdir()
        (src / name / "nested" / "opt.pt").write_bytes(data[::-1])
        (src / name / "COMPLETE").touch()
    store = open_store(store_uri)
    # The index names the user who wrote it: an index naming anyone else is refused (test_checkpoint_store_trust.py).
    ident = JobIdentity(project, slugify(project, default="project"), job, pwd.getpwuid(os.getuid()).pw_name, 0, 1,
                        TEAM)
    RankUploader(store=store, ident=ident, checkpoint_dir=src, tracker=CompletionTracker(quiet_s=3600),
                 log=lambda r, m: None).run_once()


@pytest.fixture()
def world(tmp_path: Path) -> tuple[SiteSettings, str]:
    uri = f"file://{tmp_path}/store"
    _publish(uri, tmp_path, "Resume Demo", "100", {"checkpoint-1": b"old" * 100})
    _publish(uri, tmp_path, "Resume Demo", "101", {"checkpoint-1": b"a" * 100, "checkpoint-2": os.urandom(5000)})
    site = SiteSettings(storage={"checkpoint_store": uri, "workspace": f"{tmp_path}/ws", "secrets": f"{tmp_path}/s",
                                 "runtime": f"{tmp_path}/run"})
    return site, uri


def _config(tmp: Path, refs: str) -> Path:
    cfg = tmp / "cfg" / "config.py"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(textwrap.dedent(f"""
        from truss_train import definitions
        project = definitions.TrainingProject(name="next", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(start_commands=["true"],
                load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, checkpoints=[{refs}])),
        ))
        """))
    return cfg


def test_latest_by_project_is_pinned_and_downloaded(world: tuple[SiteSettings, str], tmp_path: Path) -> None:
    site, _ = world
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_latest_checkpoint(project_name="Resume Demo")')
    spec = resolve_load_checkpoints(spec_for(cfg, site))
    [ref] = spec.load_checkpoint.checkpoints
    pinned = ref["resolved"]
    assert (pinned["job_id"], pinned["checkpoint_name"], pinned["team"]) == ("101", "checkpoint-2", TEAM)
    assert sorted(p for p, _, _ in pinned["ranks"]["0"]) == ["model.bin", "nested/opt.pt"]
    dest = tmp_path / "loaded"
    assert download_pinned(spec, dest) == 2
    got = dest / "rank-0" / "checkpoint-2"
    assert (got / "model.bin").read_bytes() == (tmp_path / "src-101/checkpoint-2/model.bin").read_bytes()
    assert (got / VERIFIED_NAME).is_file()
    assert download_pinned(spec, dest) == 0, "a requeued job skips verified checkpoints"
    # The pin does not move when a newer checkpoint appears later.
    _publish(world[1], tmp_path, "Resume Demo", "102", {"checkpoint-9": b"z"})
    assert spec.load_checkpoint.checkpoints[0]["resolved"]["job_id"] == "101"


def test_named_and_latest_by_job(world: tuple[SiteSettings, str], tmp_path: Path) -> None:
    site, _ = world
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="checkpoint-1", '
                            'job_id="100"), definitions.BasetenCheckpoint.from_latest_checkpoint(job_id="101")')
    spec = resolve_load_checkpoints(spec_for(cfg, site))
    names = [(c["resolved"]["job_id"], c["resolved"]["checkpoint_name"]) for c in spec.load_checkpoint.checkpoints]
    assert names == [("100", "checkpoint-1"), ("101", "checkpoint-2")]


def test_unknown_checkpoint_fails_naming_the_field(world: tuple[SiteSettings, str], tmp_path: Path) -> None:
    site, _ = world
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="checkpoint-24", '
                            'job_id="101"), definitions.BasetenCheckpoint.from_latest_checkpoint(project_name="nope"), '
                            'definitions.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="c", job_id="5")')
    with pytest.raises(ConfigError) as info:
        resolve_load_checkpoints(spec_for(cfg, site))
    lines = info.value.lines()
    assert info.value.exit_code == 2 and len(lines) == 3
    assert "job.runtime.load_checkpoint_config.checkpoints[0]: job '101' has no checkpoint named 'checkpoint-24'" \
        in lines[0]
    assert "checkpoints[1]: project 'nope' has no checkpoints" in lines[1]
    assert "checkpoints[2]: job '5' has no checkpoints" in lines[2]


def test_submit_with_missing_checkpoint_exits_2_and_submits_nothing(world: tuple[SiteSettings, str],
                                                                     tmp_path: Path) -> None:
    site, uri = world
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="checkpoint-24", '
                            'job_id="101")')
    from slurm_bt.submit import submit_config

    slurm = FakeSlurm()
    with pytest.raises(ConfigError):
        submit_config(cfg, site=site, runner=slurm, environ={})
    assert slurm.calls == []
    site_file = tmp_path / "site.toml"
    site_file.write_text(f'[storage]\ncheckpoint_store = "{uri}"\nworkspace = "{tmp_path}/ws"\n')
    res = CliRunner().invoke(cli, ["submit", "--dry-run", str(cfg)], env={"SLURM_BT_SITE_CONFIG": str(site_file)})
    assert res.exit_code == 2, res.output
    assert "job.runtime.load_checkpoint_config.checkpoints[0]" in res.output and "checkpoint-24" in res.output


def test_cli_list_and_download(world: tuple[SiteSettings, str], tmp_path: Path) -> None:
    _, uri = world
    site_file = tmp_path / "site.toml"
    site_file.write_text(f'[storage]\ncheckpoint_store = "{uri}"\nworkspace = "{tmp_path}/ws"\n')
    env = {"SLURM_BT_SITE_CONFIG": str(site_file)}
    res = CliRunner().invoke(cli, ["checkpoints", "list", "101"], env=env)
    assert res.exit_code == 0, res.output
    assert "checkpoint-1" in res.output and "checkpoint-2" in res.output and "COMPLETE" in res.output
    res = CliRunner().invoke(cli, ["checkpoints", "list", "101", "-o", "json"], env=env)
    data = json.loads(res.output)
    assert [c["name"] for c in data["checkpoints"]] == ["checkpoint-1", "checkpoint-2"]
    target = tmp_path / "out"
    res = CliRunner().invoke(cli, ["checkpoints", "download", "101", "checkpoint-1", "--target-directory",
                                   str(target)], env=env)
    assert res.exit_code == 0, res.output
    assert (target / "rank-0/checkpoint-1/model.bin").read_bytes() == b"a" * 100
    res = CliRunner().invoke(cli, ["checkpoints", "list", "999"], env=env)
    assert res.exit_code == 2 and "has no checkpoints" in res.output


def _to_legacy(uri: str, project: str, job: str) -> Path:
    """Move a job to where a version before team namespaces put it: ``<store>/<project>/<job>``."""
    from slurm_bt.job_spec import slugify

    project_id = slugify(project, default="project")
    root = Path(uri.removeprefix("file://"))
    legacy = root / project_id
    legacy.mkdir(exist_ok=True)
    src = root / "_teams" / TEAM / project_id
    os.chown(legacy, -1, os.stat(src).st_gid)
    os.chmod(legacy, 0o2770)
    os.rename(src / job, legacy / job)
    return legacy / job


def test_legacy_jobs_are_listed_downloaded_and_resolved(world: tuple[SiteSettings, str], tmp_path: Path) -> None:
    """A store from before team namespaces: reads fall back to <store>/<project>/<job> (docs/checkpoints.md)."""
    site, uri = world
    _to_legacy(uri, "Resume Demo", "100")
    site_file = tmp_path / "site.toml"
    site_file.write_text(f'[storage]\ncheckpoint_store = "{uri}"\nworkspace = "{tmp_path}/ws"\n')
    env = {"SLURM_BT_SITE_CONFIG": str(site_file)}
    res = CliRunner().invoke(cli, ["checkpoints", "list", "100"], env=env)
    assert res.exit_code == 0 and "legacy location" in res.output, res.output
    res = CliRunner().invoke(cli, ["checkpoints", "list", "101"], env=env)
    assert res.exit_code == 0 and f"team {TEAM}" in res.output, res.output
    target = tmp_path / "out"
    res = CliRunner().invoke(cli, ["checkpoints", "download", "100", "--target-directory", str(target)], env=env)
    assert res.exit_code == 0, res.output
    assert (target / "rank-0/checkpoint-1/model.bin").read_bytes() == b"old" * 100
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_latest_checkpoint(job_id="100")')
    spec = resolve_load_checkpoints(spec_for(cfg, site))
    [ref] = spec.load_checkpoint.checkpoints
    assert (ref["resolved"]["job_id"], ref["resolved"]["team"]) == ("100", None)
    assert download_pinned(spec, tmp_path / "loaded") == 2
    # Only when the team's project has no complete checkpoint: everything of it at the legacy location.
    _to_legacy(uri, "Resume Demo", "101")
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_latest_checkpoint(project_name="Resume Demo")')
    [ref] = resolve_load_checkpoints(spec_for(cfg, site)).load_checkpoint.checkpoints
    assert (ref["resolved"]["job_id"], ref["resolved"]["team"]) == ("101", None)


def test_a_manifest_pinned_before_team_namespaces_downloads_from_the_legacy_location(
        world: tuple[SiteSettings, str], tmp_path: Path) -> None:
    site, uri = world
    cfg = _config(tmp_path, 'definitions.BasetenCheckpoint.from_latest_checkpoint(job_id="101")')
    spec = resolve_load_checkpoints(spec_for(cfg, site))
    [ref] = spec.load_checkpoint.checkpoints
    old = {**ref, "resolved": {k: v for k, v in ref["resolved"].items() if k != "team"}}  # an older job.json
    _to_legacy(uri, "Resume Demo", "101")
    spec = spec.model_copy(update={"load_checkpoint": spec.load_checkpoint.model_copy(update={"checkpoints": (old,)})})
    assert download_pinned(spec, tmp_path / "loaded") == 2
    forged = {**ref, "resolved": {**ref["resolved"], "team": "../x"}}
    load = spec.load_checkpoint.model_copy(update={"checkpoints": (forged,)})
    spec = spec.model_copy(update={"load_checkpoint": load})
    with pytest.raises(StorageError, match="unsafe team in the pinned manifest"):
        download_pinned(spec, tmp_path / "forged")
