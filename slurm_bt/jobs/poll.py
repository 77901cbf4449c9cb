"""Polling discipline: how often a waiting or following client may ask Slurm, and how failures count.

Users leave ``slurm-bt logs --follow`` running for hours; multiplied by a cluster's users, a naive
1 s poll is exactly the "sacct running continuously" complaint admins file against tools
(Snakemake-Profiles/slurm#74, reframe-hpc/reframe#283). So:

* one batched query per poll, whatever the number of jobs;
* exponential back-off (:class:`Backoff`): start fast, because a job just submitted changes state
  in seconds, then slow down to a ceiling; submitit uses 0/2/4/8 s then a long delay;
* a few consecutive failures are tolerated with a warning (:class:`FailureBudget`): slurmdbd
  restarts and controller fail-overs last seconds and must not kill a follow that ran for hours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FOLLOW_BACKOFF", "MAX_CONSECUTIVE_FAILURES", "Backoff", "FailureBudget"]

#: Consecutive failed polls tolerated (each with a warning) before a follower gives up.
MAX_CONSECUTIVE_FAILURES = 3


@dataclass
class Backoff:
    """Delays that start at ``initial_s`` and grow by ``factor`` up to ``max_s``.

    Attributes:
        initial_s: the first delay.
        max_s: the ceiling.
        factor: growth per call of :meth:`next`.
    """

    initial_s: float = 2.0
    max_s: float = 30.0
    factor: float = 2.0
    _current: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.max_s) or self.factor < 1:
            raise ValueError(f"bad back-off: initial {self.initial_s}, max {self.max_s}, factor {self.factor}")
        self._current = self.initial_s

    def next(self) -> float:
        """The delay to wait now; the following one is longer (up to the ceiling)."""
        delay = self._current
        self._current = min(self._current * self.factor, self.max_s)
        return delay

    def reset(self) -> None:
        """Start again from ``initial_s`` (something changed: the job is likely to change again)."""
        self._current = self.initial_s


#: Job-state polling while following logs: 2 s (truss's tail interval), doubling to 30 s. Log
#: *files* are read far more often; they cost the controller nothing.
FOLLOW_BACKOFF = (2.0, 30.0)


@dataclass
class FailureBudget:
    """Counts consecutive failures; :meth:`failed` says whether to keep going.

    Attributes:
        max_consecutive: failures in a row that are still tolerated.
    """

    max_consecutive: int = MAX_CONSECUTIVE_FAILURES
    consecutive: int = 0
    last_error: str = ""

    def failed(self, error: str) -> bool:
        """Record one failure; True while the budget is not exhausted."""
        self.consecutive += 1
        self.last_error = error
        return self.consecutive <= self.max_consecutive

    def succeeded(self) -> None:
        """A poll worked: forget earlier failures."""
        self.consecutive = 0
        self.last_error = ""

    def warning(self) -> str:
        """One line for the user about the current failure streak."""
        return (f"status query failed ({self.consecutive}/{self.max_consecutive} tolerated): "
                f"{self.last_error}")
