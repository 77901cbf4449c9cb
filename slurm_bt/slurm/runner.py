"""The one process seam between slurm-bt and the Slurm client commands.

Everything that runs ``sbatch``/``sacct``/``squeue``/``scancel``/``scontrol`` goes through a
:class:`CommandRunner`. Production code gets a :class:`SubprocessRunner`; tests inject
``tests.fakes.fake_slurm.FakeSlurm`` instead of patching :mod:`subprocess` (the httpx
mock-transport pattern), so a test can never reach a real cluster by accident.

Environment scrubbing lives here too (:func:`scrubbed_env`): ``sbatch`` copies its whole
environment into the job and slurmctld stores it (``AccountingStoreFlags=job_env`` even puts it in
the database), so a token in the submitter's shell must never be inherited by a Slurm command.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from slurm_bt.errors import SlurmCommandError

__all__ = [
    "ENV_ALLOWLIST",
    "ENV_ALLOWLIST_PREFIXES",
    "CommandResult",
    "CommandRunner",
    "SubprocessRunner",
    "scrubbed_env",
]

#: Variables a Slurm client command may inherit from the submitter. Everything else is dropped.
ENV_ALLOWLIST = frozenset({"PATH", "HOME", "USER", "LANG", "SLURM_CONF", "SLURM_TIME_FORMAT", "TZ"})
#: Prefixes a Slurm client command may inherit (locale categories such as ``LC_ALL``).
ENV_ALLOWLIST_PREFIXES = ("LC_",)

_MISSING_HINT = "is Slurm installed and on PATH?"


@dataclass(frozen=True)
class CommandResult:
    """What one finished command produced.

    Attributes:
        argv: the command as run.
        returncode: its exit status (negative: killed by that signal).
        stdout: standard output, decoded as UTF-8 with undecodable bytes replaced.
        stderr: standard error, decoded the same way.
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.returncode == 0


@runtime_checkable
class CommandRunner(Protocol):
    """Runs one command and reports how it ended.

    Implementations must not raise for a non-zero exit (callers decide what a failure means, for
    example ``sacct`` blips are retried) and must raise :class:`SlurmCommandError` only when the
    command could not produce a result at all (missing binary, timeout).
    """

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60,
    ) -> CommandResult:
        """Run ``argv`` (no shell) with ``input`` on stdin and exactly ``env`` as the environment.

        Args:
            argv: program and arguments; never a shell string.
            input: text written to stdin, or ``None`` for no stdin.
            env: the complete environment of the child, or ``None`` to inherit ours.
            timeout_s: kill the command after this many seconds.
        """
        ...


class SubprocessRunner:
    """A :class:`CommandRunner` backed by :func:`subprocess.run` with ``shell=False``."""

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60,
    ) -> CommandResult:
        """Run ``argv``; see :meth:`CommandRunner.run`.

        Raises:
            SlurmCommandError: the program is missing or not executable (hint: is Slurm installed),
                or it ran longer than ``timeout_s``.
        """
        args = [str(a) for a in argv]
        if not args:
            raise SlurmCommandError(["<empty>"], -1, "empty command", "this is a bug in slurm-bt")
        try:
            proc = subprocess.run(
                args,
                input=input,
                # stdin=DEVNULL rather than inheriting a terminal: a Slurm command must never wait
                # for the user to type something.
                stdin=subprocess.DEVNULL if input is None else None,
                env=dict(env) if env is not None else None,
                capture_output=True,
                text=True,
                encoding="utf-8",
                errors="replace",
                timeout=timeout_s,
                shell=False,
                check=False,
            )
        except FileNotFoundError as exc:
            raise SlurmCommandError(args, 127, f"{args[0]}: command not found", _MISSING_HINT) from exc
        except PermissionError as exc:
            raise SlurmCommandError(args, 126, f"{args[0]}: {exc.strerror}", _MISSING_HINT) from exc
        except subprocess.TimeoutExpired as exc:
            partial = exc.stderr
            stderr = partial.decode("utf-8", "replace") if isinstance(partial, bytes) else (partial or "")
            raise SlurmCommandError(
                args,
                -1,
                stderr or f"no answer within {timeout_s:g} s",
                f"timed out after {timeout_s:g} s; is slurmctld/slurmdbd responding (try `sinfo`)?",
            ) from exc
        return CommandResult(tuple(args), proc.returncode, proc.stdout or "", proc.stderr or "")


def scrubbed_env(
    environ: Mapping[str, str] | None = None, *, overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Return the subset of ``environ`` a Slurm client command may see, plus ``overrides``.

    Only :data:`ENV_ALLOWLIST` names and ``LC_*`` survive; the rest (tokens, cloud credentials,
    ``SBATCH_*`` and ``SLURM_*`` leaking from an enclosing job) is dropped. ``overrides`` are
    applied afterwards and must themselves pass the allow-list, so a caller cannot re-add a secret
    by mistake.

    Args:
        environ: the submitter's environment; ``None`` reads :data:`os.environ` now (at call time).
        overrides: values to force, e.g. ``SLURM_TIME_FORMAT`` for parseable times.

    Raises:
        ValueError: an override names a variable outside the allow-list.
    """
    source = os.environ if environ is None else environ
    out = {k: v for k, v in source.items() if _allowed(k)}
    for key, value in (overrides or {}).items():
        if not _allowed(key):
            raise ValueError(f"refusing to pass {key} to a Slurm command: not in the environment allow-list")
        out[key] = value
    return out


def _allowed(name: str) -> bool:
    return name in ENV_ALLOWLIST or name.startswith(ENV_ALLOWLIST_PREFIXES)
