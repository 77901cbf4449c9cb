"""Every feature where the shared filesystem squashes root, as real sites export it (issue 30).

The dev cluster's shared storage (the cluster cache, the project/team caches and the file:// checkpoint
store) on a GlusterFS volume with ``server.root-squash on`` (``devcluster.py up --shared gluster``):
root on the nodes acts as nobody there. The setup is what docs/admin.md tells an admin to do: the
service account ``slurmbt`` (in every team group) named as ``shared_fs_identity`` in hooks.toml, the
layout made once with the squash off (as from a file server). The module switches the cluster to that
mode when it is not in it and back at the end; CI's root-squash phase runs it (and the hostile suite)
with the cluster already there.

As btu1 (team btteam1): the quick start inside its image (the image mirrored into the team tier and
copied to both nodes), a job with project and team caches, weights (cluster tier → node tier) and
checkpoints uploaded during the run and at its end, a second job loading ``from_latest_checkpoint``,
the cache verbs, and ``admin doctor``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.cli.admin_cmd import squashed_as
from tests.integration.hostile.harness import aftermath, as_user, submit, wait, write_job
from tests.servers.hf_hub import FakeHub
from tests.unit.test_hooks_env import ensure_test_users

# whole_cluster: runs alone, after the parallel tests (scripts/test.sh; README, Development).
pytestmark = [pytest.mark.slurm, pytest.mark.whole_cluster]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEVCLUSTER = REPO / "devcluster" / "devcluster.py"
USER = "btu1"
IDENTITY = "slurmbt"


def _up(mode: str) -> None:
    proc = subprocess.run(["/usr/bin/python3", str(DEVCLUSTER), "up", "--shared", mode], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, f"devcluster up --shared {mode}:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def squashed(dev_cluster: dict[str, object]) -> Iterator[Path]:
    """The cluster with its shared storage on GlusterFS, root squashed; yields the shared directory."""
    if os.geteuid() != 0:
        pytest.fail("the root-squash tests run as root (they switch the dev cluster's shared storage)")
    switched = dev_cluster.get("shared_fs") != "gluster"
    if switched:
        _up("gluster")
    ensure_test_users()  # also puts slurmbt in the test teams' groups
    for user in ("btu1", "btu2"):
        subprocess.run(["sacctmgr", "-i", "add", "user", user, "account=default"], capture_output=True, check=False)
    info = json.loads((Path(str(dev_cluster["state_dir"])) / "cluster.json").read_text())
    try:
        yield Path(info["shared_dir"])
    finally:
        if switched:
            _up("local")


def _site(hub: FakeHub | None = None, runtime: str = "none") -> Path:
    """A site file the test users can read (pytest's tmp_path is 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="bt-squash-site-", dir="/var/tmp"))
    os.chmod(folder, 0o755)
    site = folder / "site.toml"
    text = f'container_runtime = "{runtime}"\n'
    if hub is not None:
        text += f'[weights.endpoints]\nhf_endpoint = "{hub.endpoint}"\n'
    site.write_text(text)
    site.chmod(0o644)
    return site


def _owner(path: Path) -> tuple[str, str, int]:
    """Owner, group and mode of ``path``, looked up as btu1: root (squashed) may not search team directories."""
    proc = as_user(USER, ["stat", "-c", "%U %G %a", str(path)])
    assert proc.returncode == 0, proc.stderr
    user, group, mode = proc.stdout.split()
    return user, group, int(mode, 8)


def test_the_shared_storage_squashes_root_and_the_identity_owns_teams(squashed: Path) -> None:
    assert os.path.ismount(squashed)
    assert squashed_as(str(squashed / "cache")) is not None, "root is not squashed on the shared storage"
    assert f'shared_fs_identity = "{IDENTITY}"' in Path("/etc/slurm-bt/hooks.toml").read_text()
    for rel in ("cache/teams", "weights/teams"):
        assert _owner(squashed / rel) == (IDENTITY, "root", 0o755), rel
    assert _owner(squashed / "weights" / "shared")[0] == "root"


def test_quickstart_runs_in_its_image_as_a_user(squashed: Path) -> None:
    example = REPO / "examples" / "quickstart"
    config = write_job(USER, (example / "config.py").read_text(), {"train.py": (example / "train.py").read_text()})
    # the dev cluster's site file (charliecloud: the image pinned, mirrored and staged), not the suite's host one
    job_id = submit(USER, config, site=Path("/etc/slurm-bt/site.toml"))
    record, logs = wait(USER, job_id, timeout_s=600)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    assert "final loss" in logs.lower() or "loss" in logs.lower(), logs
    # the image's staging job wrote the team tier as btu1 in a directory the identity made
    assert _owner(squashed / "weights" / "teams" / "btteam1") == (IDENTITY, "btteam1", 0o2770)
    status = as_user(USER, [str(BIN / "slurm-bt"), "status", job_id, "--json"])
    delivery = json.dumps(json.loads(status.stdout)[0])
    assert "image" in delivery, delivery
    aftermath(job_id, USER)


TRAIN = r'''
import json, os, pathlib, sys, time
ckpt = pathlib.Path(os.environ["BT_CHECKPOINT_DIR"])
team = pathlib.Path(os.environ["BT_TEAM_CACHE_DIR"])
project = pathlib.Path(os.environ["BT_PROJECT_CACHE_DIR"])
weights = pathlib.Path("/app/models/m")
out = {"weights": (weights / "config.json").read_text(), "ro": not os.access(weights, os.W_OK)}
(project / "epoch.txt").write_text("1")
(team / f"shared-{os.environ['BT_TRAINING_JOB_ID']}.txt").write_text("team")
out["caches"] = sorted(p.name for p in project.iterdir())
load = os.environ.get("BT_LOAD_CHECKPOINT_DIR")
if load:
    out["loaded"] = sorted(str(p.relative_to(load)) for p in pathlib.Path(load).rglob("*") if p.is_file())
if os.environ.get("BT_NODE_RANK") == "0":
    for step in (1, 2):
        d = ckpt / f"checkpoint-{step}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "weights.bin").write_bytes(os.urandom(4096))
        (d / ".complete").write_text("")
        time.sleep(8)  # the agent uploads checkpoint-1 during the run; checkpoint-2 goes at the end
print("RESULT " + json.dumps(out), flush=True)
'''


def _job(project: str, repo: str, *, load: bool) -> str:
    loading = ("load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, checkpoints=["
               f"definitions.BasetenCheckpoint.from_latest_checkpoint(project_name={project!r})]),") if load else ""
    return f"""
        from truss_train import WeightsSource, definitions
        project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count=2, cpu_count=1),
            weights=[WeightsSource(source="hf://{repo}", mount_location="/app/models/m")],
            runtime=definitions.Runtime(
                start_commands=["python3 train.py"],
                environment_variables={{"BT_CHECKPOINT_POLL_S": "1"}},
                cache_config=definitions.CacheConfig(enabled=True),
                checkpointing_config=definitions.CheckpointingConfig(enabled=True),
                {loading}
            )))
        """


def _results(logs: str) -> list[dict[str, Any]]:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in logs.splitlines() if "RESULT " in line]


