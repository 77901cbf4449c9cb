"""Comments and docs cite only files in this repository.

Notes kept outside the repository (a threats list, Slurm observations, an API study, ``../shared``)
and the requirement codes they define (``R8``, ``P10``, ``F16``, ``E08``) mean nothing to a reader of
the repository; the facts the code relies on live in docs/ (Slurm behaviours: docs/footguns.md).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_NOTES = re.compile(r"threats-and-faults|slurm-facts|truss-train-api|transfer-perf\.md|\bstyle\.md|\bpeers\.md"
                    r"|\.\./shared")
# Requirement codes: one letter of the notes' series and two digits (R also one digit). ``R2`` is
# Cloudflare R2 and never matched; accelerator names such as ``B10`` are not in these series.
_CODES = re.compile(r"\b(?:[EPFL]\d{2}|R(?:[13-9]|\d{2}))\b")
_ALLOWED: set[tuple[str, str]] = set()  # (relative path, code) pairs that are legitimately part of a name


def _files() -> list[Path]:
    return sorted([*(ROOT / "slurm_bt").rglob("*.py"), *(ROOT / "docs").glob("*.md"),
                   ROOT / "README.md", ROOT / "prolog" / "README.md", ROOT / "epilog" / "README.md"])


def test_no_citation_of_notes_outside_the_repository() -> None:
    bad = []
    for path in _files():
        rel = str(path.relative_to(ROOT))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _NOTES.search(line):
                bad.append(f"{rel}:{n}: {line.strip()}")
            bad += [f"{rel}:{n}: {m.group()}: {line.strip()}" for m in _CODES.finditer(line)
                    if (rel, m.group()) not in _ALLOWED]
    assert bad == []


def test_the_checks_catch_what_they_are_for() -> None:
    assert _NOTES.search("(threats-and-faults.md R7)") and _NOTES.search("see ../shared/x.md")
    assert [m.group() for m in _CODES.finditer("(R8, P11, F16, E08, L06, R2 bucket, B10, H100, S3)")] == [
        "R8", "P11", "F16", "E08", "L06"]
