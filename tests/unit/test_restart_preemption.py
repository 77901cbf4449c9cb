"""The batch script's helper after a preemption, per Slurm release (slurm_bt/steps/restart.py).

On 22.05 it requeues the preempted run itself (the preemptor starts as soon as the checkpoint is
saved). On later releases it leaves the requeue to Slurm: on 24.11 a self-requeue raced the
preemption's own requeue and Slurm requeued the NEXT run again when it completed (docs/slurm-releases.md;
the real-cluster check is tests/integration/test_long_runs.py::test_preemption_saves_requeues_and_resumes).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurm_bt.job_spec import JobSpec
from slurm_bt.jobs.restarts import read_log
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.jobctl import JobFacts
from slurm_bt.slurm.release import SlurmRelease, parse_release
from slurm_bt.slurm.runner import SubprocessRunner
from slurm_bt.steps import restart
from tests.unit.test_restarts import make_spec


def _run_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: SlurmRelease | None,
               grace_left_s: float | None) -> list[str]:
    spec = make_spec(tmp_path / "job")
    Path(spec.context.job_dir).mkdir(parents=True, exist_ok=True)
    calls: list[str] = []
    now = time.time()
    fields = {"PreemptTime": str(int(now) - 2), "StartTime": str(int(now) - 60),
              "EndTime": "Unknown" if grace_left_s is None else str(int(now + grace_left_s)), "Restarts": "0"}
    monkeypatch.setattr(restart, "job_facts", lambda client, job_id: JobFacts(fields))
    monkeypatch.setattr(restart, "slurm_release", lambda client: release)
    monkeypatch.setattr(restart, "requeue_job", lambda client, job_id: calls.append("requeue"))
    monkeypatch.setattr(time, "sleep", lambda s: calls.append(f"sleep {round(s / 10) * 10}"))
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    rc = restart._after(spec, SlurmClient(SubprocessRunner()), "77", 143, False)
    assert rc == 0
    assert [e.cause for e in read_log(spec.context.job_dir, "77")] == ["preempted"]
    return calls


def test_22_05_requeues_a_preempted_run_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run_after(tmp_path, monkeypatch, parse_release("22.05.8"), 18) == ["requeue", "sleep 600"]


@pytest.mark.parametrize("release", ["24.11.5", "26.05.5", None])
def test_later_releases_leave_the_requeue_to_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   release: str | None) -> None:
    # The wait runs until the end of GraceTime (EndTime) plus a margin; only if Slurm has not ended the
    # run by then (this process is still alive) does the helper requeue it as before.
    calls = _run_after(tmp_path, monkeypatch, parse_release(release) if release else None, 18)
    assert calls == ["sleep 50", "requeue", "sleep 600"]


def test_wait_without_an_end_time_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _run_after(tmp_path, monkeypatch, parse_release("24.11.5"), None)
    assert calls[0] == "sleep 240" and calls[1:] == ["requeue", "sleep 600"]  # stop_grace_s 120 + 120


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
