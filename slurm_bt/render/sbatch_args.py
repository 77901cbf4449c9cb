"""The ``sbatch`` options ``bt-sbatch`` refuses to pass through, and why (login node and laptop alike).

Why a module of its own: both the local submission (:mod:`slurm_bt.submit`) and the remote one
(:mod:`slurm_bt.remote.commands`, which checks before uploading anything) apply the same rule.

sbatch parses its options with ``getopt_long``, which takes any unambiguous prefix of a long option
(``--wra=...`` is ``--wrap``, ``--get-u`` is ``--get-user-env``): a refused option is refused in every
spelling sbatch would accept, and :func:`sbatch_partition` reads ``--part=X`` as ``--partition``.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm_bt.errors import Problem, UserError

__all__ = ["FORBIDDEN_SBATCH_ARGS", "check_sbatch_args", "sbatch_partition"]

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
        if len(name) <= 2 or not name.startswith("--"):
            continue
        # A prefix of a refused option is that option to getopt_long (or ambiguous, which sbatch
        # refuses anyway): no sbatch option that is allowed is a prefix of a refused one.
        refused = next((full for full in FORBIDDEN_SBATCH_ARGS if full.startswith(name)), None)
        if refused is not None:
            raise UserError("bt-sbatch", [Problem(name, f"not allowed: {FORBIDDEN_SBATCH_ARGS[refused]}")])


# ``--part`` is the shortest prefix of ``--partition`` no other sbatch option shares (``--parsable``).
_PARTITION_MIN_PREFIX = len("--part")


def sbatch_partition(args: Sequence[str]) -> str | None:
    """The partition the pass-through options choose (``-p X``, ``-pX``, ``--partition[=]X``), if any.

    The last one wins, as in sbatch. Used to size a GPU job from the partition it will really run in
    (:func:`slurm_bt.slurm.node_shapes.gpu_share`); sbatch itself still validates the name.
    """
    chosen: str | None = None
    items = list(args)
    for i, arg in enumerate(items):
        name, eq, value = arg.partition("=")
        nxt = items[i + 1] if i + 1 < len(items) else None
        if name.startswith("--") and len(name) >= _PARTITION_MIN_PREFIX and "--partition".startswith(name):
            chosen = value if eq else nxt
        elif arg == "-p":
            chosen = nxt
        elif arg.startswith("-p") and not arg.startswith("--"):
            chosen = arg[2:]
    return chosen or None
