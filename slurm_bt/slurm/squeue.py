"""``squeue``: what slurmctld alone knows about jobs, for ids slurmdbd has not recorded yet.

:class:`~slurm_bt.slurm.client.SlurmClient` runs it as the status fallback (``query`` for ids sacct
lacks, ``live`` when slurmdbd is down); its answer maps onto the same
:class:`~slurm_bt.slurm.sacct.JobRow` as sacct's, so status code never asks where a row came from.

22.05 behaviour the client depends on (tests/data/sacct/2205_squeue_*): a comment prints ``(null)``
when empty; squeue's ``Reason`` is fresher than sacct's (``DependencyNeverSatisfied`` while sacct
still says ``Dependency``); ``--jobs=<one unknown id>`` exits 1 with "Invalid job id specified".
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import tzinfo

from slurm_bt.slurm.job_ids import JobId, job_id_args
from slurm_bt.slurm.sacct import JobRow, row_from_columns
from slurm_bt.slurm.states import STATE_CODES
from slurm_bt.slurm.values import ParsedRows

__all__ = ["SQUEUE_FORMAT", "build_squeue_argv", "parse_squeue"]

#: The squeue format of the live-job fallback; comment (``%k``) last so a ``|`` in it is repaired.
SQUEUE_FORMAT = "%i|%T|%r|%N|%j|%u|%D|%k"


def build_squeue_argv(
    job_ids: Iterable[str | int | JobId], *, fmt: str = SQUEUE_FORMAT, all_states: bool = False
) -> list[str]:
    """``squeue -h -o FMT --jobs=...`` for the live-job fallback.

    Note: 22.05 ``squeue --jobs=<one unknown id>`` exits 1 ("Invalid job id specified"), while a
    list with at least one known id exits 0 and omits the unknown ones. Without ``--states=all``
    (``all_states``) squeue hides jobs that already finished but are still held by slurmctld
    (``MinJobAge``), which is exactly what a status needs when slurmdbd is down.
    """
    ids = job_id_args(job_ids)
    argv = ["squeue", "--noheader", f"--format={fmt}"]
    if all_states:
        argv.append("--states=all")
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    return argv


# squeue %-codes we read, renamed to the sacct column names row_from_columns expects.
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


def parse_squeue(text: str, fmt: str = SQUEUE_FORMAT, *, tz: tzinfo | None = None) -> ParsedRows[JobRow]:
    """Parse ``squeue -h -o FMT`` output, where FMT is ``%x`` codes joined by ``|``. Never raises.

    Known codes: ``%i %A %T %t %r %N %k %j %u %U %D %P %a %Z %V %S %e %M``; others are ignored.
    ``%t`` short codes (``PD``) are expanded to long names. Put ``%k`` (comment) last so a ``|``
    inside it is repaired, as for sacct.
    """
    out = ParsedRows[JobRow]()
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
                out.skip(f"line {lineno}: {len(cols)} columns, expected {len(names)}")
                continue
            col = {n: c.strip() for n, c in zip(names, cols, strict=True)}
            if short_state:
                code_state = STATE_CODES.get(col.get("state", "").upper())
                if code_state is not None:
                    col["state"] = code_state.value
            if col.get("comment") == "(null)":
                col["comment"] = ""
            row = row_from_columns(col, tz, "squeue")
            if row is None:
                out.skip(f"line {lineno}: unreadable job id")
                continue
            out.append(row)
    except Exception as exc:
        out.skip(f"parser error: {type(exc).__name__}")
    return out
