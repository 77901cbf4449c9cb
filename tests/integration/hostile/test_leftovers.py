"""Nothing of a job outlives it, and nobody can take another user's runtime directory (issue #8 items 5, 7).

Real jobs on the dev cluster (proctrack/linuxproc; each node a machine of its own where nodes are
isolated, every node on this host otherwise; paths on a node are read through cluster_nodes.node_root):

* a job leaves ``setsid nohup sleep``, a SIGTERM-ignoring sleeper, an ``env -i`` double fork, a
  sleeper in its own user and pid namespace and one calling itself ``slurmstepd``, on both nodes:
  all are gone after the epilog;
* the same user's other job on the same node keeps them alive (it might be that job's), and its own
  processes are never touched; when it ends, its epilog ends them;
* a process of the same user's login session on the host (under ``runuser``) is not a leftover;
* step 2 never reads its per-node environment file and the job is cancelled: no env file and no
  runtime directory remain;
* btu2 pre-creates ``/dev/shm/slurm-bt-<btu1 uid>`` on n1 (a 0777 directory, then a symlink): btu1's job
  there still runs, the squat is in the hook log and in n1's ``slurm-bt admin doctor``.
"""

from __future__ import annotations

import os
import pwd
import random
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.cluster_nodes import node_root, notes_dir, on_node
from tests.integration.hostile.harness import BIN, aftermath, as_user, attack, forget_squats, submit, wait, write_job

# whole_cluster: runs alone, after the parallel tests (scripts/test.sh; README, Development).
pytestmark = [pytest.mark.slurm, pytest.mark.whole_cluster]

HOOK_LOG = Path("/var/log/slurm-bt/hooks.log")
SHM = Path("/dev/shm")

LEAVE = r'''#!/bin/bash
m="$1"
setsid nohup sleep "1000.$m" >/dev/null 2>&1 </dev/null &
setsid bash -c "trap '' TERM; exec sleep 1001.$m" >/dev/null 2>&1 </dev/null &
env -i /usr/bin/setsid /bin/sh -c "( /bin/sleep 1002.$m & )" >/dev/null 2>&1 </dev/null
setsid unshare -r --fork --pid sleep "1003.$m" >/dev/null 2>&1 </dev/null &
setsid bash -c "exec -a slurmstepd sleep 1004.$m" >/dev/null 2>&1 </dev/null &
echo "LEFT $(hostname)"
'''

LEAVE_JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-leftovers", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count={nodes}, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["bash leave.sh {marker}"]),
    ))
"""

PLAIN_JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-{name}", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=1, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands={commands!r}),
    ))
"""


def _marker() -> str:
    return str(random.randint(10000, 99999))


def _with_marker(marker: str) -> list[str]:
    """``pid cmdline`` of every process whose command line names ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if f".{marker}" in cmd and "pytest" not in cmd:
                found.append(f"{entry.name} {cmd.strip()}")
    return found


def _leftover_sleepers(marker: str) -> list[str]:
    """The sleepers ``leave.sh`` starts (``sleep 100x.<marker>``)."""
    return [p for p in _with_marker(marker) if p.split()[-1].startswith("100")]


def _notes_gone(job_id: str, node: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while os.path.lexists(notes_dir(node) / "jobs" / job_id):
        assert time.monotonic() < deadline, f"epilog of job {job_id} on {node} did not finish"
        time.sleep(0.5)


def _squeue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                          check=False).stdout.strip()


def _hook_log_lines(job_id: str, needle: str) -> list[str]:
    text = HOOK_LOG.read_text(errors="replace") if HOOK_LOG.exists() else ""
    return [ln for ln in text.splitlines() if f"job={job_id} " in ln and needle in ln]


def test_setsid_nohup_and_term_ignoring_leftovers_are_ended(tenants: dict[str, object]) -> None:
    with attack("leftover processes: setsid nohup, SIGTERM ignored, env -i double fork, pid namespace, "
                "named slurmstepd, on 2 nodes"):
        marker = _marker()
        config = write_job("btu2", LEAVE_JOB.format(nodes=2, marker=marker), {"leave.sh": LEAVE})
        job_id = submit("btu2", config)
        record, logs = wait("btu2", job_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
        assert logs.count("LEFT") == 2, logs
        aftermath(job_id, "btu2")
        deadline = time.monotonic() + 30
        while _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _with_marker(marker), f"job {job_id}'s processes outlived it: {_with_marker(marker)}"
        assert any(re.search(r"killed=[1-9]", ln) for ln in _hook_log_lines(job_id, "processes terminated=")), \
            "the epilog did not report ending the leftovers (the SIGTERM-ignoring one needs SIGKILL)"


def test_login_side_process_of_the_user_is_not_a_leftover(tenants: dict[str, object]) -> None:
    """The dev host is also the login node: a session's process (under runuser, root) survives the sweep."""
    with attack("leftover sweep vs. the same user's login session on the host"):
        marker = _marker()
        session = subprocess.Popen(["runuser", "-u", "btu2", "--", "sleep", f"120.{marker}"])
        try:
            config = write_job("btu2", LEAVE_JOB.format(nodes=1, marker=marker), {"leave.sh": LEAVE})
            job_id = submit("btu2", config)
            record, logs = wait("btu2", job_id)
            assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
            for node in ("n1", "n2"):
                _notes_gone(job_id, node)
            deadline = time.monotonic() + 30
            while (left := _leftover_sleepers(marker)) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not left, f"job {job_id}'s processes outlived it: {left}"
            assert any(p.endswith(f" sleep 120.{marker}") for p in _with_marker(marker))
            assert session.poll() is None
        finally:
            session.terminate()
            session.wait(timeout=30)
        aftermath(job_id, "btu2")


