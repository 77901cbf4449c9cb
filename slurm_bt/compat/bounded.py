"""Load a config.py with a wall-clock and a memory bound (``bt-sbatch`` on a shared login node).

Why a child process: a config.py is arbitrary code run on a login node everybody shares. One that
allocated 20 GiB at import was submitted, and one that sleeps (or never returns) hung ``bt-sbatch``.
Python cannot stop its own code after a deadline, nor bound its own memory without bounding the
caller's, so the loader (:func:`slurm_bt.compat.loader.load_training_project`, unchanged) runs in a
forked child with ``RLIMIT_AS`` set, and the parent kills it at the deadline.

What stays as it was: the config runs with the caller's environment, working directory, stdin,
stdout and stderr (its prints still show; only the truss shim is active, in the child); its own
exceptions and validation errors come back as the same :class:`~slurm_bt.errors.ConfigError`, one
line per problem. The child returns the validated project by ``pickle`` over a pipe: the child is
the same user running the same code, so there is no trust boundary to defend; a project holding an
object pickle cannot carry (a class defined in the config, in an extra key) is one problem line.

Why not :func:`slurm_bt.posix.privdrop.run_in_child`: it is built for root hooks (clean environment,
``/`` as cwd, stdio on ``/dev/null``, JSON results), none of which a config loaded for its user wants.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from slurm_bt.errors import ConfigError, Problem
from slurm_bt.units import format_bytes

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject

__all__ = ["load_training_project_bounded"]

# The child's exit status when the memory bound was hit (no result written): a status nothing else
# here uses (the config's own os._exit(N) is reported as "ended the process").
_EXIT_MEMORY = 86
_POLL_S = 0.1


def load_training_project_bounded(path: str | os.PathLike[str], *, timeout_s: float,
                                  memory_bytes: int) -> TrainingProject:
    """:func:`~slurm_bt.compat.loader.load_training_project` in a child bounded in time and memory.

    Args:
        path: the config.py, as the user gave it (the source of every message).
        timeout_s: wall-clock bound; the child is killed (SIGKILL, with its process group) at it.
        memory_bytes: the child's ``RLIMIT_AS``.

    Raises:
        ConfigError: the config's own problems, as the loader reports them; or one line naming the
            bound it exceeded (``config.py: took longer than 60 s to load (site [submit]
            config_load_timeout_s)``), or how the child ended without a result. Exit 2 either way:
            the config is at fault, and nothing was written yet.
    """
    source = os.fspath(path)
    for stream in (sys.stdout, sys.stderr):  # else the child would print what is buffered here again
        with contextlib.suppress(Exception):
            stream.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, reported through the pipe and exit status
        os.close(r)
        _child(path, w, memory_bytes, timeout_s)
    os.close(w)
    # Its own process group (set on both sides: whichever runs first), so whatever the config started
    # ends with it at the deadline.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    try:
        data, status = _collect(r, pid, time.monotonic() + timeout_s)
    except BaseException:  # Ctrl-C included: never leave the config running
        _kill_and_reap(pid)
        raise
    finally:
        os.close(r)
    if status is None:
        _kill_and_reap(pid)
        raise ConfigError(source, [Problem("", f"took longer than {timeout_s:g} s to load "
                                               "(site [submit] config_load_timeout_s)")])
    memory = (f"used more than {format_bytes(memory_bytes)} of memory while loading "
              "(site [submit] config_load_memory_bytes)")
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == _EXIT_MEMORY:
        raise ConfigError(source, [Problem("", memory)])
    if not data:
        if os.WIFSIGNALED(status):  # a library that cannot allocate may abort rather than raise
            why = (f"the loading process was {_death(status)} (at {format_bytes(memory_bytes)}, site [submit] "
                   "config_load_memory_bytes, a library may abort instead of raising MemoryError)")
        else:
            why = f"ended the loading process ({_death(status)}) before a project was loaded"
        raise ConfigError(source, [Problem("", why)])
    try:
        outcome = pickle.loads(data)  # noqa: S301 - our own child, as the same user (module docstring)
    except Exception as exc:
        raise ConfigError(source, [Problem("", f"the loaded project could not be read back: "
                                               f"{type(exc).__name__}: {exc}")]) from None
    if outcome[0] == "ok":
        project: TrainingProject = outcome[1]
        return project
    raise ConfigError(source, outcome[1])


def _child(path: str | os.PathLike[str], w: int, memory_bytes: int, timeout_s: float) -> None:
    """Never returns: load, write the pickled outcome to ``w``, ``_exit``."""
    code = 0
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        # A backstop if the parent dies: the default SIGALRM action ends the child (unless the config
        # installs its own handler, when the parent's kill still applies).
        signal.alarm(int(timeout_s) + 5)
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        outcome: tuple[str, Any]
        try:
            from slurm_bt.compat.loader import load_training_project

            outcome = ("ok", load_training_project(path, raise_memory_error=True))
        except ConfigError as exc:
            outcome = ("problems", exc.problems)
        try:
            data = pickle.dumps(outcome)
        except MemoryError:
            raise
        except Exception as exc:  # an object pickle cannot carry (a class the config defined)
            data = pickle.dumps(("problems", [Problem("", (
                f"the project holds a value bt-sbatch cannot take out of the config ({type(exc).__name__}: "
                f"{exc}); use plain values (str, int, list, dict) in the project"))]))
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
    except MemoryError:
        code = _EXIT_MEMORY
    except BaseException as exc:  # a bug in slurm-bt, not the config's (its errors are problems above)
        with contextlib.suppress(Exception):
            data = pickle.dumps(("problems", [Problem("", f"internal error while loading: "
                                                          f"{type(exc).__name__}: {exc}")]))
            os.write(w, data)
    finally:
        for stream in (sys.stdout, sys.stderr):  # the config's prints: os._exit does not flush
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _collect(r: int, pid: int, deadline: float) -> tuple[bytes, int | None]:
    """Read the child's result until it exits; (data, wait status), or (data so far, None) at the deadline.

    Ends when the child exits, not at end-of-file: a process the config started may hold the pipe.
    """
    chunks: list[bytes] = []
    os.set_blocking(r, False)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), None
        ready, _, _ = select.select([r], [], [], min(left, _POLL_S))
        if ready:
            _drain(r, chunks)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            _drain(r, chunks)  # what it wrote just before exiting
            return b"".join(chunks), status


def _drain(r: int, chunks: list[bytes]) -> None:
    while True:
        try:
            chunk = os.read(r, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            return
        chunks.append(chunk)


def _kill_and_reap(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _death(status: int) -> str:
    """How the child ended without a result (``killed by SIGSEGV``, ``exit status 3``)."""
    if os.WIFSIGNALED(status):
        try:
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        except ValueError:
            return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
