"""Issue 4's done-when on the dev cluster: doctor is clean, and a 2-node job with caches, checkpointing
and a loaded checkpoint runs end to end with everything visible.

Job A (2 nodes, CacheConfig, checkpointing) writes a checkpoint on every rank and a file into the
project cache. Job B (same project, same user) loads ``from_latest_checkpoint(project_name=...)``
and finds job A's checkpoint at ``BT_LOAD_CHECKPOINT_DIR`` and job A's file in the project cache.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.integration.cluster_nodes import isolated, nodes, on_node
from tests.unit.test_hooks_env import ensure_test_users

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
USER = "btu1"

WRITER = r'''
import json, os
rank = os.environ["BT_NODE_RANK"]
ckpt = os.path.join(os.environ["BT_CHECKPOINT_DIR"], "checkpoint-7")
os.makedirs(ckpt, exist_ok=True)
with open(os.path.join(ckpt, "weights.bin"), "wb") as f:
    f.write(f"rank{rank}-weights".encode() * 1000)
open(os.path.join(ckpt, ".complete"), "w").close()
with open(os.path.join(os.environ["BT_PROJECT_CACHE_DIR"], f"tokenized-{rank}.txt"), "w") as f:
    f.write("cached by job A")
print("WROTE", rank, flush=True)
'''

READER = r'''
import json, os
root = os.environ["BT_LOAD_CHECKPOINT_DIR"]
found = sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)
cache = sorted(os.listdir(os.environ["BT_PROJECT_CACHE_DIR"]))
print("READ " + json.dumps({"rank": os.environ["BT_NODE_RANK"], "found": found, "cache": cache}), flush=True)
'''


def _as(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", USER, "--", *argv], capture_output=True, text=True,  # type: ignore[call-overload]
                          timeout=kw.pop("timeout", 300), **kw)


def _config(work: Path, script: str, body: str) -> Path:
    _as(["mkdir", "-p", str(work)]).check_returncode()
    _as(["tee", str(work / "step.py")], input=script).check_returncode()
    _as(["tee", str(work / "config.py")], input=textwrap.dedent(body)).check_returncode()
    return work / "config.py"


def _run(config: Path) -> tuple[str, str]:
    sub = _as([str(BIN / "bt-sbatch"), "--parsable", str(config)], cwd=config.parent)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    st = _as([str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "240", "--json"])
    logs = _as([str(BIN / "slurm-bt"), "logs", job_id]).stdout
    assert json.loads(st.stdout)[0]["current_status"] == "TRAINING_JOB_COMPLETED", logs
    return job_id, logs


@pytest.mark.whole_cluster  # reads every node's hook state, which other tests' jobs change
def test_doctor_is_clean(dev_cluster: dict[str, object]) -> None:
    # On this host (every node, in the host layout; the login host's checks alone where nodes are
    # machines of their own), then on the first and last node as an admin there would run it.
    where = [[], *([on_node(n) for n in dict.fromkeys((nodes()[0], nodes()[-1]))] if isolated() else [])]
    for prefix in where:
        proc = subprocess.run([*prefix, str(BIN / "slurm-bt"), "admin", "doctor"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"{prefix}: {proc.stdout}{proc.stderr}"
        problems = [ln for ln in proc.stdout.splitlines() if ln.startswith(("WARN", "FAIL", "ERROR"))]
        assert problems == [], proc.stdout
        node_checked = any(ln.startswith("ok    scratch root on ") for ln in proc.stdout.splitlines())
        assert node_checked == (bool(prefix) or not isolated()), proc.stdout


def test_two_node_job_with_caches_checkpoints_and_a_loaded_checkpoint(dev_cluster: dict[str, object]) -> None:
    ensure_test_users()
    project = f"e2e-{uuid.uuid4().hex[:6]}"
    home = Path(f"/home/{USER}")
    common = f"""
        from truss_train import definitions
        project = definitions.TrainingProject(name="{project}", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(
                start_commands=["python3 step.py"],
                cache_config=definitions.CacheConfig(enabled=True),
                checkpointing_config=definitions.CheckpointingConfig(enabled=True),
                %s
            ),
        ))
        """
    a = _config(home / f"{project}-a", WRITER, common % "")
    job_a, logs_a = _run(a)
    assert logs_a.count("WROTE") == 2

    listing = _as([str(BIN / "slurm-bt"), "checkpoints", "list", job_a, "-o", "json"])
    assert listing.returncode == 0, listing.stderr
    assert "checkpoint-7" in listing.stdout

    load = ("load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, checkpoints=["
            f"definitions.BasetenCheckpoint.from_latest_checkpoint(project_name={project!r})]),")
    b = _config(home / f"{project}-b", READER, common % load)
    _, logs_b = _run(b)
    reads = [json.loads(m) for m in re.findall(r"READ (\{.*\})", logs_b)]
    assert len(reads) == 2, logs_b
    for r in reads:
        assert any(p.endswith("checkpoint-7/weights.bin") for p in r["found"]), r
        assert {"tokenized-0.txt", "tokenized-1.txt"} <= set(r["cache"]), r
