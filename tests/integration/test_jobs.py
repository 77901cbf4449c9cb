"""Real jobs on the dev cluster: multi-node GPU jobs, CPU jobs, secrets, the push API.

The examples (the quick start's among them) run as documented in tests/integration/test_examples.py.

Each test submits through the real ``bt-sbatch`` console script and waits with ``slurm-bt status``.
The secret test runs as an ordinary user created with useradd, and afterwards scans everything Slurm
stored or printed about the job for the secret's value.
"""

from __future__ import annotations

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

from tests.integration.cluster_nodes import node_root, nodes

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(2)]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
USER = "btalice"

PROBE = r'''
import json, os, socket, sys, time
keys = ["BT_NODE_RANK", "NODE_RANK", "BT_LEADER_ADDR", "MASTER_ADDR", "MASTER_PORT", "BT_NUM_GPUS",
        "BT_GROUP_SIZE", "NNODES", "BT_TRAINING_JOB_ID", "BT_TRAINING_PROJECT_NAME", "BT_TRAINING_JOB_NAME",
        "BT_RETRY_COUNT", "BT_SCRATCH_DIR", "BT_CHECKPOINT_DIR", "SLURM_GPUS_ON_NODE", "CUDA_VISIBLE_DEVICES",
        "SLURMD_NODENAME", "MODE"]
env = {k: os.environ.get(k) for k in keys}
rank, port, leader = int(env["BT_NODE_RANK"]), int(env["MASTER_PORT"]), env["BT_LEADER_ADDR"]
# Rendezvous over the real network path: rank 0 listens on the leader address, others connect to it.
if rank == 0:
    srv = socket.create_server((leader, port))
    srv.settimeout(60)
    peers = []
    for _ in range(int(env["BT_GROUP_SIZE"]) - 1):
        conn, _ = srv.accept()
        peers.append(conn.recv(64).decode())
    env["peers"] = sorted(peers)
else:
    for _ in range(300):
        try:
            with socket.create_connection((leader, port), timeout=2) as c:
                c.sendall(f"rank{rank}".encode())
            env["reached_leader"] = True
            break
        except OSError:
            time.sleep(0.2)
env["scratch_writable"] = os.access(env["BT_SCRATCH_DIR"] or "/nonexistent", os.W_OK)
print("PROBE " + json.dumps(env), flush=True)
'''


def _config(tmp: Path, body: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "probe.py").write_text(PROBE)
    (tmp / "config.py").write_text("from truss_train import definitions\n"
                                   "from truss.base import truss_config\n" + textwrap.dedent(body))
    return tmp / "config.py"


