"""Resource *usage* of a job's steps, from ``sacct`` (finished steps) and ``sstat`` (running steps).

Usage is a different question from status: it needs step rows (the allocation row of a job has no
usage; ``.batch``, ``.extern`` and ``.0`` have it) and the ``TRESUsageIn*`` columns, whose values
are not plain TRES counts. Observed on 22.05 (``tests/data/sacct/2205_usage_*``)::

    cpu=00:00:15,energy=0,fs/disk=1685831,mem=224276480,pages=3,vmem=227500032   (TRESUsageInMax)
    cpu=n2,energy=n2,fs/disk=n2,mem=n1,pages=n2,vmem=n2                          (...MaxNode)
    cpu=00:00:18,energy=0,fs/disk=3371662,mem=438040K,pages=6,vmem=444336K       (sstat, no --noconvert)

so ``cpu`` is a *duration*, memory is bytes (or ``K``/``M`` suffixed), and the ``*Node`` columns hold
node names. GPU usage appears as ``gres/gpuutil`` (percent) and ``gres/gpumem`` (bytes) only when the
site accounts them (``AccountingStorageTRES=gres/gpumem,gres/gpuutil`` with NVML); absent otherwise.

``sstat`` only answers for running steps of the caller's own jobs (or for root/operators), which is
exactly the visibility Slurm itself grants, so slurm-bt never works around it.

Both parsers are total, like :mod:`slurm_bt.slurm.sacct`: unreadable rows are skipped and counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from slurm_bt.slurm.job_ids import JobId, parse_job_id, try_parse_job_id
from slurm_bt.slurm.sacct import parse_elapsed, parse_tres

__all__ = [
    "SACCT_USAGE_FIELDS",
    "SSTAT_FIELDS",
    "StepUsage",
    "UsageRows",
    "build_sacct_usage_argv",
    "build_sstat_argv",
    "parse_tres_usage",
    "parse_usage",
]

#: Step usage columns for finished (and running) steps, all in 22.05 ``sacct --helpformat``.
SACCT_USAGE_FIELDS: tuple[str, ...] = (
    "JobID",
    "State",
    "ElapsedRaw",
    "NNodes",
    "NTasks",
    "NodeList",
    "AllocTRES",
    "TotalCPU",
    "MaxRSS",
    "MaxRSSNode",
    "TRESUsageInAve",
    "TRESUsageInMax",
    "TRESUsageInMaxNode",
    "TRESUsageInTot",
)

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

_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)", re.ASCII)
_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


@dataclass(frozen=True)
class StepUsage:
    """What one step used, as Slurm accounted it.

    Attributes:
        job_id: the step id (``123.0``, ``123.batch``).
        state: the step's state (``""`` from sstat: a step sstat reports is running).
        elapsed_s: wall time of the step so far.
        nnodes: nodes the step ran on.
        ntasks: tasks of the step.
        node_list: where it ran.
        alloc_tres: TRES allocated to the step (``cpu``, ``mem`` bytes, ``gres/gpu``...).
        total_cpu_s: CPU time used by all tasks (user + system), seconds.
        max_rss_bytes: largest resident set of any task.
        max_rss_node: the node of that task.
        usage_ave, usage_max, usage_tot: ``TRESUsageIn{Ave,Max,Tot}`` as numbers (``cpu`` in
            seconds, ``mem``/``vmem``/``gres/gpumem`` in bytes, ``gres/gpuutil`` in percent).
        usage_max_node: ``TRESUsageInMaxNode``: which node had the maximum of each TRES.
        source: ``"sacct"`` or ``"sstat"``.
    """

    job_id: JobId
    state: str = ""
    elapsed_s: int | None = None
    nnodes: int | None = None
    ntasks: int | None = None
    node_list: str = ""
    alloc_tres: dict[str, int] = field(default_factory=dict, hash=False)
    total_cpu_s: float | None = None
    max_rss_bytes: int | None = None
    max_rss_node: str = ""
    usage_ave: dict[str, float] = field(default_factory=dict, hash=False)
    usage_max: dict[str, float] = field(default_factory=dict, hash=False)
    usage_tot: dict[str, float] = field(default_factory=dict, hash=False)
    usage_max_node: dict[str, str] = field(default_factory=dict, hash=False)
    source: str = "sacct"


class UsageRows(list[StepUsage]):
    """Parsed usage rows plus how many input rows were unreadable (see :class:`SacctRows`)."""

    def __init__(self, rows: Iterable[StepUsage] = (), skipped: int = 0, warnings: Sequence[str] = ()) -> None:
        super().__init__(rows)
        self.skipped = skipped
        self.warnings: list[str] = list(warnings)

    def _skip(self, why: str) -> None:
        self.skipped += 1
        if len(self.warnings) < 20:
            self.warnings.append(why)


def build_sacct_usage_argv(job_ids: Iterable[str | int | JobId], *, delimiter: str = "|") -> list[str]:
    """One ``sacct`` call for the step usage of all ``job_ids`` (steps included, no ``-X``)."""
    ids = [str(j) if isinstance(j, JobId) else str(parse_job_id(str(j))) for j in job_ids]
    argv = ["sacct", "--parsable2", "--noheader", "--noconvert", f"--format={','.join(SACCT_USAGE_FIELDS)}"]
    if delimiter != "|":
        argv.append(f"--delimiter={delimiter}")
    argv.append(f"--jobs={','.join(ids)}")
    return argv


def build_sstat_argv(job_ids: Iterable[str | int | JobId], *, delimiter: str = "|") -> list[str]:
    """``sstat --allsteps`` for running steps of ``job_ids`` (the caller's own jobs only)."""
    ids = [str(j) if isinstance(j, JobId) else str(parse_job_id(str(j))) for j in job_ids]
    argv = ["sstat", "--allsteps", "--parsable2", "--noheader", "--noconvert",
            f"--format={','.join(SSTAT_FIELDS)}"]
    if delimiter != "|":
        argv.append(f"--delimiter={delimiter}")
    argv.append(f"--jobs={','.join(ids)}")
    return argv


def _duration_s(text: str) -> float | None:
    """``[D-]HH:MM:SS[.mmm]`` or ``MM:SS.mmm`` → seconds (with the fraction)."""
    s = text.strip()
    whole = parse_elapsed(s)
    if whole is None:
        return None
    frac = re.search(r"\.([0-9]+)$", s)
    return whole + (float("0." + frac.group(1)) if frac else 0.0)


def _size(text: str) -> float | None:
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    try:
        return float(m.group(1)) * _UNIT[m.group(2)]
    except (OverflowError, ValueError):
        return None


def parse_tres_usage(text: str) -> dict[str, float]:
    """``cpu=00:00:15,mem=224276480,gres/gpuutil=87`` → numbers; ``cpu`` in seconds. Never raises.

    Memory-like TRES (``mem``, ``vmem``, ``gres/gpumem``, ``fs/disk``) may carry ``K``/``M``/``G``
    suffixes (sstat without ``--noconvert``); they become bytes. Junk items are dropped.
    """
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            continue
        number = _duration_s(value) if ":" in value else _size(value)
        if number is not None:
            out[key] = number
    return out


def _tres_nodes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key and value.strip():
            out[key] = value.strip()
    return out


def _int(text: str) -> int | None:
    s = text.strip()
    return int(s) if s.isascii() and s.isdigit() and len(s) < 20 else None


def parse_usage(
    text: str, fields: Sequence[str] = SACCT_USAGE_FIELDS, *, source: str = "sacct", delimiter: str | None = None
) -> UsageRows:
    """Parse ``sacct``/``sstat`` usage output (``--parsable2 --noheader``). Never raises.

    Only step rows are kept (an allocation row carries no usage); rows with a wrong column count
    or an unreadable id are skipped and counted.
    """
    out = UsageRows()
    try:
        names = [f.strip().lower() for f in fields]
        sep = delimiter or ("\x1f" if "\x1f" in text else "|")
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            cols = line.split(sep)
            if len(cols) != len(names):
                out._skip(f"line {lineno}: {len(cols)} columns, expected {len(names)}")
                continue
            col: Mapping[str, str] = dict(zip(names, cols, strict=True))
            job_id = try_parse_job_id(col.get("jobid", ""))
            if job_id is None:
                out._skip(f"line {lineno}: unreadable job id")
                continue
            if not job_id.is_step:
                continue
            rss = _size(col.get("maxrss", ""))
            out.append(
                StepUsage(
                    job_id=job_id,
                    state=col.get("state", "").split(" ")[0].strip().upper(),
                    elapsed_s=_int(col.get("elapsedraw", "")),
                    nnodes=_int(col.get("nnodes", "")),
                    ntasks=_int(col.get("ntasks", "")),
                    node_list=col.get("nodelist", "").strip(),
                    alloc_tres=parse_tres(col.get("alloctres", "")),
                    total_cpu_s=_duration_s(col.get("totalcpu", "")),
                    max_rss_bytes=int(rss) if rss is not None else None,
                    max_rss_node=col.get("maxrssnode", "").strip(),
                    usage_ave=parse_tres_usage(col.get("tresusageinave", "")),
                    usage_max=parse_tres_usage(col.get("tresusageinmax", "")),
                    usage_tot=parse_tres_usage(col.get("tresusageintot", "")),
                    usage_max_node=_tres_nodes(col.get("tresusageinmaxnode", "")),
                    source=source,
                )
            )
    except Exception as exc:  # totality is the contract
        out._skip(f"parser error: {type(exc).__name__}")
    return out

