"""Remote use over a real OpenSSH server on 127.0.0.1: submit, status and logs with ``--host``.

A session fixture starts ``/usr/sbin/sshd`` with its own host key and config in a temp dir
(``ListenAddress=127.0.0.1``, a free port) in the foreground (``-D``) and stops that child process. The remote
user is created with useradd and unlocked for key login; the test writes its authorized_keys. The
client side is the console scripts run with ``HOME`` pointing at a temp dir that holds the ssh
config (HostName/User/Port/IdentityFile) and known_hosts, so the real ~/.ssh is never touched.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
USER = "btsshuser"
ALIAS = "btdev-login"


@dataclass(frozen=True)
class Sshd:
    port: int
    host_pub: str  # "ssh-ed25519 AAAA..."
    client_key: Path
    root: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs root and /usr/sbin/sshd (apt-get install openssh-server)")
    root = tmp_path_factory.mktemp("sshd")
    root.chmod(0o755)
    _keygen(root / "host_key")
    _keygen(root / "client_key")
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", "-s", "/bin/bash", USER], check=True)
    subprocess.run(["usermod", "-p", "*", USER], check=True)  # unlocked for key login, no password
    subprocess.run(["sacctmgr", "-i", "add", "user", USER, "account=default"], capture_output=True)
    # This server's own key file (not the user's ~/.ssh/authorized_keys): several sessions' servers (xdist
    # workers) then never cut each other's clients off. sshd reads it as the user, so not under pytest's
    # 0700 temp dir; StrictModes would refuse it below the 1777 /var/tmp.
    keys = Path(tempfile.mkdtemp(prefix="bt-sshd-keys-", dir="/var/tmp"))
    keys.chmod(0o755)
    auth = keys / "authorized_keys"
    auth.write_text((root / "client_key.pub").read_text())
    auth.chmod(0o644)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    port = _free_port()
    config = root / "sshd_config"
    config.write_text(textwrap.dedent(f"""\
        HostKey {root}/host_key
        PidFile {root}/sshd.pid
        AuthorizedKeysFile {auth}
        StrictModes no
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        PubkeyAuthentication yes
        PermitRootLogin no
        UsePAM no
        AllowUsers {USER}
        Subsystem sftp internal-sftp
        LogLevel VERBOSE
        """))
    # The login node's bt-sbatch reads the suite's site file (tests/conftest.py host_runtime_site), as
    # a local one does: an ssh session does not inherit this process's environment.
    if os.environ.get("SLURM_BT_SITE_CONFIG"):
        with config.open("a") as f:
            f.write(f"SetEnv SLURM_BT_SITE_CONFIG={os.environ['SLURM_BT_SITE_CONFIG']}\n")
    # -D keeps sshd in the foreground as our child: its PID is known without a pid file (the daemon
    # writes PidFile only after it starts listening, so polling the port then reading it raced).
    log = root / "sshd.log"
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(config), "-E", str(log),
                             "-o", "ListenAddress=127.0.0.1", "-o", f"Port={port}"])
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                pytest.fail(f"sshd exited with {proc.returncode}: {log.read_text() if log.exists() else ''}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"sshd did not listen on {port}: {log.read_text() if log.exists() else ''}")
                time.sleep(0.05)
        yield Sshd(port, " ".join((root / "host_key.pub").read_text().split()[:2]), root / "client_key", root)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(keys, ignore_errors=True)


def _client_home(base: Path, sshd: Sshd, *, known: bool) -> dict[str, str]:
    home = base / "laptop-home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    key = ssh / "id_btdev"
    shutil.copy(sshd.client_key, key)
    key.chmod(0o600)
    (ssh / "config").write_text(textwrap.dedent(f"""\
        Host {ALIAS}
            HostName 127.0.0.1
            Port {sshd.port}
            User {USER}
            IdentityFile ~/.ssh/id_btdev
        """))
    if known:
        (ssh / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_pub}\n")
    env = {k: v for k, v in os.environ.items() if k not in {"SSH_AUTH_SOCK", "SLURM_BT_SITE_CONFIG"}}
    env["HOME"] = str(home)
    return env


def _run(argv: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, **kw)  # type: ignore[call-overload]


def test_unknown_host_key_is_refused_unless_accepted(sshd: Sshd, tmp_path: Path,
                                                     dev_cluster: dict[str, object]) -> None:
    env = _client_home(tmp_path, sshd, known=False)
    refused = _run([str(BIN / "slurm-bt"), "list", "--host", ALIAS], env)
    assert refused.returncode == 1, refused
    assert "host key" in refused.stderr and "known_hosts" in refused.stderr
    assert "--accept-new-host-key" in refused.stderr
    assert not (Path(env["HOME"]) / ".ssh" / "known_hosts").exists()

    accepted = _run([str(BIN / "slurm-bt"), "list", "--host", ALIAS, "--accept-new-host-key"], env)
    assert accepted.returncode == 0, accepted.stderr
    known = (Path(env["HOME"]) / ".ssh" / "known_hosts").read_text()
    assert f"[127.0.0.1]:{sshd.port}" in known and sshd.host_pub.split()[1] in known
    # A *changed* key is always refused, even when new keys are accepted.
    (Path(env["HOME"]) / ".ssh" / "known_hosts").write_text(
        f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHn6zDcPZ6n0ZqTQ2S4xsl2m7vHf1rS9u7aN8i1W4XUk\n")
    changed = _run([str(BIN / "slurm-bt"), "list", "--host", ALIAS, "--accept-new-host-key"], env)
    assert changed.returncode == 1 and "does not match" in changed.stderr, changed.stderr


def test_submit_status_logs_over_ssh(sshd: Sshd, tmp_path: Path, dev_cluster: dict[str, object]) -> None:
    env = _client_home(tmp_path, sshd, known=True)
    project = tmp_path / "proj"
    (project / "__pycache__").mkdir(parents=True)
    (project / "__pycache__" / "junk.pyc").write_bytes(b"ignored by the snapshot rules")
    (project / "data.txt").write_text("payload-from-laptop\n")
    (project / "config.py").write_text(textwrap.dedent("""
        from truss_train import definitions
        project = definitions.TrainingProject(name="ssh-probe", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=[
                "echo \\"user $(id -un) rank $BT_NODE_RANK $(cat data.txt)\\"",
                "ls -a",
            ]),
        ))
        """))
    sub = _run([str(BIN / "bt-sbatch"), "--host", ALIAS, "--json", str(project / "config.py")], env)
    assert sub.returncode == 0, sub.stderr
    info = json.loads(sub.stdout)
    job_id = info["job_id"]
    assert info["training_job"]["id"] == job_id
    assert info["training_job"]["training_project"]["name"] == "ssh-probe"
    assert info["job_dir"].startswith(pwd.getpwnam(USER).pw_dir)

    st = _run([str(BIN / "slurm-bt"), "status", job_id, "--host", ALIAS, "--wait", "--timeout", "120", "--json"], env)
    assert st.returncode == 0, st.stderr
    [row] = json.loads(st.stdout)
    assert row["current_status"] == "TRAINING_JOB_COMPLETED", row
    assert row["user"] == USER and row["training_project"]["name"] == "ssh-probe"

    logs = _run([str(BIN / "slurm-bt"), "logs", job_id, "--host", ALIAS], env)
    assert logs.returncode == 0, logs.stderr
    for rank in (0, 1):
        assert f"[node {rank}] user {USER} rank {rank} payload-from-laptop" in logs.stdout, logs.stdout
    assert "__pycache__" not in logs.stdout  # the ignore rules applied to the uploaded snapshot
    table = _run([str(BIN / "slurm-bt"), "view", "--project", "ssh-probe", "--host", ALIAS], env)
    assert table.returncode == 0 and job_id in table.stdout and "TRAINING_JOB_COMPLETED" in table.stdout
    # Remote exit codes are passed on: a usage error on the login node is 2 here too.
    bad = _run([str(BIN / "slurm-bt"), "logs", "12345678", "--host", ALIAS], env)
    assert bad.returncode == 2 and "no submission record" in bad.stderr


def test_push_api_with_remote_alias(sshd: Sshd, tmp_path: Path, dev_cluster: dict[str, object],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    env = _client_home(tmp_path, sshd, known=True)
    monkeypatch.setenv("HOME", env["HOME"])
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    from slurm_bt import push

    config = tmp_path / "p" / "config.py"
    config.parent.mkdir()
    config.write_text(textwrap.dedent("""
        from truss_train import definitions
        project = definitions.TrainingProject(name="ssh-push", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(start_commands=["true"]),
        ))
        """))
    result = push(config, remote=ALIAS)
    assert result["id"].isdigit() and result["training_project"]["name"] == "ssh-push"
    assert result["current_status"] == "TRAINING_JOB_PENDING" and result["job_object"].runtime.start_commands
    local_keys = {"id", "name", "training_project", "current_status", "instance_type", "created_at", "updated_at",
                  "priority", "availability_model", "user", "error_message", "job_dir", "job_object"}
    assert set(result) == local_keys
