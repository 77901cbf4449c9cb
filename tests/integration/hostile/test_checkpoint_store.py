"""Hostile users against the shared ``file://`` checkpoint store (issue #8 item 1).

The dev cluster's store is ``/var/lib/slurm-bt-dev/shared/checkpoints``: root-owned, ``1777``, so
btu2 (btteam2) can create a directory under any name at its top. Uploads go to the team's namespace
``<store>/_teams/<team>/<project>`` (``_teams/btteam1`` is ``2770`` with btteam1's group, so btu2
cannot create anything in it); the top level holds only legacy projects, still read.

1. **Uploads never go into a squat.** btu2 pre-creates btu1's project name at the legacy location
   (a ``0777`` directory, or a symlink to a directory btu2 owns). btu1's checkpointing job uploads
   into its team's namespace and completes; nothing is written into the squat.
2. **A planted job directory is never loaded.** btu2 squats another project name at the legacy
   location and plants a job directory whose index names btu1 as its user, with a checkpoint of its
   own bytes (sha256s right, world-readable). btu1's ``from_latest_checkpoint(project_name=...)``
   finds nothing in its team's namespace, falls back to the legacy location and is refused at
   submit naming the directory; ``slurm-bt checkpoints list/download`` of the planted job id never
   show or write the planted bytes.

After each job: no node drained, nothing of the job left (``aftermath``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from slurm_bt.checkpoints.locations import parse_store_uri
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import FileStore
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader
from tests.integration.hostile.harness import (
    BIN,
    admin_path,
    aftermath,
    as_user,
    attack,
    cluster,
    submit,
    wait,
    write_job,
)

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(2)]

STORE = Path("/var/lib/slurm-bt-dev/shared/checkpoints")
TEAM_DIR = STORE / "_teams" / "btteam1"  # btu1's team namespace (docs/checkpoints.md)
PLANTED = b"PLANTED BYTES FROM btu2 " * 64
PLANTED_JOB = "99999999"  # above any real job id: "latest" of the project on the old code

TRAIN = r'''
import os, pathlib, time
d = pathlib.Path(os.environ["BT_CHECKPOINT_DIR"])
c = d / "checkpoint-1"
c.mkdir(parents=True)
(c / "model.bin").write_bytes(b"btu1 private weights " * 1000)
(c / ".complete").touch()
print("WROTE checkpoint-1", flush=True)
time.sleep(8)
'''

LOAD = r'''
import os, pathlib
root = pathlib.Path(os.environ["BT_LOAD_CHECKPOINT_DIR"])
for p in sorted(root.rglob("*")):
    if p.is_file():
        print("LOADED", p.relative_to(root), p.read_bytes()[:40], flush=True)
'''


def _config(project: str, runtime: str) -> str:
    return f"""
        from truss_train import definitions
        project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime({runtime}),
        ))
    """


def _drop_empty_handoffs(job_id: str) -> None:
    """Remove the epilog's hand-off entries of ``job_id`` that hold no checkpoint (the job wrote none).

    The failed job's flush still meets the squatted store and hands off its empty checkpoint
    directory; that is the flush's business (bounded and reported there), not this test's.
    """
    info = cluster()
    for node in info["nodes"]:
        entry = Path(info["node_local_dir"]) / node / "checkpoint-handoff" / f"{job_id}.{node}"
        data = entry / "data"
        checkpoints = [p for p in data.iterdir() if not p.name.startswith(".")] if data.is_dir() else []
        if entry.is_dir() and not entry.is_symlink() and not checkpoints:
            shutil.rmtree(entry, ignore_errors=True)


def _remove(path: Path) -> None:
    path = admin_path(path)  # as an admin: root may be squashed on the shared storage
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


@pytest.mark.parametrize("shape", ["dir", "symlink"])
def test_uploads_never_go_into_a_squatted_project(tenants: dict[str, object], shape: str) -> None:
    """A project name squatted at the legacy location: the upload goes to the team's namespace instead."""
    project = f"squat-up-{shape}-{uuid.uuid4().hex[:8]}"
    squat = STORE / project
    loot = Path(f"/home/btu2/loot-{uuid.uuid4().hex[:8]}")  # where a symlink squat would send btu1's bytes
    cleanup: list[str] = []
    with attack(f"checkpoint store: project name squatted ({shape}) before its owner's upload"):
        try:
            if shape == "dir":
                as_user("btu2", ["mkdir", "-m", "0777", str(squat)]).check_returncode()
                target = squat
            else:
                as_user("btu2", ["mkdir", "-m", "0777", str(loot)]).check_returncode()
                as_user("btu2", ["chmod", "0755", "/home/btu2"]).check_returncode()
                as_user("btu2", ["ln", "-s", str(loot), str(squat)]).check_returncode()
                target = loot
            config = write_job("btu1", _config(project, (
                'start_commands=["python3 train.py"], environment_variables={"BT_CHECKPOINT_POLL_S": "1"}, '
                "checkpointing_config=definitions.CheckpointingConfig(enabled=True)")), {"train.py": TRAIN})
            job_id = submit("btu1", config)
            record, logs = wait("btu1", job_id)
            cleanup.append(job_id)
            assert os.listdir(admin_path(target)) == [], f"btu1's job wrote into btu2's {target}"
            assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
            assert admin_path(TEAM_DIR / project / job_id / "index.json").is_file(), "in the team namespace"
            aftermath(job_id, "btu1")
            assert os.listdir(admin_path(target)) == [], "nor did the epilog's flush"
        finally:
            _remove(squat)
            _remove(loot)
            _remove(TEAM_DIR / project)
            for job in cleanup:
                _drop_empty_handoffs(job)


