"""Interactive sessions on the real dev cluster: ``slurm-bt ssh`` / ``train isession`` (docs/cli.md).

* a pseudo-terminal (the ``pty`` module) drives ``slurm-bt ssh JOB --node 1`` into a running 2-node
  job: the shell runs on n2 with the job's rank environment, in its working directory, and what it
  does (touching a file the start commands wait for) ends the job;
* the ``on_startup`` trigger prints the attach command into the job's log;
* ``on_failure`` holds the allocation for ``timeout_minutes`` after the start commands fail (a
  session can attach during the hold), then the job fails with the start commands' exit code;
* another user cannot attach (no record; Slurm refuses ``srun --jobid`` too), and the saved session
  environment holds no secret value;
* ``--host``: the same session through a real sshd (tests/integration/test_ssh.py's fixture);
* a host job with weights: the session sees them read-only at ``mount_location`` (the bubblewrap view).
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.cluster_nodes import job_nodes, node_root
from tests.integration.hostile.harness import BIN, aftermath, as_user, attack, submit, wait, write_job
from tests.integration.hostile.weights_jobs import readable_site
from tests.integration.test_ssh import ALIAS, USER, Sshd, _client_home
from tests.integration.test_ssh import sshd as sshd  # the session fixture, reused
from tests.servers.hf_hub import FakeHub

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(2)]

SECRET_VALUE = "isession-s3cr3t-value"

_CONFIG = """
from truss_train import definitions as d
job = d.TrainingJob(
    image=d.Image(base_image="python:3.11"),
    compute=d.Compute(node_count={nodes}, cpu_count=1, memory="256Mi"),
    runtime=d.Runtime(
        start_commands=[{commands}],
        environment_variables={{"MY_VAR": "visible", "MY_TOKEN": d.SecretReference(name="isession_tok")}},
    ),
    interactive_session=d.InteractiveSession(trigger=d.InteractiveSessionTrigger.{trigger}, timeout_minutes=1),
)
project = d.TrainingProject(name="isession-probe", job=job)
"""
# Rank 0 waits (at most 90 s) for a file the test creates from inside a session; rank 1 just waits.
_WAIT_FOR_FLAG = repr('for i in $(seq 180); do [ -e session.flag ] && exit 0; sleep 0.5; done; exit 9')


def _set_secret(user: str) -> None:
    proc = as_user(user, [str(BIN / "slurm-bt"), "secrets", "set", "isession_tok"], input=SECRET_VALUE)
    assert proc.returncode == 0, proc.stderr


def _running(job_id: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                               check=False).stdout.strip()
        if state == "RUNNING":
            return
        time.sleep(0.5)
    pytest.fail(f"job {job_id} did not start within {timeout_s} s")


def _log_has(user: str, job_id: str, needle: str, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    logs = ""
    while time.monotonic() < deadline:
        logs = as_user(user, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
        if needle in logs:
            return logs
        time.sleep(0.5)
    pytest.fail(f"{needle!r} not in the logs of job {job_id} after {timeout_s} s:\n{logs}")


def _drive(argv: list[str], lines: list[bytes], *, env: dict[str, str] | None = None,
           timeout_s: float = 60) -> tuple[str, int]:
    """Run ``argv`` on a new pseudo-terminal, type ``lines`` once a prompt shows, return (output, exit)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: argv on the pty's slave side as its terminal, 33 rows x 111 columns
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 111, 0, 0))
            os.execvpe(argv[0], argv, env if env is not None else dict(os.environ, TERM="xterm"))
        finally:
            os._exit(127)
    out = b""
    deadline = time.monotonic() + timeout_s

    def read_until(pattern: bytes | None, limit_s: float) -> bool:
        nonlocal out
        end = min(deadline, time.monotonic() + limit_s)
        while time.monotonic() < end:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                return False
            if not data:
                return False
            out += data
            if pattern is not None and re.search(pattern, out):
                return True
        return pattern is None

    read_until(rb"\$ $|\$ \x1b|# $", 30)  # the remote bash prompt
    for line in lines:
        os.write(fd, line + b"\r")
        time.sleep(0.3)
    read_until(None, timeout_s)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return out.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def _job_user_home(user: str) -> str:
    import pwd

    return pwd.getpwnam(user).pw_dir


