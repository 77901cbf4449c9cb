"""``sbatch``: submit a batch script; read the job id it prints and explain its refusals.

:class:`~slurm_bt.slurm.client.SlurmClient` runs it (``submit``) with the script on stdin and a
scrubbed environment; this module holds the argv, the ``--parsable`` answer's parser and the hints
shown with a refusal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from slurm_bt.slurm.job_ids import JobId, try_parse_job_id

__all__ = ["build_sbatch_argv", "parse_sbatch_job_id", "sbatch_hint"]

# (pattern in sbatch's stderr, what the user can do). First match wins.
_SBATCH_HINTS: tuple[tuple[str, str], ...] = (
    (r"invalid partition", "check the partition name with `sinfo -s`"),
    (r"node configuration is not available", "no node has that many GPUs/CPUs/memory; compare with `sinfo`"),
    (r"invalid generic resource|gres", "check the GPU type/count against `sinfo -o '%P %G'`"),
    (r"invalid account|association", "check your Slurm account with `sacctmgr show assoc user=$USER`"),
    (r"time limit", "lower the time limit or pick a partition that allows it"),
    (r"qos", "check the QOS limits with `sacctmgr show qos`"),
    (r"unable to contact slurm controller|connection refused|timed out", "is slurmctld up? try `sinfo`"),
)
_DEFAULT_SBATCH_HINT = "sbatch rejected the job; `bt-sbatch --dry-run` prints the script it was given"


def build_sbatch_argv(extra_args: Sequence[str] = ()) -> list[str]:
    """``sbatch --parsable [extra_args]``: the script comes on stdin, one argv element per option."""
    return ["sbatch", "--parsable", *(str(a) for a in extra_args)]


def parse_sbatch_job_id(stdout: str) -> JobId | None:
    """The job id of ``sbatch --parsable`` (``123`` or, in a federation, ``123;cluster``).

    The last non-blank line is read; ``None`` when it is not a job id.
    """
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    return try_parse_job_id(lines[-1].split(";", 1)[0]) if lines else None


def sbatch_hint(stderr: str) -> str:
    """What the user can do about sbatch's refusal ``stderr``."""
    low = stderr.lower()
    for pattern, hint in _SBATCH_HINTS:
        if re.search(pattern, low):
            return hint
    return _DEFAULT_SBATCH_HINT
