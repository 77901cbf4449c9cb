"""Hostile jobs against the root-started checkpoint flush and hand-off sweep (issue #8 items 4 and 6).

Each job kills its own background uploader first, so the epilog's flush (root, dropping to the user)
and the detached hand-off sweep are the ones that read what the job left behind:

1. the uploader's state file swapped for a symlink to ``/dev/zero`` and checkpoint files swapped for a
   FIFO and a ``/dev/zero`` symlink: the epilog finishes in seconds, the rest is uploaded;
2. ``job.json`` swapped for a FIFO: the flush hands off at once, the detached sweep fails fast (never
   blocks), the entry is quarantined after ``max_failures`` (3) sweeps, ``admin doctor`` lists it
   and later sweeps leave it alone;
3. file names that are not UTF-8 or hold a newline: everything uploads, downloads and loads into a
   later job byte for byte;
4. the store location made unwritable by the job: the hand-off waits; once it is repaired,
   ``slurm-bt checkpoints resume-handoffs`` as root completes it.

After each: no node drained, nothing of the job left (``aftermath``).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

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

pytestmark = pytest.mark.slurm

HOOK_LOG = Path("/var/log/slurm-bt/hooks.log")
STORE = Path("/var/lib/slurm-bt-dev/shared/checkpoints")

# Shared by every job below: stop the background uploader (so the epilog does the upload), make
# checkpoint-1 complete, then run the scenario's ATTACK.
PRELUDE = r'''
import json, os, pathlib, signal, subprocess, sys, time
d = pathlib.Path(os.environ["BT_CHECKPOINT_DIR"])
state = d / ".slurm-bt-uploader.json"
for _ in range(300):
    if state.exists():
        break
    time.sleep(0.1)
spec_path = json.loads(state.read_text())["spec_path"]
spec = json.loads(pathlib.Path(spec_path).read_text())
def stop_uploader():
    out = subprocess.run(["pgrep", "-u", str(os.getuid()), "-f", "slurm_bt.steps.checkpoint_agent"],
                         capture_output=True, text=True).stdout.split()
    for pid in out:
        # pgrep also lists the agent's srun; killing it ends the step, so the agent may be gone already
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
def checkpoint(name, files):
    c = d / name
    c.mkdir()
    for rel, data in files.items():
        p = os.path.join(os.fsencode(c), rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
    (c / ".complete").touch()
'''

POISON_FILES = PRELUDE + r'''
stop_uploader()
checkpoint("checkpoint-1", {b"good.bin": b"g" * 5000, b"fifo.bin": b"x", b"zero.bin": b"x"})
c = d / "checkpoint-1"
os.unlink(c / "fifo.bin"); os.mkfifo(c / "fifo.bin")
os.unlink(c / "zero.bin"); os.symlink("/dev/zero", c / "zero.bin")
os.unlink(state); os.symlink("/dev/zero", state)
print("POISONED", flush=True)
'''

POISON_SPEC = PRELUDE + r'''
stop_uploader()
checkpoint("checkpoint-1", {b"w.bin": os.urandom(5000)})
os.unlink(spec_path); os.mkfifo(spec_path)
print("POISONED", flush=True)
'''

ODD_NAMES = PRELUDE + r'''
stop_uploader()
checkpoint("checkpoint-1", {b"plain.bin": b"p" * 1000, b"bad-\xff-name": b"not utf-8", b"nl\nname": b"newline",
                            b"sub/50%25.txt": b"percent"})
print("WROTE", flush=True)
'''

BREAK_STORE = PRELUDE + r'''
checkpoint("checkpoint-1", {b"a.bin": os.urandom(4000)})
rank0 = pathlib.Path(sys.argv[1]) / spec["project_id"] / os.environ["SLURM_JOB_ID"] / "rank-0"
for _ in range(600):
    if (rank0 / "checkpoint-1" / "a.bin").exists():
        break
    time.sleep(0.1)
stop_uploader()
checkpoint("checkpoint-2", {b"b.bin": os.urandom(4000)})
os.chmod(rank0, 0o555)  # the store location is broken until an admin repairs it
print("BROKE " + str(rank0), flush=True)
'''


LOAD = r'''
import os
root = os.path.join(os.fsencode(os.environ["BT_LOAD_CHECKPOINT_DIR"]), b"rank-0", b"checkpoint-1")
for dirpath, _, names in sorted(os.walk(root)):
    for n in sorted(names):
        if n.startswith(b".slurm-bt"):
            continue  # slurm-bt's own marker
        p = os.path.join(dirpath, n)
        print("LOADED", repr(os.path.relpath(p, root)), repr(open(p, "rb").read()[:20]), flush=True)
'''


def _config(project: str, script: str, args: str = "") -> str:
    return f"""
    from truss_train import definitions
    project = definitions.TrainingProject(name={project!r}, job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(cpu_count=1, memory="512Mi"),
        runtime=definitions.Runtime(start_commands=["python3 {script} {args}".strip()],
            environment_variables={{"BT_CHECKPOINT_POLL_S": "1"}},
            checkpointing_config=definitions.CheckpointingConfig(enabled=True)),
    ))
    """


def _run_job(user: str, script_text: str, args: str = "", project: str | None = None) -> tuple[str, str, str, float]:
    """Submit, wait for the job and for its epilog; (job id, node, logs, epilog seconds)."""
    project = project or f"hostile-handoff-{uuid.uuid4().hex[:8]}"
    config = write_job(user, _config(project, "attack.py", args), {"attack.py": script_text})
    job_id = submit(user, config)
    record, logs = wait(user, job_id)
    node = str(record.get("nodes") or "n1").split(",")[0]
    return job_id, node, logs, _epilog_seconds(job_id, node)


def _hook_lines(pattern: str, timeout_s: float) -> list[str]:
    """Lines of the hook log matching ``pattern``, waiting up to ``timeout_s`` for one to appear."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [ln for ln in HOOK_LOG.read_text(errors="replace").splitlines() if re.search(pattern, ln)]
        if lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def _epilog_seconds(job_id: str, node: str) -> float:
    lines = _hook_lines(rf"epilog\[\d+\] job={job_id} node={node} .* ok in ", 120)
    m = re.search(r" ok in ([\d.]+) s", lines[-1] if lines else "")
    assert m, f"no epilog line for job {job_id} on {node}"
    return float(m.group(1))