def _as(user: str | None, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    cmd = argv if user is None else ["runuser", "-u", user, "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 300), **kw)  # type: ignore[call-overload]


def submit_and_wait(config: Path, user: str | None = None, timeout_s: int = 240) -> tuple[str, str]:
    """Submit, wait until terminal; return (job id, the job's tagged logs)."""
    sub = _as(user, [str(BIN / "bt-sbatch"), "--parsable", str(config)], cwd=config.parent)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    st = _as(user, [str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", str(timeout_s), "--json"])
    assert st.returncode == 0, st.stderr
    logs = _as(user, [str(BIN / "slurm-bt"), "logs", job_id])
    assert logs.returncode == 0, logs.stderr
    state = json.loads(st.stdout)[0]
    assert state["current_status"] == "TRAINING_JOB_COMPLETED", (state, logs.stdout)
    return job_id, logs.stdout


def probes(logs: str) -> list[dict[str, object]]:
    return [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs)]


def test_two_nodes_four_gpus_each(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    config = _config(tmp_path / "mn", """
        project = definitions.TrainingProject(name="mn-probe", job=definitions.TrainingJob(
            name="gpus",
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count=2, cpu_count=1, memory="512Mi",
                                        accelerator=truss_config.AcceleratorSpec(accelerator="H100", count=4)),
            runtime=definitions.Runtime(start_commands=["python3 probe.py"],
                                        environment_variables={"MODE": "multi"}),
        ))
        """)
    job_id, logs = submit_and_wait(config)
    found = sorted(probes(logs), key=lambda p: int(str(p["BT_NODE_RANK"])))
    assert [p["BT_NODE_RANK"] for p in found] == ["0", "1"], logs
    names = {str(p["SLURMD_NODENAME"]) for p in found}
    assert len(names) == 2 and names <= set(nodes()), found
    leaders = {p["BT_LEADER_ADDR"] for p in found}
    assert len(leaders) == 1 and leaders == {p["MASTER_ADDR"] for p in found}
    assert leaders.isdisjoint(names), "leader must be an address, not a node name"
    assert found[0]["peers"] == ["rank1"] and found[1]["reached_leader"] is True
    for p in found:
        assert p["BT_NUM_GPUS"] == "4" and p["SLURM_GPUS_ON_NODE"] == "4"
        assert len(str(p["CUDA_VISIBLE_DEVICES"]).split(",")) == 4
        assert p["BT_GROUP_SIZE"] == p["NNODES"] == "2"
        assert p["NODE_RANK"] == p["BT_NODE_RANK"]
        assert p["BT_TRAINING_JOB_ID"] == job_id and p["BT_RETRY_COUNT"] == "0"
        assert p["BT_TRAINING_PROJECT_NAME"] == "mn-probe" and p["BT_TRAINING_JOB_NAME"] == "gpus"
        assert p["MODE"] == "multi" and p["scratch_writable"] is True
    sacct = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "--format=AllocTRES,NNodes"],
                           capture_output=True, text=True).stdout
    assert "gres/gpu=8" in sacct and sacct.strip().endswith("|2")


def test_cpu_only_job(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    config = _config(tmp_path / "cpu", """
        project = definitions.TrainingProject(name="cpu-probe", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=["python3 probe.py"]),
        ))
        """)
    _, logs = submit_and_wait(config)
    [p] = probes(logs)
    assert p["BT_NUM_GPUS"] == "0" and p["SLURM_GPUS_ON_NODE"] is None
    assert p["BT_NODE_RANK"] == "0" and p["BT_GROUP_SIZE"] == "1"


def test_failing_start_command_fails_the_job(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    config = _config(tmp_path / "fail", """
        project = definitions.TrainingProject(name="fail-probe", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(start_commands=["echo first", "exit 3", "echo never"]),
        ))
        """)
    sub = _as(None, [str(BIN / "bt-sbatch"), "--parsable", str(config)])
    job_id = sub.stdout.strip()
    st = _as(None, [str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "120", "--json"])
    state = json.loads(st.stdout)[0]
    assert state["current_status"] == "TRAINING_JOB_FAILED"
    assert state["exit_code"] == [3, 0]
    logs = _as(None, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
    assert "first" in logs and "never" not in logs


@pytest.fixture(scope="module")
def job_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a test user")
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
    return USER


def test_secret_reaches_the_job_and_nothing_else(dev_cluster: dict[str, object], job_user: str,
                                                 tmp_path: Path) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    home = Path(f"/home/{job_user}")
    work = home / f"secret-test-{uuid.uuid4().hex[:8]}"
    _as(job_user, ["mkdir", "-p", str(work)]).check_returncode()
    setter = _as(job_user, [str(BIN / "slurm-bt"), "secrets", "set", "canary_secret"], input=canary + "\n")
    assert setter.returncode == 0, setter.stderr
    body = textwrap.dedent("""
        from truss_train import definitions
        project = definitions.TrainingProject(name="secret-probe", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count=2, memory="256Mi"),
            runtime=definitions.Runtime(
                start_commands=["python3 -c 'import hashlib,os; "
                                "print(\\"SHA\\", hashlib.sha256(os.environ[\\"MY_TOKEN\\"].encode()).hexdigest())'"],
                environment_variables={"MY_TOKEN": definitions.SecretReference(name="canary_secret")},
            ),
        ))
        """)
    _as(job_user, ["tee", str(work / "config.py")], input=body).check_returncode()
    env_with_secret = {**os.environ, "MY_TOKEN": canary, "AWS_SECRET_ACCESS_KEY": canary}
    sub = subprocess.run(["runuser", "-u", job_user, "--", str(BIN / "bt-sbatch"), "--parsable",
                          str(work / "config.py")], capture_output=True, text=True, env=env_with_secret,
                         cwd=work, timeout=120)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    st = _as(job_user, [str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "180", "--json"])
    logs = _as(job_user, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
    assert json.loads(st.stdout)[0]["current_status"] == "TRAINING_JOB_COMPLETED", logs
    import hashlib

    digest = hashlib.sha256(canary.encode()).hexdigest()
    assert logs.count(f"SHA {digest}") == 2, logs  # both nodes saw the value

    # The canary scan: everything Slurm shows or stored, our files, the logs, the runtime dir.
    for _ in range(60):  # slurmdbd stores the script asynchronously after the job starts
        stored = subprocess.run(["sacct", "-j", job_id, "--batch-script"], capture_output=True, text=True).stdout
        if "#SBATCH" in stored:
            break
        time.sleep(0.5)
    places = {
        "scontrol": subprocess.run(["scontrol", "show", "job", "-dd", job_id], capture_output=True, text=True).stdout,
        "sacct": subprocess.run(["sacct", "-j", job_id, "-P", "--format=ALL"], capture_output=True, text=True).stdout,
        "batch_script": subprocess.run(["sacct", "-j", job_id, "--batch-script"], capture_output=True,
                                       text=True).stdout,
        "env_vars": subprocess.run(["sacct", "-j", job_id, "--env-vars"], capture_output=True, text=True).stdout,
        "sacct_json": subprocess.run(["sacct", "-j", job_id, "--json"], capture_output=True, text=True).stdout,
    }
    assert "#SBATCH" in places["batch_script"], "job_script storage must be on for this test to mean anything"
    assert "BT_TRAINING_PROJECT" in places["batch_script"]
    for where, text in places.items():
        assert canary not in text, f"secret leaked into {where}"
    scanned = 0
    shms = [node_root(n) / "dev" / "shm" for n in nodes()]  # each node's own where nodes are isolated
    roots = [home / ".slurm-bt", Path("/var/log/slurm"), Path("/var/lib/slurm-bt-dev/node"), *shms]
    for root in roots:
        # Other tests' jobs run meanwhile: their files come and go under the node roots.
        for dirpath, dirs, files in os.walk(root):
            # An unpacked container image (another test's job) is the image's bytes, not what slurm-bt wrote.
            dirs[:] = [d for d in dirs if d != ".bt-image"]
            if "secrets" in Path(dirpath).parts:
                continue
            for name in files:
                path = Path(dirpath) / name
                try:
                    if path.is_symlink() or not path.is_file():
                        continue
                    data = path.read_bytes()
                except OSError:
                    continue
                scanned += 1
                assert canary.encode() not in data, f"secret leaked into {path}"
    assert scanned > 0
    leftover = [p for shm in shms for p in shm.glob(f"slurm-bt-*/{job_id}/*.env")]
    assert leftover == [], "per-node env files must be deleted once read"


def test_push_api_returns_truss_shaped_result(dev_cluster: dict[str, object]) -> None:
    """``slurm_bt.push(Path)`` submits like bt-sbatch and returns what truss_train callers read."""
    from slurm_bt import push

    result = push(REPO / "examples" / "quickstart" / "config.py")
    assert result["id"].isdigit()
    assert result["training_project"] == {"id": "quickstart", "name": "quickstart"}
    assert result["current_status"] == "TRAINING_JOB_PENDING"
    assert result["job_object"].compute.node_count == 2
    st = _as(None, [str(BIN / "slurm-bt"), "status", result["id"], "--wait", "--timeout", "180", "--json"])
    assert json.loads(st.stdout)[0]["current_status"] == "TRAINING_JOB_COMPLETED"
