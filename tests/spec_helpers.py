"""Shared helpers for tests that build JobSpecs deterministically (no clock, no pwd, no randomness)."""

from __future__ import annotations

from pathlib import Path

from slurm_bt.compat.loader import load_training_project
from slurm_bt.job_spec import JobSpec, SubmitContext, build_job_spec
from slurm_bt.site.settings import SiteSettings

GOLDEN = Path(__file__).parent / "golden"


def fixed_context(config_path: Path, *, source: str | None = None) -> SubmitContext:
    """A SubmitContext that renders identically on every machine."""
    return SubmitContext(
        config_path=f"/home/alice/work/{config_path.name}",
        source=source or config_path.name,
        submit_id="20260101T000000Z-0123abcd",
        user="alice",
        uid=1001,
        home="/home/alice",
        job_dir="/home/alice/.slurm-bt/projects/p/jobs/20260101T000000Z-0123abcd",
        python="/opt/slurm-bt/venv/bin/python",
        version="0.1.0",
    )


def spec_for(config_path: Path, site: SiteSettings | None = None) -> JobSpec:
    """Load a config file and translate it with a fixed context."""
    project = load_training_project(config_path)
    return build_job_spec(project, site or SiteSettings(), fixed_context(config_path))
