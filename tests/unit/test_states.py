"""Slurm states as data, and the truss lifecycle mapping table (states.py module docstring)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_bt.slurm.states import (
    ACTIVE_STATES,
    PENDING_STATES,
    STATE_CODES,
    TERMINAL_STATES,
    SlurmState,
    TrainingJobStatus,
    base_state,
    lifecycle,
)

S = TrainingJobStatus


def test_every_state_is_classified_exactly_once() -> None:
    assert len(SlurmState) == 24  # squeue(1) 22.05 §JOB STATE CODES
    groups = [TERMINAL_STATES, PENDING_STATES, ACTIVE_STATES]
    for state in SlurmState:
        assert sum(state in g for g in groups) == 1, state
    assert set(STATE_CODES.values()) == set(SlurmState)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("CANCELLED by 0", SlurmState.CANCELLED),
        ("PD", SlurmState.PENDING),
        ("running", SlurmState.RUNNING),
        ("COMPLETING+", SlurmState.COMPLETING),
        ("OOM", SlurmState.OUT_OF_MEMORY),
        ("", None),
        ("WEIRD", None),
    ],
)
def test_from_text(text: str, expected: SlurmState | None) -> None:
    assert SlurmState.from_text(text) is expected


# (slurm_state, kwargs, status, detail)
TABLE: list[tuple[str | None, dict[str, object], TrainingJobStatus, str]] = [
    (None, {}, S.QUEUED, "UNKNOWN"),
    ("PENDING", {"reason": "Resources"}, S.PENDING, "PENDING (Resources)"),
    ("PENDING", {"reason": "None"}, S.PENDING, "PENDING"),
    ("PENDING", {"reason": "BeginTime", "restarts": 2}, S.PENDING, "PENDING (BeginTime); requeued 2 times"),
    (
        "PENDING",
        {"reason": "Dependency", "staging_state": "PENDING"},
        S.PENDING,
        "PENDING (Dependency); staging job PENDING",
    ),
    (
        "PENDING",
        {"reason": "Dependency", "staging_state": "RUNNING"},
        S.CREATED,
        "PENDING (Dependency); staging job RUNNING",
    ),
    (
        "PENDING",
        {"reason": "Resources", "staging_state": "COMPLETED"},
        S.CREATED,
        "PENDING (Resources); staging job COMPLETED",
    ),
    (
        "PENDING",
        {"reason": "DependencyNeverSatisfied", "staging_state": "FAILED"},
        S.DEPLOY_FAILED,
        "PENDING (DependencyNeverSatisfied); staging job FAILED",
    ),
    (
        "CANCELLED by 0",
        {"reason": "Dependency", "staging_state": "TIMEOUT"},
        S.DEPLOY_FAILED,
        "CANCELLED by 0 (Dependency); staging job TIMEOUT",
    ),
    (  # 24.11 and 26.05: the job cancelled for its failed staging job keeps no reason, only Start=None
        "CANCELLED",
        {"reason": "None", "staging_state": "FAILED", "started": False},
        S.DEPLOY_FAILED,
        "CANCELLED; staging job FAILED",
    ),
    (  # 22.05, right after slurmctld cancels the dependent job: no reason yet, Start = End set
        "CANCELLED",
        {"reason": "None", "staging_state": "FAILED", "started": True},
        S.DEPLOY_FAILED,
        "CANCELLED; staging job FAILED",
    ),
    (  # a job that ran and was then cancelled by its user stays STOPPED, whatever its staging job did
        "CANCELLED by 1001",
        {"reason": "None", "staging_state": "FAILED", "started": True},
        S.STOPPED,
        "CANCELLED by 1001; staging job FAILED",
    ),
    (
        "PENDING",
        {"reason": "launch failed requeued held"},
        S.DEPLOY_FAILED,
        "PENDING (launch failed requeued held)",
    ),
    (
        "CANCELLED",
        {"reason": "Prolog failure on node n1"},
        S.DEPLOY_FAILED,
        "CANCELLED (Prolog failure on node n1)",
    ),
    ("PENDING", {"reason": "Prolog"}, S.PENDING, "PENDING (Prolog)"),
    ("BOOT_FAIL", {}, S.DEPLOY_FAILED, "BOOT_FAIL"),
    ("CONFIGURING", {}, S.DEPLOYING, "CONFIGURING"),
    ("RUNNING", {"reason": "None"}, S.RUNNING, "RUNNING"),
    ("RUNNING", {"reason": "Prolog"}, S.DEPLOYING, "RUNNING (Prolog)"),  # squeue, recorded on 22.05
    ("COMPLETING", {}, S.RUNNING, "COMPLETING"),
    ("SUSPENDED", {}, S.RUNNING, "SUSPENDED"),
    (
        "COMPLETED",
        {"reason": "BeginTime", "exit_code": (0, 0), "restarts": 1},
        S.COMPLETED,
        "COMPLETED; requeued 1 time",
    ),
    ("CANCELLED by 1001", {}, S.STOPPED, "CANCELLED by 1001"),
    ("CANCELLED", {"cancelled_by": 0, "exit_code": (0, 15)}, S.STOPPED, "CANCELLED by 0; exit code 0:15"),
    ("FAILED", {"exit_code": (3, 0)}, S.FAILED, "FAILED; exit code 3:0"),
    ("FAILED", {"exit_code": (0, 9), "reason": "JobArrayTaskLimit"}, S.FAILED, "FAILED; exit code 0:9"),
    ("TIMEOUT", {"exit_code": (0, 0)}, S.FAILED, "TIMEOUT"),
    ("OUT_OF_MEMORY", {}, S.FAILED, "OUT_OF_MEMORY"),
    ("NODE_FAIL", {}, S.FAILED, "NODE_FAIL"),
    ("DEADLINE", {}, S.FAILED, "DEADLINE"),
    ("PREEMPTED", {}, S.PENDING, "PREEMPTED"),
    ("REQUEUED", {"restarts": 1}, S.PENDING, "REQUEUED; requeued 1 time"),
    ("REQUEUE_HOLD", {"reason": "JobHeldUser"}, S.PENDING, "REQUEUE_HOLD (JobHeldUser)"),
    ("FUTURE_FAIL", {}, S.FAILED, "FUTURE_FAIL"),
    ("FUTURE_WAIT", {"reason": "Stars"}, S.PENDING, "FUTURE_WAIT (Stars)"),
]


@pytest.mark.parametrize(("state", "kwargs", "status", "detail"), TABLE)
def test_lifecycle_table(
    state: str | None, kwargs: dict[str, object], status: TrainingJobStatus, detail: str
) -> None:
    got = lifecycle(state, **kwargs)  # type: ignore[arg-type]
    assert (got.status, got.detail) == (status, detail)


def test_terminal_flags() -> None:
    preempted = lifecycle("PREEMPTED")
    assert not preempted.terminal and preempted.slurm_terminal  # documented mismatch
    assert lifecycle("COMPLETED").terminal and lifecycle("CANCELLED by 0").terminal
    assert not lifecycle("RUNNING").terminal and not lifecycle("RUNNING").slurm_terminal


def test_every_slurm_state_maps() -> None:
    for state in SlurmState:
        got = lifecycle(state.value, reason="Resources")
        assert state.value in got.detail
        assert got.terminal == (
            state in TERMINAL_STATES and state is not SlurmState.PREEMPTED and state is not SlurmState.REVOKED
        ), state


def test_base_state() -> None:
    assert base_state("CANCELLED by 0") == "CANCELLED"
    assert base_state("  ") == ""


@given(
    st.one_of(st.none(), st.text()),
    st.one_of(st.none(), st.text()),
    st.one_of(st.none(), st.text()),
    st.integers(0, 10),
)
def test_lifecycle_never_raises(
    state: str | None, reason: str | None, staging: str | None, restarts: int
) -> None:
    got = lifecycle(state, reason=reason, staging_state=staging, restarts=restarts)
    assert isinstance(got.status, TrainingJobStatus)
    assert got.detail
