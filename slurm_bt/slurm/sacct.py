"""Ask Slurm about many jobs at once and turn every answer into one typed record, :class:`SacctRow`.

Sources, all mapped to the same row type:

* ``sacct -P -n --noconvert --format=<SACCT_FIELDS>`` text (:func:`build_sacct_argv`,
  :func:`parse_sacct`): the only output stable from 22.05 to 25.11 (slurm-facts.md §6).
* ``sacct --json`` (:func:`parse_sacct_json`): the 22.05 ``dbv0.0.38`` shape (``state.current``
  a string, ``exit_code.return_code`` a number) and the 23.11+ ``v0.0.40``+ shape
  (``state.current`` a list of flags, numbers wrapped as ``{"set", "infinite", "number"}``).
* ``squeue -h -o '%i|%T|%r|%N|%k'`` (:func:`parse_squeue`): live jobs slurmdbd has not recorded yet.
* ``scontrol show job [-o]`` (:func:`parse_scontrol_show_job`): ``key=value`` pairs.

Every parser is total: it never raises on arbitrary input (hypothesis fuzzes this). Rows that
cannot be read are skipped and counted in :attr:`SacctRows.skipped`, with a reason in
:attr:`SacctRows.warnings`, so a watcher can log "sacct printed 1 unreadable row" rather than crash.

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
* ``--json`` ignores ``--format``; step ids are bare (``"batch"``, ``0``); ``0`` means "no time";
  TRES ``mem`` counts megabytes; earlier runs of requeued jobs are always included; a pending
  array's ``array.task`` is a hex bitmap (``"0xE"``); and **exit codes are lost**: ``exit 3``
  shows as ``SUCCESS``/0 (only signals survive). Prefer the text form for exit codes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone, tzinfo
from typing import Any

from slurm_bt.slurm.job_ids import JobId, parse_job_id, try_parse_job_id
from slurm_bt.slurm.states import STATE_CODES, base_state

__all__ = [
    "SACCT_DELIMITER",
    "SACCT_FIELDS",
    "SQUEUE_FORMAT",
    "SacctRow",
    "SacctRows",
    "build_sacct_argv",
    "build_squeue_argv",
    "latest_runs",
    "parse_elapsed",
    "parse_exit_code",
    "parse_sacct",
    "parse_sacct_json",
    "parse_scontrol_show_job",
    "parse_slurm_time",
    "parse_squeue",
    "parse_tres",
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

#: The squeue format used for the live-job fallback; comment (``%k``) last for the same reason.
SQUEUE_FORMAT = "%i|%T|%r|%N|%j|%u|%D|%k"

_NO_VALUE = frozenset({"", "unknown", "none", "none assigned", "(null)", "n/a", "invalid"})
_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


@dataclass(frozen=True)
class SacctRow:
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


class SacctRows(list[SacctRow]):
    """A list of rows that also says how many input rows could not be read, and why."""

    def __init__(self, rows: Iterable[SacctRow] = (), skipped: int = 0, warnings: Sequence[str] = ()) -> None:
        super().__init__(rows)
        self.skipped = skipped
        self.warnings: list[str] = list(warnings)

    def _skip(self, why: str) -> None:
        self.skipped += 1
        if len(self.warnings) < 20:  # bounded: a garbage answer must not produce a garbage log
            self.warnings.append(why)


# --------------------------------------------------------------------------- argv builders


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
    ids = [str(j) if isinstance(j, JobId) else str(parse_job_id(str(j))) for j in job_ids]
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


def build_squeue_argv(
    job_ids: Iterable[str | int | JobId], *, fmt: str = SQUEUE_FORMAT, all_states: bool = False
) -> list[str]:
    """``squeue -h -o FMT --jobs=...`` for the live-job fallback.

    Note: 22.05 ``squeue --jobs=<one unknown id>`` exits 1 ("Invalid job id specified"), while a
    list with at least one known id exits 0 and omits the unknown ones. Without ``--states=all``
    (``all_states``) squeue hides jobs that already finished but are still held by slurmctld
    (``MinJobAge``), which is exactly what a status needs when slurmdbd is down.
    """
    ids = [str(j) if isinstance(j, JobId) else str(parse_job_id(str(j))) for j in job_ids]
    argv = ["squeue", "--noheader", f"--format={fmt}"]
    if all_states:
        argv.append("--states=all")
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    return argv


def _safe_value(opt: str, value: str) -> str:
    if not value or value.startswith("-") or "\n" in value:
        raise ValueError(f"invalid value for {opt}: {value!r}")
    return value


# --------------------------------------------------------------------------- scalar parsers


def parse_slurm_time(text: str, *, tz: tzinfo | None = None) -> datetime | None:
    """Parse a Slurm time: ISO ``2026-11-22T02:22:49`` or epoch seconds (``SLURM_TIME_FORMAT=%s``).

    Naive ISO times are in the clock of the process that ran sacct; they are interpreted in
    ``tz`` (default: this process's local zone). Returns ``None`` for ``Unknown``/``None``/``0``/junk.
    """
    s = text.strip()
    if s.lower() in _NO_VALUE:
        return None
    try:
        if s.isascii() and s.isdigit():
            secs = int(s)
            return datetime.fromtimestamp(secs, tz=timezone.utc) if secs > 0 else None
        dt = datetime.fromisoformat(s)
    except (ValueError, OverflowError, OSError):
        return None
    if dt.tzinfo is None:
        try:
            dt = dt.replace(tzinfo=tz) if tz is not None else dt.astimezone()
        except (ValueError, OverflowError, OSError):
            return None
    return dt


def parse_elapsed(text: str) -> int | None:
    """``[D-]HH:MM:SS``, ``MM:SS`` or ``MM:SS.mmm`` → whole seconds; ``None`` for anything else."""
    s = text.strip()
    m = re.fullmatch(r"(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+)(?:\.[0-9]+)?", s, re.ASCII)
    if m is None:
        return None
    days, hours, mins, secs = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + mins) * 60 + secs


def parse_exit_code(text: str) -> tuple[int, int] | None:
    """``"3:0"`` → ``(3, 0)`` (exit code, signal); ``None`` if not of that form."""
    m = re.fullmatch(r"([0-9]+):([0-9]+)", text.strip(), re.ASCII)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_tres(text: str) -> dict[str, int]:
    """``billing=2,cpu=2,gres/gpu=4,mem=8000M,node=2`` → ints; ``mem`` in bytes. Junk items are dropped."""
    out: dict[str, int] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            continue
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)", value.strip(), re.ASCII)
        if m is None:
            continue
        number = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
        unit = m.group(2)
        # A bare mem number is megabytes (Slurm's unit for memory); other TRES are plain counts.
        if key == "mem" and unit == "":
            unit = "M"
        try:
            out[key] = int(number * _UNIT[unit])
        except (OverflowError, ValueError):
            continue
    return out


def _int_or_none(text: str) -> int | None:
    s = text.strip()
    if s.isascii() and s.isdigit() and len(s) < 20:
        return int(s)
    return None


def _clean(text: str) -> str:
    s = text.strip()
    return "" if s.lower() in _NO_VALUE else s


def _split_state(text: str) -> tuple[str, int | None]:
    words = text.split()
    by = None
    if len(words) == 3 and words[1] == "by":
        by = _int_or_none(words[2])
    return base_state(text), by


# --------------------------------------------------------------------------- sacct text


def parse_sacct(
    text: str,
    fields: Sequence[str] = SACCT_FIELDS,
    *,
    delimiter: str | None = None,
    tz: tzinfo | None = None,
) -> SacctRows:
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
    out = SacctRows()
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
                out._skip(f"line {lineno}: {len(cols)} columns, expected {len(names)}")
                continue
            row = _row_from_columns(dict(zip(names, cols, strict=True)), tz, "sacct")
            if row is None:
                out._skip(f"line {lineno}: unreadable job id")
                continue
            out.append(row)
    except Exception as exc:  # totality is the contract: report, never raise
        out._skip(f"parser error: {type(exc).__name__}")
    return out


def _row_from_columns(col: Mapping[str, str], tz: tzinfo | None, source: str) -> SacctRow | None:
    raw_id = col.get("jobid", col.get("jobidraw", ""))
    job_id = try_parse_job_id(raw_id)
    if job_id is None:
        return None
    state, by = _split_state(col.get("state", ""))

    def time(key: str) -> datetime | None:
        return parse_slurm_time(col.get(key, ""), tz=tz)

    elapsed = _int_or_none(col.get("elapsedraw", ""))
    if elapsed is None:
        elapsed = parse_elapsed(col.get("elapsed", ""))
    return SacctRow(
        job_id=job_id,
        state=state,
        job_id_raw=_clean(col["jobidraw"]) or None if "jobidraw" in col else None,
        name=col.get("jobname", ""),
        user=col.get("user", ""),
        uid=_int_or_none(col.get("uid", "")),
        account=col.get("account", ""),
        partition=col.get("partition", ""),
        cancelled_by=by,
        reason=_clean(col.get("reason", "")),
        exit_code=parse_exit_code(col.get("exitcode", "")),
        derived_exit_code=parse_exit_code(col.get("derivedexitcode", "")),
        submit=time("submit"),
        eligible=time("eligible"),
        start=time("start"),
        end=time("end"),
        elapsed_s=elapsed,
        timelimit_min=_int_or_none(col.get("timelimitraw", "")),
        node_list=_clean(col.get("nodelist", "")),
        nnodes=_int_or_none(col.get("nnodes", "")),
        alloc_tres=parse_tres(col.get("alloctres", "")),
        work_dir=col.get("workdir", ""),
        comment=col.get("comment", ""),
        source=source,
    )


def latest_runs(rows: Iterable[SacctRow]) -> list[SacctRow]:
    """Collapse ``sacct -D`` history: keep the last row per job id, with ``restarts`` = earlier rows.

    sacct prints runs oldest first, so the last row of an id is the current run; the order of
    first appearance is kept.
    """
    last: dict[JobId, SacctRow] = {}
    seen: dict[JobId, int] = {}
    for row in rows:
        seen[row.job_id] = seen.get(row.job_id, 0) + 1
        last[row.job_id] = row
    # dataclasses.replace costs ~10 us a row: only rebuild the (few) rows whose count changes.
    return [r if r.restarts >= seen[j] - 1 else replace(r, restarts=seen[j] - 1) for j, r in last.items()]


# --------------------------------------------------------------------------- sacct --json


def parse_sacct_json(data: str | bytes | Mapping[str, Any], *, include_steps: bool = False) -> SacctRows:
    """Parse ``sacct --json`` from 22.05 (dbv0.0.38) or 23.02+ (data_parser v0.0.39+). Never raises.

    Args:
        data: the raw text or an already-decoded document.
        include_steps: also emit one row per step (``123.batch``), after each job's row.
    """
    out = SacctRows()
    try:
        doc: Any = json.loads(data) if isinstance(data, (str, bytes)) else data
    except (ValueError, RecursionError):
        out._skip("not JSON")
        return out
    jobs = doc.get("jobs") if isinstance(doc, Mapping) else None
    if not isinstance(jobs, list):
        out._skip("no jobs list")
        return out
    for index, job in enumerate(jobs):
        try:
            row = _row_from_json_job(job)
        except Exception as exc:  # one odd job must not hide the others
            row = None
            out._skip(f"jobs[{index}]: {type(exc).__name__}")
            continue
        if row is None:
            out._skip(f"jobs[{index}]: no usable job id")
            continue
        out.append(row)
        if include_steps:
            steps = _get(job, "steps")
            for s_index, step in enumerate(steps if isinstance(steps, list) else []):
                try:
                    step_row = _row_from_json_step(row, step)
                except Exception:
                    step_row = None
                if step_row is None:
                    out._skip(f"jobs[{index}].steps[{s_index}]: unreadable")
                else:
                    out.append(step_row)
    return out


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _num(value: Any) -> int | None:
    """A JSON number, or a 23.11+ ``{"set": true, "infinite": false, "number": N}`` wrapper."""
    if isinstance(value, Mapping):
        if value.get("set") is False or value.get("infinite") is True:
            return None
        value = value.get("number")
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value and abs(value) < 2**63:
        return int(value)
    return None


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return ""


def _epoch(value: Any) -> datetime | None:
    secs = _num(value)
    if secs is None or secs <= 0:
        return None
    try:
        return datetime.fromtimestamp(secs, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return None


def _json_state(value: Any) -> tuple[str, frozenset[str]]:
    """22.05: ``{"current": "RUNNING"}``; 23.02: a string; 23.11+: ``["RUNNING", "CONFIGURING"]``."""
    current = value.get("current") if isinstance(value, Mapping) else value
    if isinstance(current, str):
        return base_state(current), frozenset()
    if isinstance(current, list):
        words = [base_state(w) for w in current if isinstance(w, str) and w.strip()]
        if words:
            return words[0], frozenset(words[1:])
    return "", frozenset()


def _json_reason(value: Any) -> str:
    return _clean(_text(_get(value, "reason"))) if isinstance(value, Mapping) else ""


def _json_exit(value: Any) -> tuple[int, int] | None:
    """``{"status": "SIGNALED", "signal": {"signal_id": 9}}`` (22.05) or the 23.11+ wrappers."""
    if not isinstance(value, Mapping):
        return None
    code = _num(value.get("return_code"))
    signal = value.get("signal")
    sig = None
    if isinstance(signal, Mapping):
        sig = _num(signal.get("signal_id")) if "signal_id" in signal else _num(signal.get("id"))
    if code is None and sig is None:
        return None
    return (code or 0, sig or 0)


def _json_tres(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    if not isinstance(items, list):
        return out
    for item in items:
        kind, count = _text(_get(item, "type")), _num(_get(item, "count"))
        if not kind or count is None:
            continue
        name = _text(_get(item, "name"))
        key = f"{kind}/{name}" if name else kind
        out[key] = count * _UNIT["M"] if key == "mem" else count
    return out


def _json_job_id(job: Mapping[str, Any]) -> JobId | None:
    raw = _num(job.get("job_id"))
    if raw is None or raw < 0:
        return None
    array_master = _num(_get(job, "array", "job_id")) or 0
    het_leader = _num(_get(job, "het", "job_id")) or 0
    if array_master > 0:
        task = _num(_get(job, "array", "task_id"))
        if task is not None and task >= 0:
            return JobId(array_master, array_task=task)
        spec = _array_spec(
            _text(_get(job, "array", "task")), _num(_get(job, "array", "limits", "max", "running", "tasks"))
        )
        if spec:
            return JobId(array_master, array_spec=spec)
        return JobId(raw)
    if het_leader > 0:
        offset = _num(_get(job, "het", "job_offset"))
        if offset is not None and offset >= 0:
            return JobId(het_leader, het_offset=offset)
    return JobId(raw)


def _array_spec(task: str, throttle: int | None) -> str:
    """Pending array tasks: 22.05 JSON prints a hex bitmap (``"0xE"`` = tasks 1-3), text a range."""
    task = task.strip().strip("[]")
    if task.lower().startswith("0x") and 2 < len(task) <= 4096:
        try:
            bits = int(task[2:], 16)
        except ValueError:
            return ""
        indices = [i for i in range(bits.bit_length()) if bits >> i & 1]
        ranges: list[str] = []
        for i in indices:
            if ranges and ranges[-1].split("-")[-1] == str(i - 1):
                ranges[-1] = f"{ranges[-1].split('-')[0]}-{i}"
            else:
                ranges.append(str(i))
        task = ",".join(ranges)
        if task and throttle:
            task += f"%{throttle}"
    if task and re.fullmatch(r"[0-9,:%\-]+", task, re.ASCII):
        return task
    return ""


def _row_from_json_job(job: Any) -> SacctRow | None:
    if not isinstance(job, Mapping):
        return None
    job_id = _json_job_id(job)
    if job_id is None:
        return None
    state, flags = _json_state(job.get("state"))
    time = job.get("time")
    limit = _num(_get(time, "limit"))
    nodes = _clean(_text(job.get("nodes")))

    return SacctRow(
        job_id=job_id,
        state=state,
        job_id_raw=str(_num(job.get("job_id"))),
        name=_text(job.get("name")),
        user=_text(job.get("user")),
        account=_text(job.get("account")),
        partition=_text(job.get("partition")),
        state_flags=flags,
        cancelled_by_user=_text(job.get("kill_request_user")) if state == "CANCELLED" else "",
        reason=_json_reason(job.get("state")),
        exit_code=_json_exit(job.get("exit_code")),
        derived_exit_code=_json_exit(job.get("derived_exit_code")),
        submit=_epoch(_get(time, "submission")),
        eligible=_epoch(_get(time, "eligible")),
        start=_epoch(_get(time, "start")),
        end=_epoch(_get(time, "end")),
        elapsed_s=_num(_get(time, "elapsed")),
        timelimit_min=limit if limit is not None and limit > 0 else None,
        node_list=nodes,
        nnodes=_num(job.get("allocation_nodes")) if nodes else None,
        alloc_tres=_json_tres(_get(job, "tres", "allocated")),
        work_dir=_text(job.get("working_directory")),
        comment=_text(_get(job, "comment", "job")),
        restarts=_num(job.get("restart_cnt")) or 0,
        source="sacct-json",
    )


def _row_from_json_step(job_row: SacctRow, step: Any) -> SacctRow | None:
    if not isinstance(step, Mapping):
        return None
    step_id = _text(_get(step, "step", "id"))
    # 22.05 prints the bare step ("batch"); 23.x prints "123.batch" with the *raw* job id.
    suffix = step_id.split(".", 1)[1] if "." in step_id else step_id
    job_id = try_parse_job_id(f"{job_row.job_id.job}.{suffix}")
    if job_id is None:
        return None
    state, flags = _json_state({"current": step.get("state")})
    time = step.get("time")
    return SacctRow(
        job_id=job_id,
        state=state,
        name=_text(_get(step, "step", "name")),
        state_flags=flags,
        exit_code=_json_exit(step.get("exit_code")),
        start=_epoch(_get(time, "start")),
        end=_epoch(_get(time, "end")),
        elapsed_s=_num(_get(time, "elapsed")),
        node_list=_clean(_text(_get(step, "nodes", "range"))),
        nnodes=_num(_get(step, "nodes", "count")),
        alloc_tres=_json_tres(_get(step, "tres", "allocated")),
        source="sacct-json",
    )


# --------------------------------------------------------------------------- squeue


_SQUEUE_CODES = {
    "i": "jobid",
    "A": "jobidraw",
    "T": "state",
    "t": "state",
    "r": "reason",
    "N": "nodelist",
    "k": "comment",
    "j": "jobname",
    "u": "user",
    "U": "uid",
    "D": "nnodes",
    "P": "partition",
    "a": "account",
    "Z": "workdir",
    "V": "submit",
    "S": "start",
    "e": "end",
    "M": "elapsed",
}


def parse_squeue(text: str, fmt: str = SQUEUE_FORMAT, *, tz: tzinfo | None = None) -> SacctRows:
    """Parse ``squeue -h -o FMT`` output, where FMT is ``%x`` codes joined by ``|``. Never raises.

    Known codes: ``%i %A %T %t %r %N %k %j %u %U %D %P %a %Z %V %S %e %M``; others are ignored.
    ``%t`` short codes (``PD``) are expanded to long names. Put ``%k`` (comment) last so a ``|``
    inside it is repaired, as for sacct.
    """
    out = SacctRows()
    try:
        specs = fmt.split("|")
        names: list[str] = []
        for spec in specs:
            m = re.fullmatch(r"%\.?[0-9]*([A-Za-z])", spec.strip())
            code = m.group(1) if m else ""
            names.append(_SQUEUE_CODES.get(code, f"?{len(names)}"))
        short_state = any(re.fullmatch(r"%\.?[0-9]*t", s.strip()) for s in specs)
        joinable = names[-1] == "comment"
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            cols = line.split("|")
            if len(cols) > len(names) and joinable:
                cols = [*cols[: len(names) - 1], "|".join(cols[len(names) - 1 :])]
            if len(cols) != len(names):
                out._skip(f"line {lineno}: {len(cols)} columns, expected {len(names)}")
                continue
            col = {n: c.strip() for n, c in zip(names, cols, strict=True)}
            if short_state:
                code_state = STATE_CODES.get(col.get("state", "").upper())
                if code_state is not None:
                    col["state"] = code_state.value
            if col.get("comment") == "(null)":
                col["comment"] = ""
            row = _row_from_columns(col, tz, "squeue")
            if row is None:
                out._skip(f"line {lineno}: unreadable job id")
                continue
            out.append(row)
    except Exception as exc:
        out._skip(f"parser error: {type(exc).__name__}")
    return out


# --------------------------------------------------------------------------- scontrol


_SCONTROL_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", re.DOTALL)


def _scontrol_pairs(record: str) -> dict[str, str]:
    """Split ``Key=value Key2=value with spaces`` into pairs.

    A token that does not start with ``Key=`` continues the previous value (``Comment=a b``).
    """
    pairs: dict[str, str] = {}
    last: str | None = None
    for token in record.split():
        m = _SCONTROL_KEY.match(token)
        if m and m.group(1)[0].isupper() and m.group(1) not in pairs:
            last = m.group(1)
            pairs[last] = m.group(2)
        elif last is not None:
            pairs[last] += " " + token
    return pairs


def _scontrol_records(text: str) -> list[str]:
    records: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("JobId="):
            records.append(stripped)
        elif stripped and records and line[:1].isspace():
            records[-1] += " " + stripped
        elif not stripped and records and records[-1]:
            records.append("")  # blank line ends the multi-line record
    return [r for r in records if r]


def parse_scontrol_show_job(text: str, *, tz: tzinfo | None = None) -> SacctRows:
    """Parse ``scontrol show job [-o] [ids]`` (one-line or multi-line form). Never raises.

    Array tasks (``ArrayJobId=14 ArrayTaskId=2``) and het components (``HetJobId``,
    ``HetJobOffset``) are turned into ``14_2`` and ``19+0``; ``Restarts`` is filled in.
    """
    out = SacctRows()
    try:
        for index, record in enumerate(_scontrol_records(text)):
            kv = _scontrol_pairs(record)
            job_id = _scontrol_job_id(kv)
            if job_id is None:
                out._skip(f"record {index}: unreadable JobId")
                continue
            user, _, uid = kv.get("UserId", "").partition("(")
            state = kv.get("JobState", "")
            pending = base_state(state) == "PENDING"
            col = {
                "jobid": str(job_id),
                "jobidraw": kv.get("JobId", ""),
                "jobname": kv.get("JobName", ""),
                "user": user,
                "uid": uid.rstrip(")"),
                "account": kv.get("Account", ""),
                "partition": kv.get("Partition", ""),
                "state": state,
                "exitcode": kv.get("ExitCode", ""),
                "derivedexitcode": kv.get("DerivedExitCode", ""),
                "reason": kv.get("Reason", ""),
                "submit": kv.get("SubmitTime", ""),
                "eligible": kv.get("EligibleTime", ""),
                "start": "" if pending else kv.get("StartTime", ""),
                "end": "" if pending else kv.get("EndTime", ""),
                "elapsed": kv.get("RunTime", ""),
                "nodelist": kv.get("NodeList", ""),
                "nnodes": "" if pending else kv.get("NumNodes", ""),
                "alloctres": "" if pending else kv.get("TRES", kv.get("AllocTRES", "")),
                "workdir": kv.get("WorkDir", ""),
                "comment": _clean(kv.get("Comment", "")),
            }
            row = _row_from_columns(col, tz, "scontrol")
            if row is None:
                out._skip(f"record {index}: unreadable JobId")
                continue
            limit = parse_elapsed(kv.get("TimeLimit", ""))
            restarts = _int_or_none(kv.get("Restarts", "")) or 0
            out.append(
                replace(row, restarts=restarts, timelimit_min=limit // 60 if limit is not None else None)
            )
    except Exception as exc:
        out._skip(f"parser error: {type(exc).__name__}")
    return out


def _scontrol_job_id(kv: Mapping[str, str]) -> JobId | None:
    raw = _int_or_none(kv.get("JobId", ""))
    if raw is None:
        return None
    master = _int_or_none(kv.get("ArrayJobId", ""))
    task = kv.get("ArrayTaskId", "")
    if master is not None:
        if _int_or_none(task) is not None:
            return JobId(master, array_task=int(task))
        if task and re.fullmatch(r"[0-9,:%\-]+", task, re.ASCII):
            return JobId(master, array_spec=task)
    leader = _int_or_none(kv.get("HetJobId", ""))
    offset = _int_or_none(kv.get("HetJobOffset", ""))
    if leader is not None and offset is not None:
        return JobId(leader, het_offset=offset)
    return JobId(raw)
