"""Submission records: how later commands find a project's jobs without asking Slurm for everything.

One small JSON file per submitted job in the user's workspace, ``records/<job_id>.json``, published
atomically. Slurm stays the source of truth for *state*; the record holds what Slurm does not know
(project, truss job name, where the snapshot and logs are).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["SubmissionRecord", "list_records", "read_record", "select_records", "write_record"]


@dataclass(frozen=True)
class SubmissionRecord:
    """What was submitted, by whom, from where.

    A plain dataclass, not a pydantic model: ``slurm-bt status --project`` reads a thousand of
    these before its one ``sacct`` call, and importing pydantic alone costs more than that call.
    """

    job_id: str
    project_name: str
    project_id: str
    job_name: str
    submit_id: str
    job_dir: str
    config_path: str
    submitted_at: str
    user: str
    #: The separate weights-staging job this job depends on (``--dependency=afterok``), if any.
    staging_job_id: str | None = None
    #: How many weights sources the job declared: ``slurm-bt status`` reads the job dir's weights
    #: status files only when this is non-zero (records written before it existed say 0).
    weights_sources: int = 0

    @classmethod
    def from_json(cls, raw: bytes | str) -> SubmissionRecord:
        """Parse and type-check one record file; unknown keys (from newer versions) are ignored.

        Raises:
            ValueError: not JSON, a required key is missing, or a value has the wrong type.
        """
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("a submission record is a JSON object")
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is not MISSING:  # written before this field existed
                    continue
                raise ValueError(f"missing {f.name}")
            value = data[f.name]
            if f.name == "weights_sources":
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
            elif f.name == "staging_job_id":
                ok = value is None or isinstance(value, str)
            else:
                ok = isinstance(value, str)
            if not ok:
                raise ValueError(f"{f.name} has the wrong type")
            values[f.name] = value
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """The JSON-ready mapping written to the record file."""
        return asdict(self)



def _records_dir(workspace: Path) -> Path:
    return workspace / "records"


def write_record(workspace: Path, record: SubmissionRecord) -> Path:
    """Publish ``record`` under the workspace (temp + fsync + rename)."""
    from slurm_bt.atomic import write_file_atomic  # ctypes and secrets: only writers pay for them

    folder = _records_dir(workspace)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{record.job_id}.json"
    write_file_atomic(path, json.dumps(record.as_dict(), indent=2).encode() + b"\n", mode=0o600)
    return path


def read_record(workspace: Path, job_id: str) -> SubmissionRecord | None:
    """The record of ``job_id``, or ``None`` if this workspace never submitted it."""
    path = _records_dir(workspace) / f"{job_id}.json"
    try:
        return SubmissionRecord.from_json(path.read_bytes())
    except (OSError, ValueError):
        return None


def list_records(workspace: Path, project: str | None = None) -> list[SubmissionRecord]:
    """Every readable record, newest first; only ``project``'s (name or id) when given."""
    out = []
    folder = _records_dir(workspace)
    if not folder.is_dir():
        return []
    for path in folder.glob("*.json"):
        try:
            rec = SubmissionRecord.from_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        if project is None or project in (rec.project_name, rec.project_id):
            out.append(rec)
    return sorted(out, key=lambda r: (r.submitted_at, r.job_id), reverse=True)


def select_records(
    workspace: Path, job_ids: Sequence[str] = (), project: str | None = None, *, everything: bool = False
) -> dict[str, SubmissionRecord]:
    """The records of ``job_ids``, or all of ``project``'s, or all (``everything``), newest first."""
    if project is not None or everything:
        return {r.job_id: r for r in list_records(workspace, project)}
    from slurm_bt.slurm.job_ids import try_parse_job_id

    out = {}
    for jid in job_ids:
        # The one job-id parser (slurm_bt.slurm.job_ids), not a rule of its own: only a Slurm job id
        # names a record file, so no other text becomes a path under records/.
        rec = read_record(workspace, jid) if try_parse_job_id(jid) is not None else None
        if rec is not None:
            out[jid] = rec
    return out

