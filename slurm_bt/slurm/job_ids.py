"""Parse and format Slurm job ids as they appear in sbatch, sacct, squeue and scontrol output.

Slurm prints one textual id for many different things, and status code that treats them all as
``int(job_id)`` silently merges array tasks, het components and steps. The grammar accepted here::

    job_id   := base [ "_" task | "_[" spec "]" ] [ "+" het ] [ "." step ]
    base     := digits                        123
    task     := digits                        123_4        (one array task)
    spec     := [0-9,:%-]+                    123_[1-3%2]  (pending array tasks, as sacct/squeue print)
    het      := digits                        123+0        (heterogeneous job component)
    step     := "batch" | "extern" | "interactive" | digits [ "+" digits ]
                                              123.batch, 123.0, 123_4.batch, 123.0+1 (het step)

Only ASCII digits are accepted: ``int()`` alone would also take ``"١٢٣"`` and ``"1_2"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["STEP_NAMES", "JobId", "format_job_id", "job_id_args", "parse_job_id", "try_parse_job_id"]

#: Named steps Slurm creates itself; numbered steps come from ``srun``.
STEP_NAMES = frozenset({"batch", "extern", "interactive"})

_JOB_ID_RE = re.compile(
    r"(?P<base>[0-9]+)"
    r"(?:_(?:(?P<task>[0-9]+)|\[(?P<spec>[0-9,:%\-]+)\]))?"
    r"(?:\+(?P<het>[0-9]+))?"
    r"(?:\.(?P<step>batch|extern|interactive|[0-9]+(?:\+[0-9]+)?))?",
    re.ASCII,
)


@dataclass(frozen=True, order=True)
class JobId:
    """One Slurm job, array task, het component or step id.

    Attributes:
        base: the leading number: the job id, or the array *master* id for array tasks.
        array_task: the task index of ``123_4``; ``None`` otherwise.
        array_spec: the bracket contents of ``123_[1-3%2]`` (still-pending tasks); ``None`` otherwise.
        het_offset: the component of ``123+0``; ``None`` for non-het jobs.
        step: ``"batch"``, ``"extern"``, ``"interactive"`` or a step number like ``"0"``/``"0+1"``;
            ``None`` for the job (allocation) itself.
    """

    base: int
    array_task: int | None = None
    array_spec: str | None = None
    het_offset: int | None = None
    step: str | None = None

    def __post_init__(self) -> None:
        # Validate by round-tripping so that hand-built ids cannot format into something unparsable.
        if self.base < 0 or (self.array_task is not None and self.array_task < 0):
            raise ValueError(f"negative job id component in {self!r}")
        if self.het_offset is not None and self.het_offset < 0:
            raise ValueError(f"negative het offset in {self!r}")
        if self.array_task is not None and self.array_spec is not None:
            raise ValueError("a job id has an array task or an array spec, not both")
        if _JOB_ID_RE.fullmatch(str(self)) is None:
            raise ValueError(f"not a valid Slurm job id: {str(self)!r}")

    def __str__(self) -> str:
        return format_job_id(self)

    @property
    def is_step(self) -> bool:
        """True for step rows (``.batch``, ``.extern``, ``.0``) that sacct lists without ``-X``."""
        return self.step is not None

    @property
    def is_array(self) -> bool:
        """True for an array task or a pending array range."""
        return self.array_task is not None or self.array_spec is not None

    @property
    def job(self) -> JobId:
        """This id without its step: the allocation a step belongs to."""
        if self.step is None:
            return self
        return JobId(self.base, self.array_task, self.array_spec, self.het_offset)


def format_job_id(job_id: JobId) -> str:
    """Format a :class:`JobId` exactly as Slurm prints it (``parse_job_id`` inverts this)."""
    out = str(job_id.base)
    if job_id.array_task is not None:
        out += f"_{job_id.array_task}"
    elif job_id.array_spec is not None:
        out += f"_[{job_id.array_spec}]"
    if job_id.het_offset is not None:
        out += f"+{job_id.het_offset}"
    if job_id.step is not None:
        out += f".{job_id.step}"
    return out


@lru_cache(maxsize=8192)
def parse_job_id(text: str) -> JobId:
    """Parse one job id such as ``123``, ``123_4``, ``123_[1-3%2]``, ``123+0`` or ``123_4.batch``.

    Surrounding whitespace is ignored; anything else that does not fit the grammar in the module
    docstring is rejected. Cached: a status query parses each id several times (argument, argv,
    sacct row) and :class:`JobId` is immutable.

    Raises:
        ValueError: ``text`` is not a Slurm job id.
    """
    m = _JOB_ID_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not a Slurm job id: {text!r}")
    task, het = m.group("task"), m.group("het")
    return JobId(
        base=int(m.group("base")),
        array_task=int(task) if task is not None else None,
        array_spec=m.group("spec"),
        het_offset=int(het) if het is not None else None,
        step=m.group("step"),
    )


def try_parse_job_id(text: str) -> JobId | None:
    """Like :func:`parse_job_id` but returns ``None`` instead of raising, for tolerant parsers."""
    try:
        return parse_job_id(text)
    except ValueError:
        return None


def job_id_args(job_ids: Iterable[str | int | JobId]) -> list[str]:
    """``job_ids`` as Slurm spells them, each one validated first.

    Every command that takes ids (sacct, squeue, sstat, scancel) goes through this, so a value such
    as ``-a`` or ``1,2 --allusers`` can never become an option of the command.

    Raises:
        ValueError: an id is malformed.
    """
    return [str(j) if isinstance(j, JobId) else str(parse_job_id(str(j))) for j in job_ids]
