"""The one place where errors become messages and exit codes.

0 ok · 1 runtime failure (what failed and what to do; a missing optional package names the
``pip install 'slurm-bt[extra]'`` to run) · 2 bad input (every problem, one line each, naming file
and field). Commands raise errors from :mod:`slurm_bt.errors` and run their body inside
:func:`handle_errors`; the only other exits are ``SystemExit`` with a status passed on from a remote
run or a ``--check``-style verdict. A traceback appears only with ``--debug`` (or ``SLURM_BT_DEBUG=1``), and never
for a user mistake.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

from slurm_bt.errors import BtError, UserError, extra_for_module

__all__ = ["handle_errors"]


def _emit(line: str) -> None:
    click.echo(line, err=True)


@contextmanager
def handle_errors(prog: str, *, debug: bool = False) -> Iterator[None]:
    """Run a command body, mapping every failure to a message and an exit code."""
    debug = debug or os.environ.get("SLURM_BT_DEBUG") == "1"
    try:
        yield
    except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise
    except UserError as exc:
        for line in exc.lines():
            _emit(line)
        raise SystemExit(exc.exit_code) from None
    except BtError as exc:
        if debug:
            traceback.print_exc(file=sys.stderr)
        for line in exc.lines():
            _emit(f"{prog}: error: {line}")
        raise SystemExit(exc.exit_code) from None
    except ImportError as exc:
        extra = extra_for_module(exc.name)
        if extra is None:  # not an optional package: a broken install or a bug
            _internal(prog, exc, debug)
        if debug:
            traceback.print_exc(file=sys.stderr)
        _emit(f"{prog}: error: the optional package {exc.name!r} is not installed: "
              f"pip install 'slurm-bt[{extra}]'")
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        _emit(f"{prog}: interrupted")
        raise SystemExit(130) from None
    except Exception as exc:  # a bug in slurm-bt, not the user's fault: say so, briefly
        _internal(prog, exc, debug)


def _internal(prog: str, exc: BaseException, debug: bool) -> NoReturn:
    if debug:
        traceback.print_exc(file=sys.stderr)
    _emit(f"{prog}: internal error: {type(exc).__name__}: {exc} "
          "(run with --debug for a traceback, and please report it)")
    raise SystemExit(1) from None
