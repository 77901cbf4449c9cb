"""Bounded retries with exponential backoff and jitter for metadata calls (listing, HEAD)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from slurm_bt.errors import SourceUnavailableError

__all__ = ["backoff_delay_s", "retry_transient"]

T = TypeVar("T")


def backoff_delay_s(attempt: int, base_s: float = 0.2, cap_s: float = 5.0) -> float:
    """Full-jitter exponential backoff: uniform in ``[0, min(cap, base * 2**attempt)]``."""
    return random.uniform(0, min(cap_s, base_s * (2**attempt)))  # noqa: S311 - jitter, not crypto


def retry_transient(call: Callable[[], T], attempts: int, *, base_s: float = 0.2) -> T:
    """Run ``call``; on :class:`SourceUnavailableError` retry up to ``attempts`` times in all."""
    for attempt in range(max(1, attempts)):
        try:
            return call()
        except SourceUnavailableError:
            if attempt + 1 >= attempts:
                raise
            time.sleep(backoff_delay_s(attempt, base_s))
    raise AssertionError("unreachable")