def _sweep(node: str) -> subprocess.CompletedProcess[str]:
    """One periodic sweep of ``node``'s hand-off area, as the systemd timer runs it (root)."""
    return subprocess.run([sys.executable, "-I", "-m", "slurm_bt.checkpoints.handoff", "--node", node],
                          capture_output=True, text=True, timeout=300, check=False)


def _entry(node: str, job_id: str) -> Path:
    return Path(cluster()["node_local_dir"]) / node / "checkpoint-handoff" / f"{job_id}.{node}"


def _list(user: str, job_id: str) -> dict[str, list[str]]:
    out = as_user(user, [str(BIN / "slurm-bt"), "checkpoints", "list", job_id, "-o", "json"])
    assert out.returncode == 0, out.stderr
    index = json.loads(out.stdout)
    return {c["name"]: sorted(f["path"] for f in c["ranks"]["0"]) for c in index["checkpoints"]}


def test_state_file_and_checkpoint_files_swapped_for_dev_zero_and_fifo(tenants: dict[str, object]) -> None:
    with attack("checkpoint state file -> /dev/zero, checkpoint files -> FIFO and /dev/zero"):
        job_id, node, logs, took = _run_job("btu2", POISON_FILES)
        assert "POISONED" in logs, logs
        assert took < 30, f"the epilog took {took} s"
        flush = _hook_lines(rf"job={job_id} node={node} .*flush_job_checkpoints", 5)
        assert flush and "done" in flush[-1], flush
        assert _list("btu2", job_id) == {"checkpoint-1": ["good.bin"]}
        assert not _entry(node, job_id).exists()
        aftermath(job_id, "btu2")


def test_job_json_swapped_for_a_fifo_is_quarantined_after_k_sweeps(tenants: dict[str, object]) -> None:
    with attack("job.json -> FIFO before the epilog's flush and the hand-off sweep"):
        job_id, node, logs, took = _run_job("btu2", POISON_SPEC)
        assert "POISONED" in logs, logs
        assert took < 30, f"the epilog took {took} s (it waited on the FIFO)"
        entry = _entry(node, job_id)
        assert (entry / "data" / "checkpoint-1" / "w.bin").is_file(), "handed off, not kept in scratch"
        # The epilog's detached sweep fails fast instead of blocking for hours on the FIFO.
        first = _hook_lines(rf"resume-handoffs node={node} entry={job_id}\.{node} ", 90)
        assert first and "failed: attempt 1 of 3" in first[0] and "not a regular file" in first[0], first
        aftermath(job_id, "btu2")
        try:
            second = _sweep(node)
            assert f"entry={job_id}.{node} failed: attempt 2 of 3" in second.stdout, second.stdout
            started = time.monotonic()
            third = _sweep(node)
            assert time.monotonic() - started < 120
            assert f"entry={job_id}.{node} quarantined: failed 3 times" in third.stdout, third.stdout
            doctor = subprocess.run([str(BIN / "slurm-bt"), "admin", "doctor", "--node", node], capture_output=True,
                                    text=True, timeout=120, check=False)
            assert f"quarantined hand-offs on {node}" in doctor.stdout, doctor.stdout
            assert f"{job_id}.{node} (user btu2, 3 failures" in doctor.stdout, doctor.stdout
            fourth = _sweep(node)
            assert f"entry={job_id}.{node} quarantined: not retried" in fourth.stdout, fourth.stdout
            assert (entry / "data" / "checkpoint-1" / "w.bin").is_file(), "quarantined entries are kept"
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(entry)], check=False)


