"""Issue 31, items 4 and 6: names that collide or lie, job ids that are paths, refusals that say why.

(a) distinct project names never share an id; names that already are safe ids keep theirs;
(b) every table and line escapes control and bidi characters, JSON stays exact;
(c) one job-id validator for every verb, one line per bad id, and one parser behind it;
(e) a requeued job's run causes go with the requeue count, not after the staging job's state;
    status and train view refuse another user's job like logs and the other train verbs.
(d) is in tests/unit/test_cache_evict_user.py (it needs a second user).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_bt.cli import options
from slurm_bt.cli.main import cli
from slurm_bt.display import visible
from slurm_bt.job_spec import slugify
from slurm_bt.jobs.lifecycle import query_statuses
from slurm_bt.records import SubmissionRecord, select_records, write_record
from slurm_bt.slurm.client import SlurmClient
from tests.fakes.fake_slurm import FakeSlurm

SCRIPT = "#!/bin/sh\n#SBATCH -J train\nsleep 1\n"
RLO = "\u202e"


def _record(job_id: str, project: str = "proj", *, staging: str | None = None, name: str = "train") -> SubmissionRecord:
    return SubmissionRecord(job_id=job_id, project_name=project, project_id=slugify(project, default="project"),
                            job_name=name, submit_id="s", job_dir="/nonexistent", config_path="/c/config.py",
                            submitted_at="2026-01-01T00:00:00", user="alice", staging_job_id=staging)


@pytest.fixture()
def slurm(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    fake = FakeSlurm()
    monkeypatch.setattr(options, "make_client", lambda: SlurmClient(fake, sleep=lambda s: None))
    return fake


# -- (a) project ids ------------------------------------------------------------------------------


def test_distinct_project_names_never_share_an_id() -> None:
    assert slugify("../rt3", default="project") != slugify("rt3-Ω名", default="project")
    names = ["rt3", "../rt3", "rt3-Ω名", "rt3 ", "RT3", "My finetune", "My-finetune", "a" * 63, "a" * 64, "a" * 65,
             "x..y", "///", "%%%", slugify("../rt3", default="project")]
    ids = [slugify(n, default="project") for n in names]
    assert len(set(ids)) == len(names), dict(zip(names, ids, strict=True))
    for n, i in zip(names, ids, strict=True):
        assert i[0].isalnum() and len(i) <= 63 and all(c.isascii() and (c.isalnum() or c in "._-") for c in i), n
    # Names that already are safe ids keep them: stores and records written before stay where they are.
    for safe in ("rt3", "my-finetune", "proj_1.v2", "a" * 63):
        assert slugify(safe, default="project") == safe
    assert slugify("", default="default") == "default"  # no account: the team directory it always was
    assert slugify("///", default="") == ""  # nothing safe in it: the caller refuses it (cache summarize)


# -- (b) visible text -----------------------------------------------------------------------------


def test_visible_escapes_control_and_bidi_characters_only() -> None:
    assert visible("plain name-1.2") == "plain name-1.2"
    assert visible("Ω名 🚀") == "Ω名 🚀"
    assert visible(f"evil{RLO}gnp.exe") == "evil\\u202egnp.exe"
    for ch in ["\u202a", "\u202b", "\u202c", "\u202d", "\u2066", "\u2067", "\u2068", "\u2069", "\u200b", "\ufeff",
               "\x1b", "\x7f", "\x85", "\u2028"]:
        assert ch not in visible(f"a{ch}b") and "\\" in visible(f"a{ch}b"), repr(ch)
    assert visible("a\nb\tc\rd") == "a\\nb\\tc\\rd"


def test_status_table_escapes_names_and_json_stays_exact(slurm: FakeSlurm, isolated_home: Path) -> None:
    job = SlurmClient(slurm).submit(SCRIPT)
    slurm.set_state(job, "RUNNING")
    project, name = f"prod{RLO}tset", f"job\x1b[2Jx\n{job} FAKE"
    write_record(isolated_home / "ws", _record(job, project, name=name))
    res = CliRunner().invoke(cli, ["status", job])
    assert res.exit_code == 0, res.output
    assert RLO not in res.stdout and "\x1b" not in res.stdout and len(res.stdout.splitlines()) == 2
    assert "prod\\u202etset" in res.stdout and "job\\x1b[2Jx\\n" in res.stdout
    res = CliRunner().invoke(cli, ["status", job, "--json"])
    [row] = json.loads(res.stdout)
    assert row["training_project"]["name"] == project and row["name"] == name
    res = CliRunner().invoke(cli, ["train", "view", "--job-id", job])
    assert res.exit_code == 0, res.output
    assert RLO not in res.stdout and "prod\\u202etset" in res.stdout


# -- (c) job ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["checkpoints", "list", "../365"], ["checkpoints", "download", "../365"], ["status", "../365"],
    ["view", "../365"], ["logs", "../365"], ["metrics", "../365"], ["stop", "../365"], ["ssh", "../365"],
    ["train", "view", "--job-id", "../365"], ["train", "logs", "--job-id", "../365"],
    ["train", "checkpoints", "list", "--job-id", "../365"], ["train", "download", "--job-id", "../365"],
])
def test_every_verb_refuses_a_job_id_that_is_not_one(slurm: FakeSlurm, argv: list[str]) -> None:
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2, res.output
    assert res.stderr == "slurm-bt: job id '../365': not a Slurm job id\n"
    assert slurm.calls == []


def test_records_are_read_only_for_job_ids(tmp_path: Path) -> None:
    write_record(tmp_path / "ws", _record("365"))
    (tmp_path / "x.json").write_text((tmp_path / "ws" / "records" / "365.json").read_text())
    assert list(select_records(tmp_path / "ws", ["../../x", "365"])) == ["365"]
    assert select_records(tmp_path / "ws", ["../../x"]) == {}


def test_job_ids_are_canonical_after_the_one_parser(slurm: FakeSlurm, isolated_home: Path) -> None:
    job = SlurmClient(slurm).submit(SCRIPT)
    slurm.set_state(job, "RUNNING")
    write_record(isolated_home / "ws", _record(job))
    res = CliRunner().invoke(cli, ["status", f"0{job}", "--json"])
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in json.loads(res.stdout)] == [job]


# -- (e) status: staging job once, runs as runs; another user's job ----------------------------------


def test_run_causes_go_with_the_requeue_count_not_the_staging_job(slurm: FakeSlurm, isolated_home: Path) -> None:
    client = SlurmClient(slurm, sleep=lambda s: None)
    staging, train = client.submit(SCRIPT), client.submit(SCRIPT)
    slurm.finish(staging)
    for _ in range(2):
        slurm.set_state(train, "RUNNING")
        slurm.requeue(train)
    slurm.finish(train, exit_code=1)
    records = {train: _record(train, staging=staging)}
    [st] = query_statuses(client, [train], records=records).statuses
    assert st.lifecycle is not None
    assert st.lifecycle.detail == "FAILED; exit code 1:0; requeued 2 times (requeued, requeued); staging job COMPLETED"
    write_record(isolated_home / "ws", records[train])
    table = CliRunner().invoke(cli, ["status", train]).stdout.splitlines()
    assert table[1].count("staging job COMPLETED") == 1 and table[1].count("requeued") == 3
    assert "requeued 2 times (requeued, requeued); staging job COMPLETED  n1" in table[1]
    assert [line.split(":")[0].strip() for line in table[2:]] == ["run 1", "run 2"]


def test_status_and_train_view_refuse_another_users_job(slurm: FakeSlurm) -> None:
    theirs = SlurmClient(slurm).submit(SCRIPT)  # no record in this workspace: someone else's job
    slurm.set_state(theirs, "RUNNING")
    for argv in (["status", theirs], ["view", theirs], ["status", theirs, "--json"]):
        res = CliRunner().invoke(cli, argv)
        assert res.exit_code == 2, res.output
        assert res.stdout == ""
        assert res.stderr == (f"slurm-bt: JOB_ID: job {theirs} was not submitted with slurm-bt from this account "
                              "(no submission record): statuses are only shown for your own jobs\n")
    res = CliRunner().invoke(cli, ["logs", theirs])
    assert res.exit_code == 2 and "logs are only shown for your own jobs" in res.stderr
    res = CliRunner().invoke(cli, ["train", "view", "--job-id", theirs])
    assert res.exit_code == 2 and f"No training job found with ID: {theirs}" in res.output
    assert "QUEUED" not in res.output and "UNKNOWN" not in res.output
