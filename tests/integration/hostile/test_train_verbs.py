"""Hostile use of ``slurm-bt train``: driving another tenant's job through the truss-train verbs.

``train`` picks jobs from the caller's own submission records, which the caller can write anything
into. So btu2 forges records naming btu1's jobs (and btu1's job directory) and tries every verb
that acts or reads: stop --all, update --priority, download, get_checkpoint_urls, checkpoints list.
Slurm (scancel/scontrol as the caller), the store's permissions (btteam1's project directory) and the
download's ownership check must each refuse; btu1's queued job stays queued at its priority, nothing of
btu1's is copied or listed. And a user cannot raise their own job's priority with ``update``.
"""

from __future__ import annotations

import json
import pwd
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.hostile.harness import aftermath, as_user, attack, submit, wait, write_job

pytestmark = pytest.mark.slurm

SLURM_BT = str(Path(sys.executable).parent / "slurm-bt")

CKPT = r'''
import os, pathlib
c = pathlib.Path(os.environ["BT_CHECKPOINT_DIR"]) / "checkpoint-1"
c.mkdir(parents=True)
(c / "secret-weights.bin").write_bytes(b"btu1-only" * 100)
(c / ".complete").touch()
'''

JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["python3 ckpt.py"],
                                    checkpointing_config=definitions.CheckpointingConfig(enabled=True)),
    ))
"""


def _record(user: str, job_id: str) -> dict[str, object]:
    path = Path(pwd.getpwnam(user).pw_dir) / ".slurm-bt" / "records" / f"{job_id}.json"
    data = json.loads(path.read_text())
    assert isinstance(data, dict)
    return data


def _forge(user: str, victim: dict[str, object], project: str) -> None:
    """A record in ``user``'s workspace claiming the victim's job id and job directory."""
    fake = {**victim, "project_name": project, "project_id": project, "user": user}
    records = Path(pwd.getpwnam(user).pw_dir) / ".slurm-bt" / "records"
    as_user(user, ["mkdir", "-p", str(records)]).check_returncode()
    as_user(user, ["tee", str(records / f"{victim['job_id']}.json")], input=json.dumps(fake)).check_returncode()


def _squeue(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T %Q"], capture_output=True, text=True).stdout.strip()


def test_train_verbs_cannot_drive_another_tenants_job(tenants: dict[str, object]) -> None:
    project = f"hostile-train-{uuid.uuid4().hex[:8]}"
    cfg = write_job("btu1", JOB.format(project=project), {"ckpt.py": CKPT})
    done = submit("btu1", cfg)
    held = submit("btu1", cfg, "--begin=now+600")  # queued (BeginTime), not held
    try:
        record, logs = wait("btu1", done)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
        before = _squeue(held)
        assert before.startswith("PENDING"), before
        forged = f"{project}-forged"
        _forge("btu2", _record("btu1", held), forged)
        _forge("btu2", _record("btu1", done), forged)
        home2 = Path(pwd.getpwnam("btu2").pw_dir)

        with attack("train stop --all through a forged record of another tenant's job"):
            as_user("btu2", [SLURM_BT, "train", "stop", "--all", "--project", forged, "--yes"])
            assert _squeue(held) == before

        with attack("train update --priority of another tenant's job"):
            r = as_user("btu2", [SLURM_BT, "train", "update", "--job-id", held, "--priority", "99999"])
            assert r.returncode != 0 and _squeue(held) == before

        with attack("train update --priority raising one's own job"):
            # Only operators may raise a priority (a user may lower it): ask for one above the current.
            higher = str(int(before.split()[1]) + 1)
            r = as_user("btu1", [SLURM_BT, "train", "update", "--job-id", held, "--priority", higher])
            assert r.returncode == 1, (r.stdout, r.stderr)
            assert _squeue(held) == before
        # Lowering one's own job is the user's right: Slurm applies it (and says it may not last).
        low = as_user("btu1", [SLURM_BT, "train", "update", "--job-id", held, "--priority", "7"])
        assert low.returncode == 0 and "not persistent" in low.stderr, (low.stdout, low.stderr)
        assert _squeue(held) == "PENDING 7"

        with attack("train download of another tenant's snapshot through a forged record"):
            target = home2 / f"dl-{uuid.uuid4().hex[:6]}"
            r = as_user("btu2", [SLURM_BT, "train", "download", "--job-id", done, "--target-directory", str(target)])
            assert r.returncode != 0
            assert not any(p.is_file() for p in target.rglob("*")) if target.exists() else True

        with attack("train get_checkpoint_urls / checkpoints list of another team's job"):
            r = as_user("btu2", [SLURM_BT, "train", "get_checkpoint_urls", "--job-id", done], cwd=home2)
            assert r.returncode != 0 and "secret-weights" not in r.stdout + r.stderr
            assert not list(home2.glob(f"*_{done}_checkpoints.json"))
            r = as_user("btu2", [SLURM_BT, "train", "checkpoints", "list", "--job-id", done, "-o", "json"])
            assert r.returncode != 0 and "secret-weights" not in r.stdout
    finally:
        subprocess.run(["scancel", held], capture_output=True)
    aftermath(done, "btu1")