def test_pty_session_in_a_running_two_node_job(tenants: dict[str, object]) -> None:
    _set_secret("btu1")
    config = write_job("btu1", _CONFIG.format(
        nodes=2, trigger="ON_STARTUP",
        commands=f'"[ \\"$BT_NODE_RANK\\" = 0 ] && {{ {_WAIT_FOR_FLAG[1:-1]}; }} || sleep 2"'))
    job_id = submit("btu1", config)
    _running(job_id)
    logs = _log_has("btu1", job_id, "interactive session (on_startup)")
    assert f"slurm-bt ssh {job_id} --node RANK" in logs and "RANK 0..1" in logs, logs

    # A shell on node rank 1 (n2), driven through a real pseudo-terminal.
    out, code = _drive(["runuser", "-u", "btu1", "--", str(BIN / "slurm-bt"), "ssh", job_id, "--node", "1"], [
        b'echo "MARK rank=$BT_NODE_RANK node=$SLURMD_NODENAME size=$BT_GROUP_SIZE var=$MY_VAR '
        b'tok=${MY_TOKEN:-none} tty=$(tty) job=$BT_TRAINING_JOB_ID size=$(stty size)"',
        b"exit 7",
    ])
    nodes = job_nodes(job_id)
    assert re.search(rf"MARK rank=1 node={nodes[1]} size=2 var=visible tok=none tty=/dev/pts/\d+ job={job_id} "
                     r"size=33 111", out), out  # a terminal on the node, of the caller's size
    assert code == 7, out  # the shell's exit status is the command's

    with attack("isession: another user opens a session in someone else's job"):
        other = as_user("btu2", [str(BIN / "slurm-bt"), "ssh", job_id, "--command", "id"])
        assert other.returncode == 2 and "no submission record" in other.stderr, other
        raw = as_user("btu2", ["srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1", "id"], timeout=60)
        assert raw.returncode != 0 and "uid=" not in raw.stdout, raw

    with attack("isession: the saved session environment holds a secret value"):
        uid = int(as_user("btu1", ["id", "-u"]).stdout)
        saved = node_root(nodes[0]) / f"dev/shm/slurm-bt-{uid}/{job_id}/node-0.session"  # the leader's /dev/shm
        assert saved.exists() and (saved.stat().st_mode & 0o077) == 0, saved
        data = saved.read_bytes()
        assert b"BT_NODE_RANK=0\0" in data and SECRET_VALUE.encode() not in data and b"MY_TOKEN=" not in data

    # isession (the `train` verb's form) on the leader: its cwd is the start commands' working
    # directory, so touching the flag there ends rank 0's wait and the job completes.
    from slurm_bt.cli.isession_cmd import isession_command  # noqa: F401  (the click command exists)

    done = as_user("btu1", [str(BIN / "slurm-bt"), "ssh", job_id, "--node", nodes[0],
                            "--command", 'touch session.flag && echo "leader=$BT_NODE_RANK on $SLURMD_NODENAME"'])
    assert done.returncode == 0 and f"leader=0 on {nodes[0]}" in done.stdout, done
    record, _ = wait("btu1", job_id, timeout_s=120)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", record
    aftermath(job_id, "btu1")


