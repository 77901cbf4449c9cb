"""Long runs on the real dev cluster (docs/long-runs.md): time limit and application failures (preemption and
node failure: test_long_runs_nodes.py).

Each test runs the quick start's training loop (examples/quickstart/train.py, copied into the job) slowed
down with ``--step-seconds`` so that it outlives a run, and checks that it resumes from its checkpoint
and ends with exactly the result of an uninterrupted run.

Slow by nature: Slurm holds a requeued job for ``cred_expire`` before it may start again (the dev
cluster sets 30 s, Slurm's default is 120 s: BeginTime; a job started earlier finds the prolog skipped
on a node that still caches its credential), so each requeue costs about a minute.
"""

from __future__ import annotations

import re

import pytest

from tests.integration.hostile.harness import BIN, as_user, submit, wait, write_job
from tests.integration.long_runs_support import TRAIN, USER, config_text, final_line, uninterrupted, users

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(4)]
__all__ = ["users"]  # the module fixture


def test_time_limit_requeues_and_resumes_to_the_uninterrupted_result(users: dict[str, object]) -> None:
    """The 2-node quick start, 1-minute limit, 100 s of work: two or more requeues, same result.

    A run stops 20 s before its limit (a third of it) and starts training a few seconds in: observed
    24 to 38 steps a run, so 100 steps take three runs or more.
    """
    steps = 100
    config = write_job(USER, config_text(nodes=2, args=f"--steps {steps} --step-seconds 1 --checkpoint-every 10",
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
    assert final_line(logs) == uninterrupted(steps)
    table = as_user(USER, [str(BIN / "slurm-bt"), "status", job]).stdout
    assert "time limit" in table, table


def test_application_error_fails_unless_retry_is_opted_in_and_the_cap_holds(users: dict[str, object]) -> None:
    plain = write_job(USER, config_text(nodes=1, args="--steps 5 && exit 3", env={}), {"train.py": TRAIN})
    retried = write_job(USER, config_text(nodes=1, args="--steps 5 && exit 3", env={"BT_RETRY_ON_FAILURE": "1"}),
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