def test_same_users_other_job_on_the_node_keeps_processes_until_it_ends(tenants: dict[str, object]) -> None:
    with attack("leftover sweep vs. the same user's running job on the same node"):
        marker = _marker()
        busy = write_job("btu2", PLAIN_JOB.format(name="busy", commands=[f"sleep 40.{marker}", "echo BUSY-DONE"]))
        busy_id = submit("btu2", busy, "--nodelist=n1")
        deadline = time.monotonic() + 120
        while not any("40." + marker in p for p in _with_marker(marker)):
            assert time.monotonic() < deadline, f"job {busy_id} did not start: {_squeue_state(busy_id)}"
            time.sleep(0.5)
        leaver = write_job("btu2", LEAVE_JOB.format(nodes=1, marker=marker), {"leave.sh": LEAVE})
        leaver_id = submit("btu2", leaver, "--nodelist=n1")
        record, logs = wait("btu2", leaver_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
        _notes_gone(leaver_id, "n1")
        alive = _leftover_sleepers(marker)
        assert _squeue_state(busy_id) == "RUNNING", f"job {busy_id} was hurt by job {leaver_id}'s epilog"
        assert len({p.split()[-1] for p in alive}) == 5, \
            f"leftovers were ended while job {busy_id} of the same user ran on the host: {alive}"
        assert _hook_log_lines(leaver_id, "another job on this host"), "the epilog did not say why it kept them"
        record, logs = wait("btu2", busy_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED" and "BUSY-DONE" in logs, logs
        aftermath(busy_id, "btu2")
        assert not _with_marker(marker), f"job {busy_id}'s epilog left them: {_with_marker(marker)}"


STUCK_ENTRY = "#!/bin/bash\necho STUCK-BEFORE-READING-ENV\nsleep 300\n"


def test_job_cancelled_before_step2_read_its_env_file_leaves_no_env_file(tenants: dict[str, object]) -> None:
    with attack("cancel between step 1 and step 2: env file with resolved values"):
        uid = pwd.getpwnam("btu1").pw_uid
        config = write_job("btu1", PLAIN_JOB.format(name="cancelled", commands=["echo NEVER"]))
        job_id = submit("btu1", config, "--hold", "--nodelist=n1")
        try:
            show = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                                  check=True).stdout
            job_dir = Path(re.search(r"\bWorkDir=(\S+)", show).group(1))  # type: ignore[union-attr]
            # Step 2 never reads the env file (as if the job were cancelled before it started).
            as_user("btu1", ["tee", str(job_dir / "node_entry.sh")], input=STUCK_ENTRY).check_returncode()
            subprocess.run(["scontrol", "release", job_id], check=True, capture_output=True)
            env_file = node_root("n1") / SHM.relative_to("/") / f"slurm-bt-{uid}" / job_id / "node-0.env"
            deadline = time.monotonic() + 120
            while not env_file.exists():
                assert time.monotonic() < deadline, f"step 1 of job {job_id} never wrote {env_file}"
                time.sleep(0.2)
            assert b"HOME=" in env_file.read_bytes()
        finally:
            subprocess.run(["scancel", job_id], capture_output=True, check=False)
        wait("btu1", job_id)
        aftermath(job_id, "btu1")
        assert not env_file.exists() and not env_file.parent.exists()


def _free_runtime_name(user: str, path: Path, timeout_s: float = 300) -> None:
    """Wait until ``user`` has no job, then move their (unused) runtime directory out of the way."""
    deadline = time.monotonic() + timeout_s
    while subprocess.run(["squeue", "-h", "-u", user, "-o", "%i"], capture_output=True, text=True,
                         check=False).stdout.strip():
        assert time.monotonic() < deadline, f"{user} always has a job running; cannot set up the squat"
        time.sleep(1)
    if path.is_symlink() or path.exists():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


@pytest.mark.parametrize("shape", ["directory", "symlink"])
def test_squatted_runtime_dir_is_sidestepped_and_reported(tenants: dict[str, object], shape: str) -> None:
    with attack(f"btu2 squats btu1's /dev/shm runtime directory ({shape})"):
        uid = pwd.getpwnam("btu1").pw_uid
        on_n1 = SHM / f"slurm-bt-{uid}"  # as n1 names it
        squat = node_root("n1") / on_n1.relative_to("/")  # the same, seen from here
        _free_runtime_name("btu1", squat)
        if shape == "directory":
            made = as_user("btu2", ["mkdir", "-m", "0777", str(on_n1)], node="n1")
            as_user("btu2", ["tee", str(on_n1 / "planted")], input="squatter's", node="n1")
        else:
            as_user("btu2", ["mkdir", "-p", "/home/btu2/squat-target"]).check_returncode()
            made = as_user("btu2", ["ln", "-s", "/home/btu2/squat-target", str(on_n1)], node="n1")
        assert made.returncode == 0, f"could not set up the squat: {made.stderr}"
        assert squat.lstat().st_uid == pwd.getpwnam("btu2").pw_uid
        config = write_job("btu1", PLAIN_JOB.format(name="squatted", commands=['echo "RAN as $(id -un)"']))
        job_id = submit("btu1", config, "--nodelist=n1")
        record, logs = wait("btu1", job_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED" and "RAN as btu1" in logs, logs
        aftermath(job_id, "btu1")
        lines = _hook_log_lines(job_id, "squatted runtime directory")
        assert lines and f"owned by uid {pwd.getpwnam('btu2').pw_uid}" in lines[0], lines
        if squat.exists():  # the epilog removes it when btu1 has no other job; if it is there, it is btu1's
            assert squat.lstat().st_uid == uid and not squat.is_symlink() and not (squat / "planted").exists()
        doctor = subprocess.run([*on_node("n1"), str(BIN / "slurm-bt"), "admin", "doctor"], capture_output=True,
                                text=True, check=False).stdout
        assert re.search(rf"WARN\s+squatted directories on n1: .*{on_n1}", doctor), doctor
        forget_squats(on_n1)


CKPT_JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-ckpt-path", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=1, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(
            start_commands=['echo private-weights > "$BT_CHECKPOINT_DIR/model.bin"; echo WROTE'],
            checkpointing_config=definitions.CheckpointingConfig(enabled=True, checkpoint_path={path!r}),
        ),
    ))
