"""SSH target resolution (ssh config, URL forms) and the remote command plumbing without a server."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from slurm_bt.errors import RemoteError, UserError
from slurm_bt.remote.commands import RemoteOutcome, remote_program, submit_remote
from slurm_bt.remote.ssh import resolve_target


def _env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "USER": "laptopuser"}


def test_alias_from_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # paramiko expands ~ in IdentityFile itself
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host hpc\n  HostName login.example.org\n  User alice\n  Port 2200\n  IdentityFile ~/.ssh/id_hpc\n"
        "  StrictHostKeyChecking accept-new\n\nHost *\n  ConnectTimeout 7\n")
    t = resolve_target("hpc", environ=_env(tmp_path))
    assert (t.hostname, t.port, t.user) == ("login.example.org", 2200, "alice")
    assert t.identity_files == (str(tmp_path / ".ssh" / "id_hpc"),)
    assert t.accept_new and t.connect_timeout_s == 7
    assert t.known_hosts == str(tmp_path / ".ssh" / "known_hosts")
    assert t.host_key_name == "[login.example.org]:2200"


def test_explicit_values_win_and_defaults(tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host hpc\n  User alice\n  Port 2200\n")
    t = resolve_target("ssh://bob@hpc:2222", environ=_env(tmp_path))
    assert (t.hostname, t.port, t.user, t.accept_new) == ("hpc", 2222, "bob", False)
    t = resolve_target("plainhost", environ=_env(tmp_path))
    assert (t.hostname, t.port, t.user, t.host_key_name) == ("plainhost", 22, "laptopuser", "plainhost")
    assert resolve_target("plainhost", accept_new_host_key=True, environ=_env(tmp_path)).accept_new


@pytest.mark.parametrize("bad", ["", "-oProxyCommand=x", "a b", "user@", "host:notaport", "ssh://a@b:1:2"])
def test_bad_host_specs_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(RemoteError):
        resolve_target(bad, environ=_env(tmp_path))


def test_remote_program_prefix() -> None:
    assert remote_program("slurm-bt", {}) == "slurm-bt"
    assert remote_program("bt-sbatch", {"SLURM_BT_REMOTE_BIN": "/opt/x/bin/"}) == "/opt/x/bin/bt-sbatch"


def test_argv_is_joined_with_shlex_not_formatted() -> None:
    argv = ["slurm-bt", "status", "1; rm -rf ~", "$(id)"]
    assert shlex.split(shlex.join(argv)) == argv


def test_outcome_json() -> None:
    assert RemoteOutcome(0, '{"a": 1}', "").json() == {"a": 1}
    assert RemoteOutcome(1, "not json", "").json() is None and RemoteOutcome(0, "", "").json() is None


def test_remote_submit_validates_locally_before_connecting(tmp_path: Path) -> None:
    (tmp_path / "config.py").write_text("this is not python (\n")
    with pytest.raises(UserError):
        submit_remote(tmp_path / "config.py", "unreachable.invalid")
    (tmp_path / "config.py").write_text(
        "from truss_train import definitions\n"
        "project = definitions.TrainingProject(name='x', job=definitions.TrainingJob(\n"
        "  image=definitions.Image(base_image='b'),\n"
        "  workspace=definitions.Workspace(external_dirs=['../elsewhere'])))\n")
    with pytest.raises(UserError, match="external_dirs"):
        submit_remote(tmp_path / "config.py", "unreachable.invalid")
    with pytest.raises(UserError, match="not allowed"):
        submit_remote(tmp_path / "config.py", "unreachable.invalid", sbatch_args=["--export=ALL"])
