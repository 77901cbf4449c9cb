"""Long runs that lose their node (docs/long-runs.md): preempted by an urgent job, or the node goes DOWN.

Each job has its node to itself (``--exclusive``), so taking that node away touches no other test's job
and these tests run beside the others (scripts/test.sh). As in test_long_runs.py, each run resumes from its
checkpoint and must end with exactly the result of an uninterrupted run; a requeue costs about a minute.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.integration.cluster_nodes import nodes
from tests.integration.hostile.harness import submit, wait, write_job
from tests.integration.long_runs_support import (
    TRAIN,
    USER,
    checkpoint_uploaded,
    config_text,
    final_line,
    running_elsewhere_or_gone,
    uninterrupted,
    users,
    wait_until,
)

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(4)]
__all__ = ["users"]  # the module fixture


def test_preemption_saves_requeues_and_resumes(users: dict[str, object]) -> None:
    """A preemptible job preempted by an urgent one mid-run: saves, requeues, resumes, completes."""
    steps = 60
    config = write_job(USER, config_text(nodes=1, args=f"--steps {steps} --step-seconds 1 --checkpoint-every 5",
                                     env={}), {"train.py": TRAIN})
    node = nodes()[-1]
    job = submit(USER, config, "--partition=preemptible", f"--nodelist={node}", "--exclusive")
    wait_until(lambda: checkpoint_uploaded(job), 120, "a first checkpoint")
    urgent = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "--parsable", "--partition=urgent",
                             f"--nodelist={node}", "--exclusive", "--output=/dev/null", "--wrap", "sleep 2"],
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
    assert final_line(logs) == uninterrupted(steps)


def test_node_failure_requeues_and_resumes_on_the_other_node(users: dict[str, object]) -> None:
    """The node of a running 1-node job goes DOWN: the job is requeued and resumes on the other node."""
    steps = 60
    config = write_job(USER, config_text(nodes=1, args=f"--steps {steps} --step-seconds 1 --checkpoint-every 5",
                                     env={}), {"train.py": TRAIN})
    # Its own node (no other job is hurt when it goes down): not the one the preemption test holds, nor
    # n1, which tests pin jobs to (--nodelist), when there are nodes enough to leave the requeue one.
    spare = [f"--exclude={nodes()[0]},{nodes()[-1]}"] if len(nodes()) > 3 else []
    job = submit(USER, config, "--exclusive", *spare)
    wait_until(lambda: checkpoint_uploaded(job), 120, "a first checkpoint")
    node = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert node in nodes(), node
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
        wait_until(lambda: running_elsewhere_or_gone(job, node), 300, "the second run")
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
    record, logs = wait(USER, job, timeout_s=300)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs[-3000:])
    assert record["restarts"] == 1 and record["runs"][0]["cause"] == "node failure", record
    assert record["runs"][0]["nodes"] == node and record["nodes"] not in {node, None}, record
    assert re.search(r"rank 0/1 resumed from step ([1-9]\d*)", logs), logs[-3000:]
    assert final_line(logs) == uninterrupted(steps)


