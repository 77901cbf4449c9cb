"""An interactive command on a login node over SSH: ``slurm-bt ssh JOB --host HOST``.

The other ``--host`` verbs run ``slurm-bt VERB --json`` and render its answer here
(:mod:`slurm_bt.remote.commands`); a shell cannot work that way. Here the login node runs the same
``slurm-bt ssh JOB ...`` in an SSH channel with a pseudo-terminal of this terminal's type and size,
and this side only copies bytes both ways (this terminal in raw mode, window-size changes passed on)
until the remote command exits; its exit status becomes ours. Without a terminal on stdin (a script
piping commands in) no pty is requested and stdin is copied until end of file.
"""

from __future__ import annotations

import os
import select
import shlex
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from slurm_bt.errors import RemoteError
from slurm_bt.remote.commands import remote_program
from slurm_bt.remote.ssh import RemoteSession, resolve_target

__all__ = ["run_interactive"]

_CHUNK = 32768


def _window_size(fd: int) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 80, 24
    return size.columns, size.lines


def run_interactive(host: str, argv: Sequence[str], *, accept_new_host_key: bool = False) -> int:
    """Run ``slurm-bt argv...`` on ``host`` attached to this terminal; its exit status.

    Raises:
        RemoteError: connecting, or the channel, failed.
    """
    import paramiko

    target = resolve_target(host, accept_new_host_key=accept_new_host_key)
    stdin_fd, stdout_fd = sys.stdin.fileno(), sys.stdout.fileno()
    tty = os.isatty(stdin_fd)
    with RemoteSession(target) as session:
        chan = session.open_channel()
        try:
            if tty:
                cols, rows = _window_size(stdin_fd)
                chan.get_pty(term=os.environ.get("TERM", "xterm") or "xterm", width=cols, height=rows)
            chan.exec_command(shlex.join([remote_program("slurm-bt"), *argv]))
            return _pump(chan, stdin_fd, stdout_fd, tty)
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(target.name, f"interactive session failed: {exc}") from exc
        finally:
            chan.close()


def _pump(chan: Any, stdin_fd: int, stdout_fd: int, tty: bool) -> int:
    """Copy bytes between this terminal and ``chan`` until the remote side exits."""
    import termios
    import tty as tty_mod

    saved = termios.tcgetattr(stdin_fd) if tty else None
    old_winch = None
    if tty:
        def resize(_sig: int, _frame: FrameType | None) -> None:
            cols, rows = _window_size(stdin_fd)
            chan.resize_pty(width=cols, height=rows)

        old_winch = signal.signal(signal.SIGWINCH, resize)
        tty_mod.setraw(stdin_fd)
    stdin_open = True
    try:
        while True:
            if chan.recv_ready():
                data = chan.recv(_CHUNK)
                if data:
                    os.write(stdout_fd, data)
                continue
            if chan.recv_stderr_ready():
                os.write(sys.stderr.fileno(), chan.recv_stderr(_CHUNK))
                continue
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            watch = [chan, stdin_fd] if stdin_open else [chan]
            try:
                readable, _, _ = select.select(watch, [], [], 0.5)
            except InterruptedError:  # SIGWINCH
                continue
            if stdin_open and stdin_fd in readable:
                data = os.read(stdin_fd, _CHUNK)
                if data:
                    chan.sendall(data)
                else:  # end of input: the remote shell sees EOF too
                    stdin_open = False
                    chan.shutdown_write()
        code: int = chan.recv_exit_status()
        return code
    finally:
        if saved is not None:
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        if old_winch is not None:
            signal.signal(signal.SIGWINCH, old_winch)
