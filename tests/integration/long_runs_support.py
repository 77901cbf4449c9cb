"""What the long-run tests share (test_long_runs.py, test_long_runs_nodes.py; docs/long-runs.md): the quick
start's training loop slowed down with ``--step-seconds`` so that it outlives a run, its config, and the
result of the same loop run in one go, which every resumed run must end with."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.hostile.harness import BIN, as_user
from tests.unit.test_hooks_env import ensure_test_users

ROOT = Path(__file__).resolve().parents[2]
TRAIN = (ROOT / "examples" / "quickstart" / "train.py").read_text()
USER = "btu1"


@pytest.fixture(scope="module")
def users(dev_cluster: dict[str, object]) -> dict[str, object]:
    ensure_test_users()
    subprocess.run(["sacctmgr", "-i", "add", "user", USER, "account=default"], capture_output=True, check=False)
    return dev_cluster


def config_text(*, nodes: int, args: str, env: dict[str, str]) -> str:
    env = {"LEARNING_RATE": "0.05", "BT_CHECKPOINT_QUIET_S": "2", "BT_CHECKPOINT_POLL_S": "1", **env}
    return f"""
        from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject, definitions

        training_job = TrainingJob(
            name="long-run",
            image=Image(base_image="python:3.11-slim"),
            compute=Compute(node_count={nodes}, cpu_count=1, memory="512Mi"),
            runtime=Runtime(
                start_commands=[{f"python3 train.py {args}"!r}],
                environment_variables={env!r},
                checkpointing_config=definitions.CheckpointingConfig(enabled=True),
            ),
        )
        training_project = TrainingProject(name="long-runs", job=training_job)
    """


def uninterrupted(steps: int) -> str:
    """Rank 0's final line of the same loop run in one go, here (no Slurm)."""
    out = subprocess.run([sys.executable, "-c", TRAIN, "--steps", str(steps)], capture_output=True, text=True,
                         check=True, env={"BT_CHECKPOINT_DIR": "/tmp/bt-long-runs-ref", "PATH": "/usr/bin:/bin"})
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("rank 0/1 done:")]
    return line.split("done:")[1].strip()


def final_line(logs: str) -> str:
    done = re.findall(r"rank 0/\d+ done: (w \S+ b \S+)", logs)
    assert done, logs[-3000:]
    return str(done[-1])


def state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          check=False).stdout.strip()


def running_elsewhere_or_gone(job_id: str, node: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %N"], capture_output=True, text=True,
                         check=False).stdout.split()
    return not out or (out[0] == "RUNNING" and out[1:] != [node])


def wait_until(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def checkpoint_uploaded(job_id: str) -> bool:
    logs = as_user(USER, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
    return "uploaded checkpoint-" in logs
