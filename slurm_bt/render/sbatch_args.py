"""The ``sbatch`` options ``bt-sbatch`` refuses to pass through, and why (login node and laptop alike).

Why a module of its own: both the local submission (:mod:`slurm_bt.submit`) and the remote one
(:mod:`slurm_bt.remote.commands`, which checks before uploading anything) apply the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_bt.errors import Problem, UserError

__all__ = ["FORBIDDEN_SBATCH_ARGS", "check_sbatch_args"]

FORBIDDEN_SBATCH_ARGS = {
    "--export": "the job environment is explicit so that no secret from your shell reaches Slurm",
    "--export-file": "the job environment is explicit so that no secret from your shell reaches Slurm",
    "--get-user-env": "the job environment is explicit so that no secret from your shell reaches Slurm",
    "--wrap": "the batch script is generated from the config",
}


def check_sbatch_args(args: Sequence[str]) -> None:
    """Refuse pass-through options that would change the job's environment or script.

    Raises:
        UserError: one of ``args`` is in :data:`FORBIDDEN_SBATCH_ARGS`.
    """
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in FORBIDDEN_SBATCH_ARGS:
            raise UserError("bt-sbatch", [Problem(name, f"not allowed: {FORBIDDEN_SBATCH_ARGS[name]}")])
