"""The slurm-bt Prolog/Epilog on the real dev cluster, with real users in different teams.

* btu1 (group btteam1) runs a 2-node job with CacheConfig(enabled=True): its scratch is 0700 and
  its own, its project/team caches are 2770 root:btteam1, btu2 (btteam2) gets EACCES on them, the
  epilog removes the scratch afterwards, and both nodes stay up.
* btu1 submits held, tampers with job.json (claims to be root), releases: the prolog refuses the
  job, which FAILS with the prolog's reason in its log, and both nodes stay IDLE (no drain).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.hostile.harness import cancel_on_error
from tests.unit.test_hooks_env import ensure_test_users

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent

PROBE = r'''
import json, os, stat
s = os.stat(os.environ["BT_SCRATCH_DIR"])
pc, tc = os.environ["BT_PROJECT_CACHE_DIR"], os.environ["BT_TEAM_CACHE_DIR"]
rank = os.environ["BT_NODE_RANK"]
with open(os.path.join(pc, f"from-rank{rank}.txt"), "w") as f:
    f.write("hi")
print("HOOKPROBE " + json.dumps({"scratch": os.environ["BT_SCRATCH_DIR"], "scratch_uid": s.st_uid,
      "scratch_mode": stat.S_IMODE(s.st_mode), "pc": os.path.realpath(pc), "tc": os.path.realpath(tc),
      "hf": os.path.realpath(os.environ["HF_HOME"]), "uid": os.getuid(), "rank": rank}), flush=True)
'''


def _as(user: str, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *argv], capture_output=True, text=True,  # type: ignore[call-overload]
                          timeout=kw.pop("timeout", 240), **kw)


def _write_config(user: str, body: str) -> Path:
    work = Path(f"/home/{user}/hooktest-{uuid.uuid4().hex[:8]}")
    _as(user, ["mkdir", "-p", str(work)]).check_returncode()
    _as(user, ["tee", str(work / "probe.py")], input=PROBE).check_returncode()
    _as(user, ["tee", str(work / "config.py")], input=textwrap.dedent(body)).check_returncode()
    return work / "config.py"


def _node_states(settle_s: float = 60) -> dict[str, str]:
    """Node -> sinfo's short state, once no node is completing any more (``comp``, at most ``settle_s``).

    24.11 reports a job's end (sacct, hence ``slurm-bt status``) while its epilog still runs, so the
    nodes can read ``comp`` right after the status says FAILED; drained or down is what must never show.
    """
    deadline = time.monotonic() + settle_s
    while True:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        if not any(s.startswith("comp") for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(1)


def _wait(user: str, job_id: str, timeout_s: int = 180) -> tuple[dict[str, object], str]:
    st = _as(user, [str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", str(timeout_s), "--json"])
    assert st.returncode == 0, st.stderr
    logs = _as(user, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
    return json.loads(st.stdout)[0], logs


@pytest.fixture(scope="module")
def users(dev_cluster: dict[str, object]) -> dict[str, object]:
    ensure_test_users()
    for u in ("btu1", "btu2"):
        subprocess.run(["sacctmgr", "-i", "add", "user", u, "account=default"], capture_output=True, check=False)
    return dev_cluster


CACHE_JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hooks-cache", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(
            start_commands=["python3 probe.py"],
            cache_config=definitions.CacheConfig(enabled=True, enable_legacy_hf_mount=True),
        ),
    ))
"""


def test_team_caches_and_private_scratch(users: dict[str, object]) -> None:
    config = _write_config("btu1", CACHE_JOB)
    sub = _as("btu1", [str(BIN / "bt-sbatch"), "--parsable", str(config)], cwd=config.parent)
    assert sub.returncode == 0, sub.stderr
    state, logs = _wait("btu1", sub.stdout.strip())
    assert state["current_status"] == "TRAINING_JOB_COMPLETED", logs
    probes = [json.loads(m) for m in re.findall(r"HOOKPROBE (\{.*\})", logs)]
    assert sorted(p["rank"] for p in probes) == ["0", "1"], logs
    uid = int(subprocess.run(["id", "-u", "btu1"], capture_output=True, text=True).stdout)
    for p in probes:
        assert p["scratch_uid"] == uid and p["scratch_mode"] == 0o700
        assert p["pc"].endswith("/teams/btteam1/projects/hooks-cache") and p["tc"].endswith("/teams/btteam1/shared")
        assert p["hf"] == p["pc"] + "/huggingface"
    pc = Path(str(probes[0]["pc"]))
    assert _as("btu1", ["cat", str(pc / "from-rank1.txt")]).stdout == "hi"
    for target in (pc, Path(str(probes[0]["tc"])), pc / "from-rank0.txt"):
        denied = _as("btu2", ["ls", str(target)])
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, target
    summary = _as("btu1", [str(BIN / "slurm-bt"), "cache", "summarize", "hooks-cache", "-o", "json"])
    assert summary.returncode == 0, summary.stderr
    files = {e["filepath"] for e in json.loads(summary.stdout)[0]["entries"]}
    assert {"from-rank0.txt", "from-rank1.txt"} <= files
    assert _as("btu2", [str(BIN / "slurm-bt"), "cache", "summarize", "hooks-cache"]).returncode != 0
    # The epilog removed the scratch on both nodes (it runs as the job completes; allow a moment).
    deadline = time.monotonic() + 20
    while any(Path(str(p["scratch"])).exists() for p in probes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(Path(str(p["scratch"])).exists() for p in probes)
    assert all(s in {"idle", "mix", "alloc"} for s in _node_states().values()), _node_states()


def test_prolog_user_error_fails_job_and_keeps_nodes_up(users: dict[str, object]) -> None:
    config = _write_config("btu1", CACHE_JOB)
    sub = _as("btu1", [str(BIN / "bt-sbatch"), "--parsable", str(config), "--", "--hold"], cwd=config.parent)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    with cancel_on_error(job_id):
        show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
        work = re.search(r"WorkDir=(\S+)", show)
        assert work, show
        spec = Path(work.group(1)) / "job.json"
        tamper = ("import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['context'].update(uid=0, user='root'); "
                  "open(p,'w').write(json.dumps(d))")
        _as("btu1", ["python3", "-c", tamper, str(spec)]).check_returncode()
        subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
    state, logs = _wait("btu1", job_id)
    assert state["current_status"] == "TRAINING_JOB_FAILED", logs
    assert "the slurm-bt prolog refused this job on node" in logs and "written for 'root'" in logs, logs
    states = _node_states()
    assert set(states) >= {"n1", "n2"} and all(s in {"idle", "mix", "alloc"} for s in states.values()), states
