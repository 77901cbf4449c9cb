"""Hostile jobs that forge or swap what the root prolog reads on their behalf: ``job.json``.

The job is submitted held, its ``job.json`` is replaced as the user, then it is released. Each swap
must fail only that job, with the prolog's reason in its log, within the hook's bounds, and leave
the nodes up and nothing behind (``aftermath``).
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.hostile.harness import aftermath, as_user, attack, cancel_on_error, submit, wait, write_job

pytestmark = pytest.mark.slurm

JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-forged", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["echo SHOULD-NOT-RUN"]),
    ))
"""

# Each swap runs as the job's user in its job directory (argv, no shell): (name, argv after "python3 -c").
SWAPS = {
    "job.json -> FIFO": "import os; os.unlink('job.json'); os.mkfifo('job.json')",
    "job.json -> symlink to /etc/shadow": "import os; os.unlink('job.json'); os.symlink('/etc/shadow', 'job.json')",
    "job.json -> symlink to /dev/zero": "import os; os.unlink('job.json'); os.symlink('/dev/zero', 'job.json')",
    "job.json oversized (sparse 8 GiB)": "f = open('job.json', 'r+b'); f.truncate(8 << 30)",
    "job.json -> directory": "import os; os.unlink('job.json'); os.mkdir('job.json')",
    "job.json forged for another uid": (
        "import json; d = json.load(open('job.json')); d['context'].update(uid=0, user='root'); "
        "open('job.json', 'w').write(json.dumps(d))"),
}


@pytest.mark.parametrize("name", sorted(SWAPS))
def test_swapped_job_json_fails_only_that_job(tenants: dict[str, object], name: str) -> None:
    with attack(f"prolog input: {name}"):
        config = write_job("btu1", JOB)
        job_id = submit("btu1", config, "--hold")
        with cancel_on_error(job_id):
            show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
            work = re.search(r"WorkDir=(\S+)", show)
            assert work, show
            as_user("btu1", ["python3", "-c", SWAPS[name]], cwd=Path(work.group(1))).check_returncode()
            t0 = time.monotonic()
            subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
        record, logs = wait("btu1", job_id)
        assert record["current_status"] == "TRAINING_JOB_FAILED", logs
        assert "the slurm-bt prolog refused this job on node" in logs, logs
        assert "SHOULD-NOT-RUN" not in logs
        # The prolog's user step is bounded (user_step_timeout_s = 15 s): far below PrologEpilogTimeout.
        assert time.monotonic() - t0 < 100
        aftermath(job_id, "btu1")
