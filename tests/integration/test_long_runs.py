"""Long runs on the real dev cluster (docs/long-runs.md): time limit, preemption, node failure, failures.

Each test runs the quick start's training loop (examples/quickstart/train.py, copied into the job) slowed
down with ``--step-seconds`` so that it outlives a run, and checks that it resumes from its checkpoint
and ends with exactly the result of an uninterrupted run.

Slow by nature: Slurm holds a requeued job for ``cred_expire`` before it may start again (the dev
cluster sets 30 s, Slurm's default is 120 s: BeginTime; a job started earlier finds the prolog skipped
on a node that still caches its credential), so each requeue costs about a minute.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.hostile.harness import BIN, as_user, submit, wait, write_job
from tests.unit.test_hooks_env import ensure_test_users

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]
TRAIN = (ROOT / "examples" / "quickstart" / "train.py").read_text()
USER = "btu1"


@pytest.fixture(scope="module")
def users(dev_cluster: dict[str, object]) -> dict[str, object]:
    ensure_test_users()
    subprocess.run(["sacctmgr", "-i", "add", "user", USER, "account=default"], capture_output=True, check=False)
    return dev_cluster


def _config(*, nodes: int, args: str, env: dict[str, str]) -> str:
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


def _uninterrupted(steps: int) -> str:
    """Rank 0's final line of the same loop run in one go, here (no Slurm)."""
    out = subprocess.run([sys.executable, "-c", TRAIN, "--steps", str(steps)], capture_output=True, text=True,
                         check=True, env={"BT_CHECKPOINT_DIR": "/tmp/bt-long-runs-ref", "PATH": "/usr/bin:/bin"})
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("rank 0/1 done:")]
    return line.split("done:")[1].strip()


def _final(logs: str) -> str:
    done = re.findall(r"rank 0/\d+ done: (w \S+ b \S+)", logs)
    assert done, logs[-3000:]
    return str(done[-1])


def _state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          check=False).stdout.strip()


def _running_elsewhere_or_gone(job_id: str, node: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %N"], capture_output=True, text=True,
                         check=False).stdout.split()
    return not out or (out[0] == "RUNNING" and out[1:] != [node])


def _wait_until(pred: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def _checkpoint_uploaded(job_id: str) -> bool:
    logs = as_user(USER, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
    return "uploaded checkpoint-" in logs


def test_time_limit_requeues_and_resumes_to_the_uninterrupted_result(users: dict[str, object]) -> None:
    """The 2-node quick start, 1-minute limit, 100 s of work: two or more requeues, same result.

    A run stops 20 s before its limit (a third of it) and starts training a few seconds in: observed
    24 to 38 steps a run, so 100 steps take three runs or more.
    """
    steps = 100
    config = write_job(USER, _config(nodes=2, args=f"--steps {steps} --step-seconds 1 --checkpoint-every 10",
                                     env={"BT_MAX_RESTARTS": "5"}), {"train.py": TRAIN})
    job = submit(USER, config, "--time=00:01:00")
    record, logs = wait(USER, job, timeout_s=1200)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs[-3000:])
    causes = [r["cause"] for r in record["runs"]]
    # A restart whose prolog Slurm skipped is requeued again as a node failure (steps/restart.py).
    assert causes.count("time limit") >= 2 and set(causes) <= {"time limit", "node failure"}, record["runs"]
    assert "time limit" in record["detail"]
    resumed = re.findall(r"rank 0/2 resumed from step \d+", logs)
    assert len(resumed) == record["restarts"] - causes.count("node failure"), logs[-3000:]
    assert "sending SIGTERM to the start commands" in logs
    assert _final(logs) == _uninterrupted(steps)
    table = as_user(USER, [str(BIN / "slurm-bt"), "status", job]).stdout
    assert "time limit" in table, table


def test_preemption_saves_requeues_and_resumes(users: dict[str, object]) -> None:
    """A preemptible job preempted by an urgent one mid-run: saves, requeues, resumes, completes."""
    steps = 60
    config = write_job(USER, _config(nodes=1, args=f"--steps {steps} --step-seconds 1 --checkpoint-every 5",
                                     env={}), {"train.py": TRAIN})
    job = submit(USER, config, "--partition=preemptible", "--nodelist=n2", "--exclusive")
    _wait_until(lambda: _checkpoint_uploaded(job), 120, "a first checkpoint")
    urgent = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "--parsable", "--partition=urgent",
                             "--nodelist=n2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 2"],
                            capture_output=True, text=True, check=True).stdout.strip()
    try:
        record, logs = wait(USER, job, timeout_s=600)
    finally:
        subprocess.run(["scancel", urgent], check=False)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs[-3000:])
    # Slurm 24.11 requeues a once-preempted job again when its next run completes (its state reads
    # PREEMPTED; docs/slurm-releases.md): one more short run, from the final checkpoint. Other releases
    # run it exactly twice.
    stale = 1 if str(users["slurm_version"]) == "24.11" and record["restarts"] == 2 else 0
    assert record["restarts"] == 1 + stale and record["runs"][0]["cause"] == "preempted", record
    assert re.search(r"rank 0/1 resumed from step ([1-9]\d*)", logs), logs[-3000:]
    assert _final(logs) == _uninterrupted(steps)


