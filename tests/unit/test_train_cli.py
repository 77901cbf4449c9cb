"""``slurm-bt train``: the parts that need no cluster (overrides, job choice, formats, downloads, init).

The verbs against the real cluster are in tests/integration/test_train_verbs.py.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_bt.checkpoints.index import CheckpointView, FileEntry, JobIndex
from slurm_bt.checkpoints.locations import parse_store_uri
from slurm_bt.checkpoints.resolve import FoundJob
from slurm_bt.cli.main import cli
from slurm_bt.cli.train_checkpoints import checkpoint_artifacts, checkpoint_rows, sort_rows
from slurm_bt.cli.train_cmd import apply_overrides, download_snapshot, snapshot_config
from slurm_bt.cli.train_init import RUN_SH, render_config, write_starter
from slurm_bt.cli.train_jobs import artifact_stem
from slurm_bt.compat.definitions import AvailabilityModel, InteractiveSessionTrigger
from slurm_bt.compat.loader import load_training_project
from slurm_bt.errors import UserError
from slurm_bt.records import SubmissionRecord, write_record
from slurm_bt.slurm.scontrol import build_update_priority_argv

SHA = "0" * 64


def _project(tmp_path: Path, job_extra: str = "", compute: str = "") -> Any:
    (tmp_path / "config.py").write_text(
        "from truss_train import definitions\n"
        "from truss.base import truss_config\n"
        "training_project = definitions.TrainingProject(name='p', job=definitions.TrainingJob(\n"
        f"    image=definitions.Image(base_image='python:3.11'), compute=definitions.Compute({compute}),\n"
        f"    runtime=definitions.Runtime(start_commands=['true']){job_extra}))\n")
    return load_training_project(tmp_path / "config.py")


def _overrides(project: Any, **kw: Any) -> None:
    args: dict[str, Any] = dict(job_name=None, interactive=None, interactive_timeout_minutes=None, accelerator=None,
                                node_count=None, entrypoint=None, priority=None, spot=False)
    args.update(kw)
    apply_overrides(project, **args)


def test_overrides_warn_only_when_they_replace_a_config_value(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    project = _project(tmp_path)
    _overrides(project, job_name="j", accelerator="H100:2", node_count=2, priority=3, spot=True,
               interactive="on_failure", interactive_timeout_minutes=5)
    assert capsys.readouterr().err == ""  # nothing in the config was replaced
    job = project.job
    assert (job.name, job.compute.node_count, job.priority) == ("j", 2, 3)
    assert job.compute.accelerator.count == 2 and job.compute.availability_model == AvailabilityModel.SPOT
    assert job.interactive_session.trigger == InteractiveSessionTrigger.ON_FAILURE
    assert job.interactive_session.timeout_minutes == 5

    _overrides(project, job_name="k", node_count=4, entrypoint="python3 x.py", priority=9)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "⚠ Warning: name 'j' provided in config file will be ignored. Using job name 'k' provided via "
        "--job-name flag.",
        "⚠ Warning: node_count '2' provided in config file will be ignored. Using '4' provided via "
        "--node-count flag.",
        "⚠ Warning: start_commands ['true'] provided in config file will be ignored. Using 'python3 x.py' "
        "provided via --entrypoint flag.",
        "⚠ Warning: priority '3' provided in config file will be ignored. Using '9' provided via --priority flag.",
    ]
    assert project.job.runtime.start_commands == ["python3 x.py"]


def test_snapshot_config_is_the_longest_matching_tail(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.py").write_text("# a different config.py at the top of the workspace")
    (src / "sub" / "config.py").write_text("# the pushed one")
    assert snapshot_config(src, "/home/u/ws/sub/config.py") == src / "sub" / "config.py"
    assert snapshot_config(src, "/home/u/elsewhere/config.py") == src / "config.py"
    os.symlink("/etc/passwd", src / "sub" / "other.py")
    with pytest.raises(Exception, match=r"holds no other\.py"):
        snapshot_config(src, "/x/sub/other.py")


def _index() -> JobIndex:
    def view(name: str, created: str, files: dict[int, list[tuple[str, int]]], complete: bool) -> CheckpointView:
        return CheckpointView(name=name, created=created, complete=complete, ranks={
            r: tuple(FileEntry(path=p, size=s, sha256=SHA) for p, s in fs) for r, fs in files.items()})

    return JobIndex(project_name="proj", project_id="proj", job_id="77", user="u", group_size=2, updated="t",
                    checkpoints=(
                        view("checkpoint-9", "2026-01-02", {0: [("w.bin", 50)]}, True),
                        view("checkpoint-10", "2026-01-01", {0: [("adapter_config.json", 5), ("a.bin", 1)],
                                                              1: [("a.bin", 1)]}, True),
                        view("checkpoint-11", "2026-01-03", {1: [("w.bin", 7)]}, False),
                    ))


def test_checkpoint_rows_sort_like_truss_with_natural_ids() -> None:
    rows = checkpoint_rows(_index())
    assert [(r["checkpoint_id"], r["checkpoint_type"], r["size_bytes"], r["complete"]) for r in rows] == [
        ("checkpoint-9", "full", 50, True), ("checkpoint-10", "lora", 7, True), ("checkpoint-11", "full", 7, False)]
    ids = [r["checkpoint_id"] for r in sort_rows(rows, "checkpoint-id", "desc")]
    assert ids == ["checkpoint-11", "checkpoint-10", "checkpoint-9"]
    assert [r["checkpoint_id"] for r in sort_rows(rows, "created", "asc")] == [
        "checkpoint-10", "checkpoint-9", "checkpoint-11"]
    assert next(r["checkpoint_id"] for r in sort_rows(rows, "size", "desc")) == "checkpoint-9"


def test_checkpoint_urls_of_a_file_store_are_paths() -> None:
    class Store:
        uri = parse_store_uri("file:///srv/ckpt")

    arts = checkpoint_artifacts(Store(), FoundJob(_index(), "btteam1"), 3600)  # type: ignore[arg-type]
    assert len(arts) == 5
    first = arts[0]
    assert first["relative_file_name"] == "rank-0/checkpoint-9/w.bin"
    assert first["path"] == "/srv/ckpt/_teams/btteam1/proj/77/rank-0/checkpoint-9/w.bin"
    assert first["url"] == "file:///srv/ckpt/_teams/btteam1/proj/77/rank-0/checkpoint-9/w.bin"
    assert {a["checkpoint_name"] for a in arts if not a["complete"]} == {"checkpoint-11"}
    # A job found at the legacy location (a store from before team namespaces): its files are there.
    legacy = checkpoint_artifacts(Store(), FoundJob(_index(), None), 3600)  # type: ignore[arg-type]
    assert legacy[0]["path"] == "/srv/ckpt/proj/77/rank-0/checkpoint-9/w.bin"
    forged = _index().model_copy(update={"checkpoints": (CheckpointView(
        name="checkpoint-1", created="t", complete=True,
        ranks={0: (FileEntry(path="../../../other-project/9/rank-0/x", size=1, sha256=SHA),)}),)})
    with pytest.raises(UserError, match="unsafe name"):
        checkpoint_artifacts(Store(), FoundJob(forged, "btteam1"), 3600)  # type: ignore[arg-type]


def test_update_priority_argv_is_validated() -> None:
    assert build_update_priority_argv("12", 500) == ["scontrol", "update", "JobId=12", "Priority=500"]
    for bad in (0, -1, 2**32, True):
        with pytest.raises(ValueError):
            build_update_priority_argv("12", bad)
    with pytest.raises(ValueError):
        build_update_priority_argv("12 Priority=1", 5)


@pytest.mark.parametrize("accelerator", [None, "H100"])
def test_the_starter_config_loads(tmp_path: Path, accelerator: str | None) -> None:
    (tmp_path / "config.py").write_text(render_config(accelerator))
    project = load_training_project(tmp_path / "config.py")
    assert project.job.runtime.start_commands == ["/bin/sh -c 'chmod +x ./run.sh && ./run.sh'"]
    assert (project.job.compute.accelerator is None) == (accelerator is None)


def test_init_refuses_an_existing_directory(tmp_path: Path, isolated_home: Path) -> None:
    write_starter(tmp_path / "new")
    assert (tmp_path / "new" / "run.sh").read_text() == RUN_SH and os.access(tmp_path / "new" / "run.sh", os.X_OK)
    result = CliRunner().invoke(cli, ["train", "init", "--target-directory", str(tmp_path / "new")])
    assert result.exit_code == 1 and "already exists" in result.output
    result = CliRunner().invoke(cli, ["train", "init", "--list-examples"])
    assert result.exit_code == 1 and "ml-cookbook" in result.output


def test_artifact_names_stay_one_plain_component() -> None:
    assert artifact_stem("My Project", "12") == "My-Project_12"
    assert artifact_stem("../../etc/x\n", "12") == "-..-etc-x-_12"
    assert artifact_stem("..", "3") == "project_3"
    assert len(artifact_stem("x" * 5000, "3")) == 102


def _record(tmp_path: Path, src_files: dict[str, str]) -> SubmissionRecord:
    job_dir = tmp_path / "ws" / "job"
    for rel, text in src_files.items():
        (job_dir / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (job_dir / "src" / rel).write_text(text)
    return SubmissionRecord(job_id="55", project_name="My Proj", project_id="my-proj", job_name="", submit_id="s",
                            job_dir=str(job_dir), config_path="/c/config.py", submitted_at="t", user="u")


def test_download_copies_only_regular_files_and_dirs(tmp_path: Path) -> None:
    rec = _record(tmp_path, {"config.py": "cfg", "pkg/train.py": "code"})
    src = Path(rec.job_dir) / "src"
    os.symlink("/etc/shadow", src / "link")
    os.mkfifo(src / "fifo")  # would block a naive copy forever
    out = download_snapshot(rec, tmp_path / "dl", unzip=True)
    assert out == tmp_path / "dl" / "My-Proj_55"
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == ["config.py", "pkg", "pkg/train.py"]
    tgz = download_snapshot(rec, tmp_path / "dl", unzip=False)
    with tarfile.open(tgz) as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == ["./config.py", "./pkg/train.py"]
        assert all(m.isfile() or m.isdir() for m in tar.getmembers())
    with pytest.raises(Exception, match="already exists"):
        download_snapshot(rec, tmp_path / "dl", unzip=True)
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["My-Proj_55", "My-Proj_55.tgz"]


def test_stop_without_a_job_asks_and_non_interactive_refuses(isolated_home: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import slurm_bt.cli.train_cmd as train_cmd

    ws = isolated_home / "ws"
    write_record(ws, SubmissionRecord(job_id="41", project_name="p", project_id="p", job_name="", submit_id="s",
                                      job_dir="/x", config_path="/c", submitted_at="t", user="u"))

    class St:
        job_id, status = "41", "TRAINING_JOB_RUNNING"

        def as_dict(self) -> dict[str, Any]:
            return {"id": "41", "user": "u"}

    monkeypatch.setattr(train_cmd, "job_statuses", lambda records: [St()])
    stopped: list[tuple[str, ...]] = []
    def fake_stop(ids: list[str], timeout_s: float) -> list[dict[str, Any]]:
        stopped.append(tuple(ids))
        return []

    monkeypatch.setattr("slurm_bt.cli.stop_cmd._stop_local", fake_stop)
    runner = CliRunner()
    no = runner.invoke(cli, ["train", "stop", "--non-interactive"])
    assert no.exit_code == 2 and "Training job not stopped." in no.output and not stopped
    asked = runner.invoke(cli, ["train", "stop"], input="n\n")
    assert "Are you sure you want to stop training job 41 (created by u)?" in asked.output and not stopped
    yes = runner.invoke(cli, ["train", "stop", "--all", "--yes"])
    assert yes.exit_code == 0, yes.output
    assert stopped == [("41",)]


def test_remote_runs_the_same_verb_line_on_the_login_node(isolated_home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_bt.remote.commands import RemoteOutcome

    calls: list[tuple[str, list[str]]] = []

    def fake_run(host: str, argv: list[str], **kw: Any) -> RemoteOutcome:
        calls.append((host, argv))
        return RemoteOutcome(3, "", "")

    monkeypatch.setattr("slurm_bt.remote.commands.run_remote", fake_run)
    runner = CliRunner()
    result = runner.invoke(cli, ["train", "stop", "--project", "p q", "--all", "--yes", "--remote", "login1"])
    assert result.exit_code == 3  # the login node's status, passed on
    assert calls == [("login1", ["train", "stop", "--project", "p q", "--all", "--yes", "--non-interactive"])]
    result = runner.invoke(cli, ["train", "checkpoints", "list", "-o", "csv", "--remote", "login1"])
    assert calls[-1] == ("login1", ["train", "checkpoints", "list", "--output-format", "csv"])
    # "baseten"/"local" (upstream's usual remote names) mean this cluster: nothing is forwarded.
    runner.invoke(cli, ["train", "view", "--remote", "baseten"])
    assert len(calls) == 2
    # Verbs that write files here from the cluster's storage run on the cluster only.
    result = runner.invoke(cli, ["train", "download", "--job-id", "5", "--remote", "login1"])
    assert result.exit_code == 2 and "login node" in result.output


def test_csv_and_json_formats(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import contextmanager

    import slurm_bt.cli.train_checkpoints as tc

    @contextmanager
    def fake(job_id: str) -> Any:
        yield None, FoundJob(_index(), "btteam1")

    monkeypatch.setattr(tc, "_open_index", fake)
    runner = CliRunner()
    out = runner.invoke(cli, ["train", "checkpoints", "list", "--job-id", "77", "-o", "csv"])
    rows = list(csv.DictReader(io.StringIO(out.output)))
    assert [r["Checkpoint ID"] for r in rows] == ["checkpoint-10", "checkpoint-9", "checkpoint-11"]
    assert rows[2]["Complete"] == "no (1/2 ranks)" and rows[0]["Size (bytes)"] == "7"
    doc = json.loads(runner.invoke(cli, ["train", "checkpoints", "list", "--job-id", "77", "-o", "json"]).output)
    assert doc["total_checkpoints"] == 3 and doc["job_id"] == "77"
    files = runner.invoke(cli, ["train", "checkpoints", "list", "--job-id", "77", "--checkpoint-name", "nope"])
    assert files.exit_code == 1


def test_group_lists_upstreams_verbs() -> None:
    result = CliRunner().invoke(cli, ["train", "--help"])
    for verb in ("push", "recreate", "logs", "view", "stop", "metrics", "checkpoints", "get_checkpoint_urls",
                 "download", "init", "update", "isession", "cache"):
        assert f"  {verb} " in result.output, verb
    assert CliRunner().invoke(cli, ["train", "cache", "summarize", "--help"]).exit_code == 0


def test_a_refused_override_is_a_usage_error_naming_it(isolated_home: Path) -> None:
    _project(isolated_home)
    result = CliRunner().invoke(cli, ["train", "push", str(isolated_home / "config.py"), "--dry-run",
                                      "--accelerator", "NOPE:2"])
    assert result.exit_code == 2, result.output
    assert "command-line override refused" in result.output and "NOPE" in result.output
    assert "internal error" not in result.output


def test_presigning_failures_are_storage_errors() -> None:
    """gcsfs signs only with a service-account key, adlfs only with an account key: a clear SourceError."""
    from slurm_bt.errors import SourceError
    from slurm_bt.storage._fs import FsspecBackend
    from slurm_bt.storage.base import Backend
    from slurm_bt.storage.url import parse_url

    class Fs:
        def __init__(self, exc: Exception | None) -> None:
            self.exc = exc

        def sign(self, path: str, expiration: int) -> str:
            if self.exc is not None:
                raise self.exc
            return f"https://signed/{path}?e={expiration}"

    class Gs(FsspecBackend):
        def __init__(self, exc: Exception | None) -> None:
            self.url, self.fs = parse_url("gs://bucket/pre"), Fs(exc)

        def _root(self) -> str:
            return "bucket/pre"

    assert Gs(None).presigned_url("a/b", 60) == "https://signed/bucket/pre/a/b?e=60"
    with pytest.raises(SourceError, match="cannot presign URLs"):
        Gs(NotImplementedError()).presigned_url("a", 60)
    with pytest.raises(SourceError, match="cannot presign with these credentials: AttributeError"):
        Gs(AttributeError("no private key")).presigned_url("a", 60)

    class Plain(Backend):
        url = parse_url("https://example.com/x")

    with pytest.raises(SourceError, match="cannot presign"):
        Plain().presigned_url("a", 60)