def _plant(project: str) -> Path:
    """As btu2: squat ``project`` and plant a job directory whose index names btu1 (sha256s right)."""
    work = Path(tempfile.mkdtemp(prefix="ckpt-plant-", dir="/tmp"))
    try:
        src = work / "src" / "checkpoint-1"
        src.mkdir(parents=True)
        (src / "model.bin").write_bytes(PLANTED)
        (src / ".complete").touch()
        # The forged index is what slurm-bt itself writes for btu1, so only *where* it lies can tell.
        ident = JobIdentity(project, project, PLANTED_JOB, "btu1", 0, 1, "root")
        RankUploader(store=FileStore(parse_store_uri(f"file://{work}/store"), gid=0), ident=ident,
                     checkpoint_dir=work / "src", tracker=CompletionTracker(quiet_s=3600),
                     log=lambda r, m: None).run_once()
        subprocess.run(["chmod", "-R", "a+rX", str(work)], check=True)
        os.chmod(work, 0o755)
        squat = STORE / project
        as_user("btu2", ["mkdir", "-m", "0755", str(squat)]).check_returncode()
        as_user("btu2", ["cp", "-r", str(work / "store" / "_teams" / "root" / project / PLANTED_JOB),
                         str(squat)]).check_returncode()
        as_user("btu2", ["chmod", "-R", "a+rX", str(squat)]).check_returncode()
        return squat
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_planted_job_dir_with_forged_index_is_never_loaded(tenants: dict[str, object]) -> None:
    project = f"squat-load-{uuid.uuid4().hex[:8]}"
    squat = STORE / project
    with attack("checkpoint store: planted job dir with a forged index naming the victim"):
        try:
            _plant(project)
            assert os.stat(admin_path(squat / PLANTED_JOB)).st_uid == int(subprocess.check_output(["id", "-u", "btu2"]))
            # 1. LoadCheckpointConfig, resolved at submit as btu1: refused, naming the directory.
            config = write_job("btu1", _config(project, (
                'start_commands=["python3 load.py"], load_checkpoint_config=definitions.LoadCheckpointConfig('
                f'enabled=True, checkpoints=[definitions.BasetenCheckpoint.from_latest_checkpoint('
                f'project_name={project!r})])')), {"load.py": LOAD})
            sub = as_user("btu1", [str(BIN / "bt-sbatch"), "--parsable", str(config)], cwd=config.parent)
            job_id = sub.stdout.strip().splitlines()[-1].split(";")[0] if sub.returncode == 0 else None
            if job_id:  # the old code submitted it: show what the job loaded
                _, logs = wait("btu1", job_id)
                pytest.fail(f"btu1's load was resolved to btu2's planted job {PLANTED_JOB}: {logs[-2000:]}")
            assert sub.returncode == 2, (sub.returncode, sub.stdout, sub.stderr)
            assert "load_checkpoint_config.checkpoints[0]" in sub.stderr and str(squat) in sub.stderr, sub.stderr
            assert f"rm -rf {squat}" in sub.stderr, sub.stderr
            # 2. The CLI, by job id (searching every project): the planted job is not btu1's.
            listed = as_user("btu1", [str(BIN / "slurm-bt"), "checkpoints", "list", PLANTED_JOB, "-o", "json"])
            assert "checkpoint-1" not in listed.stdout, listed.stdout
            home = Path("/home/btu1") / f"dl-{uuid.uuid4().hex[:8]}"
            try:
                got = as_user("btu1", [str(BIN / "slurm-bt"), "checkpoints", "download", PLANTED_JOB,
                                       "--target-directory", str(home)], cwd="/home/btu1")
                assert got.returncode != 0, got.stdout
                planted = [p for p in home.rglob("*") if p.is_file() and PLANTED[:20] in p.read_bytes()] \
                    if home.exists() else []
                assert not planted, f"planted bytes downloaded: {planted}"
            finally:
                shutil.rmtree(home, ignore_errors=True)
        finally:
            _remove(squat)


def test_owner_round_trip_still_works(tenants: dict[str, object]) -> None:
    """The baseline: btu1 checkpoints into a fresh project, then loads it back by project name."""
    project = f"owner-ok-{uuid.uuid4().hex[:8]}"
    with attack("checkpoint store: baseline upload then load by the owner"):
        try:
            config = write_job("btu1", _config(project, (
                'start_commands=["python3 train.py"], environment_variables={"BT_CHECKPOINT_POLL_S": "1"}, '
                "checkpointing_config=definitions.CheckpointingConfig(enabled=True)")), {"train.py": TRAIN})
            job_id = submit("btu1", config)
            record, logs = wait("btu1", job_id)
            assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
            aftermath(job_id, "btu1")
            st = os.stat(admin_path(TEAM_DIR / project))
            assert (oct(st.st_mode & 0o7777), st.st_uid) == (oct(0o2770), int(
                subprocess.check_output(["id", "-u", "btu1"]))), "the project is claimed for btu1's team"
            assert not admin_path(STORE / project).exists(), "nothing goes to the legacy location"
            config = write_job("btu1", _config(project, (
                'start_commands=["python3 load.py"], load_checkpoint_config=definitions.LoadCheckpointConfig('
                f'enabled=True, checkpoints=[definitions.BasetenCheckpoint.from_latest_checkpoint('
                f'project_name={project!r})])')), {"load.py": LOAD})
            load_id = submit("btu1", config)
            record, logs = wait("btu1", load_id)
            assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
            assert "LOADED rank-0/checkpoint-1/model.bin b'btu1 private weights" in logs, logs
            aftermath(load_id, "btu1")
        finally:
            _remove(TEAM_DIR / project)
