"""Jobs run inside their pinned image on the real dev cluster (site container_runtime = "charliecloud").

* a 2-node job as btu1: the start commands run inside the image (ch-run on the node's copy of the
  squashfs: the host's /etc/slurm is not there, CH_RUNNING is set), each node sees its rank and the
  job's environment (BT_*, MASTER_*, SLURM_*, the config's variables and secrets), the weights read-only at their
  mount_location, a writable checkpoint dir at checkpoint_path, the snapshot as working directory;
  the prolog staged the image to the node tier and step 1 reported its tier (``image`` entry);
* a second job of the same image starts from the node tier (``node-hit`` on its node).

The site file is the dev cluster's defaults plus ``container_runtime = "charliecloud"`` (and the fake
Hub's endpoint for the weights); the dev registry (devcluster.py) serves ``python:3.11-slim`` through
the default ``docker.io`` mirror.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster_nodes import mirror_toml
from tests.integration.hostile.harness import BIN, aftermath, as_user, write_job
from tests.servers.hf_hub import FakeHub
from tests.unit.test_hooks_env import ensure_test_users

pytestmark = pytest.mark.slurm

USER = "btu1"

PROBE = r'''
import hashlib, json, os, socket
rank = os.environ.get("BT_NODE_RANK")
out = {"rank": rank, "cwd": os.getcwd(), "ch": os.environ.get("CH_RUNNING"),
       "host_etc_slurm": os.path.exists("/etc/slurm"), "snapshot": sorted(os.listdir(".")),
       "env": {k: os.environ.get(k) for k in ("BT_TRAINING_JOB_ID", "BT_GROUP_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                             "SLURM_JOB_ID", "SLURM_NODEID", "MY_VAR", "BT_CHECKPOINT_DIR",
                                             "BT_WEIGHTS_0", "BT_SCRATCH_DIR")}}
files = {}
for root, _, names in os.walk("/app/models/m"):
    for n in names:
        p = os.path.join(root, n)
        files[os.path.relpath(p, "/app/models/m")] = hashlib.sha256(open(p, "rb").read()).hexdigest()
out["weights"] = files
out["home_ok"] = os.path.isdir(os.environ["HOME"]) and os.access(os.environ["HOME"], os.W_OK)
out["secret_ok"] = os.environ.get("MY_SECRET") == "s3cr3t-" + os.environ.get("MY_VAR", "")[:5]
try:
    open("/app/models/m/written-by-job", "w").write("x")
    out["weights_writable"] = True
except OSError as exc:
    out["weights_writable"] = exc.strerror
ckpt = os.path.join(os.environ["BT_CHECKPOINT_DIR"], f"probe-{rank}")
open(ckpt, "w").write("saved")
out["ckpt_written"] = open(ckpt).read()
print("PROBE " + json.dumps(out), flush=True)
'''


@pytest.fixture(scope="module")
def users(dev_cluster: dict[str, object]) -> dict[str, object]:
    ensure_test_users()
    subprocess.run(["sacctmgr", "-i", "add", "user", USER, "account=default"], capture_output=True, check=False)
    return dev_cluster


@pytest.fixture(scope="module")
def ch_site(fake_hub: FakeHub) -> Iterator[Path]:
    """A site file the job user can read: the dev defaults, charliecloud, the fake Hub."""
    folder = Path(tempfile.mkdtemp(prefix="bt-images-site-", dir="/tmp"))
    os.chmod(folder, 0o755)
    path = folder / "site.toml"
    path.write_text(f'container_runtime = "charliecloud"\n{mirror_toml()}'
                    f'[weights.endpoints]\nhf_endpoint = "{fake_hub.endpoint}"\n')
    os.chmod(path, 0o644)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


def _bt(site: Path, *argv: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={site}", *argv], cwd=cwd, timeout=timeout)


def _run_job(site: Path, config: Path, *sbatch: str) -> tuple[str, dict[str, Any], str]:
    sub = _bt(site, str(BIN / "bt-sbatch"), "--json", str(config), *(["--", *sbatch] if sbatch else []),
              cwd=config.parent)
    assert sub.returncode == 0, sub.stderr
    info = json.loads(sub.stdout)
    job_id = str(info["job_id"])
    st = _bt(site, str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "240", "--json", timeout=320)
    assert st.stdout, st.stderr
    record = json.loads(st.stdout)[0]
    logs = _bt(site, str(BIN / "slurm-bt"), "logs", job_id).stdout
    return job_id, {**record, "job_dir": info["job_dir"]}, logs


def _image_tiers(job_dir: str) -> dict[str, str]:
    """{node: tier} of the image entry step 1 wrote into weights/status-<node>.json (read as root)."""
    out = {}
    for p in sorted((Path(job_dir) / "weights").glob("status-*.json")):
        data = json.loads(p.read_text())
        for e in data.get("weights", []):
            if e.get("kind") == "image":
                out[str(data["node"])] = str(e["tier"])
    return out


def test_two_node_job_runs_inside_the_pinned_image(users: dict[str, object], ch_site: Path,
                                                   fake_hub: FakeHub) -> None:
    tag = uuid.uuid4().hex[:8]
    model = {"config.json": b'{"hidden": 8}', "model.safetensors": os.urandom(300_000)}
    fake_hub.add_repo(f"org/img-{tag}", model)
    secret = as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={ch_site}", str(BIN / "slurm-bt"), "secrets", "set",
                            "img_secret"], input="s3cr3t-hello\n")
    assert secret.returncode == 0, secret.stderr
    config = write_job(USER, f"""
        from truss_train import WeightsSource, definitions
        project = definitions.TrainingProject(name="images-run-{tag}", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11-slim"),
            compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(
                start_commands=["python3 probe.py"],
                environment_variables={{"MY_VAR": "hello image",
                                       "MY_SECRET": definitions.SecretReference(name="img_secret")}},
                checkpointing_config=definitions.CheckpointingConfig(enabled=True, checkpoint_path="/mnt/ckpts"),
            ),
            weights=[WeightsSource(source="hf://org/img-{tag}@main", mount_location="/app/models/m")],
        ))
        """, {"probe.py": PROBE})
    job_id, record, logs = _run_job(ch_site, config)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    probes = {p["rank"]: p for p in (json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs))}
    assert set(probes) == {"0", "1"}, logs
    want = {p: hashlib.sha256(b).hexdigest() for p, b in model.items()}
    for rank, p in probes.items():
        assert p["ch"], "not inside ch-run"
        assert p["host_etc_slurm"] is False, "the host's root filesystem is visible: not inside the image"
        assert "probe.py" in p["snapshot"] and "config.py" in p["snapshot"], p  # workdir = the snapshot
        env = p["env"]
        assert env["SLURM_JOB_ID"] == env["BT_TRAINING_JOB_ID"] == job_id
        assert env["SLURM_NODEID"] == rank and env["BT_GROUP_SIZE"] == "2"
        assert env["MASTER_ADDR"] and env["MASTER_PORT"] and env["MY_VAR"] == "hello image"
        assert env["BT_CHECKPOINT_DIR"] == "/mnt/ckpts" and env["BT_WEIGHTS_0"] == "/app/models/m"
        assert p["weights"] == want
        assert p["home_ok"] is True, "$HOME is not there inside the image"
        assert p["secret_ok"] is True, "the secret did not reach the start commands inside the image"
        assert p["weights_writable"] in ("Read-only file system", "Permission denied"), p
        assert p["ckpt_written"] == "saved"
    assert "slurm-bt image: python:3.11-slim@sha256:" in logs
    assert "s3cr3t" not in logs
    tiers = _image_tiers(str(record["job_dir"]))
    assert len(tiers) == 2 and set(tiers) <= set(users["nodes"]), tiers  # type: ignore[call-overload]
    assert set(tiers.values()) <= {"cluster-hit", "node-hit"}, tiers
    aftermath(job_id, USER)


def test_second_job_starts_from_the_node_tier(users: dict[str, object], ch_site: Path) -> None:
    node = sorted(users["nodes"])[0]  # type: ignore[call-overload]
    config = write_job(USER, """
        from truss_train import definitions
        project = definitions.TrainingProject(name="images-hit", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11-slim"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=['echo "inside=${CH_RUNNING:+yes}"']),
        ))
        """)
    for _ in range(2):  # the first may copy the image to this node; the second is a node hit
        job_id, record, logs = _run_job(ch_site, config, f"--nodelist={node}")
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
        assert "inside=yes" in logs
    assert _image_tiers(str(record["job_dir"])) == {node: "node-hit"}
    # status --json shows the image's node tier for a job without weights too
    [entry] = record["weights"]["nodes"][node]
    assert (entry["kind"], entry["tier"]) == ("image", "node-hit"), record["weights"]
    aftermath(job_id, USER)


def test_ssh_into_a_charliecloud_job_enters_its_image(users: dict[str, object], ch_site: Path) -> None:
    config = write_job(USER, """
        from truss_train import definitions
        project = definitions.TrainingProject(name="images-ssh", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11-slim"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=["sleep 60"]),
        ))
        """)
    sub = _bt(ch_site, str(BIN / "bt-sbatch"), "--parsable", str(config), cwd=config.parent)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().splitlines()[-1].split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout
            if state.strip() == "RUNNING":
                break
            time.sleep(0.5)
        ssh = _bt(ch_site, str(BIN / "slurm-bt"), "ssh", job_id, "--node", "0", "--command",
                  'echo "in=${CH_RUNNING:+yes}"; test -e /etc/slurm || echo no-host-etc-slurm', timeout=120)
        assert "in=yes" in ssh.stdout and "no-host-etc-slurm" in ssh.stdout, ssh.stdout + ssh.stderr
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)
    aftermath(job_id, USER)
