"""``slurm-bt train <verb>`` against the dev cluster: truss train's verbs with truss train's meaning.

Every test uses its own site file whose ``workspace`` is a fresh temp dir, so "your jobs" (the
submission records ``view``, ``stop --all`` and the latest-job default read) are only this test's:
``stop --all`` can never cancel another test's (or another helper's) job.

1. init → push (overrides warn, --tail follows to the end) → view / view --job-id → download →
   recreate: the starter project runs here as written; recreate runs the pushed snapshot, not the
   folder as edited since.
2. logs --tail started while a job runs follows it until it ends (truss's meaning of --tail);
   isession --command runs inside that running job.
3. stop: several active jobs → asks for a job id; --all asks first (no: nothing stopped; yes: all).
4. update --priority on a pending job sets Slurm's priority; a running job is refused.
5. checkpoints list (-o csv/json, --sort/--order, --checkpoint-name) and get_checkpoint_urls with an
   S3 store: each presigned URL downloads the file's exact bytes; metrics of the finished job.
6. --remote HOST (an SSH login node, tests/integration/test_ssh.py's sshd): push, view, logs run there.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from slurm_bt.secrets_store import SecretStore
from tests.integration.test_ssh import ALIAS, Sshd, _client_home, sshd  # noqa: F401  (session fixture)
from tests.integration.test_ssh import USER as SSH_USER
from tests.servers.fixtures import seaweed  # noqa: F401  (session fixture)
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
SLURM_BT = str(BIN / "slurm-bt")


def _site(tmp: Path, extra: str = "") -> dict[str, str]:
    toml = tmp / "site.toml"
    toml.write_text(f'[storage]\nworkspace = "{tmp}/ws"\nsecrets = "{tmp}/secrets"\n{extra}')
    return {**os.environ, "SLURM_BT_SITE_CONFIG": str(toml)}


def _train(env: dict[str, str], *argv: str, input: str | None = None, cwd: Path | None = None,
           timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SLURM_BT, "train", *argv], capture_output=True, text=True, env=env, input=input,
                          cwd=cwd, timeout=timeout)


def _job_id(out: str) -> str:
    [line] = [ln for ln in out.splitlines() if "successfully created" in ln]
    return line.rsplit("Slurm job ", 1)[1].rstrip(")")


def _squeue(job_id: str, fmt: str = "%T") -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", fmt], capture_output=True, text=True).stdout.strip()


def _wait_state(job_id: str, states: set[str], timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = _squeue(job_id) or "GONE"
        if state in states:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} never reached {states} (last: {state})")


def _sacct(job_id: str, field: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", field], capture_output=True, text=True)
    return out.stdout.strip()


def _config(folder: Path, project: str, start: str, extra: str = "", name: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import definitions
        training_project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
            name={name!r},
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=[{start!r}]{extra}),
        ))
        """))
    return folder / "config.py"


