"""Restarts by cause (docs/long-runs.md): the policy, the restart log, the per-job overrides, the script."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_bt.compat.loader import load_training_project
from slurm_bt.errors import ConfigError
from slurm_bt.job_spec import JobSpec, build_job_spec
from slurm_bt.jobs.restarts import RestartEntry, append_entry, cause_of_run, decide, log_path, read_log
from slurm_bt.render.batch_script import render_batch_script, render_node_entry, sbatch_directives
from slurm_bt.site.settings import RestartSettings, SiteSettings
from tests.unit.test_render_injection import Cfg, make_context, site_for

POLICY = {"max_restarts": 2, "retry_on_failure": 0}


def make_spec(root: Path, *, env: dict[str, str] | None = None, site: SiteSettings | None = None) -> JobSpec:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.py").write_text(Cfg(env=env or {}).source(), encoding="utf-8")
    base = site_for(root)
    if site is not None:
        base = base.model_copy(update={"restarts": site.restarts})
    return build_job_spec(load_training_project(str(root / "config.py")), base, make_context(root))


@pytest.mark.parametrize(("kw", "action", "cause"), [
    ({"rc": 0, "stopped": False, "preempted": False, "restarts": 0, "failures": 0}, "complete", None),
    ({"rc": 0, "stopped": True, "preempted": False, "restarts": 0, "failures": 0}, "requeue", "time limit"),
    ({"rc": 143, "stopped": True, "preempted": False, "restarts": 1, "failures": 0}, "requeue", "time limit"),
    ({"rc": 0, "stopped": False, "preempted": True, "restarts": 1, "failures": 0}, "requeue", "preempted"),
    # the cap: two restarts used, a third time limit fails the job
    ({"rc": 0, "stopped": True, "preempted": False, "restarts": 2, "failures": 0}, "fail", "time limit"),
    ({"rc": 3, "stopped": False, "preempted": False, "restarts": 0, "failures": 0}, "fail", "failed"),
])
def test_decide(kw: dict[str, object], action: str, cause: str | None) -> None:
    d = decide(**kw, **POLICY)  # type: ignore[arg-type]
    assert (d.action, d.cause) == (action, cause)
    if action == "fail":
        assert d.exit != 0


def test_failure_retry_is_opt_in_with_its_own_cap() -> None:
    d = decide(rc=3, stopped=False, preempted=False, restarts=0, failures=0, max_restarts=0, retry_on_failure=0)
    assert d.action == "fail" and d.exit == 3 and "BT_RETRY_ON_FAILURE" in d.message
    d = decide(rc=3, stopped=False, preempted=False, restarts=2, failures=0, max_restarts=2, retry_on_failure=1)
    assert d.action == "requeue" and d.cause == "failed"
    d = decide(rc=3, stopped=False, preempted=False, restarts=3, failures=1, max_restarts=2, retry_on_failure=1)
    assert d.action == "fail" and d.exit == 3
    # a retried failure does not use up the time-limit restarts
    d = decide(rc=0, stopped=True, preempted=False, restarts=3, failures=1, max_restarts=3, retry_on_failure=1)
    assert d.action == "requeue"


def test_restart_log_round_trip_and_causes(tmp_path: Path) -> None:
    append_entry(tmp_path, "42", RestartEntry(run=0, cause="time limit", exit=0, at=1.0))
    append_entry(tmp_path, "42", RestartEntry(run=2, cause="failed", exit=3, at=2.0))
    with open(log_path(tmp_path, "42"), "a") as f:
        f.write("not json\n{\"run\": \"x\"}\n")
    log = read_log(tmp_path, "42")
    assert [(e.run, e.cause, e.exit) for e in log] == [(0, "time limit", 0), (2, "failed", 3)]
    assert cause_of_run(0, "REQUEUED", log) == "time limit"
    assert cause_of_run(1, "PREEMPTED", log) == "preempted"
    assert cause_of_run(1, "NODE_FAIL", log) == "node failure"
    # run 2 logged "failed", but Slurm ended it for a node failure: Slurm's record wins
    assert cause_of_run(2, "NODE_FAIL", log) == "node failure"
    assert cause_of_run(2, "REQUEUED", log) == "failed"
    assert read_log(tmp_path, "43") == []


def test_restart_log_never_follows_a_symlink_or_reads_a_fifo(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere"
    secret.write_text('{"run": 0, "cause": "leaked"}\n')
    os.symlink(secret, log_path(tmp_path, "7"))
    assert read_log(tmp_path, "7") == []
    with pytest.raises(OSError):
        append_entry(tmp_path, "7", RestartEntry(run=0, cause="time limit"))
    assert secret.read_text() == '{"run": 0, "cause": "leaked"}\n'
    os.mkfifo(log_path(tmp_path, "8"))
    assert read_log(tmp_path, "8") == []  # returns at once: a FIFO is never opened for reading


def test_site_default_and_job_overrides(tmp_path: Path) -> None:
    spec = make_spec(tmp_path)
    assert spec.restarts == RestartSettings() and spec.requeue
    assert "--signal=B:USR2@120" in sbatch_directives(spec)
    site = SiteSettings(restarts=RestartSettings(max_restarts=0, stop_grace_s=60))
    spec = make_spec(tmp_path / "b", site=site)
    assert not spec.requeue and "--no-requeue" in sbatch_directives(spec)
    spec = make_spec(tmp_path / "c", env={"BT_MAX_RESTARTS": "7", "BT_STOP_SIGNAL": "SIGINT",
                                          "BT_STOP_GRACE_S": "30", "BT_RETRY_ON_FAILURE": "1"})
    assert spec.restarts == RestartSettings(max_restarts=7, retry_on_failure=1, stop_signal="INT", stop_grace_s=30)
    assert "trap 'bt_stopping=1' TERM INT" in render_node_entry(spec)
    script = render_batch_script(spec)
    assert "--signal=B:USR2@30" in script
    # The warning can arrive within the first second: the trap comes before any command that takes time.
    assert script.index("trap 'bt_stop_asked=1' USR2") < script.index("bt_restart begin") < script.index("srun")


@pytest.mark.parametrize(("name", "value"), [("BT_MAX_RESTARTS", "many"), ("BT_STOP_SIGNAL", "USR1"),
                                             ("BT_STOP_GRACE_S", "1"), ("BT_RETRY_ON_FAILURE", "-1")])
def test_bad_overrides_name_the_variable(tmp_path: Path, name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_spec(tmp_path, env={name: value})
    assert any(p.loc == f"job.runtime.environment_variables.{name}" for p in err.value.problems)


def test_status_table_lists_earlier_runs_with_their_causes() -> None:
    from slurm_bt.cli.status_cmd import render_table

    rows = [{"id": "5", "current_status": "TRAINING_JOB_RUNNING", "elapsed_s": 3,
             "detail": "RUNNING; requeued 2 times (time limit, preempted)",
             "runs": [{"run": 0, "state": "REQUEUED", "cause": "time limit", "nodes": "n[1-2]", "elapsed_s": 44},
                      {"run": 1, "state": "PREEMPTED", "cause": "preempted", "nodes": "n2", "elapsed_s": 61}]}]
    lines = render_table(rows)
    assert "requeued 2 times (time limit, preempted)" in lines[1]
    assert lines[2:] == ["    run 1: time limit (REQUEUED on n[1-2], 0:00:44)",
                         "    run 2: preempted (PREEMPTED on n2, 0:01:01)"]


class _Runner:
    """Answers scontrol --version and show config like a Slurm of ``release``."""

    def __init__(self, release: str, config: str) -> None:
        self.release, self.config, self.calls = release, config, []  # type: ignore[var-annotated]

    def run(self, argv, *, input=None, env=None, timeout_s=None):  # type: ignore[no-untyped-def]
        from slurm_bt.slurm.runner import CommandResult

        self.calls.append(list(argv))
        out = f"slurm {self.release}\n" if argv[1:] == ["--version"] else self.config
        return CommandResult(tuple(argv), 0, out, "")


@pytest.mark.parametrize(("release", "config", "want"), [
    ("22.05.8", "", []),
    ("25.11.1", "SlurmctldParameters = enable_expedited_requeue\n", ["--requeue=expedite"]),
    ("25.11.1", "SlurmctldParameters = (null)\n", []),
])
def test_expedited_requeue_where_slurm_offers_it(release: str, config: str, want: list[str]) -> None:
    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.slurm.jobctl import expedite_args

    runner = _Runner(release, config)
    client = SlurmClient(runner)
    assert expedite_args(client, True) == want
    assert expedite_args(client, False) == []
    assert expedite_args(client, True, ["--no-requeue"]) == []
    if release.startswith("22"):
        assert all(c[1:] == ["--version"] for c in runner.calls), "no show config on an old release"


def test_a_job_that_cannot_resume_is_not_requeued_for_a_time_limit() -> None:
    d = decide(rc=143, stopped=True, preempted=False, restarts=0, failures=0, max_restarts=3,
               retry_on_failure=0, resumable=False)
    assert d.action == "fail" and d.cause == "time limit" and d.wait_for_slurm
    # a preemption still requeues it: the next run may finish
    d = decide(rc=0, stopped=False, preempted=True, restarts=0, failures=0, max_restarts=3,
               retry_on_failure=0, resumable=False)
    assert d.action == "requeue"
    d = decide(rc=3, stopped=False, preempted=False, restarts=0, failures=0, max_restarts=3, retry_on_failure=0)
    assert not d.wait_for_slurm  # an application error fails at once, as FAILED


def test_unreadable_job_json_leaves_the_verdict_to_step_1(tmp_path: Path) -> None:
    # A job.json swapped for a FIFO (or gone): the helper must neither hang nor end the run before step 1
    # reports why (tests/integration/hostile/test_forged_inputs.py), and must pass exit codes through.
    from slurm_bt.steps import restart

    fifo = tmp_path / "job.json"
    os.mkfifo(fifo)
    assert restart.main(["begin", str(fifo)]) == 0
    assert restart.main(["watch", str(fifo), "1"]) == 0
    assert restart.main(["stop", str(fifo)]) == 1
    assert restart.main(["prepare-failed", str(fifo), "7"]) == 7
    assert restart.main(["after", str(fifo), "3", "0"]) == 3
    assert restart.main(["after", str(tmp_path / "missing.json"), "0", "0"]) == 0


def test_watcher_ends_when_the_batch_shell_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Slurm may kill the batch shell and leave its background watcher behind (proctrack/linuxproc); the
    # watcher must then end by itself instead of polling Slurm for ever.
    import subprocess
    import threading
    import time

    from slurm_bt.errors import SlurmCommandError
    from slurm_bt.steps import restart

    calls: list[str] = []

    def facts(_client: object, job_id: str) -> object:
        calls.append(job_id)
        raise SlurmCommandError(["sacct"], 1, "job not found")

    monkeypatch.setattr(restart, "job_facts", facts)
    shell = subprocess.Popen(["sleep", "3"])
    threading.Thread(target=shell.wait, daemon=True).start()  # reaped when it ends, as init would
    t0 = time.monotonic()
    restart._watch(None, None, "42", shell.pid)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 15
    assert calls and calls[0] == "42"


def test_per_job_restarts_and_retries_are_capped_by_the_site_ceiling(tmp_path: Path) -> None:
    from slurm_bt.site.settings import SiteRestartSettings

    spec = make_spec(tmp_path / "ok", env={"BT_MAX_RESTARTS": "10", "BT_RETRY_ON_FAILURE": "10"})
    assert spec.restarts.max_restarts == spec.restarts.retry_on_failure == 10
    for name in ("BT_MAX_RESTARTS", "BT_RETRY_ON_FAILURE"):
        with pytest.raises(ConfigError) as err:
            make_spec(tmp_path / name, env={name: "11"})
        assert [(p.loc, p.message) for p in err.value.problems] == [(
            f"job.runtime.environment_variables.{name}",
            "11 is above this site's ceiling of 10 ([restarts] ceiling in the site file)")]
    site = SiteSettings(restarts=SiteRestartSettings(ceiling=50))
    assert make_spec(tmp_path / "high", env={"BT_RETRY_ON_FAILURE": "50"}, site=site).restarts.retry_on_failure == 50
    # job.json carries the job's policy, never the site's ceiling
    assert "ceiling" not in make_spec(tmp_path / "json").model_dump_json()


def test_site_defaults_above_the_ceiling_are_a_site_error(tmp_path: Path) -> None:
    from slurm_bt.errors import SiteConfigError
    from slurm_bt.site.settings import load_site_settings

    site = tmp_path / "site.toml"
    site.write_text("[restarts]\nmax_restarts = 20\n")
    with pytest.raises(SiteConfigError) as err:
        load_site_settings(site)
    assert err.value.lines() == [f"{site}: restarts: max_restarts = 20 is above ceiling = 10"]
    site.write_text("[restarts]\nmax_restarts = 20\nceiling = 20\n")
    assert load_site_settings(site).restarts.max_restarts == 20
