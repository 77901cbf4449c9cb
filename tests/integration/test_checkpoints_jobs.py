"""Real jobs on the dev cluster with an S3 checkpoint store (SeaweedFS on loopback).

1. A slow job writes three marked checkpoints and one unmarked at the end: each marked one appears in
   the store while the job is still RUNNING (polled), and the final flush completes the set.
2. A second job loads ``from_latest_checkpoint(project_name=...)`` and sees the files in
   ``$BT_LOAD_CHECKPOINT_DIR/rank-0/<name>/``, byte for byte.
3. A job naming a checkpoint that does not exist fails at submit (exit 2, naming the field).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from slurm_bt.secrets_store import SecretStore
from tests.servers.fixtures import seaweed  # noqa: F401  (session fixture)
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
BUCKET = "ckpt-jobs"

TRAIN = r'''
import hashlib, json, os, pathlib, time
d = pathlib.Path(os.environ["BT_CHECKPOINT_DIR"])
for i in range(1, 4):
    c = d / f"checkpoint-{i}"
    (c / "sub").mkdir(parents=True)
    (c / "model.bin").write_bytes(os.urandom(300_000 * i))
    (c / "sub" / "state.json").write_text(json.dumps({"step": i}))
    (c / ".complete").touch()
    print(f"WROTE checkpoint-{i}", flush=True)
    time.sleep(6)
last = d / "checkpoint-4"
last.mkdir()
(last / "model.bin").write_bytes(os.urandom(123_457))
print("WROTE checkpoint-4 (no marker)", flush=True)
'''

LOAD = r'''
import hashlib, json, os, pathlib
root = pathlib.Path(os.environ["BT_LOAD_CHECKPOINT_DIR"])
files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
         for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}
print("LOADED " + json.dumps(files), flush=True)
'''


@pytest.fixture(scope="module")
def site(seaweed: SeaweedS3, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:  # noqa: F811
    seaweed.create_bucket(BUCKET)
    root = tmp_path_factory.mktemp("ckptsite")
    store = SecretStore(root / "secrets")
    store.set("ckpt-store", json.dumps({"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}))
    uri = f"s3://{BUCKET}/bt?endpoint_url={seaweed.endpoint}&secret=ckpt-store&part_size_mib=8"
    toml = root / "site.toml"
    toml.write_text(f'[storage]\ncheckpoint_store = "{uri}"\nsecrets = "{root}/secrets"\n')
    return {**os.environ, "SLURM_BT_SITE_CONFIG": str(toml)}


def _config(tmp: Path, project: str, runtime: str, script: tuple[str, str]) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / script[0]).write_text(script[1])
    (tmp / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import definitions
        project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="512Mi"),
            runtime=definitions.Runtime({runtime}),
        ))
        """))
    return tmp / "config.py"


def _run(argv: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180, **kw)  # type: ignore[call-overload]


def _state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out or "GONE"


def _uploaded(seaweed: SeaweedS3, project: str, job_id: str) -> set[str]:  # noqa: F811
    # Uploads go to the job's team namespace, bt/_teams/<team>/<project>/<job>/ (docs/checkpoints.md):
    # the team bt-sbatch and the prolog resolve for this user.
    from slurm_bt.weights.plan import team_for_user

    prefix = f"bt/_teams/{team_for_user()}/{project}/{job_id}/rank-0/"
    resp = seaweed.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return {k["Key"].split("/")[6] for k in resp.get("Contents", [])}


def test_checkpoints_upload_during_the_job_then_load_in_the_next(
        dev_cluster: dict[str, object], seaweed: SeaweedS3, site: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    project = f"ckpt-it-{uuid.uuid4().hex[:8]}"
    cfg = _config(tmp_path / "train", project, (
        'start_commands=["python3 train.py"], environment_variables={"BT_CHECKPOINT_POLL_S": "1"}, '
        "checkpointing_config=definitions.CheckpointingConfig(enabled=True)"), ("train.py", TRAIN))
    sub = _run([str(BIN / "bt-sbatch"), "--parsable", str(cfg)], site)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    seen_while_running: set[str] = set()
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        state = _state(job_id)
        now = _uploaded(seaweed, project, job_id)
        if state == "RUNNING":
            seen_while_running |= now
        if state == "GONE":
            break
        time.sleep(0.5)
    st = _run([str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "60", "--json"], site)
    logs = _run([str(BIN / "slurm-bt"), "logs", job_id], site).stdout
    assert json.loads(st.stdout)[0]["current_status"] == "TRAINING_JOB_COMPLETED", logs
    assert {"checkpoint-1", "checkpoint-2"} <= seen_while_running, (seen_while_running, logs)
    listed = _run([str(BIN / "slurm-bt"), "checkpoints", "list", job_id, "-o", "json"], site)
    assert listed.returncode == 0, listed.stderr
    index = json.loads(listed.stdout)
    assert [c["name"] for c in index["checkpoints"]] == [f"checkpoint-{i}" for i in range(1, 5)]
    assert all(c["complete"] for c in index["checkpoints"])
    expected = {f"rank-0/checkpoint-4/{f['path']}": f["sha256"] for f in index["checkpoints"][3]["ranks"]["0"]}

    # Second job: load the project's latest checkpoint (checkpoint-4, uploaded by the final flush).
    cfg2 = _config(tmp_path / "load", project + "-next", (
        'start_commands=["python3 load.py"], load_checkpoint_config=definitions.LoadCheckpointConfig('
        f'enabled=True, checkpoints=[definitions.BasetenCheckpoint.from_latest_checkpoint(project_name={project!r})])'),
        ("load.py", LOAD))
    sub2 = _run([str(BIN / "bt-sbatch"), "--parsable", str(cfg2)], site)
    assert sub2.returncode == 0, sub2.stderr
    job2 = sub2.stdout.strip()
    st2 = _run([str(BIN / "slurm-bt"), "status", job2, "--wait", "--timeout", "120", "--json"], site)
    logs2 = _run([str(BIN / "slurm-bt"), "logs", job2], site).stdout
    assert json.loads(st2.stdout)[0]["current_status"] == "TRAINING_JOB_COMPLETED", logs2
    [loaded] = re.findall(r"LOADED (\{.*\})", logs2)
    assert json.loads(loaded) == expected
    assert all(len(v) == 64 for v in expected.values()) and hashlib.sha256(b"").hexdigest() not in expected.values()


def test_missing_named_checkpoint_fails_at_submit(dev_cluster: dict[str, object], site: dict[str, str],
                                                  tmp_path: Path) -> None:
    cfg = _config(tmp_path / "missing", "ckpt-missing", (
        'start_commands=["true"], load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, '
        'checkpoints=[definitions.BasetenCheckpoint.from_named_checkpoint(checkpoint_name="checkpoint-24", '
        'job_id="987654")])'), ("noop.py", ""))
    sub = _run([str(BIN / "bt-sbatch"), "--parsable", str(cfg)], site)
    assert sub.returncode == 2, (sub.stdout, sub.stderr)
    assert "job.runtime.load_checkpoint_config.checkpoints[0]" in sub.stderr
    assert "987654" in sub.stderr and sub.stdout.strip() == ""