def test_init_push_view_download_recreate(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    env = _site(tmp_path)
    init = _train(env, "init", "--target-directory", "proj", cwd=tmp_path)
    assert init.returncode == 0, init.stderr
    assert {p.name for p in (tmp_path / "proj").iterdir()} == {"config.py", "run.sh"}
    # Upstream refuses an existing target directory; so does this.
    assert _train(env, "init", "--target-directory", "proj", cwd=tmp_path).returncode == 1

    # push: --job-name and --node-count override the config with upstream's warnings; --tail follows
    # the job to its end, so the run.sh's last line is in the output and the job is over on return.
    (tmp_path / "proj" / "config.py").write_text((tmp_path / "proj" / "config.py").read_text().replace(
        "definitions.TrainingJob(", 'definitions.TrainingJob(name="from-config", ').replace(
        "NUM_NODES = 1", "NUM_NODES = 1\nPROJECT_NAME = 'e-train-init'"))
    push = _train(env, "push", "proj/config.py", "--job-name", "from-flag", "--node-count", "2", "--tail",
                  cwd=tmp_path)
    assert push.returncode == 0, push.stderr
    assert ("⚠ Warning: name 'from-config' provided in config file will be ignored. Using job name 'from-flag' "
            "provided via --job-name flag.") in push.stderr
    job = _job_id(push.stdout)
    done = {ln for ln in push.stdout.splitlines() if ln.endswith("] Training process completed (placeholder).")}
    assert done == {f"[node {r}] Training process completed (placeholder)." for r in (0, 1)}, push.stdout
    assert _sacct(job, "State") == "COMPLETED" and _sacct(job, "NNodes") == "2"

    view = _train(env, "view")
    assert view.returncode == 0, view.stderr
    assert "Training Projects" in view.stdout and "e-train-init" in view.stdout and job in view.stdout
    assert "No queued or active training jobs." in view.stdout
    detail = _train(env, "view", "--job-id", job)
    assert "from-flag" in detail.stdout and "TRAINING_JOB_COMPLETED" in detail.stdout

    # download: the snapshot as pushed, unpacked (default) or as a .tgz.
    (tmp_path / "proj" / "run.sh").write_text("#!/bin/sh\necho EDITED-AFTER-PUSH\n")
    dl = _train(env, "download", "--job-id", job, "--target-directory", str(tmp_path / "dl"))
    assert dl.returncode == 0, dl.stderr
    got = tmp_path / "dl" / f"e-train-init_{job}"
    assert sorted(p.name for p in got.iterdir()) == ["config.py", "run.sh"]
    assert "Training process completed" in (got / "run.sh").read_text()
    tgz = _train(env, "download", "--job-id", job, "--target-directory", str(tmp_path / "dl"), "--no-unzip")
    assert tgz.returncode == 0 and (tmp_path / "dl" / f"e-train-init_{job}.tgz").stat().st_size > 0

    # recreate (no --job-id: the most recent job, after a confirmation) runs the pushed snapshot,
    # not the folder as edited since.
    no = _train(env, "recreate", input="n\n")
    assert no.returncode == 2 and "Training job not recreated." in no.stderr
    again = _train(env, "recreate", "--tail", input="y\n")
    assert again.returncode == 0, again.stderr
    job2 = _job_id(again.stdout)
    assert job2 != job and "EDITED-AFTER-PUSH" not in again.stdout
    assert "Training process completed (placeholder)." in again.stdout
    logs = _train(env, "logs")  # no --job-id: the most recent job, said on stderr
    assert f"Showing the most recently created job: {job2}" in logs.stderr
    assert "Training process completed (placeholder)." in logs.stdout


def test_logs_tail_follows_a_running_job(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    env = _site(tmp_path)
    cfg = _config(tmp_path / "tick", "e-tick", "/bin/sh -c 'for i in $(seq 1 8); do echo tick $i; sleep 1; done'")
    push = _train(env, "push", str(cfg))
    job = _job_id(push.stdout)
    _wait_state(job, {"RUNNING"})
    # isession (slurm_bt/cli/isession_cmd.py, registered in the train group) reaches into the running job.
    inside = _train(env, "isession", "--job-id", job, "--command", "echo inside-$SLURM_JOB_ID", timeout=60)
    assert inside.returncode == 0 and f"inside-{job}" in inside.stdout, (inside.stdout, inside.stderr)
    assert _squeue(job) == "RUNNING"
    started = time.monotonic()
    follow = _train(env, "logs", "--project", "e-tick", "--tail", timeout=120)
    took = time.monotonic() - started
    assert follow.returncode == 0, follow.stderr
    ticks = [ln for ln in follow.stdout.splitlines() if "tick " in ln]
    # Started while the job ran, it printed every line up to the last one: it followed, not dumped.
    assert ticks == [f"[node 0] tick {i}" for i in range(1, 9)], follow.stdout
    assert took >= 2 and _sacct(job, "State") == "COMPLETED"


def test_stop_asks_first_and_stop_all(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    env = _site(tmp_path)
    cfg = _config(tmp_path / "held", "e-stop", "sleep 60")
    jobs = [_job_id(_train(env, "push", str(cfg), "--", "--hold").stdout) for _ in range(2)]
    try:
        many = _train(env, "stop", "--project", "e-stop")
        assert many.returncode == 2 and "Multiple active jobs found. Please specify a job id." in many.stderr
        no = _train(env, "stop", "--all", input="n\n")
        assert no.returncode == 2 and "Are you sure you want to stop 2 active jobs?" in no.stderr
        assert [_squeue(j) for j in jobs] == ["PENDING", "PENDING"]
        yes = _train(env, "stop", "--all", input="y\n")
        assert yes.returncode == 0, yes.stderr
        assert "Training jobs stopped successfully." in yes.stdout
        assert {_sacct(j, "State").split()[0] for j in jobs} == {"CANCELLED"}
        assert _train(env, "stop", "--all").stdout.strip() == "No queued or active jobs found."
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)


def test_update_priority_of_a_pending_job(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    env = _site(tmp_path)
    cfg = _config(tmp_path / "later", "e-update", "true")
    job = _job_id(_train(env, "push", str(cfg), "--", "--begin=now+600").stdout)
    try:
        assert _train(env, "update", "--job-id", job).returncode == 2  # nothing to update (upstream)
        up = _train(env, "update", "--job-id", job, "--priority", "4321")
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"Training job {job} updated."
        assert _squeue(job, "%Q") == "4321"
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
        _wait_state(job, {"RUNNING", "COMPLETING", "GONE"})
        late = _train(env, "update", "--job-id", job, "--priority", "5")
        assert late.returncode == 2 and "only PENDING jobs" in late.stderr
    finally:
        subprocess.run(["scancel", job], capture_output=True)


CKPT = r'''
import os, pathlib
d = pathlib.Path(os.environ["BT_CHECKPOINT_DIR"])
for i, size in ((2, 70_000), (10, 1_000)):
    c = d / f"checkpoint-{i}"
    (c / "sub").mkdir(parents=True)
    (c / "sub" / "weights.bin").write_bytes(os.urandom(size))
    (c / "adapter_config.json").write_text('{"r": 8}')
    (c / ".complete").touch()
'''


def test_checkpoints_list_and_presigned_urls(dev_cluster: dict[str, object], seaweed: SeaweedS3,  # noqa: F811
                                             tmp_path: Path) -> None:
    bucket = f"etrain-{uuid.uuid4().hex[:8]}"
    seaweed.create_bucket(bucket)
    SecretStore(tmp_path / "secrets").set(
        "ckpt", json.dumps({"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}))
    env = _site(tmp_path, f'checkpoint_store = "s3://{bucket}/bt?endpoint_url={seaweed.endpoint}&secret=ckpt"\n')
    folder = tmp_path / "ck"
    cfg = _config(folder, "e-ckpt", "python3 ckpt.py",
                  ", checkpointing_config=definitions.CheckpointingConfig(enabled=True)")
    (folder / "ckpt.py").write_text(CKPT)
    push = _train(env, "push", str(cfg), "--tail")
    assert push.returncode == 0, push.stderr
    job = _job_id(push.stdout)
    assert _sacct(job, "State") == "COMPLETED", push.stdout

    # csv: upstream's columns (+ Complete); natural checkpoint-id order, descending.
    out = _train(env, "checkpoints", "list", "-o", "csv", "--sort", "checkpoint-id", "--order", "desc")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["Checkpoint ID"] for r in rows] == ["checkpoint-10", "checkpoint-2"]
    assert {r["Type"] for r in rows} == {"lora"} and {r["Complete"] for r in rows} == {"yes"}
    by_size = json.loads(_train(env, "checkpoints", "list", "--job-id", job, "-o", "json", "--sort", "size").stdout)
    assert [c["checkpoint_id"] for c in by_size["checkpoints"]] == ["checkpoint-10", "checkpoint-2"]
    files = json.loads(_train(env, "checkpoints", "list", "--job-id", job, "-o", "json",
                              "--checkpoint-name", "checkpoint-2").stdout)
    assert {f["relative_file_name"] for f in files["files"]} == {
        "rank-0/checkpoint-2/adapter_config.json", "rank-0/checkpoint-2/sub/weights.bin"}

    # get_checkpoint_urls: truss's <project>_<job>_checkpoints.json with a presigned URL per file;
    # each URL alone (no credentials) returns exactly the bytes the index names.
    urls = _train(env, "get_checkpoint_urls", "--job-id", job, cwd=tmp_path)
    assert urls.returncode == 0, urls.stderr
    doc = json.loads((tmp_path / f"e-ckpt_{job}_checkpoints.json").read_text())
    assert doc["job"]["id"] == job and len(doc["checkpoint_artifacts"]) == 4
    for art in doc["checkpoint_artifacts"]:
        assert "X-Amz-Signature=" in art["url"]
        with urllib.request.urlopen(art["url"], timeout=30) as resp:
            body = resp.read()
        assert len(body) == art["size_bytes"] and hashlib.sha256(body).hexdigest() == art["sha256"]

    metrics = _train(env, "metrics", "--job-id", job, timeout=60)  # finished: one sample, then it returns
    assert metrics.returncode == 0 and f"Job {job}  COMPLETED" in metrics.stdout, metrics.stdout


def test_remote_names_an_ssh_login_node(sshd: Sshd, tmp_path: Path, dev_cluster: dict[str, object]) -> None:  # noqa: F811
    """``--remote HOST`` as in ``slurm_bt.push(remote=...)``: push uploads and submits there, the job verbs run
    there (streamed, exit codes passed on); overrides and file-writing verbs say why they cannot."""
    env = _client_home(tmp_path, sshd, known=True)
    project = f"e-remote-{uuid.uuid4().hex[:6]}"
    cfg = _config(tmp_path / "laptop", project, "echo ran-as-$(id -un)")
    push = _train(env, "push", str(cfg), "--remote", ALIAS, "--tail")
    assert push.returncode == 0, push.stderr
    job = _job_id(push.stdout)
    assert f"[node 0] ran-as-{SSH_USER}" in push.stdout, push.stdout
    view = _train(env, "view", "--project", project, "--remote", ALIAS)
    assert view.returncode == 0 and "TRAINING_JOB_COMPLETED" in view.stdout and job in view.stdout, view.stderr
    logs = _train(env, "logs", "--project", project, "--remote", ALIAS)
    assert logs.returncode == 0 and f"ran-as-{SSH_USER}" in logs.stdout
    bad = _train(env, "logs", "--job-id", "nope", "--remote", ALIAS)
    assert bad.returncode == 2  # the login node's usage error, passed on
    over = _train(env, "push", str(cfg), "--remote", ALIAS, "--node-count", "2")
    assert over.returncode == 2 and "--node-count" in over.stderr
    urls = _train(env, "get_checkpoint_urls", "--job-id", job, "--remote", ALIAS)
    assert urls.returncode == 2 and "login node" in urls.stderr


def test_recreate_runs_the_pushed_workspace(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    """A config below its workspace_root with an external dir: recreate runs the copies taken at push."""
    env = _site(tmp_path)
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "data.txt").write_text("v1\n")
    (tmp_path / "root" / "cfg").mkdir(parents=True)
    (tmp_path / "root" / "config.py").write_text("# not the pushed config: a decoy of the same name\n")
    cfg = tmp_path / "root" / "cfg" / "config.py"
    cfg.write_text(textwrap.dedent(f"""
        from truss_train import definitions
        training_project = definitions.TrainingProject(name="e-recreate", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=["cat ext/data.txt"]),
            workspace=definitions.Workspace(workspace_root="..", external_dirs=[{str(tmp_path / "ext")!r}]),
        ))
        """))
    first = _train(env, "push", str(cfg), "--tail")
    assert first.returncode == 0 and "[node 0] v1" in first.stdout, (first.stdout, first.stderr)
    (tmp_path / "ext" / "data.txt").write_text("v2\n")
    again = _train(env, "recreate", "--job-id", _job_id(first.stdout), "--tail")
    assert again.returncode == 0, again.stderr
    assert "[node 0] v1" in again.stdout and "v2" not in again.stdout, again.stdout
