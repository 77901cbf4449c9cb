"""``allow_patterns`` / ``ignore_patterns`` with truss semantics.

Truss's docs call these "Unix shell-style wildcards", but its loader (truss-transfer
``create/filter.rs``) implements something narrower, and configs written for Baseten rely on that:

* only ``*`` is a wildcard, and it also matches ``/`` (so ``*.safetensors`` selects files at any
  depth, and ``sub/*`` selects everything below ``sub/``);
* ``?`` and ``[...]`` are literal characters;
* a pattern without ``*`` must equal the path exactly;
* ignore patterns are checked first and a match excludes the file; when allow patterns are given,
  a file must match at least one of them;
* matching is on the POSIX path relative to the repository root or the object-store prefix.

An empty allow list is treated like ``None`` (no allow filter), as an empty ``Vec`` is in the
reference. An empty *result* is an error, raised by :func:`select_paths`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from slurm_bt.errors import Problem, SourceSpecError

__all__ = ["filter_paths", "matches", "select_paths"]


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    # re.escape makes ?, [ and ] literal; DOTALL so that '*' also matches a newline in a key.
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def matches(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern`` (only ``*`` is special and it matches ``/``)."""
    return _compile(pattern).fullmatch(path) is not None


def filter_paths(
    paths: Iterable[str], allow: Sequence[str] | None = None, ignore: Sequence[str] | None = None
) -> list[str]:
    """The paths kept by the filters, in input order (ignore first, then allow)."""
    kept = []
    for path in paths:
        if ignore and any(matches(p, path) for p in ignore):
            continue
        if allow and not any(matches(p, path) for p in allow):
            continue
        kept.append(path)
    return kept


def select_paths(
    source: str,
    paths: Iterable[str],
    allow: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> list[str]:
    """Like :func:`filter_paths`, but nothing left is the user's mistake, reported as such.

    Raises:
        SourceSpecError: no file of ``source`` survives the filters (or the source is empty).
    """
    all_paths = list(paths)
    kept = filter_paths(all_paths, allow, ignore)
    if not kept:
        if not all_paths:
            msg = "the source contains no files"
        else:
            msg = (
                f"No files matched weights filters (allow_patterns={list(allow or [])!r}, "
                f"ignore_patterns={list(ignore or [])!r}) among {len(all_paths)} files"
            )
        raise SourceSpecError(source, [Problem("", msg)])
    return kept
