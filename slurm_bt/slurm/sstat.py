"""``sstat``: live usage of a job's *running* steps, asked of the slurmds through slurmctld.

:class:`~slurm_bt.slurm.client.SlurmClient` runs it (``live_usage``) while a job runs; sacct's step
usage (:mod:`slurm_bt.slurm.sacct`) covers finished steps. sstat prints the same ``--parsable2``
columns as sacct, so its answer is read by :func:`slurm_bt.slurm.sacct.parse_usage`.

Observed on 22.05 (``tests/data/sacct/2205_usage_sstat*``): without ``--noconvert`` memory carries
``K``/``M`` suffixes (``mem=438040K``), which :func:`~slurm_bt.slurm.values.parse_tres_usage`
accepts either way. sstat answers only for the caller's own jobs (or for root/operators): exactly
the visibility Slurm itself grants, so slurm-bt never works around it.
"""

from __future__ import annotations

from collections.abc import Iterable

from slurm_bt.slurm.job_ids import JobId, job_id_args
from slurm_bt.slurm.sacct import StepUsage, parse_usage
from slurm_bt.slurm.values import ParsedRows

__all__ = ["SSTAT_FIELDS", "build_sstat_argv", "parse_sstat"]

#: Live usage columns of running steps, all in 22.05 ``sstat --helpformat``.
SSTAT_FIELDS: tuple[str, ...] = (
    "JobID",
    "NTasks",
    "Nodelist",
    "MaxRSS",
    "MaxRSSNode",
    "TRESUsageInAve",
    "TRESUsageInMax",
    "TRESUsageInMaxNode",
    "TRESUsageInTot",
)


def build_sstat_argv(job_ids: Iterable[str | int | JobId], *, delimiter: str = "|") -> list[str]:
    """``sstat --allsteps`` for running steps of ``job_ids`` (the caller's own jobs only).

    Raises:
        ValueError: a job id is malformed.
    """
    ids = job_id_args(job_ids)
    argv = ["sstat", "--allsteps", "--parsable2", "--noheader", "--noconvert",
            f"--format={','.join(SSTAT_FIELDS)}"]
    if delimiter != "|":
        argv.append(f"--delimiter={delimiter}")
    argv.append(f"--jobs={','.join(ids)}")
    return argv


def parse_sstat(text: str, *, delimiter: str | None = None) -> ParsedRows[StepUsage]:
    """Parse the output of :func:`build_sstat_argv`'s command. Never raises."""
    return parse_usage(text, SSTAT_FIELDS, source="sstat", delimiter=delimiter)
