"""slurm-bt commands run on a login node over SSH: the laptop side of ``--host``.

The design keeps *one* implementation of every command: the login node runs the same
``bt-sbatch``/``slurm-bt`` with ``--json`` (argv joined with :func:`shlex.join`), and the laptop
renders the JSON with the same code as a local run. So remote output, exit codes (0/1/2) and
privacy rules are exactly the local ones, applied by the login node as the remote user.

Submission (:func:`submit_remote`): the config is loaded and validated *locally* first (bad input
fails fast, exit 2, nothing uploaded), the snapshot is built locally with
:func:`slurm_bt.snapshot.snapshot_config_dir` (the same ignore rules as a local submission), sent as
one tar over SFTP into a ``mktemp -d`` directory, unpacked there, submitted with ``bt-sbatch --json``
(which copies it into the job directory), and the temporary directory is removed.

Where the remote programs are: ``bt-sbatch``/``slurm-bt`` on the remote ``PATH``, or in the directory
named by ``$SLURM_BT_REMOTE_BIN`` (read when called).
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_bt.errors import Problem, RemoteError, UserError
from slurm_bt.remote.ssh import RemoteSession, resolve_target

__all__ = ["REMOTE_BIN_ENV", "RemoteOutcome", "remote_program", "run_remote", "submit_remote"]

REMOTE_BIN_ENV = "SLURM_BT_REMOTE_BIN"


class RemoteOutcome:
    """What a remote command did: its exit status, stdout and stderr.

    Attributes:
        returncode: the remote exit status (0 ok, 1 runtime failure, 2 usage), as the CLI passes on.
        stdout: standard output (JSON for ``--json`` commands).
        stderr: standard error (already ``slurm-bt: error: ...`` lines).
    """

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    def json(self) -> Any:
        """The stdout parsed as JSON; ``None`` if it is empty or not JSON."""
        try:
            return json.loads(self.stdout) if self.stdout.strip() else None
        except ValueError:
            return None


def remote_program(name: str, environ: Mapping[str, str] | None = None) -> str:
    """``slurm-bt`` or ``$SLURM_BT_REMOTE_BIN/slurm-bt``."""
    env = os.environ if environ is None else environ
    prefix = env.get(REMOTE_BIN_ENV, "").strip()
    return f"{prefix.rstrip('/')}/{name}" if prefix else name


def run_remote(
    host: str,
    argv: Sequence[str],
    *,
    accept_new_host_key: bool = False,
    on_stdout: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
) -> RemoteOutcome:
    """Run ``slurm-bt argv...`` on ``host`` (argv never includes ``--host``).

    Args:
        host: ssh config alias, ``user@host:port`` or ``ssh://user@host:port``.
        argv: the verb and its arguments, e.g. ``["status", "123", "--json"]``.
        accept_new_host_key: add an unknown host key to known_hosts instead of refusing.
        on_stdout, on_stderr: receive output line by line as it arrives (``logs --follow``).

    Raises:
        RemoteError: connecting or running failed (HostKeyError for host key problems).
    """
    target = resolve_target(host, accept_new_host_key=accept_new_host_key)
    with RemoteSession(target) as session:
        code, out, err = session.stream([remote_program("slurm-bt"), *argv], on_stdout=on_stdout,
                                        on_stderr=on_stderr)
    return RemoteOutcome(code, out, err)


def _tar_snapshot(src: Path, dest: Path) -> None:
    def scrub(info: tarfile.TarInfo) -> tarfile.TarInfo:
        # The remote user owns what is unpacked; local uids and names mean nothing there.
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(dest, "w") as tar:
        tar.add(src, arcname="src", filter=scrub)


def submit_remote(
    config: str | os.PathLike[str],
    host: str,
    *,
    sbatch_args: Sequence[str] = (),
    accept_new_host_key: bool = False,
    on_stderr: Callable[[str], None] | None = None,
) -> RemoteOutcome:
    """Submit ``config`` on ``host``'s cluster; returns the remote ``bt-sbatch --json`` outcome.

    Raises:
        ConfigError, SnapshotError: the config or its folder is invalid (checked locally).
        UserError: the config uses ``external_dirs`` (not supported remotely yet).
        RemoteError: SSH, upload or the remote command could not run.
    """
    from slurm_bt.compat.loader import load_training_project
    from slurm_bt.render.sbatch_args import check_sbatch_args
    from slurm_bt.site.settings import load_site_settings
    from slurm_bt.snapshot import snapshot_config_dir

    source = os.fspath(config)
    config_path = Path(source).resolve()
    project = load_training_project(config)
    check_sbatch_args(sbatch_args)
    workspace = project.job.workspace
    if workspace is not None and workspace.external_dirs:
        raise UserError(source, [Problem("job.workspace.external_dirs",
                                         "not supported with --host yet: the login node re-applies the "
                                         "workspace rules to the uploaded snapshot; submit from the login node")])
    site = load_site_settings()
    target = resolve_target(host, accept_new_host_key=accept_new_host_key)
    with tempfile.TemporaryDirectory(prefix="slurm-bt-push-") as tmp:
        info = snapshot_config_dir(config_path, workspace, Path(tmp) / "src", max_bytes=site.max_snapshot_bytes,
                                   max_files=site.max_snapshot_files)
        tar_path = Path(tmp) / "snapshot.tar"
        _tar_snapshot(info.dest, tar_path)
        with RemoteSession(target) as session:
            rdir = session.mkdtemp("slurm-bt-push-")
            try:
                remote_tar = f"{rdir}/snapshot.tar"
                session.put(tar_path, remote_tar)
                unpacked = session.run(["tar", "-x", "--no-same-owner", "-f", remote_tar, "-C", rdir])
                if not unpacked.ok:
                    raise RemoteError(host, f"unpacking the snapshot failed: {unpacked.stderr.strip()}")
                sub = info.config_subdir
                inside = config_path.name if sub == "." else f"{sub}/{config_path.name}"
                remote_config = f"{rdir}/src/{inside}"
                code, out, err = session.stream(
                    [remote_program("bt-sbatch"), "--json", remote_config, "--", *sbatch_args],
                    on_stderr=on_stderr,
                )
            finally:
                session.run(["rm", "-rf", "--", rdir])
    return RemoteOutcome(code, out, err)
