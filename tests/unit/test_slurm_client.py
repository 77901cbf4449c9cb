"""SlurmClient against the injected FakeSlurm (no subprocess patching) and SubprocessRunner basics."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from slurm_bt.errors import SlurmCommandError
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.job_ids import JobId
from slurm_bt.slurm.runner import CommandResult, CommandRunner, SubprocessRunner, scrubbed_env
from slurm_bt.slurm.sacct import latest_runs
from slurm_bt.slurm.states import TrainingJobStatus, lifecycle

try:
    from tests.fakes.fake_slurm import FakeSlurm, RecordedCall
except ModuleNotFoundError:  # `pytest` without the repo root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.fakes.fake_slurm import FakeSlurm, RecordedCall

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
SCRIPT = "#!/bin/bash\n#SBATCH --job-name=train\necho hi\n"
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/alice",
    "USER": "alice",
    "LANG": "C.UTF-8",
    "LC_ALL": "C",
    "HF_TOKEN": "hf_secret",
    "AWS_SECRET_ACCESS_KEY": "s3cr3t",
    "SLURM_JOB_ID": "9",
    "SBATCH_ACCOUNT": "x",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "TZ": "UTC",
}


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def client(slurm: FakeSlurm) -> SlurmClient:
    return SlurmClient(slurm, environ=ENV, sleep=lambda s: None)


def test_fake_is_a_command_runner(slurm: FakeSlurm) -> None:
    assert isinstance(slurm, CommandRunner) and isinstance(SubprocessRunner(), CommandRunner)


def test_submit_sends_script_on_stdin_with_scrubbed_env(slurm: FakeSlurm, client: SlurmClient) -> None:
    job_id = client.submit(SCRIPT, ["--nodes=2", "--gres=gpu:h100:2"], ENV)
    assert job_id == "100"
    (call,) = slurm.calls
    assert call.argv == ("sbatch", "--parsable", "--nodes=2", "--gres=gpu:h100:2")
    assert call.stdin == SCRIPT
    assert call.env is not None
    assert set(call.env) == {"PATH", "HOME", "USER", "LANG", "LC_ALL", "SLURM_CONF", "TZ"}
    assert "hf_secret" not in repr(call.env) and "s3cr3t" not in repr(call.env)
    assert slurm.job(job_id).name == "train" and slurm.job(job_id).nodes == 2


def test_every_command_gets_a_scrubbed_env(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT, ["--hold"])
    client.release(job)
    client.query([job])
    client.usage([job])
    client.live_usage([job])
    client.live([job])
    client.cancel(job)
    client.node_addr("n1")
    client.nodes()
    client.hostnames("n[1-2]")
    client.config()
    client.default_account("alice")
    assert {c.program for c in slurm.calls} == {"sbatch", "scontrol", "sacct", "sstat", "squeue", "scancel",
                                                "sacctmgr"}
    for call in slurm.calls:
        assert call.env is not None and "HF_TOKEN" not in call.env and "SLURM_JOB_ID" not in call.env, call


def test_submit_strips_cluster_suffix() -> None:
    slurm = FakeSlurm(cluster="btdev", first_job_id=7)
    assert SlurmClient(slurm, environ=ENV).submit(SCRIPT) == "7"


def test_submit_failure_carries_stderr_and_hint(client: SlurmClient) -> None:
    with pytest.raises(SlurmCommandError) as info:
        client.submit(SCRIPT, ["--partition=nosuch"])
    err = info.value
    assert err.returncode == 1 and "Invalid partition name" in err.stderr
    assert "sinfo" in err.hint and "sbatch failed" in str(err)


def test_submit_without_job_id_in_output(slurm: FakeSlurm, client: SlurmClient) -> None:
    slurm.handle("sbatch", lambda c: CommandResult(c.argv, 0, "Submitted batch job\n", ""))
    with pytest.raises(SlurmCommandError, match="sbatch failed"):
        client.submit(SCRIPT)


def test_query_one_batched_sacct(slurm: FakeSlurm, client: SlurmClient) -> None:
    ids = [client.submit(SCRIPT) for _ in range(3)]
    slurm.finish(ids[0])
    slurm.finish(ids[1], exit_code=3)
    slurm.set_state(ids[2], "RUNNING")
    rows = client.query(ids)
    assert len(slurm.calls_to("sacct")) == 1 and not slurm.calls_to("squeue")
    sacct = slurm.calls_to("sacct")[0]
    assert sacct.argv[-1] == "--jobs=100,101,102" and sacct.env and sacct.env["SLURM_TIME_FORMAT"] == "%s"
    assert [(str(r.job_id), r.state, r.exit_code) for r in rows] == [
        ("100", "COMPLETED", (0, 0)),
        ("101", "FAILED", (3, 0)),
        ("102", "RUNNING", (0, 0)),
    ]
    assert rows[0].start is not None and rows[0].start.tzinfo is not None
    assert lifecycle(rows[1].state, exit_code=rows[1].exit_code).status is TrainingJobStatus.FAILED


def test_query_falls_back_to_squeue_for_unrecorded_jobs(slurm: FakeSlurm, client: SlurmClient) -> None:
    old, new = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.sacct_lag.add(int(new))
    rows = client.query([old, new])
    assert [(str(r.job_id), r.source) for r in rows] == [("100", "sacct"), ("101", "squeue")]
    assert rows[1].state == "PENDING" and rows[1].reason == "Priority"
    assert slurm.calls_to("squeue")[0].argv[-1] == "--jobs=101"


def test_query_unknown_everywhere_is_absent(slurm: FakeSlurm, client: SlurmClient) -> None:
    assert client.query(["999"]) == []
    assert client.last_warnings == []  # squeue's "Invalid job id" for a lone id is an answer


def test_query_retries_transient_failures(slurm: FakeSlurm) -> None:
    delays: list[float] = []
    client = SlurmClient(slurm, environ=ENV, sleep=delays.append)
    job = client.submit(SCRIPT)
    slurm.fail_next("sacct", times=2)
    rows = client.query([job], retries=2, retry_delay_s=1.0)
    assert [r.state for r in rows] == ["PENDING"]
    assert delays == [1.0, 2.0] and len(client.last_warnings) == 2


def test_query_gives_up_after_retries(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.fail_next("sacct", times=3, stderr="sacct: error: Problem talking to the database\n")
    with pytest.raises(SlurmCommandError) as info:
        client.query([job], retries=1)
    assert "database" in info.value.stderr and "slurmdbd" in info.value.hint
    assert len(slurm.calls_to("sacct")) == 2


def test_query_rejects_bad_ids(client: SlurmClient) -> None:
    with pytest.raises(ValueError):
        client.query(["--all"])
    assert client.query([]) == []


def test_requeue_history_and_steps(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.set_state(job, "RUNNING")
    slurm.requeue(job)
    rows = client.query([job], duplicates=True)
    assert [r.state for r in rows] == ["REQUEUED", "PENDING"]
    (current,) = latest_runs(rows)
    life = lifecycle(current.state, reason=current.reason, restarts=current.restarts)
    assert (life.status, life.detail) == (TrainingJobStatus.PENDING, "PENDING (BeginTime); requeued 1 time")
    slurm.finish(job)
    steps = client.query([job], steps=True)
    assert [str(r.job_id) for r in steps] == ["100", "100.batch", "100.extern"]


def test_cancel(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT)
    slurm.set_state(job, "RUNNING")
    client.cancel(job)
    client.cancel(job)  # idempotent, like 22.05 scancel
    assert slurm.calls_to("scancel")[0].argv == ("scancel", "100")
    (row,) = client.query([job])
    assert (row.state, row.cancelled_by) == ("CANCELLED", 1000)
    assert lifecycle("CANCELLED by 1000").detail == "CANCELLED by 1000"
    client.cancel(JobId(100), signal="USR2")
    assert slurm.calls_to("scancel")[-1].argv == ("scancel", "--signal=USR2", "100")
    with pytest.raises(ValueError):
        client.cancel("100; rm -rf /")
    slurm.fail_next(
        "scancel", stderr="scancel: error: Kill job error on job id 100: Access/permission denied\n"
    )
    with pytest.raises(SlurmCommandError, match="permission denied"):
        client.cancel(job)


def test_node_addr(slurm: FakeSlurm, client: SlurmClient) -> None:
    assert client.node_addr("n2") == "10.0.0.2"
    assert slurm.calls[-1].argv == ("scontrol", "--oneliner", "show", "node", "n2")
    with pytest.raises(SlurmCommandError, match="not found"):
        client.node_addr("nosuch")
    with pytest.raises(ValueError):
        client.node_addr("-a")


def test_nodes_and_hostnames(slurm: FakeSlurm, client: SlurmClient) -> None:
    assert [(n["NodeName"], n["NodeAddr"]) for n in client.nodes()] == [("n1", "10.0.0.1"), ("n2", "10.0.0.2")]
    assert slurm.calls[-1].argv == ("scontrol", "--oneliner", "show", "node")
    assert client.hostnames("n[1-2]") == ["n1", "n2"]
    assert slurm.calls[-1].argv == ("scontrol", "show", "hostnames", "n[1-2]")
    with pytest.raises(ValueError):
        client.hostnames("")
    with pytest.raises(ValueError):
        client.hostnames("--help")
    slurm.fail_next("scontrol", stderr="scontrol: error: Unable to contact slurm controller\n")
    with pytest.raises(SlurmCommandError, match="controller"):
        client.nodes()


def test_release_held_job(slurm: FakeSlurm, client: SlurmClient) -> None:
    job = client.submit(SCRIPT, ["--hold"])
    client.release(job, env=ENV)
    assert slurm.released == [int(job)] and slurm.calls[-1].argv == ("scontrol", "release", job)
    slurm.fail_next("scontrol", stderr="scontrol: error: Invalid job id specified\n")
    with pytest.raises(SlurmCommandError, match="stays held"):
        client.release(job)
    with pytest.raises(ValueError):
        client.release("1 2")


def test_config_folds_indexed_keys(slurm: FakeSlurm, client: SlurmClient) -> None:
    slurm.handle("scontrol", lambda c: CommandResult(
        c.argv, 0, "Configuration data as of x\nProlog[0]   = /a\nProlog[1]   = /b\nPrologFlags = Alloc\n", ""))
    assert client.config() == {"Prolog": "/a,/b", "PrologFlags": "Alloc"}
    slurm.fail_next("scontrol")
    with pytest.raises(SlurmCommandError):
        client.config()


def test_default_account(slurm: FakeSlurm, client: SlurmClient) -> None:
    assert client.default_account("alice") == "default"
    assert slurm.calls[-1].argv == ("sacctmgr", "-n", "-P", "show", "user", "alice", "format=DefaultAccount")
    assert client.default_account("bob") is None  # no association: sacctmgr prints nothing
    slurm.fail_next("sacctmgr")
    assert client.default_account("alice") is None
    with pytest.raises(ValueError):
        client.default_account("name=alice")


def test_fake_records_everything(slurm: FakeSlurm) -> None:
    slurm.run(["sinfo"])
    assert slurm.calls == [RecordedCall(("sinfo",), None, None)]
    assert slurm.run(["sinfo"]).returncode == 127


# ---------------------------------------------------------------------- runner / env


def test_scrubbed_env() -> None:
    env = scrubbed_env(ENV, overrides={"SLURM_TIME_FORMAT": "%s"})
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/alice",
        "USER": "alice",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "TZ": "UTC",
        "SLURM_TIME_FORMAT": "%s",
    }
    with pytest.raises(ValueError, match="allow-list"):
        scrubbed_env(ENV, overrides={"HF_TOKEN": "x"})


def test_subprocess_runner_basics() -> None:
    runner = SubprocessRunner()
    res = runner.run(["sh", "-c", "cat; echo err >&2; exit 3"], input="hello", env={"PATH": "/usr/bin:/bin"})
    assert (res.returncode, res.stdout, res.stderr.strip(), res.ok) == (3, "hello", "err", False)
    env = runner.run(["env"], env={"PATH": "/usr/bin:/bin", "A": "1"}).stdout
    assert "A=1" in env and "HOME=" not in env


def test_subprocess_runner_missing_binary_and_timeout() -> None:
    runner = SubprocessRunner()
    with pytest.raises(SlurmCommandError, match="is Slurm installed and on PATH") as info:
        runner.run(["sbatch-definitely-missing", "--parsable"])
    assert info.value.returncode == 127
    with pytest.raises(SlurmCommandError, match="timed out"):
        runner.run(["sleep", "5"], timeout_s=0.2)


# ---------------------------------------------------------------------- the former bypasses, now on the client


def test_moved_call_sites_reach_the_fake_with_a_scrubbed_env(
    slurm: FakeSlurm, client: SlurmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """steps/leader.py, weights/plan.py (twice) and cli/admin_cmd.py used to run scontrol/sacctmgr
    around the client: FakeSlurm never saw them and leader/admin passed the whole environment."""
    import os
    import pwd
    import socket

    from slurm_bt.cli import admin_cmd, options
    from slurm_bt.steps.leader import leader_address
    from slurm_bt.weights.plan import default_account, release_staging_job

    assert leader_address(client, "n[1-2]") == "10.0.0.1"
    assert [c.argv for c in slurm.calls] == [
        ("scontrol", "show", "hostnames", "n[1-2]"),
        ("scontrol", "--oneliner", "show", "node", "n1"),
    ]
    with pytest.raises(ValueError):
        leader_address(client, "")

    staging = client.submit(SCRIPT, ["--hold"])
    release_staging_job(client, staging, ENV)
    assert slurm.released == [int(staging)]

    slurm.default_accounts = {pwd.getpwuid(os.getuid()).pw_name: "btteam1"}
    assert default_account(client) == "btteam1"
    assert slurm.calls[-1].program == "sacctmgr"

    slurm.config["Prolog"] = "/usr/libexec/slurm-bt/slurm-bt-prolog"
    slurm.node_addrs = {socket.gethostname().split(".")[0]: "10.0.0.9", "other": "10.0.0.8"}
    monkeypatch.setattr(options, "make_client", lambda: client)
    conf = admin_cmd._scontrol_config()
    assert conf is not None and conf["Prolog"] == "/usr/libexec/slurm-bt/slurm-bt-prolog"
    assert admin_cmd._local_nodes() == [socket.gethostname().split(".")[0]]
    assert client.timeout_s == 20
    # A login host runs no node: nothing to check there (not its own name expanded into %n roots).
    slurm.node_addrs = {"other": "10.0.0.8"}
    assert admin_cmd._local_nodes() == []
    slurm.fail_next("scontrol", times=2)
    assert admin_cmd._scontrol_config() is None and admin_cmd._local_nodes() == [socket.gethostname().split(".")[0]]

    assert {c.program for c in slurm.calls} == {"scontrol", "sbatch", "sacctmgr"}
    for call in slurm.calls:
        assert call.env is not None and "HF_TOKEN" not in call.env and "SLURM_JOB_ID" not in call.env, call


class _Recorded:
    """A CommandRunner answering each command from a recording (tests/data/sacct/)."""

    def __init__(self, answers: dict[str, str]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, input: str | None = None, env: Mapping[str, str] | None = None,
            timeout_s: float | None = None) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(tuple(argv), 0, self.answers[argv[0]], "")


@pytest.mark.parametrize("release", ["2411", "2605"])
def test_requeued_pending_job_takes_its_reason_from_squeue(release: str) -> None:
    # Recorded on each release's dev cluster (tests/data/sacct/README.md): job 186 (26.05) / its 24.11
    # twin, requeued while running. sacct says PENDING with Reason=None, squeue says BeginTime.
    sacct = (DATA / f"{release}_requeue_pending_client.txt").read_text()
    squeue = (DATA / f"{release}_requeue_pending_squeue.txt").read_text()
    job = sacct.split("\x1f", 1)[0]
    runner = _Recorded({"sacct": sacct, "squeue": squeue})
    client = SlurmClient(runner, environ=ENV, sleep=lambda s: None)
    rows = client.query([job], duplicates=True)
    assert [(r.state, r.reason) for r in rows] == [("REQUEUED", ""), ("PENDING", "BeginTime")]
    assert [c[0] for c in runner.calls] == ["sacct", "squeue"]  # one squeue, for the reasonless job only
    assert runner.calls[1][-1] == f"--jobs={job}"
    (current,) = latest_runs(rows)
    life = lifecycle(current.state, reason=current.reason, restarts=current.restarts)
    assert life.detail == "PENDING (BeginTime); requeued 1 time"


def test_pending_jobs_with_a_reason_ask_no_squeue(slurm: FakeSlurm, client: SlurmClient) -> None:
    # 22.05's sacct keeps the requeued job's BeginTime, and held or queued jobs have a reason on every
    # release: the status stays one sacct call (bench/status_bench.py's held jobs).
    held, requeued = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.set_state(requeued, "RUNNING")
    slurm.requeue(requeued)
    rows = latest_runs(client.query([held, requeued], duplicates=True))
    assert [(r.state, bool(r.reason)) for r in rows] == [("PENDING", True), ("PENDING", True)]
    assert slurm.calls_to("squeue") == []


def test_reasonless_pending_job_and_missing_id_share_one_squeue() -> None:
    sacct = (DATA / "2605_requeue_pending_client.txt").read_text()
    squeue = (DATA / "2605_requeue_pending_squeue.txt").read_text()
    fresh = "186|PENDING|BeginTime||rec-requeue|root|1|(null)\n".replace("186", "187", 1)
    runner = _Recorded({"sacct": sacct, "squeue": squeue + fresh.replace("BeginTime", "Priority")})
    client = SlurmClient(runner, environ=ENV, sleep=lambda s: None)
    rows = client.query(["186", "187"], duplicates=True)
    assert [(str(r.job_id), r.state, r.reason, r.source) for r in rows] == [
        ("186", "REQUEUED", "", "sacct"),
        ("186", "PENDING", "BeginTime", "sacct"),
        ("187", "PENDING", "Priority", "squeue"),
    ]
    assert [c[0] for c in runner.calls] == ["sacct", "squeue"] and runner.calls[1][-1] == "--jobs=186,187"
