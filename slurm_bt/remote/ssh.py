"""One SSH connection to a login node (paramiko), configured the way ``ssh`` itself would be.

Why paramiko and not ``ssh`` subprocesses: uploading a snapshot, running several commands and
streaming ``logs --follow`` share one authenticated connection, and errors (unknown host key, auth
failure) are typed instead of scraped from ssh's stderr.

What is honoured, as OpenSSH does:

* ``~/.ssh/config`` for the host (or alias): ``HostName``, ``User``, ``Port``, ``IdentityFile``,
  ``ProxyCommand``, ``UserKnownHostsFile``, ``StrictHostKeyChecking``, ``ConnectTimeout``;
* the SSH agent (``SSH_AUTH_SOCK``) and the default keys (``~/.ssh/id_*``);
* ``known_hosts`` (the system file and the user's): an **unknown host key is refused** unless the
  user asks otherwise (``--accept-new-host-key``, or ``StrictHostKeyChecking accept-new``/``no`` in
  their ssh config), in which case it is added to the user's known_hosts, like ssh's
  ``accept-new``. A *changed* key is always refused.

Remote commands are argv lists joined with :func:`shlex.join` (the remote shell parses them back
into exactly those words); no command is ever built by string formatting.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_bt.errors import HostKeyError, RemoteError
from slurm_bt.slurm.runner import CommandResult

__all__ = ["RemoteSession", "SshTarget", "resolve_target"]

_URL = re.compile(r"^(?:ssh://)?(?:(?P<user>[^@/:\s]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^@/:\s]+)(?::(?P<port>[0-9]{1,5}))?/?$")


@dataclass(frozen=True)
class SshTarget:
    """Where and as whom to connect, after applying the user's ssh config.

    Attributes:
        name: the host as the user gave it (alias, ``user@host:port`` or ``ssh://...``).
        hostname: the address to connect to.
        port: TCP port.
        user: remote user name.
        identity_files: keys to offer, in order (besides the agent and default keys).
        known_hosts: the user's known_hosts file (new keys are added here).
        accept_new: add an unknown host key instead of refusing.
        proxy_command: ``ProxyCommand`` from the ssh config, if any.
        connect_timeout_s: TCP connect timeout.
    """

    name: str
    hostname: str
    port: int = 22
    user: str = ""
    identity_files: tuple[str, ...] = ()
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new: bool = False
    proxy_command: str | None = None
    connect_timeout_s: float = 15.0

    @property
    def host_key_name(self) -> str:
        """The known_hosts key for this host: ``host`` on port 22, ``[host]:port`` otherwise."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_target(
    spec: str,
    *,
    accept_new_host_key: bool = False,
    ssh_config: str | os.PathLike[str] | None = None,
    environ: dict[str, str] | None = None,
) -> SshTarget:
    """Turn ``alias``, ``user@host:port`` or ``ssh://user@host:port`` into an :class:`SshTarget`.

    Values given in ``spec`` win over the ssh config, which wins over defaults (like ``ssh``).

    Args:
        spec: the host as the user typed it.
        accept_new_host_key: add unknown host keys to known_hosts (never replaces a changed one).
        ssh_config: the ssh config file; default ``~/.ssh/config`` (resolved now, from ``HOME``).
        environ: environment for ``~`` and ``USER`` (default: the process's, read now).

    Raises:
        RemoteError: ``spec`` is not a host, or the ssh config cannot be read.
    """
    import paramiko

    env = dict(os.environ) if environ is None else environ
    home = env.get("HOME") or os.path.expanduser("~")
    m = _URL.match(spec.strip())
    if m is None or spec.strip().startswith("-"):
        raise RemoteError(spec, "not a host: use an ssh config alias, user@host, host:port or ssh://user@host:port")
    host = m.group("host").strip("[]")
    config_path = Path(ssh_config) if ssh_config is not None else Path(home) / ".ssh" / "config"
    cfg: dict[str, Any] = {}
    if config_path.is_file():
        try:
            cfg = dict(paramiko.SSHConfig.from_path(str(config_path)).lookup(host))
        except (OSError, ValueError, paramiko.SSHException) as exc:
            raise RemoteError(spec, f"cannot read {config_path}: {exc}") from exc

    def expand(path: str) -> str:
        return str(Path(home) / path[2:]) if path.startswith("~/") else path

    port_text = m.group("port") or cfg.get("port") or "22"
    try:
        port = int(port_text)
    except ValueError as exc:
        raise RemoteError(spec, f"bad port {port_text!r}") from exc
    strict = str(cfg.get("stricthostkeychecking", "")).lower()
    known = str(cfg.get("userknownhostsfile", "~/.ssh/known_hosts")).split()[0]
    timeout = cfg.get("connecttimeout")
    return SshTarget(
        name=spec,
        hostname=str(cfg.get("hostname", host)),
        port=port,
        user=m.group("user") or str(cfg.get("user", "")) or env.get("USER", "") or _login_name(),
        identity_files=tuple(expand(p) for p in cfg.get("identityfile", [])),
        known_hosts=expand(known),
        accept_new=accept_new_host_key or strict in {"accept-new", "no", "off"},
        proxy_command=str(cfg["proxycommand"]) if cfg.get("proxycommand") else None,
        connect_timeout_s=float(timeout) if timeout and str(timeout).isdigit() else 15.0,
    )


def _login_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