"""


def test_squatted_checkpoint_path_in_tmp_is_refused_not_adopted(tenants: dict[str, object]) -> None:
    with attack("btu2 pre-creates the /tmp checkpoint_path of btu1's host job"):
        path = f"/tmp/bt-ckpt-{_marker()}"  # on n1
        seen = node_root("n1") / path.lstrip("/")
        as_user("btu2", ["mkdir", "-m", "0777", path], node="n1").check_returncode()
        try:
            config = write_job("btu1", CKPT_JOB.format(path=path))
            job_id = submit("btu1", config, "--nodelist=n1")
            record, logs = wait("btu1", job_id)
            assert record["current_status"] != "TRAINING_JOB_COMPLETED" and "WROTE" not in logs, logs
            assert f"{path}: belongs to uid {pwd.getpwnam('btu2').pw_uid}" in logs, logs
            # The job's data never reached the squatter's directory. (The epilog's checkpoint flush
            # still leaves its 0600 state file there: slurm_bt/checkpoints/flush.py, not step 1.)
            assert "model.bin" not in os.listdir(seen)
            aftermath(job_id, "btu1")
        finally:
            shutil.rmtree(seen, ignore_errors=True)


SWAP = r'''#!/bin/bash
job="/dev/shm/slurm-bt-$(id -u)/$SLURM_JOB_ID"
ln -s /home/btu2/hostile-victim-dir "$job/into-victim"
ln -s /etc/passwd "$job/node-9.env"
mkfifo "$job/fifo"
mkdir -p "$job/deep/er" && ln -s / "$job/deep/er/root" && chmod 000 "$job/deep"
echo PLANTED
'''

SWAP_JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-runtime-traps", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(node_count=1, cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["bash traps.sh"]),
    ))
"""


def test_runtime_dir_full_of_traps_is_removed_without_following_them(tenants: dict[str, object]) -> None:
    with attack("job fills its /dev/shm runtime dir with symlinks to another tenant, /etc and /, a FIFO, chmod 000"):
        victim = Path("/home/btu2/hostile-victim-dir")
        as_user("btu2", ["mkdir", "-p", str(victim)]).check_returncode()
        as_user("btu2", ["tee", str(victim / "keep.txt")], input="mine").check_returncode()
        passwd = Path("/etc/passwd").read_bytes()
        config = write_job("btu1", SWAP_JOB, {"traps.sh": SWAP})
        job_id = submit("btu1", config)
        record, logs = wait("btu1", job_id)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED" and "PLANTED" in logs, logs
        aftermath(job_id, "btu1")  # the runtime dir is gone
        assert (victim / "keep.txt").read_text() == "mine" and Path("/etc/passwd").read_bytes() == passwd
