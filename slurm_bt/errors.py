"""One error tree for slurm-bt; the CLI maps it to messages and exit codes in one place.

    BtError
     ├── UserError            exit 2: the user's input is wrong; nothing was submitted or written
     │    ├── ConfigError       a config.py problem (one or more, each with a field path)
     │    ├── SiteConfigError   the admin's site file is missing, unreadable or invalid
     │    ├── SecretError       a SecretReference names a secret the user's store lacks
     │    └── SnapshotError     the config folder cannot be snapshotted (too big, bad workspace)
     └── RuntimeFailure       exit 1: something outside the input failed; the message says what to do
          ├── SlurmCommandError  a Slurm client command failed (argv, returncode, stderr)
          └── StorageError       a filesystem or object-store operation failed

Each user error carries a list of :class:`Problem` so that *every* problem is reported at once,
one line each, as ``<file>: <field>: <message>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BtError",
    "ConfigError",
    "Problem",
    "RuntimeFailure",
    "SecretError",
    "SiteConfigError",
    "SlurmCommandError",
    "SnapshotError",
    "StorageError",
    "UserError",
]


@dataclass(frozen=True)
class Problem:
    """One problem with user input.

    Attributes:
        loc: dotted field path (``job.compute.accelerator.accelerator``), or ``""`` when the problem
            is about the file as a whole (for example an exception raised while importing it).
        message: one line saying what is wrong, never containing a secret value.
    """

    loc: str
    message: str


class BtError(Exception):
    """Root of every error slurm-bt raises on purpose."""

    exit_code = 1

    def lines(self) -> list[str]:
        """The message as the CLI prints it: one line per problem."""
        return [str(self)]


class UserError(BtError):
    """Bad input from the user or admin: exit code 2, nothing submitted, nothing half-written."""

    exit_code = 2

    def __init__(self, source: str, problems: Sequence[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        """``<source>: <loc>: <message>`` per problem (``<source>: <message>`` without a loc)."""
        out = []
        for p in self.problems:
            msg = " ".join(p.message.split())  # one line each, whatever pydantic or the user produced
            out.append(f"{self.source}: {p.loc}: {msg}" if p.loc else f"{self.source}: {msg}")
        return out


class ConfigError(UserError, ValueError):
    """A config.py could not be loaded or validated."""


class SiteConfigError(UserError, ValueError):
    """The site configuration file is missing, unreadable or invalid."""


class SecretError(UserError, KeyError):
    """A referenced secret is missing from, or cannot be read from, the user's secret store."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return "\n".join(self.lines())


class SnapshotError(UserError, ValueError):
    """The config folder could not be snapshotted for submission."""


class RuntimeFailure(BtError, RuntimeError):
    """Something outside the user's input failed: exit code 1."""


class SlurmCommandError(RuntimeFailure):
    """A Slurm client command failed.

    Attributes:
        argv: the command that ran.
        returncode: its exit status.
        stderr: what it printed on stderr (trimmed).
        hint: what the user can do about it.
    """

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, hint: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.hint = hint
        detail = self.stderr.splitlines()[-1] if self.stderr else f"exit status {returncode}"
        msg = f"{self.argv[0]} failed: {detail}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class StorageError(RuntimeFailure, OSError):
    """A filesystem or object-store operation failed.

    Attributes:
        uri: the path or URI involved.
    """

    def __init__(self, uri: str, message: str) -> None:
        self.uri = uri
        super().__init__(f"{uri}: {message}")

    def __str__(self) -> str:
        return str(self.args[0])
