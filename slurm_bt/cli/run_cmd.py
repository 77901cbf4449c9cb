"""``slurm-bt run SCRIPT [ARGS]...``: run an upstream-style Python script against this cluster.

Baseten's programmatic style is a script that imports ``truss_train``, builds a ``TrainingProject``
and calls ``truss_train.push(...)``. ``slurm-bt run script.py`` runs it as ``python script.py``
would (``__name__ == "__main__"``, ``sys.argv``, the script's directory first on ``sys.path``), with
the import shim that configs get (``truss_train``, ``truss.base.truss_config``...; compat/shim.py)
and with ``truss_train.push`` submitting to Slurm (slurm_bt/api.py registers it). The script's own
exceptions print their traceback, as python would; slurm-bt's errors (a rejected project, a missing
secret) print as every other slurm-bt command prints them.
"""

from __future__ import annotations

import builtins
import os
import sys
import types

import click

from slurm_bt.cli.errors import handle_errors

__all__ = ["run_command"]


@click.command(
    name="run",
    context_settings={"help_option_names": ["-h", "--help"], "ignore_unknown_options": True,
                      "allow_interspersed_args": False},
)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(script: str, script_args: tuple[str, ...]) -> None:
    """Run SCRIPT (a truss_train script that pushes) with truss_train mapped to slurm-bt."""
    import traceback

    import slurm_bt.api  # noqa: F401 - registers truss_train.push (see the module docstring)
    from slurm_bt.compat.shim import install_truss_modules
    from slurm_bt.errors import BtError

    install_truss_modules()
    path = os.path.abspath(script)  # python >= 3.9 gives __main__ an absolute __file__ too
    sys.argv = [script, *script_args]  # ... and leaves argv[0] as typed (runpy.run_path would not)
    sys.path.insert(0, os.path.dirname(path))
    with handle_errors("slurm-bt run"):
        try:
            _run_as_main(path)
        except (BtError, SystemExit, KeyboardInterrupt):
            raise
        except BaseException:
            # The script's own failure: its traceback, as `python SCRIPT` prints it (without
            # slurm-bt's frames above the script), and python's exit status.
            exc_type, exc, tb = sys.exc_info()
            while tb is not None and tb.tb_frame.f_code.co_filename != path:
                tb = tb.tb_next
            traceback.print_exception(exc_type, exc, tb or sys.exc_info()[2], file=sys.stderr)
            raise SystemExit(1) from None


def _run_as_main(path: str) -> None:
    """Execute the file at ``path`` as the ``__main__`` module, as ``python path`` does.

    A real ``__main__`` in ``sys.modules`` (not a namespace dict) keeps what scripts rely on working:
    pickling classes the script defines (multiprocessing), ``sys.modules["__main__"]`` lookups.
    """
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None)
    sys.modules["__main__"] = module
    exec(code, module.__dict__)  # noqa: S102 - running the user's own script is this command's purpose
