"""Upstream-style scripts and the Python API on the real dev cluster (docs/compatibility.md, "Scripts").

* ``slurm-bt run launch.py``: a script that imports ``truss_train``, falls back on a
  ``ValidationError`` it catches itself, builds a project and pushes it; the job runs and its log
  shows the fallback's values;
* a script pushing a project object that ``bt-sbatch`` would refuse (``node_count=0``, a weights
  mount under ``/etc``) is refused the same way: exit 2, one line per problem, no job, nothing written;
* ``--dry-run`` refuses what the real submit refuses (a FIFO in the folder, a missing secret)
  instead of passing and leaving the failure for later.
"""

from __future__ import annotations

import pwd
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.integration.hostile.harness import BIN, aftermath, as_user, attack, wait, write_job

pytestmark = pytest.mark.slurm

_LAUNCH = '''
import sys
from pathlib import Path
from pydantic import ValidationError
from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject, push
from truss.base import truss_config

try:  # a config's own fallback must run (slurm-bt used to swallow the error and reject the config)
    compute = Compute(cpu_count="one", memory="256Mi")
except ValidationError:
    compute = Compute(cpu_count=1, memory="256Mi")
resources = compute.to_truss_config()
job = TrainingJob(
    image=Image(base_image="python:3.11"),
    compute=compute,
    runtime=Runtime(start_commands=[f"echo script-job cpu={resources.cpu} mem={resources.memory} arg={sys.argv[1]}"]),
)
if __name__ == "__main__":
    result = push(TrainingProject(name="run-script", job=job), source_dir=Path(__file__).parent)
    print(result["id"])
'''


def _jobs_of(user: str, name: str = "refused-script") -> set[str]:
    """``user``'s jobs whose Slurm name carries ``name`` (queued, running or ended): other tests' jobs of the
    same user come and go meanwhile (the suite runs in parallel)."""
    queued = subprocess.run(["squeue", "-h", "-u", user, "-o", "%i %j"], capture_output=True, text=True,
                            check=False).stdout
    ended = subprocess.run(["sacct", "-n", "-X", "-P", "-u", user, "-S", "now-1hours", "-o", "JobID,JobName"],
                           capture_output=True, text=True, check=False).stdout
    rows = [ln.split(None, 1) for ln in queued.splitlines()] + [ln.split("|", 1) for ln in ended.splitlines()]
    return {r[0] for r in rows if len(r) == 2 and name in r[1]}


def _files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def test_run_pushes_an_upstream_script_that_runs(tenants: dict[str, object]) -> None:
    config = write_job("btu1", "x = 1\n", files={"launch.py": _LAUNCH})
    proc = as_user("btu1", [str(BIN / "slurm-bt"), "run", str(config.parent / "launch.py"), "hello"],
                   cwd=config.parent)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    assert job_id.isdigit(), proc.stdout
    record, logs = wait("btu1", job_id, timeout_s=120)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    assert "script-job cpu=1 mem=256Mi arg=hello" in logs
    aftermath(job_id, "btu1")


@pytest.mark.parametrize(("body", "loc", "fragment"), [
    ("compute=Compute(node_count=0, memory='256Mi')", "job.compute.node_count", "must be at least 1"),
    ("weights=[truss_config.WeightsSource(source='hf://a/b', mount_location='/etc/cron.d')]",
     "job.weights[0].mount_location", "under the system directory /etc"),
])
def test_push_of_a_project_object_is_refused_like_bt_sbatch(tenants: dict[str, object], body: str, loc: str,
                                                             fragment: str) -> None:
    script = textwrap.dedent(f"""
        from pathlib import Path
        from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject, push
        from truss.base import truss_config
        job = TrainingJob(image=Image(base_image="python:3.11"), runtime=Runtime(start_commands=["true"]), {body})
        push(TrainingProject(name="refused-script", job=job), source_dir=Path(__file__).parent)
        """)
    config = write_job("btu2", "x = 1\n", files={"launch.py": script})
    workspace = Path(pwd.getpwnam("btu2").pw_dir)
    before_files = {p for p in _files_under(workspace) if "refused-script" in str(p)}
    before_jobs = _jobs_of("btu2")
    with attack(f"push(project) with {loc} bt-sbatch refuses"):
        proc = as_user("btu2", [str(BIN / "slurm-bt"), "run", str(config.parent / "launch.py")], cwd=config.parent)
        assert proc.returncode == 2, (proc.stdout, proc.stderr)
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith(f"push: {loc}: ") and fragment in line, line
        assert _jobs_of("btu2") == before_jobs
        assert {p for p in _files_under(workspace) if "refused-script" in str(p)} == before_files


def test_dry_run_refuses_what_the_submit_refuses(tenants: dict[str, object]) -> None:
    fifo_config = write_job("btu1", """
        from truss_train import definitions as d
        project = d.TrainingProject(name="dry", job=d.TrainingJob(image=d.Image(base_image="python:3.11"),
                                    runtime=d.Runtime(start_commands=["true"])))
        """)
    as_user("btu1", ["mkfifo", str(fifo_config.parent / "pipe")]).check_returncode()
    secret_config = write_job("btu1", """
        from truss_train import definitions as d
        project = d.TrainingProject(name="dry", job=d.TrainingJob(image=d.Image(base_image="python:3.11"),
            runtime=d.Runtime(start_commands=["true"],
                              environment_variables={"T": d.SecretReference(name="never_set_dry_run")})))
        """)
    with attack("bt-sbatch --dry-run passes what the real submit refuses"):
        for config, expected in ((fifo_config, "pipe: not a regular file"),
                                 (secret_config, "slurm-bt secrets set never_set_dry_run")):
            proc = as_user("btu1", [str(BIN / "bt-sbatch"), "--dry-run", str(config)], cwd=config.parent)
            assert proc.returncode == 2 and expected in proc.stderr, (proc.returncode, proc.stderr)
            assert proc.stdout == ""
        ok = write_job("btu1", """
            from truss_train import definitions as d
            project = d.TrainingProject(name="dry", job=d.TrainingJob(image=d.Image(base_image="python:3.11"),
                                        runtime=d.Runtime(start_commands=["true"])))
            """)
        proc = as_user("btu1", [str(BIN / "bt-sbatch"), "--dry-run", str(ok)], cwd=ok.parent)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("#!/bin/bash")
        assert "not checked: whether Slurm accepts the job" in proc.stderr
