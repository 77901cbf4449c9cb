"""``srun --overlap --pty --jobid``: a shell (or a command) inside a running job, on one of its nodes.

Used by ``slurm-bt ssh`` / ``slurm-bt train isession`` (slurm_bt/cli/isession_cmd.py). The step
overlaps the job's own steps (``--overlap``: the start commands keep every CPU and GPU they hold,
the shell does not wait for free resources) and runs on exactly one node of the allocation.

Why this runs with the terminal attached instead of through :class:`~slurm_bt.slurm.runner.CommandRunner`:
the runner captures output, and an interactive shell needs the caller's terminal as its own. It is
still the one place that starts ``srun`` from Python (docs/slurm.md: no Slurm command outside
``slurm_bt/slurm/``) and it gets the same scrubbed environment as every other Slurm command, plus
``TERM`` so the shell on the node draws the way the caller's terminal expects.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence

from slurm_bt.errors import SlurmCommandError
from slurm_bt.slurm.job_ids import job_id_args, parse_job_id
from slurm_bt.slurm.runner import scrubbed_env

__all__ = ["attach_env", "build_attach_argv", "run_attached"]

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TERM = re.compile(r"[A-Za-z0-9._+-]{1,64}")


def build_attach_argv(
    job_id: str,
    node: str,
    command: Sequence[str],
    *,
    pty: bool = True,
    time_limit_min: int | None = None,
    container_args: Sequence[str] = (),
) -> list[str]:
    """The ``srun`` argv that runs ``command`` in job ``job_id`` on ``node``.

    Args:
        job_id: a plain job id (``123``); array/het ids are refused (one allocation, one node).
        node: a node name of the job's allocation.
        command: what runs on the node (never an option: its first word cannot start with ``-``).
        pty: allocate a pseudo-terminal (``--pty``) for an interactive shell.
        time_limit_min: the step's time limit (``--time``), e.g. the session's ``timeout_minutes``.
        container_args: pyxis options (``--container-name=...``) placed before the command.

    Raises:
        ValueError: a malformed job id, node name, time limit or command.
    """
    jid = parse_job_id(job_id)
    if jid.step is not None or jid.array_task is not None or jid.array_spec is not None or jid.het_offset is not None:
        raise ValueError(f"not a plain job id: {job_id!r}")
    if not _NODE_NAME.fullmatch(node):
        raise ValueError(f"not a node name: {node!r}")
    if not command or not command[0] or command[0].startswith("-"):
        raise ValueError(f"not a command: {list(command)!r}")
    if time_limit_min is not None and time_limit_min < 1:
        raise ValueError(f"time limit must be at least 1 minute, not {time_limit_min}")
    if any(not a.startswith("--container-") for a in container_args):
        raise ValueError(f"not a container option: {list(container_args)!r}")
    (jobs_arg,) = job_id_args([jid])
    argv = ["srun", f"--jobid={jobs_arg}", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={node}",
            "--job-name=bt-session", "--quiet"]
    if pty:
        argv.append("--pty")
    if time_limit_min is not None:
        argv.append(f"--time={time_limit_min}")
    argv += list(container_args)
    argv += list(command)
    return argv


def attach_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The scrubbed environment of every Slurm command, plus a well-formed ``TERM``."""
    source = os.environ if environ is None else environ
    env = scrubbed_env(source)
    term = source.get("TERM", "")
    env["TERM"] = term if _TERM.fullmatch(term) else "xterm"
    return env


def run_attached(argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` (from :func:`build_attach_argv`) on the caller's terminal; its exit status.

    SIGINT and SIGQUIT are ignored here while srun runs: with ``--pty`` srun puts the terminal in
    raw mode and forwards Ctrl-C to the shell on the node; without a pty srun handles them itself
    (twice within a second cancels the step). Either way this process must not die first.

    Raises:
        SlurmCommandError: srun is not installed or cannot be started.
    """
    if not argv or argv[0] != "srun":
        raise ValueError("run_attached runs srun only")
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGQUIT)}
    try:
        proc = subprocess.run(list(argv), env=dict(env) if env is not None else attach_env(), check=False)
    except OSError as exc:
        raise SlurmCommandError(list(argv), 127, str(exc), "is Slurm installed and on PATH?") from exc
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