def test_odd_file_names_upload_and_round_trip(tenants: dict[str, object], tmp_path: Path) -> None:
    with attack("checkpoint file names: not UTF-8, newline, look-alike escapes"):
        project = f"hostile-handoff-{uuid.uuid4().hex[:8]}"
        job_id, node, logs, _ = _run_job("btu2", ODD_NAMES, project=project)
        assert "WROTE" in logs, logs
        assert _list("btu2", job_id) == {"checkpoint-1": ["bad-%FF-name", "nl%0Aname", "plain.bin",
                                                          "sub/50%2525.txt"]}
        assert not _entry(node, job_id).exists(), "nothing handed off"
        home = Path(f"/home/btu2/dl-{job_id}")
        try:
            dl = as_user("btu2", [str(BIN / "slurm-bt"), "checkpoints", "download", job_id, "--target-directory",
                                  str(home)])
            assert dl.returncode == 0, dl.stderr
            got = home / "rank-0" / "checkpoint-1"
            names = sorted(os.listdir(os.fsencode(got)))
            assert names == [b"bad-\xff-name", b"nl\nname", b"plain.bin", b"sub"]
            assert Path(os.fsdecode(os.path.join(os.fsencode(got), b"bad-\xff-name"))).read_bytes() == b"not utf-8"
            assert (got / "nl\nname").read_bytes() == b"newline"
            assert (got / "sub" / "50%25.txt").read_bytes() == b"percent"
        finally:
            subprocess.run(["rm", "-rf", str(home)], check=False)
        aftermath(job_id, "btu2")
        # A later job loads it: the names are decoded into $BT_LOAD_CHECKPOINT_DIR as well.
        cfg = write_job("btu2", f"""
            from truss_train import definitions
            project = definitions.TrainingProject(name={project + "-load"!r}, job=definitions.TrainingJob(
                image=definitions.Image(base_image="python:3.11"),
                compute=definitions.Compute(cpu_count=1, memory="512Mi"),
                runtime=definitions.Runtime(start_commands=["python3 load.py"],
                    load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, checkpoints=[
                        definitions.BasetenCheckpoint.from_latest_checkpoint(project_name={project!r})])),
            ))
            """, {"load.py": LOAD})
        load_id = submit("btu2", cfg)
        record, load_logs = wait("btu2", load_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", load_logs
        loaded = sorted(re.findall(r"LOADED (.*)", load_logs))
        assert loaded == ["b'bad-\\xff-name' b'not utf-8'", "b'nl\\nname' b'newline'",
                          "b'plain.bin' b'pppppppppppppppppppp'", "b'sub/50%25.txt' b'percent'"], load_logs
        aftermath(load_id, "btu2")


def test_root_resumes_a_hand_off_once_its_store_location_is_repaired(tenants: dict[str, object]) -> None:
    with attack("store location broken by the job; resume-handoffs as root after repair"):
        # btu2's uploads go to its team's namespace, <store>/_teams/btteam2/<project>/<job> (docs/checkpoints.md).
        job_id, node, logs, _ = _run_job("btu2", BREAK_STORE, str(STORE / "_teams" / "btteam2"))
        m = re.search(r"BROKE (\S+)", logs)
        assert m, logs
        rank0 = Path(m.group(1))
        entry = _entry(node, job_id)
        assert (entry / "data" / "checkpoint-2" / "b.bin").is_file(), "checkpoint-2 was handed off"
        first = _hook_lines(rf"resume-handoffs node={node} entry={job_id}\.{node} ", 90)
        assert first and "failed: attempt 1 of 3" in first[0], first
        assert "Permission denied" not in first[0] or str(rank0) in first[0], "the store, not the entry, refused"
        aftermath(job_id, "btu2")
        os.chmod(admin_path(rank0), 0o2750)  # the admin repairs the store location
        res = subprocess.run([str(BIN / "slurm-bt"), "checkpoints", "resume-handoffs", "--node", node],
                             capture_output=True, text=True, timeout=300, check=False)
        assert f"{job_id}.{node}: uploaded: 1 checkpoint(s)" in res.stdout, (res.stdout, res.stderr)
        assert not entry.exists()
        assert _list("btu2", job_id) == {"checkpoint-1": ["a.bin"], "checkpoint-2": ["b.bin"]}
        assert os.stat(admin_path(rank0 / "checkpoint-2" / "b.bin")).st_uid == pwd.getpwnam("btu2").pw_uid, \
            "uploaded as the user"