def test_caches_weights_checkpoints_and_resume_as_a_user(squashed: Path, fake_hub: FakeHub,
                                                         tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    repo = f"Org/Squashed-{tag}"
    fake_hub.add_repo(repo, {"config.json": b'{"hidden": 8}', "model.safetensors": os.urandom(1 << 20)})
    site = _site(fake_hub)
    project = f"squash-{tag}"
    first = submit(USER, write_job(USER, _job(project, repo, load=False), {"train.py": TRAIN}), site=site)
    record, logs = wait(USER, first, timeout_s=420)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    results = _results(logs)
    assert len(results) == 2, logs  # both nodes
    for r in results:
        assert r["weights"] == '{"hidden": 8}' and r["ro"], r
        assert "epoch.txt" in r["caches"], r
    team = squashed / "cache" / "teams" / "btteam1"
    assert _owner(team) == (IDENTITY, "btteam1", 0o2750)
    assert _owner(team / "projects" / project) == (IDENTITY, "btteam1", 0o2770)
    # the weights went cluster tier -> node tier: the prolog read the team tier as btu1
    status = json.dumps(record)
    assert "cluster-hit" in status or "node-hit" in status or "node-staging" in status, status
    # both checkpoints are in the store, in btu1's team's namespace
    ls = as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={site}", str(BIN / "slurm-bt"), "checkpoints", "list", first])
    listing = ls.stdout + ls.stderr
    assert "checkpoint-1" in listing and "checkpoint-2" in listing, listing
    during, flush = logs.find("uploaded checkpoint-1"), logs.find("final flush")
    assert 0 <= during and (flush < 0 or during < flush), "checkpoint-1 was not uploaded during the run"
    aftermath(first, USER)

    second = submit(USER, write_job(USER, _job(project, repo, load=True), {"train.py": TRAIN}), site=site)
    record, logs = wait(USER, second, timeout_s=420)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    loaded = [r.get("loaded") for r in _results(logs)]
    assert loaded and all(x and any("checkpoint-2" in f for f in x) for x in loaded), logs
    aftermath(second, USER)

    # the cache verbs, as the user, on the team tier the identity made
    ls = as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={site}", str(BIN / "slurm-bt"), "cache", "ls", "--json"])
    assert ls.returncode == 0, ls.stderr
    entries = json.loads(ls.stdout)
    mine = [e for e in entries if repo in json.dumps(e)]
    assert mine, entries
    mid = str(mine[0].get("manifest_id") or mine[0].get("id"))
    inspect = as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={site}", str(BIN / "slurm-bt"), "cache", "inspect",
                             mid[:16]])
    assert inspect.returncode == 0 and repo in inspect.stdout, inspect.stdout + inspect.stderr
    evict = as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={site}", str(BIN / "slurm-bt"), "cache", "evict", mid])
    assert evict.returncode == 0, evict.stdout + evict.stderr
    again = as_user(USER, ["env", f"SLURM_BT_SITE_CONFIG={site}", str(BIN / "slurm-bt"), "cache", "ls", "--json"])
    assert repo not in again.stdout


def test_admin_doctor_says_each_feature_works(squashed: Path) -> None:
    proc = subprocess.run([str(BIN / "slurm-bt"), "admin", "doctor"], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.splitlines()
    assert f"ok    shared_fs_identity {IDENTITY}" in "\n".join(lines), proc.stdout
    for feature in ("project and team caches", "weights and images", "checkpoint store"):
        line = next((ln for ln in lines if f"root squash: {feature}" in ln), "")
        assert line.startswith("ok    ") and IDENTITY in line, proc.stdout
    store = next((ln for ln in lines if "root squash: checkpoint store" in ln), "")
    assert store.startswith("ok    ") and IDENTITY in store, proc.stdout
