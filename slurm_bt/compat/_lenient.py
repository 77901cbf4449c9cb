"""Lenient construction: how the loader sees *every* mistake in a config.py at once.

A config builds its objects inside-out (``TrainingJob(compute=Compute(accelerator=...))``), so with
plain pydantic the innermost bad constructor raises first, without knowing where it sits in the
project, and hides every later mistake. While the loader executes a config it activates a
:class:`LenientState` through a context variable. The model base classes (``_base.py``) consult it:

* a constructor that fails validation does not raise; it records the raw keyword arguments and the
  errors and fills the instance the way ``model_construct`` would (an unvalidated *placeholder*);
* a validated assignment that fails does the same for the instance it was made on.

After the module has run, the loader replaces each placeholder by its raw arguments and validates
the whole project top-down, so pydantic reports each error with its full path. Outside the loader
the context variable is unset and the models behave exactly like upstream truss (they raise).

Only *outermost* constructor calls are lenient (``depth == 0``): objects that validators build
internally (for example ``Runtime`` migrating ``enable_cache`` into a ``CacheConfig``) must keep
raising, otherwise their errors would be swallowed into placeholders nobody references.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LenientState",
    "Record",
    "active_state",
    "contains_placeholder",
    "lenient_construction",
]


@dataclass
class Record:
    """What the loader needs to know about one placeholder.

    Attributes:
        obj: the placeholder itself (kept alive so that ``id(obj)`` stays unique).
        raw: the keyword arguments the config passed, plus later assignments, unvalidated.
        errors: ``ValidationError.errors()`` of the failed construction or assignment, with locs
            relative to ``obj``; empty when the failure was only a consequence of an invalid child.
    """

    obj: Any
    raw: dict[str, Any]
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class LenientState:
    """Per-load bookkeeping; one instance per :func:`load_training_project` call.

    Attributes:
        records: placeholders by ``id()``, in creation order.
        depth: how many model constructors are currently running (only depth 0 is lenient).
    """

    records: dict[int, Record] = field(default_factory=dict)
    depth: int = 0

    def record_for(self, obj: object) -> Record | None:
        """The placeholder record for ``obj``, or None when ``obj`` was validated normally."""
        rec = self.records.get(id(obj))
        return rec if rec is not None and rec.obj is obj else None


_STATE: contextvars.ContextVar[LenientState | None] = contextvars.ContextVar(
    "slurm_bt_compat_lenient", default=None
)


def active_state() -> LenientState | None:
    """The state of the load in progress, or None when models must behave like upstream."""
    return _STATE.get()


@contextlib.contextmanager
def lenient_construction(state: LenientState | None) -> Iterator[LenientState | None]:
    """Make model constructors lenient (``state``) or strict (``None``) for the ``with`` body.

    Passing None is how the loader switches leniency *off* again for its final top-down validation,
    which must raise normally.
    """
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)


def contains_placeholder(value: object, state: LenientState, _seen: set[int] | None = None) -> bool:
    """Whether ``value`` is, or contains (through models, lists, tuples and dicts), a placeholder.

    Used to tell a validator crash caused by an invalid child (tolerated: the child is reported)
    from a genuine exception raised by the config (re-raised and reported once).
    """
    seen = set() if _seen is None else _seen
    if id(value) in seen:
        return False
    seen.add(id(value))
    if state.record_for(value) is not None:
        return True
    if isinstance(value, Mapping):
        return any(contains_placeholder(v, state, seen) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(contains_placeholder(v, state, seen) for v in value)
    inner = getattr(value, "__dict__", None)
    if inner is not None and hasattr(value, "__pydantic_fields__"):
        extra = getattr(value, "__pydantic_extra__", None) or {}
        return any(contains_placeholder(v, state, seen) for v in (*inner.values(), *extra.values()))
    return False
