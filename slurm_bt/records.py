"""Submission records: how later commands find a project's jobs without asking Slurm for everything.

One small JSON file per submitted job in the user's workspace, ``records/<job_id>.json``, published
atomically. Slurm stays the source of truth for *state*; the record holds what Slurm does not know
(project, truss job name, where the snapshot and logs are).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from slurm_bt.atomic import write_file_atomic

__all__ = ["SubmissionRecord", "list_records", "read_record", "write_record"]


class SubmissionRecord(BaseModel):
    """What was submitted, by whom, from where."""

    model_config = ConfigDict(extra="ignore", frozen=True)

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


def _records_dir(workspace: Path) -> Path:
    return workspace / "records"


def write_record(workspace: Path, record: SubmissionRecord) -> Path:
    """Publish ``record`` under the workspace (temp + fsync + rename)."""
    folder = _records_dir(workspace)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{record.job_id}.json"
    write_file_atomic(path, json.dumps(record.model_dump(), indent=2).encode() + b"\n", mode=0o600)
    return path


def read_record(workspace: Path, job_id: str) -> SubmissionRecord | None:
    """The record of ``job_id``, or ``None`` if this workspace never submitted it."""
    path = _records_dir(workspace) / f"{job_id}.json"
    try:
        return SubmissionRecord.model_validate_json(path.read_bytes())
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
            rec = SubmissionRecord.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue
        if project is None or project in (rec.project_name, rec.project_id):
            out.append(rec)
    return sorted(out, key=lambda r: (r.submitted_at, r.job_id), reverse=True)
