"""The batch script's restart helper where Slurm releases differ (slurm_bt/steps/restart.py,
docs/slurm-releases.md "Behaviour that differs between releases").

25.11+ holds a failed ``--requeue=expedite`` job (REQUEUE_HOLD) instead of ending it FAILED: a job
failing for good is made non-requeueable first. Real cluster: the failing-job tests of
tests/integration/test_lifecycle.py and test_hooks_jobs.py on 26.05 (releases.py test sid).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_bt.job_spec import JobSpec
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.jobctl import JobFacts
from slurm_bt.slurm.release import parse_release
from slurm_bt.slurm.runner import SubprocessRunner
from slurm_bt.steps import restart
from tests.unit.test_restarts import make_spec

# -- --requeue=expedite (25.11+): a job that fails for good must not be left held -------------------------


def _failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str) -> tuple[list[str], JobSpec]:
    calls: list[str] = []
    monkeypatch.setattr(restart, "job_facts", lambda client, job_id: JobFacts({"EndTime": "Unknown"}))
    monkeypatch.setattr(restart, "slurm_release", lambda client: parse_release(release))
    monkeypatch.setattr(restart, "requeue_job", lambda client, job_id: calls.append("requeue"))
    monkeypatch.setattr(restart, "set_requeueable", lambda client, job_id, on: calls.append(f"requeueable={on}"))
    monkeypatch.setattr(time, "sleep", lambda s: calls.append("sleep"))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    spec = make_spec(tmp_path / "job", env={"BT_MAX_RESTARTS": "2"})
    Path(spec.context.job_dir).mkdir(parents=True, exist_ok=True)
    return calls, spec


@pytest.mark.parametrize(("release", "expected"), [("26.05.5", ["requeueable=False"]), ("24.11.5", []),
                                                   ("22.05.8", [])])
def test_a_failed_run_is_made_non_requeueable_where_slurm_would_hold_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: str, expected: list[str]) -> None:
    calls, spec = _failing(tmp_path, monkeypatch, release)
    client = SlurmClient(SubprocessRunner())
    # the start commands failed, no retry: the job fails (exit 3)
    assert restart._after(spec, client, "77", 3, False) == 3
    assert calls == expected
    # step 1 failed on a first run (e.g. the prolog refused the job)
    calls.clear()
    assert restart._prepare_failed(spec, client, "77", 1) == 1
    assert calls == expected


def test_a_completed_or_requeued_run_stays_requeueable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, spec = _failing(tmp_path, monkeypatch, "26.05.5")
    client = SlurmClient(SubprocessRunner())
    assert restart._after(spec, client, "77", 0, False) == 0
    assert calls == []
    assert restart._after(spec, client, "77", 0, True) == 0  # time limit: requeued
    assert calls == ["requeue", "sleep"]


def test_unreadable_job_json_still_fails_the_job_for_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls, _ = _failing(tmp_path, monkeypatch, "26.05.5")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert restart.main(["after", str(tmp_path / "missing.json"), "3", "0"]) == 3
    assert calls == ["requeueable=False"]