def test_on_failure_holds_the_allocation_then_fails(tenants: dict[str, object]) -> None:
    _set_secret("btu1")
    config = write_job("btu1", _CONFIG.format(nodes=1, trigger="ON_FAILURE", commands='"echo failing; exit 3"'))
    job_id = submit("btu1", config)
    _running(job_id)
    logs = _log_has("btu1", job_id, "interactive session (on_failure): the allocation is kept for 1 min")
    assert "the start commands failed (exit 3)" in logs, logs
    held_at = time.monotonic()
    # The job still runs after its start commands failed, and a session attaches during the hold.
    probe = as_user("btu1", [str(BIN / "slurm-bt"), "ssh", job_id, "--command",
                             'echo "held rank=$BT_NODE_RANK var=$MY_VAR"'])
    assert probe.returncode == 0 and "held rank=0 var=visible" in probe.stdout, probe
    record, logs = wait("btu1", job_id, timeout_s=150)
    assert time.monotonic() - held_at > 40, "the hold ended long before its minute"
    assert record["current_status"] == "TRAINING_JOB_FAILED", record
    assert "exit code 3" in str(record.get("slurm_state", "")) + str(record.get("detail", "")), record
    assert ("interactive session (on_failure) ended after 1 min; the run ends as its start commands did "
            "(exit 3)") in logs, logs
    aftermath(job_id, "btu1")


def test_session_over_ssh_host(sshd: Sshd, tmp_path: Path, tenants: dict[str, object]) -> None:
    _set_secret(USER)
    config = write_job(USER, _CONFIG.format(nodes=1, trigger="ON_DEMAND", commands=repr(_WAIT_FOR_FLAG[1:-1])))
    job_id = submit(USER, config)
    _running(job_id)
    env = _client_home(tmp_path, sshd, known=True)
    env["TERM"] = "xterm"
    # Without a terminal (a script): no pty anywhere, output and exit status come back as they are.
    piped = subprocess.run([str(BIN / "slurm-bt"), "ssh", job_id, "--host", ALIAS, "--command",
                            'echo "piped rank=$BT_NODE_RANK"; exit 4'], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=180, check=False)
    assert piped.returncode == 4 and "piped rank=0" in piped.stdout, piped
    out, code = _drive([str(BIN / "slurm-bt"), "ssh", job_id, "--host", ALIAS], [
        b'echo "REMOTE rank=$BT_NODE_RANK user=$(id -un) var=$MY_VAR size=$(stty size)"; touch session.flag',
        b"exit",
    ], env=env)
    assert f"REMOTE rank=0 user={USER} var=visible size=33 111" in out and code == 0, out
    record, _ = wait(USER, job_id, timeout_s=90)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", record
    aftermath(job_id, USER)


def test_session_sees_the_weights_view_of_a_host_job(tenants: dict[str, object], fake_hub: FakeHub) -> None:
    tag = uuid.uuid4().hex[:8]
    fake_hub.add_repo(f"Org/Session-{tag}", {"config.json": b'{"session": "weights-visible"}'})
    with readable_site("bt-isession-site-", f"""
            [weights.endpoints]
            hf_endpoint = "{fake_hub.endpoint}"
            """):
        config = write_job("btu1", f"""
            from truss_train import WeightsSource, definitions as d
            project = d.TrainingProject(name="isession-weights", job=d.TrainingJob(
                image=d.Image(base_image="python:3.11"),
                compute=d.Compute(node_count=1, cpu_count=1, memory="256Mi"),
                runtime=d.Runtime(start_commands=[{_WAIT_FOR_FLAG}]),
                weights=[WeightsSource(source="hf://Org/Session-{tag}", mount_location="/app/w")],
                interactive_session=d.InteractiveSession(),
            ))
            """)
        job_id = submit("btu1", config)
        _running(job_id, timeout_s=150)
        seen = as_user("btu1", [str(BIN / "slurm-bt"), "ssh", job_id, "--command",
                                "cat /app/w/config.json; touch /app/w/x 2>/dev/null || echo read-only; "
                                'echo "rank=$BT_NODE_RANK"; touch session.flag'])
        assert seen.returncode == 0, seen
        assert '{"session": "weights-visible"}' in seen.stdout and "read-only" in seen.stdout, seen
        assert "rank=0" in seen.stdout, seen  # the environment was saved inside the view too
        record, _ = wait("btu1", job_id, timeout_s=120)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", record
    aftermath(job_id, "btu1")