def test_node_failure_requeues_and_resumes_on_the_other_node(users: dict[str, object]) -> None:
    """The node of a running 1-node job goes DOWN: the job is requeued and resumes on the other node."""
    steps = 60
    config = write_job(USER, _config(nodes=1, args=f"--steps {steps} --step-seconds 1 --checkpoint-every 5",
                                     env={}), {"train.py": TRAIN})
    job = submit(USER, config)
    _wait_until(lambda: _checkpoint_uploaded(job), 120, "a first checkpoint")
    node = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert node in {"n1", "n2"}, node
    try:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                        "reason=slurm-bt long-run test"], check=True)
        # ReturnToService=2 (the dev cluster) returns a DOWN node at its next slurmd contact, at once:
        # drained, it takes no new job until the finally below, so the second run must go elsewhere.
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain",
                        "reason=slurm-bt long-run test"], check=True)
        # Kept down until the requeued run has started elsewhere: after the ~2 min BeginTime of a
        # requeue, or at once with 25.11+'s --requeue=expedite, where the job can go from RUNNING on
        # this node to RUNNING on the other between two polls (and even finish before the next one).
        _wait_until(lambda: _running_elsewhere_or_gone(job, node), 300, "the second run")
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    record, logs = wait(USER, job, timeout_s=300)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs[-3000:])
    assert record["restarts"] == 1 and record["runs"][0]["cause"] == "node failure", record
    assert record["runs"][0]["nodes"] == node and record["nodes"] not in {node, None}, record
    assert re.search(r"rank 0/1 resumed from step ([1-9]\d*)", logs), logs[-3000:]
    assert _final(logs) == _uninterrupted(steps)


def test_application_error_fails_unless_retry_is_opted_in_and_the_cap_holds(users: dict[str, object]) -> None:
    plain = write_job(USER, _config(nodes=1, args="--steps 5 && exit 3", env={}), {"train.py": TRAIN})
    retried = write_job(USER, _config(nodes=1, args="--steps 5 && exit 3", env={"BT_RETRY_ON_FAILURE": "1"}),
                        {"train.py": TRAIN})
    a, b = submit(USER, plain), submit(USER, retried)
    rec_a, logs_a = wait(USER, a, timeout_s=180)
    assert rec_a["current_status"] == "TRAINING_JOB_FAILED" and rec_a["restarts"] == 0, rec_a
    assert "an application error is not retried" in logs_a
    rec_b, logs_b = wait(USER, b, timeout_s=420)
    # Exactly one retry (the cap), then the job fails with the start commands' exit status.
    assert rec_b["current_status"] == "TRAINING_JOB_FAILED" and rec_b["restarts"] == 1, rec_b
    assert rec_b["runs"][0]["cause"] == "failed" and rec_b["exit_code"] == [3, 0], rec_b
    assert "retried (1 of 1" in logs_b and "the most BT_RETRY_ON_FAILURE allows" in logs_b
