"""The value grammar every Slurm command prints, and the row list every parser returns.

The per-command modules (:mod:`~slurm_bt.slurm.sacct`, :mod:`~slurm_bt.slurm.squeue`,
:mod:`~slurm_bt.slurm.sstat`, :mod:`~slurm_bt.slurm.scontrol`, ...) each parse one command's
layout; the *values* inside those layouts (times, durations, exit codes, TRES lists, "no value"
spellings) are the same across commands and live here once.

Every function here is total: junk in, ``None`` (or an empty dict) out, never an exception; the
parsers built on them promise the same (hypothesis fuzzes this in tests/unit/test_slurm_*.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone, tzinfo
from typing import TypeVar

__all__ = [
    "NO_VALUE",
    "ParsedRows",
    "clean",
    "int_or_none",
    "parse_duration",
    "parse_elapsed",
    "parse_exit_code",
    "parse_size",
    "parse_slurm_time",
    "parse_tres",
    "parse_tres_usage",
]

#: How Slurm spells "no value" (lower case): ``Unknown`` times, ``None assigned`` node lists,
#: ``(null)`` comments, ``N/A``...
NO_VALUE = frozenset({"", "unknown", "none", "none assigned", "(null)", "n/a", "invalid"})

_UNIT = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([KMGTP]?)", re.ASCII)
# Bound on the warnings a row list keeps: a garbage answer must not produce a garbage log.
_MAX_WARNINGS = 20

T = TypeVar("T")


class ParsedRows(list[T]):
    """A parser's rows, plus how many input rows could not be read and why.

    A watcher logs "sacct printed 1 unreadable row" rather than crashing on it; the warnings are
    capped so an answer full of junk stays a short log.
    """

    def __init__(self, rows: Iterable[T] = (), skipped: int = 0, warnings: Sequence[str] = ()) -> None:
        super().__init__(rows)
        self.skipped = skipped
        self.warnings: list[str] = list(warnings)[:_MAX_WARNINGS]

    def skip(self, why: str) -> None:
        """Count one unreadable input row; keep ``why`` while fewer than 20 reasons are kept."""
        self.skipped += 1
        if len(self.warnings) < _MAX_WARNINGS:
            self.warnings.append(why)


def clean(text: str) -> str:
    """``text`` stripped, or ``""`` when it is one of Slurm's "no value" spellings."""
    s = text.strip()
    return "" if s.lower() in NO_VALUE else s


def int_or_none(text: str) -> int | None:
    """A plain ASCII decimal below 20 digits, else ``None`` (``int()`` also takes ``"١٢"``, ``"1_2"``)."""
    s = text.strip()
    if s.isascii() and s.isdigit() and len(s) < 20:
        return int(s)
    return None


def parse_slurm_time(text: str, *, tz: tzinfo | None = None) -> datetime | None:
    """Parse a Slurm time: ISO ``2026-11-22T02:22:49`` or epoch seconds (``SLURM_TIME_FORMAT=%s``).

    Naive ISO times are in the clock of the process that ran the command; they are interpreted in
    ``tz`` (default: this process's local zone). Returns ``None`` for ``Unknown``/``None``/``0``/junk.
    """
    s = text.strip()
    if s.lower() in NO_VALUE:
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


def parse_duration(text: str) -> float | None:
    """Like :func:`parse_elapsed` but keeps the fraction (``TotalCPU`` prints ``00:16.358``)."""
    s = text.strip()
    whole = parse_elapsed(s)
    if whole is None:
        return None
    frac = re.search(r"\.([0-9]+)$", s)
    return whole + (float("0." + frac.group(1)) if frac else 0.0)


def parse_exit_code(text: str) -> tuple[int, int] | None:
    """``"3:0"`` → ``(3, 0)`` (exit code, signal); ``None`` if not of that form."""
    m = re.fullmatch(r"([0-9]+):([0-9]+)", text.strip(), re.ASCII)
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_size(text: str) -> float | None:
    """``438040K`` / ``224276480`` → bytes; ``None`` for anything else."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    try:
        return float(m.group(1)) * _UNIT[m.group(2)]
    except (OverflowError, ValueError):
        return None


def parse_tres(text: str) -> dict[str, int]:
    """``billing=2,cpu=2,gres/gpu=4,mem=8000M,node=2`` → ints; ``mem`` in bytes. Junk items are dropped."""
    out: dict[str, int] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            continue
        m = _SIZE.fullmatch(value.strip())
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


def parse_tres_usage(text: str) -> dict[str, float]:
    """``cpu=00:00:15,mem=224276480,gres/gpuutil=87`` → numbers; ``cpu`` in seconds. Never raises.

    Usage TRES differ from allocation TRES (:func:`parse_tres`): ``cpu`` is a *duration*, and
    memory-like TRES (``mem``, ``vmem``, ``gres/gpumem``, ``fs/disk``) are bytes that may carry
    ``K``/``M``/``G`` suffixes (sstat without ``--noconvert``). Junk items are dropped.
    """
    out: dict[str, float] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key:
            continue
        number = parse_duration(value) if ":" in value else parse_size(value)
        if number is not None:
            out[key] = number
    return out