@dataclass
class RemoteSession:
    """An open SSH connection to one login node. Use as a context manager.

    Args:
        target: where to connect (:func:`resolve_target`).
    """

    target: SshTarget
    _client: Any = field(default=None, init=False, repr=False)

    def __enter__(self) -> RemoteSession:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open and authenticate the connection.

        Raises:
            HostKeyError: the host key is unknown (and accepting was not asked for) or changed.
            RemoteError: connect or authentication failed.
        """

        import paramiko

        t = self.target
        client = paramiko.SSHClient()
        try:
            client.load_system_host_keys()
        except (OSError, paramiko.SSHException):
            pass  # no readable system file: the user's file still applies
        known = Path(t.known_hosts)
        if known.is_file():
            try:
                client.load_host_keys(str(known))
            except (OSError, paramiko.SSHException) as exc:
                raise RemoteError(t.name, f"cannot read {known}: {exc}") from exc
        client.set_missing_host_key_policy(_AcceptNew(known) if t.accept_new else _Refuse(t))
        sock = paramiko.ProxyCommand(t.proxy_command) if t.proxy_command else None
        try:
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user or None,
                key_filename=[f for f in t.identity_files if os.path.exists(f)] or None,
                allow_agent=True,
                look_for_keys=True,
                timeout=t.connect_timeout_s,
                banner_timeout=t.connect_timeout_s,
                auth_timeout=t.connect_timeout_s,
                sock=sock,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                t.name,
                f"host key for {t.host_key_name} does not match {t.known_hosts} (got {exc.key.get_name()} "
                f"{exc.key.get_fingerprint().hex()}); refusing to connect: the host may be impersonated. "
                "If the key was changed on purpose, remove the old line from known_hosts",
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise RemoteError(t.name, f"authentication as {t.user!r} failed: {exc} "
                                      "(check IdentityFile / ssh-agent / authorized_keys)") from exc
        except (TimeoutError, OSError, paramiko.SSHException) as exc:
            client.close()
            raise RemoteError(t.name, f"cannot connect to {t.hostname}:{t.port}: {exc}") from exc
        self._client = client

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def _require(self) -> Any:
        if self._client is None:
            raise RemoteError(self.target.name, "not connected")
        return self._client

    def run(self, argv: Sequence[str], *, input: bytes | None = None, timeout_s: float = 300) -> CommandResult:
        """Run ``argv`` on the login node and collect its output (``shlex.join``, never formatting).

        Raises:
            RemoteError: the command could not be started, or the connection broke.
        """
        code, out, err = self.stream(argv, input=input, timeout_s=timeout_s)
        return CommandResult(tuple(argv), code, out, err)

    def stream(
        self,
        argv: Sequence[str],
        *,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        input: bytes | None = None,
        timeout_s: float | None = None,
    ) -> tuple[int, str, str]:
        """Run ``argv``, passing each output *line* to the callbacks as it arrives.

        Output without a callback is collected and returned. Returns ``(exit status, stdout, stderr)``.
        """
        import paramiko

        client = self._require()
        command = shlex.join(str(a) for a in argv)
        try:
            chan = client.get_transport().open_session(timeout=self.target.connect_timeout_s)
            chan.settimeout(timeout_s)
            chan.exec_command(command)
            if input is not None:
                chan.sendall(input)
            chan.shutdown_write()
            out: list[str] = []
            err: list[str] = []
            err_thread = threading.Thread(
                target=_pump, args=(chan.makefile_stderr("rb"), on_stderr, err), daemon=True
            )
            err_thread.start()
            _pump(chan.makefile("rb"), on_stdout, out)
            err_thread.join(timeout_s)
            code = chan.recv_exit_status()
            chan.close()
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(self.target.name, f"running {argv[0] if argv else '?'} failed: {exc}") from exc
        return code, "".join(out), "".join(err)

    def open_channel(self) -> Any:
        """A new session channel on the open connection, for callers that drive it themselves
        (``slurm-bt ssh --host``: a pseudo-terminal and both directions at once, slurm_bt/remote/interactive.py).

        Raises:
            RemoteError: not connected, or the server refused a new channel.
        """
        import paramiko

        client = self._require()
        try:
            return client.get_transport().open_session(timeout=self.target.connect_timeout_s)
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(self.target.name, f"cannot open a channel: {exc}") from exc

    def mkdtemp(self, prefix: str = "slurm-bt-") -> str:
        """A private temporary directory on the login node (``mktemp -d``)."""
        result = self.run(["mktemp", "-d", "-t", f"{prefix}XXXXXXXX"], timeout_s=60)
        path = result.stdout.strip()
        if not result.ok or not path.startswith("/"):
            raise RemoteError(self.target.name, f"mktemp -d failed: {result.stderr.strip() or result.stdout.strip()}")
        return path

    def put(self, local: Path, remote: str) -> None:
        """Upload one file over SFTP (mode 0600)."""
        import paramiko

        client = self._require()
        try:
            sftp = client.open_sftp()
            try:
                sftp.put(str(local), remote)
                sftp.chmod(remote, 0o600)
            finally:
                sftp.close()
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(self.target.name, f"upload to {remote} failed: {exc}") from exc


def _pump(stream: Any, callback: Callable[[str], None] | None, sink: list[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if callback is None:
            sink.append(line)
        else:
            callback(line)


class _Refuse:
    """Missing-host-key policy: refuse, saying how to accept the key deliberately."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        import base64
        import hashlib

        fp = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
        raise HostKeyError(
            self.target.name,
            f"host key for {hostname} is not in {self.target.known_hosts} ({key.get_name()} SHA256:{fp}); "
            "refusing to connect. Verify the fingerprint, then `ssh` to it once or pass --accept-new-host-key",
        )


class _AcceptNew:
    """Missing-host-key policy like ssh's ``accept-new``: add the key to the user's known_hosts."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)
