"""The job-keyed hand-off between the root prolog and the job's step 1 (``slurm_bt.node.prepare``).

Why a file: a prolog that exits non-zero drains the node and requeues the job held (slurm-facts.md
§1.5), so a problem the *user* caused must instead exit 0 and still make the job fail with a
readable reason (threats-and-faults.md R2). Hooks may not call Slurm commands, so the prolog leaves a
root-owned note per node and job, and step 1 of every slurm-bt job reads it before anything else:

    /run/slurm-bt/<node>/jobs/<job_id>/            0750 root:<job gid>
        prolog-error    0640  one line: why the prolog refused this job -> step 1 exits 1 with it
        prolog.json     0640  what the prolog prepared (team group, cache paths): trusted facts
                              that step 1 uses instead of recomputing them from user input

``<node>`` is in the path because the dev cluster runs two slurmds on one host. ``/run`` is cleared
at boot, which is right: the notes only matter while the job runs. The prolog clears the job's
directory first (a requeued job starts clean) and the epilog removes it.

The reader side (:func:`read_hook_state`) runs as the job user and imports nothing root-specific.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slurm_bt.errors import RuntimeFailure
from slurm_bt.trusted_files import read_trusted_file

__all__ = [
    "PROLOG_ERROR",
    "PROLOG_RECORD",
    "STATE_ROOT",
    "HookState",
    "PrologRefusedError",
    "job_state_path",
    "read_hook_state",
]

STATE_ROOT = "/run/slurm-bt"
PROLOG_ERROR = "prolog-error"
PROLOG_RECORD = "prolog.json"
_MAX_NOTE = 64 * 1024


class PrologRefusedError(RuntimeFailure):
    """The slurm-bt prolog refused this job on this node; the message says why and what to do."""


@dataclass(frozen=True)
class HookState:
    """What the prolog left for a job on one node.

    Attributes:
        error: the reason the prolog refused the job, or None.
        record: the prolog's record (``team``, ``project_cache``, ``team_cache``...), or None when
            no prolog prepared this job (then step 1 falls back to preparing everything itself).
    """

    error: str | None
    record: dict[str, Any] | None


def job_state_path(node: str, job_id: str, root: str = STATE_ROOT) -> str:
    """``<root>/<node>/jobs/<job_id>``."""
    return f"{root}/{node}/jobs/{job_id}"


def _read_root_note(path: str) -> bytes | None:
    """A small file that only root could have written, or None (absent, or not trustworthy)."""
    return read_trusted_file(path, max_bytes=_MAX_NOTE)


def read_hook_state(node: str, job_id: str, root: str = STATE_ROOT) -> HookState:
    """Read the prolog's notes for ``job_id`` on ``node`` (as the job user)."""
    base = job_state_path(node, job_id, root)
    raw_error = _read_root_note(f"{base}/{PROLOG_ERROR}")
    error = None
    if raw_error is not None:
        error = " ".join(raw_error.decode("utf-8", "replace").split()) or "refused (no reason recorded)"
    record = None
    raw = _read_root_note(f"{base}/{PROLOG_RECORD}")
    if raw is not None:
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        record = value if isinstance(value, dict) else None
    return HookState(error=error, record=record)
