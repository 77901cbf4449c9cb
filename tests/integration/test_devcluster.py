"""Real-cluster checks for the dev cluster (devcluster/devcluster.py up).

Skipped when the cluster is not running. Needs: sinfo/sbatch/sacct on PATH and a readable
<state>/cluster.json (state dir: $BT_DEVCLUSTER_DIR or /var/lib/slurm-bt-dev).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "devcluster" / "devcluster.py"
STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))
TEST_USER = "btdevtest"
HEALTHY = {"idle", "mixed", "allocated", "completing"}


def _cluster_info() -> dict | None:
    try:
        info = json.loads((STATE / "cluster.json").read_text())
    except (OSError, ValueError):
        return None
    if shutil.which("sinfo") is None:
        return None
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    return info if ping.returncode == 0 and "is UP" in ping.stdout else None


INFO = _cluster_info()
pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(INFO is None, reason="dev cluster not running (devcluster/devcluster.py up)"),
]


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _sacct_json(job_id: str, as_user: str | None = None, timeout: float = 30, want=lambda job: True) -> dict:
    """Accounting is written asynchronously: poll until the job shows up as finished (and `want(job)`).

    Seen on 22.05.8: a non-root job's record can read COMPLETED with group root (gid 0) for about a second
    before the final update arrives.
    """
    cmd = ["sacct", "--json", "-j", job_id]
    if as_user:
        cmd = ["runuser", "-u", as_user, "--", *cmd]
    deadline = time.monotonic() + timeout
    while True:
        cp = _run(cmd)
        assert cp.returncode == 0, cp.stderr
        data = json.loads(cp.stdout)
        jobs = [j for j in data.get("jobs", []) if str(j.get("job_id")) == job_id]
        if jobs and _state(jobs[0]) not in ("PENDING", "RUNNING", "COMPLETING") and want(jobs[0]):
            return jobs[0]
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} not finished in sacct --json after {timeout}s: {jobs}")
        time.sleep(1)


def _state(job: dict) -> str:
    """sacct --json's state.current: a string on 22.05, a list of flags (["COMPLETED"]) from 23.02 on."""
    cur = job["state"]["current"]
    return cur if isinstance(cur, str) else ",".join(cur)


JOB_SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:{gres_type}:{gpus}
#SBATCH --time=5
srun bash -c 'echo "STEP node=$SLURMD_NODENAME nodeid=$SLURM_NODEID gpus=$SLURM_GPUS_ON_NODE cvd=$CUDA_VISIBLE_DEVICES"'
"""


def _submit_gpu_job(workdir: Path, as_user: str | None = None) -> tuple[str, str]:
    script = workdir / "job.sh"
    script.write_text(JOB_SCRIPT.format(gres_type=INFO["gres_type"], gpus=INFO["gpus_per_node"]))
    script.chmod(0o755)
    out = workdir / "job-%j.out"
    cmd = ["sbatch", "--parsable", "--wait", "-p", "gpu", "-J", "devcluster-test", "-o", str(out),
           "-D", str(workdir), str(script)]
    if as_user:
        cmd = ["runuser", "-u", as_user, "--", *cmd]
    cp = _run(cmd, timeout=300)
    assert cp.returncode == 0, f"sbatch failed: {cp.stdout}{cp.stderr}"
    job_id = cp.stdout.strip().split(";")[0]
    return job_id, (workdir / f"job-{job_id}.out").read_text()


def _check_output(text: str) -> None:
    steps = sorted(line.split()[1:] for line in text.splitlines() if line.startswith("STEP "))
    assert len(steps) == 2, text
    fields = [dict(kv.split("=", 1) for kv in s) for s in steps]
    names = [f["node"] for f in fields]  # two distinct nodes of the cluster, whichever were free
    assert len(set(names)) == 2 and set(names) <= set(INFO["nodes"]), text
    assert sorted(f["nodeid"] for f in fields) == ["0", "1"], text
    for f in fields:
        assert f["gpus"] == str(INFO["gpus_per_node"]), text
        assert len(f["cvd"].split(",")) == INFO["gpus_per_node"], text


def test_status_reports_up():
    cp = _run([sys.executable, str(DEVCLUSTER), "status"])
    assert cp.returncode == 0, cp.stdout + cp.stderr


def test_release_reported_as_installed():
    """`status` and cluster.json name the Slurm release that runs (22.05, 24.11 and 26.05 differ)."""
    v = _run(["/usr/sbin/slurmctld", "-V"])
    release = v.stdout.split()[-1]
    assert INFO["slurm_release"] == release
    assert INFO["slurm_version"] == ".".join(release.split(".")[:2])
    cp = _run([sys.executable, str(DEVCLUSTER), "status"])
    assert f"release      Slurm {release}" in cp.stdout.splitlines()[0]
    # What up writes for the release: >= 23.02 slurmd needs CgroupPlugin=disabled without a cgroup fs.
    cgroup = Path(INFO["slurm_conf"]).with_name("cgroup.conf")
    if tuple(int(x) for x in release.split(".")[:2]) >= (23, 2):
        assert "CgroupPlugin=disabled" in cgroup.read_text().splitlines()
    else:
        assert not cgroup.exists()


def test_nodes_idle_or_busy_not_down():
    cp = _run(["sinfo", "-h", "-N", "-o", "%N %T"])
    assert cp.returncode == 0, cp.stderr
    states = dict(line.split() for line in cp.stdout.splitlines())
    # the layout's nodes: n1, n2 on this host's network, or n1..nN isolated (devcluster/README.md)
    expected = 2 if INFO.get("layout", "host") == "host" else len(INFO["nodes"])
    assert sorted(INFO["nodes"]) == [f"n{i}" for i in range(1, expected + 1)]
    for node in INFO["nodes"]:
        assert states.get(node) in HEALTHY, states


def test_two_node_gpu_job_root_or_current_user(tmp_path: Path):
    job_id, text = _submit_gpu_job(tmp_path)
    _check_output(text)
    job = _sacct_json(job_id)
    assert _state(job) == "COMPLETED", job["state"]
    assert job["cluster"] == INFO["cluster"]
    alloc = _run(["sacct", "-X", "-P", "-n", "-j", job_id, "--format=AllocTRES"]).stdout
    assert f"gres/gpu={2 * INFO['gpus_per_node']}" in alloc, alloc


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_two_node_gpu_job_as_normal_user():
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", TEST_USER], check=True, capture_output=True)
    # PrivateData: a user sees their own jobs in sacct only through an association.
    subprocess.run(["sacctmgr", "-i", "add", "user", TEST_USER, "account=default"], capture_output=True, check=False)
    workdir = STATE / "shared" / f"test-devcluster-{uuid.uuid4().hex[:8]}"
    workdir.mkdir()
    user = pwd.getpwnam(TEST_USER)
    os.chown(workdir, user.pw_uid, user.pw_gid)
    try:
        job_id, text = _submit_gpu_job(workdir, as_user=TEST_USER)
        _check_output(text)
        job = _sacct_json(job_id, as_user=TEST_USER, want=lambda j: j["group"] == TEST_USER)
        assert _state(job) == "COMPLETED", job["state"]
        # "user" is null on 22.05 when the user has no association (created after the last `up`).
        assert job["user"] in (TEST_USER, None), job["user"]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
