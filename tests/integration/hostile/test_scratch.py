"""Hostile jobs against the scratch directory the epilog removes as root.

The job fills ``$BT_SCRATCH_DIR`` with everything a root ``rm -r`` could be tricked by: symlinks to
system files and to another tenant's home, a FIFO, names with newlines and bytes that are not UTF-8,
a ``chmod 000`` directory and a deep tree. After it: the targets are untouched, the scratch is gone,
no node drained (``aftermath``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.integration.hostile.harness import aftermath, as_user, attack, submit, wait, write_job

pytestmark = pytest.mark.slurm

PLANT = r'''
import os, sys
d = os.environ["BT_SCRATCH_DIR"]
victim = sys.argv[1]
os.symlink("/etc", os.path.join(d, "etc-link"))
os.symlink("/etc/passwd", os.path.join(d, "passwd-link"))
os.symlink(victim, os.path.join(d, "victim-link"))
os.mkfifo(os.path.join(d, "fifo"))
with open(os.path.join(d.encode(), b"bad-\xff-name\nline"), "w") as f:
    f.write("x")
locked = os.path.join(d, "locked")
os.makedirs(os.path.join(locked, "inner"))
open(os.path.join(locked, "inner", "f"), "w").close()
os.chmod(os.path.join(locked, "inner"), 0)
os.chmod(locked, 0)
deep = d
for _ in range(300):
    deep = os.path.join(deep, "d")
os.makedirs(deep)
os.symlink("/", os.path.join(deep, "root-link"))
print("PLANTED", flush=True)
'''

JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-scratch", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["python3 plant.py {victim}"]),
    ))
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_scratch_full_of_traps_is_removed_and_nothing_else(tenants: dict[str, object]) -> None:
    with attack("scratch symlinks/FIFO/odd names/chmod 000/deep tree"):
        victim = Path("/home/btu2/hostile-victim.txt")
        as_user("btu2", ["tee", str(victim)], input="mine").check_returncode()
        before = {p: _digest(p) for p in (Path("/etc/passwd"), Path("/etc/group"), victim)}
        config = write_job("btu1", JOB.format(victim=victim), {"plant.py": PLANT})
        job_id = submit("btu1", config)
        record, logs = wait("btu1", job_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
        assert logs.count("PLANTED") == 2, logs
        aftermath(job_id, "btu1")
        assert {p: _digest(p) for p in before} == before
        assert Path("/etc/hosts").exists() and victim.exists()


def test_benign_job_leaves_nothing(tenants: dict[str, object]) -> None:
    with attack("baseline: an ordinary job"):
        config = write_job("btu2", JOB.format(victim="/nonexistent"), {"plant.py": "print('PLANTED')\n"})
        job_id = submit("btu2", config)
        record, logs = wait("btu2", job_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
        aftermath(job_id, "btu2")
