"""Status queries on a FakeSlurm: batching, fallbacks, requeue counts, staging jobs, arrays, degradation,
waiting with back-off, and the CLI verbs (status/view/list/stop) through CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_bt.cli import options
from slurm_bt.cli.main import cli
from slurm_bt.jobs.lifecycle import query_statuses, wait_for_jobs
from slurm_bt.records import SubmissionRecord, write_record
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.runner import CommandResult
from tests.fakes.fake_slurm import FakeSlurm, RecordedCall

SCRIPT = "#!/bin/sh\n#SBATCH -J train\nsleep 1\n"


@pytest.fixture()
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture()
def client(slurm: FakeSlurm) -> SlurmClient:
    return SlurmClient(slurm, sleep=lambda s: None)


def _record(job_id: str, project: str = "proj", staging: str | None = None,
            job_dir: str = "/nonexistent") -> SubmissionRecord:
    return SubmissionRecord(job_id=job_id, project_name=project, project_id=project, job_name="train",
                            submit_id="s", job_dir=job_dir, config_path="/c/config.py",
                            submitted_at=f"2026-01-01T00:{int(job_id) // 60:02d}:{int(job_id) % 60:02d}", user="alice",
                            staging_job_id=staging)


def test_many_jobs_one_sacct_call(slurm: FakeSlurm, client: SlurmClient) -> None:
    ids = [client.submit(SCRIPT) for _ in range(50)]
    slurm.set_state(ids[0], "PENDING", reason="Resources")
    slurm.set_state(ids[1], "RUNNING")
    slurm.finish(ids[2], exit_code=3)
    report = query_statuses(client, ids)
    assert len(slurm.calls_to("sacct")) == 1 and not slurm.calls_to("squeue")
    argv = slurm.calls_to("sacct")[0].argv
    assert "--duplicates" in argv and "--parsable2" in argv and "--noheader" in argv
    by = {s.job_id: s for s in report.statuses}
    assert by[ids[0]].status == "TRAINING_JOB_PENDING" and by[ids[0]].lifecycle.detail == "PENDING (Resources)"  # type: ignore[union-attr]
    assert by[ids[1]].status == "TRAINING_JOB_RUNNING"
    assert by[ids[2]].status == "TRAINING_JOB_FAILED" and "exit code 3:0" in by[ids[2]].lifecycle.detail  # type: ignore[union-attr]


def test_just_submitted_job_comes_from_squeue(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.sacct_lag.add(int(job))
    [st] = query_statuses(client, [job]).statuses
    assert st.row is not None and st.row.source == "squeue"
    assert st.status == "TRAINING_JOB_PENDING"
    assert "--states=all" in slurm.calls_to("squeue")[0].argv


def test_unknown_job_is_queued_not_an_error(slurm: FakeSlurm, client: SlurmClient) -> None:
    [st] = query_statuses(client, ["999"]).statuses
    assert st.status == "TRAINING_JOB_QUEUED" and st.row is None


def test_requeue_counted_from_duplicates(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.set_state(job, "RUNNING")
    slurm.requeue(job)
    slurm.set_state(job, "RUNNING")
    slurm.requeue(job)
    [st] = query_statuses(client, [job]).statuses
    assert st.status == "TRAINING_JOB_PENDING"
    # Each earlier run is listed with its cause (docs/long-runs.md); without a restart log, sacct's state.
    assert st.lifecycle is not None
    assert st.lifecycle.detail == "PENDING (BeginTime); requeued 2 times (requeued, requeued)"
    assert st.as_dict()["restarts"] == 2
    assert [r["run"] for r in st.as_dict()["runs"]] == [0, 1]


def test_cancelled_timeout_states(slurm: FakeSlurm, client: SlurmClient) -> None:
    a, b = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.set_state(a, "RUNNING")
    client.cancel(a)
    slurm.set_state(b, "TIMEOUT")
    st = {s.job_id: s for s in query_statuses(client, [a, b]).statuses}
    assert st[a].status == "TRAINING_JOB_STOPPED" and st[a].lifecycle.detail == "CANCELLED by 1000"  # type: ignore[union-attr]
    assert st[b].status == "TRAINING_JOB_FAILED" and st[b].lifecycle.detail == "TIMEOUT"  # type: ignore[union-attr]


def test_staging_job_from_record(slurm: FakeSlurm, client: SlurmClient) -> None:
    staging, train = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.set_state(staging, "RUNNING")
    slurm.set_state(train, "PENDING", reason="Dependency")
    records = {train: _record(train, staging=staging)}
    [st] = query_statuses(client, [train], records=records).statuses
    assert len(slurm.calls_to("sacct")) == 1  # the staging job rides in the same call
    assert staging in slurm.calls_to("sacct")[0].argv[-1]
    assert st.status == "TRAINING_JOB_CREATED" and "staging job RUNNING" in st.lifecycle.detail  # type: ignore[union-attr]
    slurm.finish(staging, exit_code=1)
    slurm.set_state(train, "CANCELLED", reason="DependencyNeverSatisfied")
    [st] = query_statuses(client, [train], records=records).statuses
    assert st.status == "TRAINING_JOB_DEPLOY_FAILED"
    assert st.as_dict()["staging_job_id"] == staging and st.as_dict()["staging_state"] == "FAILED"


def test_sacct_down_degrades_to_slurmctld(slurm: FakeSlurm, client: SlurmClient) -> None:
    live, done = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.set_state(live, "RUNNING")
    slurm.finish(done)
    slurm.fail_next("sacct", times=5)
    report = query_statuses(client, [live, done, "999"], retries=1)
    assert report.error is not None and "database" in str(report.error)
    assert len(slurm.calls_to("sacct")) == 2 and len(slurm.calls_to("squeue")) == 1
    st = {s.job_id: s for s in report.statuses}
    assert st[live].status == "TRAINING_JOB_RUNNING"
    assert st[done].status == "TRAINING_JOB_COMPLETED"  # still held by slurmctld (MinJobAge)
    assert st["999"].lifecycle is None and st["999"].status == "UNKNOWN"


def test_array_master_id_is_folded(slurm: FakeSlurm, client: SlurmClient) -> None:
    lines = "14_1|COMPLETED|None|\n14_2|FAILED|None|\n14_3|RUNNING|None|\n"

    def sacct(call: RecordedCall) -> CommandResult:
        return CommandResult(call.argv, 0, "", "")

    def squeue(call: RecordedCall) -> CommandResult:
        return CommandResult(call.argv, 0, "".join(f"{ln}n1|a|alice|1|\n" for ln in lines.split("\n") if ln), "")

    slurm.handle("sacct", sacct)
    slurm.handle("squeue", squeue)
    [st] = query_statuses(client, ["14"]).statuses
    assert st.members == 3 and st.status == "TRAINING_JOB_RUNNING"
    assert st.lifecycle is not None and "3 array tasks: 1 COMPLETED, 1 FAILED, 1 RUNNING" in st.lifecycle.detail


def test_wait_backs_off_and_tolerates_sacct_blips(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.set_state(job, "RUNNING")
    sleeps: list[float] = []
    warnings: list[str] = []
    now = [0.0]

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s
        if len(sleeps) == 2:
            slurm.fail_next("sacct", times=2)
        if len(sleeps) == 6:
            slurm.finish(job)

    report = wait_for_jobs(client, [job], timeout_s=600, sleep=sleep, clock=lambda: now[0],
                           on_warning=warnings.append)
    assert report.error is None and report.statuses[0].status == "TRAINING_JOB_COMPLETED"
    assert sleeps[:5] == [1.0, 2.0, 4.0, 8.0, 15.0]
    assert len(warnings) == 2 and "1/3 tolerated" in warnings[0]


def test_wait_ends_on_a_record_that_stays_preempted(slurm: FakeSlurm, client: SlurmClient) -> None:
    """PreemptMode=CANCEL: the record stays PREEMPTED (terminal to Slurm, PENDING to truss). The wait ends
    once it stayed so for the grace period, not at its timeout; a requeued job, whose PREEMPTED record
    the new run replaces within seconds, is still watched."""
    from slurm_bt.jobs.lifecycle import SETTLE_GRACE_S

    cancelled, requeued = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.set_state(cancelled, "PREEMPTED")
    slurm.set_state(requeued, "PREEMPTED")
    now = [0.0]
    polls = [0]

    def sleep(s: float) -> None:
        now[0] += s
        polls[0] += 1
        if polls[0] == 2:
            slurm.set_state(requeued, "PENDING")  # its new run
        if now[0] > 3 * SETTLE_GRACE_S:
            slurm.finish(requeued)

    report = wait_for_jobs(client, [cancelled], timeout_s=3600, sleep=sleep, clock=lambda: now[0])
    assert report.error is None and report.statuses[0].status == "TRAINING_JOB_PENDING"
    assert "PREEMPTED" in report.statuses[0].lifecycle.detail  # type: ignore[union-attr]
    assert SETTLE_GRACE_S <= now[0] < SETTLE_GRACE_S + 20
    now[0], polls[0] = 0.0, 0
    report = wait_for_jobs(client, [requeued], timeout_s=3600, sleep=sleep, clock=lambda: now[0])
    assert report.statuses[0].status == "TRAINING_JOB_COMPLETED" and now[0] > 3 * SETTLE_GRACE_S


def test_wait_gives_up_after_too_many_failures(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.fail_next("sacct", times=10)
    report = wait_for_jobs(client, [job], timeout_s=600, sleep=lambda s: None, on_warning=lambda w: None)
    assert report.error is not None
    assert len(slurm.calls_to("sacct")) == 4  # 3 tolerated, the 4th ends the wait


# ---------------------------------------------------------------------------------------- CLI


@pytest.fixture()
def cli_env(isolated_home: Path, slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    monkeypatch.setattr(options, "make_client", lambda: SlurmClient(slurm, sleep=lambda s: None))
    return slurm


def test_cli_status_table_and_json(cli_env: FakeSlurm, isolated_home: Path) -> None:
    client = SlurmClient(cli_env)
    job = client.submit(SCRIPT)
    cli_env.set_state(job, "PENDING", reason="Resources")
    write_record(isolated_home / "ws", _record(job, "alpha"))
    res = CliRunner().invoke(cli, ["view", job])
    assert res.exit_code == 0, res.output
    header, row = res.output.splitlines()
    assert header.split() == ["JOB", "ID", "PROJECT", "NAME", "STATUS", "SLURM", "NODES", "ELAPSED"]
    assert row.split()[:4] == [job, "alpha", "train", "TRAINING_JOB_PENDING"] and "PENDING (Resources)" in row
    res = CliRunner().invoke(cli, ["status", "--project", "alpha", "--json"])
    assert res.exit_code == 0 and json.loads(res.output)[0]["training_project"]["name"] == "alpha"


def test_cli_project_and_list_use_one_sacct_call(cli_env: FakeSlurm, isolated_home: Path) -> None:
    client = SlurmClient(cli_env)
    ids = [client.submit(SCRIPT) for _ in range(30)]
    for jid in ids:
        write_record(isolated_home / "ws", _record(jid, "beta" if int(jid) % 2 else "gamma"))
    before = len(cli_env.calls_to("sacct"))
    res = CliRunner().invoke(cli, ["status", "--project", "beta", "--json"])
    assert res.exit_code == 0
    assert len(json.loads(res.output)) == 15 and len(cli_env.calls_to("sacct")) == before + 1
    res = CliRunner().invoke(cli, ["list", "--limit", "5", "--json"])
    rows = json.loads(res.output)
    assert [r["id"] for r in rows] == sorted(ids, key=int, reverse=True)[:5]


def test_cli_usage_errors_exit_2(cli_env: FakeSlurm) -> None:
    assert CliRunner().invoke(cli, ["status"]).exit_code == 2
    res = CliRunner().invoke(cli, ["status", "12;rm"])
    assert res.exit_code == 2 and "not a Slurm job id" in res.output
    assert CliRunner().invoke(cli, ["stop", "-x"]).exit_code == 2


def test_cli_degraded_status_exits_1_naming_slurmdbd(cli_env: FakeSlurm, isolated_home: Path) -> None:
    job = SlurmClient(cli_env).submit(SCRIPT)
    write_record(isolated_home / "ws", _record(job))  # status shows only the caller's own jobs
    cli_env.set_state(job, "RUNNING")
    cli_env.fail_next("sacct", times=5)
    res = CliRunner().invoke(cli, ["status", job])
    assert res.exit_code == 1
    assert "TRAINING_JOB_RUNNING" in res.stdout and "slurmdbd unreachable" in res.stderr


def test_cli_stop_confirms(cli_env: FakeSlurm) -> None:
    client = SlurmClient(cli_env)
    a, b = client.submit(SCRIPT), client.submit(SCRIPT)
    cli_env.set_state(a, "RUNNING")
    cli_env.finish(b)
    res = CliRunner().invoke(cli, ["stop", a, b, "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in json.loads(res.output)}
    assert rows[a]["current_status"] == "TRAINING_JOB_STOPPED" and rows[a]["stopped"] is True
    assert rows[b]["already_finished"] is True and rows[b]["current_status"] == "TRAINING_JOB_COMPLETED"
    assert [c.argv for c in cli_env.calls_to("scancel")] == [("scancel", a)]


def test_cli_stop_unconfirmed_is_runtime_failure(cli_env: FakeSlurm) -> None:
    job = SlurmClient(cli_env).submit(SCRIPT)
    cli_env.set_state(job, "RUNNING")
    cli_env.handle("scancel", lambda call: CommandResult(call.argv, 0, "", ""))  # accepted, never acted on
    res = CliRunner().invoke(cli, ["stop", job, "--timeout", "0"])
    assert res.exit_code == 1 and "still run" in res.stderr
