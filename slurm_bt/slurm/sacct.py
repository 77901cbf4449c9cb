"""``sacct``: job status and step usage from slurmdbd, for many jobs in one call.

:class:`~slurm_bt.slurm.client.SlurmClient` runs it (``query`` for status, ``usage`` for step
usage); this module holds both directions of the grammar: the argv (:func:`build_sacct_argv`,
:func:`build_sacct_usage_argv`) and the parsers of its answer (:func:`parse_sacct`,
:func:`parse_usage`). ``sstat`` prints the usage columns in the same ``--parsable2`` layout, so
:mod:`slurm_bt.slurm.sstat` reuses :func:`parse_usage`; the live ``squeue`` fallback maps onto the
same :class:`JobRow` (:mod:`slurm_bt.slurm.squeue`).

Only the ``-P -n --noconvert --format=...`` text form is read: it is the output that stays the same
from 22.05 to 25.11, while ``sacct --json`` changed shape in 23.02, 23.11 and 24.05 and, on 22.05,
loses exit codes (``exit 3`` shows as ``SUCCESS``; tests/data/sacct/README.md).

What 22.05 prints, observed on the dev cluster (``tests/data/sacct/2205_*``):

* ``State`` is ``CANCELLED by <uid>`` for cancelled jobs; steps say plain ``CANCELLED``.
* ``Comment`` is stored only with ``AccountingStoreFlags=job_comment``; it may contain ``|``
  (``tok=a|b c`` splits into two columns), so it goes last and surplus columns are joined back.
* Times are ``Unknown`` until set; ``NodeList`` is ``None assigned`` while pending;
  ``TimelimitRaw`` is minutes, or ``Partition_Limit`` (pending) / ``UNLIMITED`` (finished).
* With ``-D`` a requeued job prints one ``REQUEUED`` row per earlier run, then the current run.
* ``Reason`` in sacct lags behind slurmctld (``Dependency`` while squeue already says
  ``DependencyNeverSatisfied``); prefer squeue's reason for live jobs.
* ``CANCELLED by <uid>`` lasts only until a running job's end record reaches slurmdbd; then the
  row says ``CANCELLED`` with exit ``0:15``. Do not rely on ``cancelled_by`` being present.

Step usage is a different question from status: it needs step rows (the allocation row of a job
has no usage; ``.batch``, ``.extern`` and ``.0`` have it) and the ``TRESUsageIn*`` columns, whose
values are not plain TRES counts. Observed on 22.05 (``tests/data/sacct/2205_usage_*``)::

    cpu=00:00:15,energy=0,fs/disk=1685831,mem=224276480,pages=3,vmem=227500032   (TRESUsageInMax)
    cpu=n2,energy=n2,fs/disk=n2,mem=n1,pages=n2,vmem=n2                          (...MaxNode)

so ``cpu`` is a *duration*, memory is bytes, and the ``*Node`` columns hold node names. GPU usage
appears as ``gres/gpuutil`` (percent) and ``gres/gpumem`` (bytes) only when the site accounts them
(``AccountingStorageTRES=gres/gpumem,gres/gpuutil`` with NVML); absent otherwise.

Every parser is total: it never raises on arbitrary input (hypothesis fuzzes this). Rows that
cannot be read are skipped and counted in :attr:`ParsedRows.skipped
<slurm_bt.slurm.values.ParsedRows>`, with a reason in its ``warnings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, tzinfo

from slurm_bt.slurm.job_ids import JobId, job_id_args, try_parse_job_id
from slurm_bt.slurm.states import base_state
from slurm_bt.slurm.values import (
    ParsedRows,
    clean,
    int_or_none,
    parse_duration,
    parse_elapsed,
    parse_exit_code,
    parse_size,
    parse_slurm_time,
    parse_tres,
    parse_tres_usage,
)

__all__ = [
    "SACCT_DELIMITER",
    "SACCT_FIELDS",
    "SACCT_USAGE_FIELDS",
    "JobRow",
    "StepUsage",
    "build_sacct_argv",
    "build_sacct_usage_argv",
    "latest_runs",
    "parse_sacct",
    "parse_usage",
    "row_from_columns",
]

#: Columns we ask sacct for; every name is in 22.05 ``sacct --helpformat``. ``Comment`` is last on
#: purpose: it is the one free-text column whose ``|`` we can repair by joining surplus columns.
#: (There is no ``Restarts`` column in sacct; count ``REQUEUED`` rows with ``-D`` instead.)
SACCT_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "UID",
    "Account",
    "Partition",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "Reason",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "Elapsed",
    "ElapsedRaw",
    "TimelimitRaw",
    "NodeList",
    "NNodes",
    "AllocTRES",
    "WorkDir",
    "Comment",
)

#: Column separator the client asks for (ASCII unit separator): unlike ``|`` it cannot occur in
#: a job name, work dir or comment typed by a user. :func:`parse_sacct` detects either.
SACCT_DELIMITER = "\x1f"

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


@dataclass(frozen=True)
class JobRow:
    """One job (or step) as Slurm reported it; any source, same fields.

    Attributes:
        job_id: the id as printed (``123_4``, ``123+0``, ``123.batch``).
        state: base state, upper case (``CANCELLED``, not ``CANCELLED by 0``); ``""`` if unknown.
        job_id_raw: ``JobIDRaw`` (the real id of an array task); ``None`` if not reported.
        name: job (or step) name.
        user: user name; ``""`` on step rows.
        uid: numeric uid, when reported.
        account: Slurm account.
        partition: partition name.
        state_flags: extra flags (23.11+ JSON lists such as ``{"REQUEUED"}``); empty otherwise.
        cancelled_by: uid from ``CANCELLED by <uid>`` (text output only).
        cancelled_by_user: user *name* from JSON ``kill_request_user`` (22.05 JSON has no uid).
        reason: Slurm's reason; ``""`` for ``None``.
        exit_code: ``(code, signal)``; ``None`` when not reported.
        derived_exit_code: highest exit code of all steps, ``(code, signal)``.
        submit, eligible, start, end: timezone-aware times, ``None`` for ``Unknown``.
        elapsed_s: run time in seconds.
        timelimit_min: time limit in minutes; ``None`` for unlimited or partition default.
        node_list: compressed host list (``n[1-2]``); ``""`` while pending.
        nnodes: node count.
        alloc_tres: allocated TRES: ``cpu``, ``mem`` (bytes), ``node``, ``billing``,
            ``gres/gpu``, ``gres/gpu:h100`` ... as integers.
        work_dir: the job's working directory.
        comment: the job comment (may contain ``|``).
        restarts: number of earlier runs (requeues), when known.
        source: ``"sacct"``, ``"sacct-json"``, ``"squeue"`` or ``"scontrol"``.
    """

    job_id: JobId
    state: str
    job_id_raw: str | None = None
    name: str = ""
    user: str = ""
    uid: int | None = None
    account: str = ""
    partition: str = ""
    state_flags: frozenset[str] = frozenset()
    cancelled_by: int | None = None
    cancelled_by_user: str = ""
    reason: str = ""
    exit_code: tuple[int, int] | None = None
    derived_exit_code: tuple[int, int] | None = None
    submit: datetime | None = None
    eligible: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None
    elapsed_s: int | None = None
    timelimit_min: int | None = None
    node_list: str = ""
    nnodes: int | None = None
    alloc_tres: dict[str, int] = field(default_factory=dict, hash=False)
    work_dir: str = ""
    comment: str = ""
    restarts: int = 0
    source: str = "sacct"

    @property
    def is_step(self) -> bool:
        """True for step rows (``.batch``, ``.extern``, ``.0``)."""
        return self.job_id.is_step

    @property
    def gpus(self) -> int:
        """Allocated GPUs over all nodes (``gres/gpu`` TRES; 0 if not accounted)."""
        return self.alloc_tres.get("gres/gpu", 0)


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


# --------------------------------------------------------------------------- argv


def build_sacct_argv(
    job_ids: Iterable[str | int | JobId],
    *,
    fields: Sequence[str] = SACCT_FIELDS,
    steps: bool = False,
    duplicates: bool = False,
    all_users: bool = False,
    user: str | None = None,
    name: str | None = None,
    starttime: str | datetime | None = None,
    delimiter: str = "|",
) -> list[str]:
    """Build one ``sacct`` call for all of ``job_ids`` (never one call per job).

    Args:
        job_ids: ids to ask about; each must parse as a job id (a value such as ``-a`` would
            otherwise become an option).
        fields: columns, in order; keep ``Comment`` last.
        steps: include step rows (``.batch``, ``.extern``, ``.0``); ``False`` adds ``-X``.
        duplicates: add ``-D`` so requeued jobs show one row per run.
        all_users: add ``-a``.
        user: add ``--user``.
        name: add ``--name`` (filter by job name).
        starttime: add ``--starttime``; without ``-j`` sacct only looks at today.
        delimiter: column separator; the client passes :data:`SACCT_DELIMITER`.

    Raises:
        ValueError: a job id is malformed, or a filter value starts with ``-``.
    """
    ids = job_id_args(job_ids)
    argv = ["sacct", "--parsable2", "--noheader", "--noconvert", f"--format={','.join(fields)}"]
    if delimiter != "|":
        argv.append(f"--delimiter={delimiter}")
    if not steps:
        argv.append("--allocations")
    if duplicates:
        argv.append("--duplicates")
    if all_users:
        argv.append("--allusers")
    for opt, value in (("--user", user), ("--name", name)):
        if value is not None:
            argv.append(f"{opt}={_safe_value(opt, value)}")
    if starttime is not None:
        when = starttime.strftime("%Y-%m-%dT%H:%M:%S") if isinstance(starttime, datetime) else starttime
        argv.append(f"--starttime={_safe_value('--starttime', when)}")
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    return argv


def build_sacct_usage_argv(job_ids: Iterable[str | int | JobId], *, delimiter: str = "|") -> list[str]:
    """One ``sacct`` call for the step usage of all ``job_ids`` (steps included, no ``-X``)."""
    ids = job_id_args(job_ids)
    argv = ["sacct", "--parsable2", "--noheader", "--noconvert", f"--format={','.join(SACCT_USAGE_FIELDS)}"]
    if delimiter != "|":
        argv.append(f"--delimiter={delimiter}")
    argv.append(f"--jobs={','.join(ids)}")
    return argv


def _safe_value(opt: str, value: str) -> str:
    if not value or value.startswith("-") or "\n" in value:
        raise ValueError(f"invalid value for {opt}: {value!r}")
    return value


def _split_state(text: str) -> tuple[str, int | None]:
    words = text.split()
    by = None
    if len(words) == 3 and words[1] == "by":
        by = int_or_none(words[2])
    return base_state(text), by


# --------------------------------------------------------------------------- status rows


def parse_sacct(
    text: str,
    fields: Sequence[str] = SACCT_FIELDS,
    *,
    delimiter: str | None = None,
    tz: tzinfo | None = None,
) -> ParsedRows[JobRow]:
    """Parse ``sacct -P -n --format=<fields>`` output. Never raises.

    Args:
        text: sacct's stdout.
        fields: the ``--format`` columns, in order (case-insensitive names).
        delimiter: column separator; ``None`` detects :data:`SACCT_DELIMITER` or ``|``.
        tz: zone for naive times (see :func:`parse_slurm_time`).

    Returns:
        Rows in sacct's order. A row with too few columns, too many (unless the last field is
        ``Comment``), or an unparsable ``JobID`` is skipped and counted.
    """
    out = ParsedRows[JobRow]()
    try:
        names = [f.strip().lower() for f in fields]
        if not names:
            return out
        sep = delimiter or (SACCT_DELIMITER if SACCT_DELIMITER in text else "|")
        joinable = names[-1] == "comment"
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            cols = line.split(sep)
            if len(cols) > len(names) and joinable:
                cols = [*cols[: len(names) - 1], sep.join(cols[len(names) - 1 :])]
            if len(cols) != len(names):
                out.skip(f"line {lineno}: {len(cols)} columns, expected {len(names)}")
                continue
            row = row_from_columns(dict(zip(names, cols, strict=True)), tz, "sacct")
            if row is None:
                out.skip(f"line {lineno}: unreadable job id")
                continue
            out.append(row)
    except Exception as exc:  # totality is the contract: report, never raise
        out.skip(f"parser error: {type(exc).__name__}")
    return out


def row_from_columns(col: Mapping[str, str], tz: tzinfo | None, source: str) -> JobRow | None:
    """One :class:`JobRow` from lower-case sacct column names (squeue's columns are renamed to
    them); ``None`` when the job id cannot be read."""
    raw_id = col.get("jobid", col.get("jobidraw", ""))
    job_id = try_parse_job_id(raw_id)
    if job_id is None:
        return None
    state, by = _split_state(col.get("state", ""))

    def time(key: str) -> datetime | None:
        return parse_slurm_time(col.get(key, ""), tz=tz)

    elapsed = int_or_none(col.get("elapsedraw", ""))
    if elapsed is None:
        elapsed = parse_elapsed(col.get("elapsed", ""))
    return JobRow(
        job_id=job_id,
        state=state,
        job_id_raw=clean(col["jobidraw"]) or None if "jobidraw" in col else None,
        name=col.get("jobname", ""),
        user=col.get("user", ""),
        uid=int_or_none(col.get("uid", "")),
        account=col.get("account", ""),
        partition=col.get("partition", ""),
        cancelled_by=by,
        reason=clean(col.get("reason", "")),
        exit_code=parse_exit_code(col.get("exitcode", "")),
        derived_exit_code=parse_exit_code(col.get("derivedexitcode", "")),
        submit=time("submit"),
        eligible=time("eligible"),
        start=time("start"),
        end=time("end"),
        elapsed_s=elapsed,
        timelimit_min=int_or_none(col.get("timelimitraw", "")),
        node_list=clean(col.get("nodelist", "")),
        nnodes=int_or_none(col.get("nnodes", "")),
        alloc_tres=parse_tres(col.get("alloctres", "")),
        work_dir=col.get("workdir", ""),
        comment=col.get("comment", ""),
        source=source,
    )


def latest_runs(rows: Iterable[JobRow]) -> list[JobRow]:
    """Collapse ``sacct -D`` history: keep the last row per job id, with ``restarts`` = earlier rows.

    sacct prints runs oldest first, so the last row of an id is the current run; the order of
    first appearance is kept.
    """
    last: dict[JobId, JobRow] = {}
    seen: dict[JobId, int] = {}
    for row in rows:
        seen[row.job_id] = seen.get(row.job_id, 0) + 1
        last[row.job_id] = row
    # dataclasses.replace costs ~10 us a row: only rebuild the (few) rows whose count changes.
    return [r if r.restarts >= seen[j] - 1 else replace(r, restarts=seen[j] - 1) for j, r in last.items()]


# --------------------------------------------------------------------------- step usage


def _tres_nodes(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if sep and key and value.strip():
            out[key] = value.strip()
    return out


def parse_usage(
    text: str, fields: Sequence[str] = SACCT_USAGE_FIELDS, *, source: str = "sacct", delimiter: str | None = None
) -> ParsedRows[StepUsage]:
    """Parse ``sacct``/``sstat`` usage output (``--parsable2 --noheader``). Never raises.

    Args:
        text: the command's stdout.
        fields: the ``--format`` columns, in order (:data:`SACCT_USAGE_FIELDS`, or
            :data:`~slurm_bt.slurm.sstat.SSTAT_FIELDS` for sstat).
        source: recorded in :attr:`StepUsage.source`.
        delimiter: column separator; ``None`` detects :data:`SACCT_DELIMITER` or ``|``.

    Only step rows are kept (an allocation row carries no usage); rows with a wrong column count
    or an unreadable id are skipped and counted.
    """
    out = ParsedRows[StepUsage]()
    try:
        names = [f.strip().lower() for f in fields]
        sep = delimiter or (SACCT_DELIMITER if SACCT_DELIMITER in text else "|")
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            cols = line.split(sep)
            if len(cols) != len(names):
                out.skip(f"line {lineno}: {len(cols)} columns, expected {len(names)}")
                continue
            col: Mapping[str, str] = dict(zip(names, cols, strict=True))
            job_id = try_parse_job_id(col.get("jobid", ""))
            if job_id is None:
                out.skip(f"line {lineno}: unreadable job id")
                continue
            if not job_id.is_step:
                continue
            rss = parse_size(col.get("maxrss", ""))
            out.append(
                StepUsage(
                    job_id=job_id,
                    state=col.get("state", "").split(" ")[0].strip().upper(),
                    elapsed_s=int_or_none(col.get("elapsedraw", "")),
                    nnodes=int_or_none(col.get("nnodes", "")),
                    ntasks=int_or_none(col.get("ntasks", "")),
                    node_list=col.get("nodelist", "").strip(),
                    alloc_tres=parse_tres(col.get("alloctres", "")),
                    total_cpu_s=parse_duration(col.get("totalcpu", "")),
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
        out.skip(f"parser error: {type(exc).__name__}")
    return out

