"""flush_job_checkpoints as the epilog calls it: upload the rest, or hand off within the budget; resume later."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from slurm_bt.checkpoints.flush import STATE_NAME, flush_job_checkpoints
from slurm_bt.checkpoints.handoff import resume_handoffs
from slurm_bt.checkpoints.store import FileStore, UploadResult, team_group
from slurm_bt.checkpoints.upload import read_job_index
from slurm_bt.job_spec import JobSpec
from slurm_bt.site.settings import SiteSettings
from tests.spec_helpers import spec_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the epilog flush runs as root")
TEAM = team_group(None)[0]
"""The team namespace of root's jobs here (root's primary group, no prolog record, no account)."""

CONFIG = """
from truss_train import definitions
project = definitions.TrainingProject(name="Flush Demo", job=definitions.TrainingJob(
    image=definitions.Image(base_image="python:3.11"),
    runtime=definitions.Runtime(start_commands=["true"],
        checkpointing_config=definitions.CheckpointingConfig(enabled=True)),
))
"""


def _job(tmp_path: Path, job_id: str = "777") -> tuple[SiteSettings, JobSpec, Path, dict[str, str]]:
    site = SiteSettings(storage={"scratch": f"{tmp_path}/node/%n/scratch",
                                 "checkpoint_store": f"file://{tmp_path}/store",
                                 "secrets": f"{tmp_path}/secrets", "workspace": f"{tmp_path}/ws"})
    cfg = tmp_path / "config.py"
    cfg.write_text(textwrap.dedent(CONFIG))
    spec = spec_for(cfg, site)
    spec_path = tmp_path / "job.json"
    spec_path.write_text(spec.model_dump_json())
    ckpt = tmp_path / "node/n1/scratch" / job_id / "mnt/checkpoints"
    for name in ("checkpoint-1", "checkpoint-2"):
        (ckpt / name).mkdir(parents=True)
        (ckpt / name / "w.bin").write_bytes(os.urandom(100_000))
    (ckpt / STATE_NAME).write_text(json.dumps({"spec_path": str(spec_path), "job_id": job_id, "rank": 0, "node": "n1"}))
    env = {"SLURM_JOB_ID": job_id, "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
           "SLURM_JOB_USER": "root"}
    return site, spec, ckpt, env


def test_flush_uploads_everything_left(tmp_path: Path) -> None:
    site, spec, _, env = _job(tmp_path)
    result = flush_job_checkpoints(env, 60, site=site)
    assert result.status == "done", result
    index = read_job_index(FileStore(_uri(tmp_path)), spec.project_id, "777", team=TEAM)
    assert index is not None and [c.name for c in index.checkpoints] == ["checkpoint-1", "checkpoint-2"]
    assert all(c.complete for c in index.checkpoints)
    again = flush_job_checkpoints(env, 60, site=site)
    assert again.status == "done" and again.uploaded == [], "idempotent (the epilog may run twice)"


def test_flush_without_checkpoints_or_job_is_harmless(tmp_path: Path) -> None:
    site, _, _, env = _job(tmp_path)
    result = flush_job_checkpoints({**env, "SLURM_JOB_ID": "999"}, 10, site=site)
    assert result.status == "nothing"
    assert flush_job_checkpoints({"SLURM_JOB_ID": "../x"}, 10, site=site).status == "error"


def test_budget_exhausted_hands_off_quickly_then_resume_finishes(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    site, spec, ckpt, env = _job(tmp_path, "778")
    real = FileStore.upload_file

    def slow(self: FileStore, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        time.sleep(30)  # a store far too slow for the epilog's budget
        return real(self, fd, size, key, expect_sha256=expect_sha256)

    monkeypatch.setattr(FileStore, "upload_file", slow)
    started = time.monotonic()
    result = flush_job_checkpoints({**env, "SLURM_JOB_ACCOUNT": "no-such-group"}, 3, site=site)
    elapsed = time.monotonic() - started
    assert result.status == "handed-off", result
    assert elapsed < 4, f"the epilog was held {elapsed:.1f} s"
    entry = tmp_path / "node/n1/checkpoint-handoff/778.n1"
    assert (entry / "data/checkpoint-1/w.bin").is_file() and not ckpt.exists(), "moved out of scratch"
    assert os.stat(entry.parent).st_uid == 0 and (os.stat(entry.parent).st_mode & 0o777) == 0o711
    record = json.loads((entry / "handoff.json").read_text())
    assert record["job_id"] == "778" and record["moved"] is True
    # Without a prolog record, the account is kept for the resume, which picks the team namespace as the
    # job's uploader did (a group the user is in; this one is not a group: the primary group).
    assert (record["team"], record["account"]) == (None, "no-such-group")
    monkeypatch.undo()
    outcomes = resume_handoffs(root=entry.parent)
    assert [o.status for o in outcomes] == ["uploaded"], outcomes
    assert not entry.exists()
    index = read_job_index(FileStore(_uri(tmp_path)), spec.project_id, "778", team=TEAM)
    assert index is not None and len(index.checkpoints) == 2


def _hand_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job_id: str) -> tuple[SiteSettings, JobSpec, Path]:
    site, spec, _, env = _job(tmp_path, job_id)
    real = FileStore.upload_file

    def slow(self: FileStore, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        time.sleep(30)
        return real(self, fd, size, key, expect_sha256=expect_sha256)

    monkeypatch.setattr(FileStore, "upload_file", slow)
    assert flush_job_checkpoints(env, 2, site=site).status == "handed-off"
    monkeypatch.undo()
    return site, spec, tmp_path / f"node/n1/checkpoint-handoff/{job_id}.n1"


def test_overlapping_sweeps_take_each_entry_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    _, spec, entry = _hand_off(tmp_path, monkeypatch, "781")
    fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another sweep is working on it
        assert [(o.entry, o.status) for o in resume_handoffs(root=entry.parent)] == [("781.n1", "busy")]
        assert (entry / "handoff.json").is_file()
    finally:
        os.close(fd)
    assert [o.status for o in resume_handoffs(root=entry.parent)] == ["uploaded"]
    assert resume_handoffs(root=entry.parent) == [] and not entry.exists()
    index = read_job_index(FileStore(_uri(tmp_path)), spec.project_id, "781", team=TEAM)
    assert index is not None and len(index.checkpoints) == 2


def test_sweep_removes_entries_with_nothing_left_to_upload(tmp_path: Path) -> None:
    area = tmp_path / "checkpoint-handoff"
    (area / "30.n1").mkdir(parents=True)
    (area / "31.n1").mkdir()
    (area / "32.n1" / "data").mkdir(parents=True)  # moved data without a record: never removed
    old = time.time() - 7200
    for name in ("30.n1", "32.n1"):
        os.utime(area / name, (old, old))
    (area / "33.n1").mkdir()  # checkpoints outside scratch, since deleted with the job's work dir
    (area / "33.n1" / "handoff.json").write_text(json.dumps(
        {"job_id": "33", "node": "n1", "uid": 0, "gid": 0, "moved": False, "source": str(tmp_path / "gone"),
         "work_dir": str(tmp_path / "gone-work")}))
    outcomes = {o.entry: o.status for o in resume_handoffs(root=area)}
    assert outcomes == {"30.n1": "removed", "31.n1": "skipped", "32.n1": "skipped", "33.n1": "removed"}
    assert sorted(p.name for p in area.iterdir()) == ["31.n1", "32.n1"]


def test_background_sweep_from_the_epilog_finishes_detached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_bt.checkpoints.handoff import start_background_sweep

    site, spec, entry = _hand_off(tmp_path, monkeypatch, "782")
    site_file = tmp_path / "site.toml"
    roots = site.storage.model_dump().items()
    site_file.write_text("[storage]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in roots))
    log = tmp_path / "hooks.log"
    proc = start_background_sweep("n1", site_path=str(site_file), log_path=str(log))
    assert os.getsid(proc.pid) == proc.pid, "own session: not killed with the epilog's process group"
    assert proc.wait(timeout=120) == 0, log.read_text()
    assert not entry.exists()
    assert "entry=782.n1 uploaded: 2 checkpoint(s)" in log.read_text()
    index = read_job_index(FileStore(_uri(tmp_path)), spec.project_id, "782", team=TEAM)
    assert index is not None and [c.complete for c in index.checkpoints] == [True, True]


def _uri(tmp_path: Path):  # type: ignore[no-untyped-def]
    from slurm_bt.checkpoints.locations import parse_store_uri

    return parse_store_uri(f"file://{tmp_path}/store")
