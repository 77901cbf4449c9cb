"""Log reading and following: node tags, --tail, partial lines, privacy checks, and the poll schedule."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_bt.cli import options
from slurm_bt.cli.main import cli
from slurm_bt.errors import RuntimeFailure
from slurm_bt.jobs.logs import LogLine, LogReader, follow_logs, log_sources
from slurm_bt.jobs.poll import Backoff, FailureBudget
from slurm_bt.records import SubmissionRecord, write_record
from slurm_bt.slurm.client import SlurmClient
from tests.fakes.fake_slurm import FakeSlurm


def _job_dir(tmp_path: Path) -> Path:
    logs = tmp_path / "job" / "logs"
    logs.mkdir(parents=True)
    (logs / "slurm-7.out").write_text("batch says hi\n")
    (logs / "slurm-7.node0.out").write_text("a0\na1\na2\n")
    (logs / "slurm-7.node1.out").write_text("b0\nb1\n")
    (logs / "slurm-70.node0.out").write_text("other job\n")
    (logs / "slurm-7.node10.out").write_text("k0\n")
    return tmp_path / "job"


def test_sources_order_and_filter(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    assert [t for t, _, _ in log_sources(job, "7")] == ["batch", "node 0", "node 1", "node 10"]
    assert [t for t, _, _ in log_sources(job, "7", node=1)] == ["node 1"]
    assert log_sources(tmp_path / "missing", "7") == []


def test_reader_tags_every_line_and_tails(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    lines = LogReader(job, "7").read()
    assert [ln.render() for ln in lines][:4] == ["[batch] batch says hi", "[node 0] a0", "[node 0] a1", "[node 0] a2"]
    tailed = LogReader(job, "7", tail=1).read()
    assert [ln.render() for ln in tailed] == ["[batch] batch says hi", "[node 0] a2", "[node 1] b1", "[node 10] k0"]
    assert LogReader(job, "7", tail=0).read() == []


def test_reader_is_incremental_and_keeps_partial_lines(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    reader = LogReader(job, "7", node=0)
    assert len(reader.read()) == 3
    with open(job / "logs" / "slurm-7.node0.out", "a") as f:
        f.write("a3\nhalf")
    assert [ln.text for ln in reader.read()] == ["a3"]
    with open(job / "logs" / "slurm-7.node0.out", "a") as f:
        f.write(" line\n")
    assert [ln.text for ln in reader.read()] == ["half line"]
    (job / "logs" / "slurm-7.node2.out").write_text("late node\n")
    assert LogLine("node 2", 2, "late node") in LogReader(job, "7").read()
    with open(job / "logs" / "slurm-7.node0.out", "a") as f:
        f.write("no newline at the end")
    assert reader.read() == [] and reader.flush() == [LogLine("node 0", 0, "no newline at the end")]


def test_tail_on_big_file_reads_backwards(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    (job / "logs" / "slurm-7.node0.out").write_text("".join(f"line {i}\n" for i in range(50000)))
    got = LogReader(job, "7", node=0, tail=3).read()
    assert [ln.text for ln in got] == ["line 49997", "line 49998", "line 49999"]


def test_symlinks_and_foreign_files_are_refused(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not show\n")
    os.symlink(secret, job / "logs" / "slurm-7.node3.out")
    reader = LogReader(job, "7")
    assert all("do not show" not in ln.text for ln in reader.read())
    assert any("symlink" in w for w in reader.warnings)
    foreign = LogReader(job, "7", uid=os.geteuid() + 12345)
    assert foreign.read() == [] and any("not a regular file owned by you" in w for w in foreign.warnings)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def test_follow_polls_state_on_backoff_not_per_line(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    clock = _Clock()
    polls: list[float] = []
    out: list[str] = []
    node0 = job / "logs" / "slurm-7.node0.out"

    def poll() -> tuple[bool, str | None, str]:
        polls.append(clock.now)
        with open(node0, "a") as f:  # a chatty job: output on every poll
            f.write(f"tick {len(polls)}\n")
        return clock.now > 100, None, "RUNNING"

    follow_logs(LogReader(job, "7", node=0), poll, emit=lambda ln: out.append(ln.text), on_warning=out.append,
                sleep=clock.sleep, clock=lambda: clock.now, final_grace_s=0)
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(polls)]
    assert gaps[:5] == [2.0, 4.0, 8.0, 16.0, 30.0] and max(gaps) <= 30.5
    assert len(polls) <= 9  # ~100 s of following: 9 state queries, not 200
    assert out[:3] == ["a0", "a1", "a2"] and out[-1] == f"tick {len(polls)}"


def test_follow_tolerates_a_few_failures_then_gives_up(tmp_path: Path) -> None:
    job = _job_dir(tmp_path)
    clock = _Clock()
    answers = iter([(False, "dbd down", ""), (False, None, "R"), (False, "x", ""), (False, "x", ""), (False, "x", ""),
                    (False, "x", "")])
    warnings: list[str] = []
    with pytest.raises(RuntimeFailure, match="giving up"):
        follow_logs(LogReader(job, "7"), lambda: next(answers), emit=lambda ln: None, on_warning=warnings.append,
                    sleep=clock.sleep, clock=lambda: clock.now, backoff=Backoff(1, 1), budget=FailureBudget(3))
    assert sum("tolerated" in w for w in warnings) == 4


def test_backoff_validation_and_reset() -> None:
    b = Backoff(1, 5)
    assert [b.next() for _ in range(5)] == [1, 2, 4, 5, 5]
    b.reset()
    assert b.next() == 1
    with pytest.raises(ValueError):
        Backoff(10, 1)


def test_cli_logs_only_from_own_records(isolated_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job_dir(tmp_path)
    rec = SubmissionRecord(job_id="7", project_name="p", project_id="p", job_name="j", submit_id="s",
                           job_dir=str(job), config_path="/c", submitted_at="2026", user="alice")
    write_record(isolated_home / "ws", rec)
    res = CliRunner().invoke(cli, ["logs", "7", "--node", "1"])
    assert res.exit_code == 0 and res.output.splitlines() == ["[node 1] b0", "[node 1] b1"]
    res = CliRunner().invoke(cli, ["logs", "7", "--tail", "1", "--json"])
    assert [json.loads(x) for x in res.output.splitlines()][1] == {"tag": "node 0", "node": 0, "line": "a2"}
    res = CliRunner().invoke(cli, ["logs", "8"])
    assert res.exit_code == 2 and "no submission record" in res.stderr
    slurm = FakeSlurm(first_job_id=7)
    SlurmClient(slurm).submit("#!/bin/sh\n")
    slurm.finish("7")
    monkeypatch.setattr(options, "make_client", lambda: SlurmClient(slurm, sleep=lambda s: None))
    monkeypatch.setattr("slurm_bt.jobs.logs.time.sleep", lambda s: None)
    res = CliRunner().invoke(cli, ["logs", "7", "--follow"])
    assert res.exit_code == 0 and "[node 10] k0" in res.output and len(slurm.calls_to("sacct")) == 1
