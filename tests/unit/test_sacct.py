"""sacct/squeue/scontrol parsers over real 22.05 recordings (tests/data/sacct), hand-made 23.11+/24.x
JSON, and hypothesis fuzzing: the parsers must never raise."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_bt.slurm.job_ids import JobId
from slurm_bt.slurm.sacct import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SacctRow,
    build_sacct_argv,
    build_squeue_argv,
    latest_runs,
    parse_elapsed,
    parse_exit_code,
    parse_sacct,
    parse_sacct_json,
    parse_scontrol_show_job,
    parse_slurm_time,
    parse_squeue,
    parse_tres,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
UTC = timezone.utc


def text(name: str) -> str:
    return (DATA / name).read_text()


def by_id(rows: list[SacctRow]) -> dict[str, SacctRow]:
    return {str(r.job_id): r for r in rows}


# --------------------------------------------------------------------------- argv


def test_build_sacct_argv_default() -> None:
    argv = build_sacct_argv(["5", 6, JobId(14, array_task=2)])
    assert argv[:4] == ["sacct", "--parsable2", "--noheader", "--noconvert"]
    assert f"--format={','.join(SACCT_FIELDS)}" in argv
    assert "--allocations" in argv and "--duplicates" not in argv
    assert argv[-1] == "--jobs=5,6,14_2"
    assert SACCT_FIELDS[-1] == "Comment"


def test_build_sacct_argv_options() -> None:
    argv = build_sacct_argv(
        ["7"],
        steps=True,
        duplicates=True,
        all_users=True,
        user="alice",
        name="train",
        starttime=datetime(2026, 1, 2, 3, 4, 5),
        delimiter=SACCT_DELIMITER,
    )
    assert "--allocations" not in argv
    for opt in (
        "--duplicates",
        "--allusers",
        "--user=alice",
        "--name=train",
        "--starttime=2026-01-02T03:04:05",
        f"--delimiter={SACCT_DELIMITER}",
    ):
        assert opt in argv


@pytest.mark.parametrize("bad", ["-a", "1;rm", "", "12 13"])
def test_build_sacct_argv_rejects_option_injection(bad: str) -> None:
    with pytest.raises(ValueError):
        build_sacct_argv([bad])
    with pytest.raises(ValueError):
        build_sacct_argv(["1"], user="-a" if bad != "" else "")


def test_build_squeue_argv() -> None:
    assert build_squeue_argv(["5", "14_2"]) == [
        "squeue",
        "--noheader",
        f"--format={SQUEUE_FORMAT}",
        "--jobs=5,14_2",
    ]


# --------------------------------------------------------------------------- scalars


def test_scalars() -> None:
    assert parse_elapsed("00:02:41") == 161
    assert parse_elapsed("1-02:03:04") == 93784
    assert parse_elapsed("05:06.123") == 306
    assert parse_elapsed("UNLIMITED") is None
    assert parse_exit_code("0:9") == (0, 9) and parse_exit_code("") is None
    assert parse_slurm_time("Unknown") is None and parse_slurm_time("None") is None
    assert parse_slurm_time("1795314169") == datetime.fromtimestamp(1795314169, UTC)
    assert parse_slurm_time("2026-11-22T02:22:49", tz=UTC) == datetime(2026, 11, 22, 2, 22, 49, tzinfo=UTC)
    assert parse_slurm_time("2026-11-22T02:22:49") is not None  # local zone
    assert parse_tres("billing=2,cpu=2,gres/gpu=4,mem=4000M,node=2") == {
        "billing": 2,
        "cpu": 2,
        "gres/gpu": 4,
        "mem": 4000 * 1024**2,
        "node": 2,
    }
    assert parse_tres("mem=1.5G,cpu=x,=3,junk") == {"mem": int(1.5 * 1024**3)}


# --------------------------------------------------------------------------- 22.05 text


def test_basic_with_steps_and_piped_comment() -> None:
    rows = parse_sacct(text("2205_basic.txt"), tz=UTC)
    assert rows.skipped == 0
    ids = [str(r.job_id) for r in rows]
    assert ids == ["7", "7.batch", "7.extern", "8", "8.batch", "8.extern", "9", "9.batch", "9.extern"]
    got = by_id(rows)
    ok = got["7"]
    assert (ok.state, ok.exit_code, ok.comment, ok.name, ok.uid) == (
        "COMPLETED",
        (0, 0),
        "tok=a|b c",
        "rec-ok",
        0,
    )
    assert ok.start == datetime(2026, 11, 22, 2, 22, 50, tzinfo=UTC)
    assert ok.alloc_tres == {"billing": 1, "cpu": 1, "mem": 2000 * 1024**2, "node": 1}
    assert ok.work_dir == "/tmp/sbt-rec" and ok.timelimit_min is None and ok.nnodes == 1
    assert (got["8"].state, got["8"].exit_code) == ("FAILED", (3, 0))
    assert (got["9"].state, got["9"].exit_code) == ("FAILED", (0, 9))
    assert got["9.batch"].is_step and got["9.batch"].state == "CANCELLED" and got["9.batch"].user == ""


def test_timeout() -> None:
    row = by_id(parse_sacct(text("2205_timeout.txt")))["5"]
    assert (row.state, row.exit_code, row.elapsed_s, row.timelimit_min) == ("TIMEOUT", (0, 0), 161, 1)


def test_cancelled_by_then_settled() -> None:
    early = by_id(parse_sacct(text("2205_cancelled.txt")))
    assert (early["10"].state, early["10"].cancelled_by) == ("CANCELLED", 0)
    assert early["12"].cancelled_by == 1001 and early["12"].user == "btdevtest"
    assert early["11"].state == "PENDING" and early["11"].reason == "Dependency"
    assert early["11"].node_list == "" and early["11"].start is None
    settled = by_id(parse_sacct(text("2205_cancelled_settled.txt")))
    # The "by <uid>" disappears once the running job's end record lands; the signal shows instead.
    assert (settled["10"].cancelled_by, settled["10"].exit_code) == (None, (0, 15))
    assert (settled["11"].cancelled_by, settled["11"].start) == (0, None)


def test_multinode_gpus() -> None:
    got = by_id(parse_sacct(text("2205_multinode.txt")))
    job = got["13"]
    assert (job.node_list, job.nnodes, job.gpus) == ("n[1-2]", 2, 4)
    assert got["13.0"].name == "hostname" and got["13.batch"].gpus == 2


def test_array_and_het() -> None:
    arr = by_id(parse_sacct(text("2205_array.txt")))
    assert arr["14_2"].job_id == JobId(14, array_task=2) and arr["14_2"].job_id_raw == "17"
    assert arr["14_2"].state == "FAILED" and arr["14_1.batch"].job_id_raw == "16.batch"
    het = by_id(parse_sacct(text("2205_het.txt")))
    assert set(het) >= {"19+0", "19+1", "19+0.0", "19+1.extern"}
    assert het["19+1"].job_id_raw == "20"


def test_live_mixed_pending_values() -> None:
    got = by_id(parse_sacct(text("2205_live_mixed.txt")))
    assert got["5"].state == "RUNNING" and got["5"].end is None
    assert got["6"].reason == "BeginTime" and got["6"].timelimit_min is None and got["6"].node_list == ""
    assert got["14_[1-3%1]"].job_id == JobId(14, array_spec="1-3%1")
    assert got["10"].timelimit_min == 525600


def test_requeue_history() -> None:
    rows = parse_sacct(text("2205_requeue_D.txt"))
    jobs = [r for r in rows if not r.is_step]
    assert [r.state for r in jobs] == ["REQUEUED", "COMPLETED"]
    (latest,) = latest_runs(jobs)
    assert (latest.state, latest.restarts) == ("COMPLETED", 1)
    pending = latest_runs(parse_sacct(text("2205_requeue_pending.txt")))
    assert [(str(r.job_id), r.state, r.restarts) for r in pending if not r.is_step] == [("6", "PENDING", 1)]
    assert [r.state for r in parse_sacct(text("2205_requeue.txt"))] == ["COMPLETED"]


def test_client_query_recording_epoch_and_unit_separator() -> None:
    rows = parse_sacct(text("2205_client_query_epoch_us.txt"))  # delimiter detected
    assert rows.skipped == 0
    ok = next(r for r in rows if str(r.job_id) == "7")
    assert ok.comment == "tok=a|b c"
    assert ok.start == datetime.fromtimestamp(1795314170, UTC)


def test_wrong_width_rows_are_counted() -> None:
    good = text("2205_basic_X.txt").splitlines()[1]
    rows = parse_sacct(f"garbage\n{good}\na|b\n\nxx|" + "|".join(["y"] * 22) + "\n", tz=UTC)
    assert [str(r.job_id) for r in rows] == ["8"]
    assert rows.skipped == 3 and len(rows.warnings) == 3


def test_too_many_columns_without_trailing_comment_skipped() -> None:
    rows = parse_sacct("1|COMPLETED|x\n", ["JobID", "State"])
    assert rows == [] and rows.skipped == 1


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("2205_*.json")))
def test_2205_json_matches_text(name: str) -> None:
    rows = parse_sacct_json(text(name))
    assert rows.skipped == 0 and rows
    text_rows = parse_sacct(text(name.replace(".json", ".txt")))
    by_text = {(str(r.job_id), r.submit): r for r in text_rows if not r.is_step}
    for row in rows:
        twin = by_text.get((str(row.job_id), row.submit))
        if twin is None:
            # 22.05 --json always includes earlier runs of requeued jobs, even without -D.
            assert row.state == "REQUEUED", row.job_id
            continue
        assert row.state == twin.state
        assert row.start == twin.start and row.end == twin.end
        assert row.comment == twin.comment


def test_2205_json_details() -> None:
    got = by_id(parse_sacct_json(text("2205_basic.json"), include_steps=True))
    assert got["9"].exit_code == (0, 9)
    # 22.05 JSON quirk (recorded): `exit 3` is reported as SUCCESS/0; text says 3:0.
    assert got["8"].exit_code == (0, 0) and got["8"].state == "FAILED"
    assert got["9.batch"].state == "CANCELLED" and got["7"].alloc_tres["mem"] == 2000 * 1024**2
    live = by_id(parse_sacct_json(text("2205_live_mixed.json")))
    assert live["14_[1-3%1]"].state == "PENDING"  # array.task "0xE" bitmap + throttle
    het = by_id(parse_sacct_json(text("2205_het.json"), include_steps=True))
    assert {"19+0", "19+1", "19+0.0", "19+1.0"} <= set(het)
    cancelled = by_id(parse_sacct_json(text("2205_cancelled.json")))
    assert cancelled["12"].cancelled_by_user == "btdevtest"
    multi = by_id(parse_sacct_json(text("2205_multinode.json")))
    assert multi["13"].gpus == 4


@pytest.mark.parametrize("name", ["2311_handmade.json", "2405_handmade.json"])
def test_newer_json_shapes(name: str) -> None:
    rows = parse_sacct_json(text(name), include_steps=True)
    assert rows.skipped == 0
    got = by_id(rows)
    assert (
        got["101"].state == "COMPLETED"
        and got["101"].exit_code == (0, 0)
        and got["101"].comment == "tok=a|b c"
    )
    assert got["101"].start == datetime.fromtimestamp(1795314170, UTC)
    assert got["101.batch"].state == "COMPLETED"
    assert got["102"].exit_code == (3, 0) and got["103"].exit_code == (0, 9)
    assert got["105"].timelimit_min == 1 and got["105"].state == "TIMEOUT"
    assert (
        got["106"].state == "RUNNING" and got["106"].state_flags == {"CONFIGURING"} and got["106"].gpus == 4
    )
    assert got["106"].end is None
    assert (
        got["107"].state == "PENDING" and got["107"].state_flags == {"REQUEUED"} and got["107"].restarts == 2
    )
    assert got["107"].timelimit_min is None and got["107"].node_list == ""
    assert got["108_1"].state == "COMPLETED" and got["108_[2-3%1]"].reason == "JobArrayTaskLimit"
    assert got["110+1"].state == "COMPLETED" and got["112"].state == "OUT_OF_MEMORY"


@pytest.mark.parametrize(
    "doc",
    [
        "",
        "null",
        "[]",
        '{"jobs": 3}',
        '{"jobs": [1, null, {}, {"job_id": "x"}]}',
        '{"jobs": [{"job_id": 5, "state": {"current": [1, 2]}, "time": "x"}]}',
    ],
)
def test_json_junk(doc: str) -> None:
    rows = parse_sacct_json(doc)
    assert all(isinstance(r, SacctRow) for r in rows)


# --------------------------------------------------------------------------- squeue / scontrol


def test_squeue_recordings() -> None:
    got = by_id(parse_squeue(text("2205_squeue_live.txt"), "%i|%T|%r|%N|%k"))
    assert got["13"].reason == "Resources" and got["5"].node_list == "n1" and got["5"].comment == ""
    assert got["14_[1-3%1]"].job_id.array_spec == "1-3%1"
    dep = parse_squeue(text("2205_squeue_dep.txt"), SQUEUE_FORMAT)
    assert [(r.state, r.reason, r.name, r.user, r.nnodes) for r in dep] == [
        ("PENDING", "DependencyNeverSatisfied", "rec-dep", "root", 1)
    ]


def test_squeue_short_codes_and_piped_comment() -> None:
    rows = parse_squeue("12|PD|a|b\n13|R|x\n", "%i|%t|%k")
    assert [(r.state, r.comment) for r in rows] == [("PENDING", "a|b"), ("RUNNING", "x")]


def test_scontrol_recordings() -> None:
    got = by_id(parse_scontrol_show_job(text("2205_scontrol_show_job_finished.txt")))
    assert set(got) == {"5", "13", "14_1", "14_2", "14_3", "11"}
    assert (got["5"].state, got["5"].reason, got["5"].timelimit_min, got["5"].exit_code) == (
        "TIMEOUT",
        "TimeLimit",
        1,
        (0, 15),
    )
    assert got["14_2"].job_id_raw == "17" and got["14_2"].exit_code == (1, 0)
    assert got["11"].reason == "DependencyNeverSatisfied" and got["11"].uid == 0 and got["11"].user == "root"
    assert got["13"].node_list == "n[1-2]" and got["13"].nnodes == 2
    (multi,) = parse_scontrol_show_job(text("2205_scontrol_show_job_multiline.txt"))
    assert (str(multi.job_id), multi.state, multi.reason, multi.restarts, multi.work_dir) == (
        "11",
        "PENDING",
        "DependencyNeverSatisfied",
        0,
        "/tmp/sbt-rec",
    )
    assert multi.start is None and multi.alloc_tres == {}


def test_scontrol_values_with_spaces_and_restarts() -> None:
    line = (
        "JobId=6 JobName=my job UserId=bob(1001) JobState=PENDING Reason=BeginTime Restarts=2 "
        "ExitCode=0:0 Comment=tok=a b=c d WorkDir=/tmp/a b\n"
    )
    (row,) = parse_scontrol_show_job(line)
    assert (row.name, row.restarts, row.uid, row.comment, row.work_dir) == (
        "my job",
        2,
        1001,
        "tok=a b=c d",
        "/tmp/a b",
    )


# --------------------------------------------------------------------------- fuzzing

_sacct_alphabet = st.text(
    alphabet=st.sampled_from(list("0123456789_[]%-+.|:,=abcdeNUK \n\x1f")), max_size=400
)


@settings(max_examples=300)
@given(st.one_of(st.text(), _sacct_alphabet))
def test_text_parsers_never_raise(blob: str) -> None:
    for rows in (
        parse_sacct(blob),
        parse_sacct(blob, ["JobID", "State"]),
        parse_squeue(blob),
        parse_squeue(blob, "%i|%t|%Q|%k"),
        parse_scontrol_show_job(blob),
    ):
        assert rows.skipped >= 0
        assert all(isinstance(r, SacctRow) for r in rows)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "jobs",
                    "job_id",
                    "state",
                    "current",
                    "time",
                    "start",
                    "exit_code",
                    "return_code",
                    "signal",
                    "array",
                    "het",
                    "task",
                    "task_id",
                    "job_offset",
                    "number",
                    "set",
                    "steps",
                    "step",
                    "id",
                    "tres",
                    "allocated",
                    "count",
                    "type",
                    "name",
                    "limits",
                    "max",
                    "running",
                    "tasks",
                    "nodes",
                ]
            ),
            children,
            max_size=6,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300)
@given(_json)
def test_json_parser_never_raises(doc: object) -> None:
    for data in ({"jobs": [doc]}, {"jobs": doc}, doc):
        try:
            raw = json.dumps(data)
        except (ValueError, TypeError):
            continue
        rows = parse_sacct_json(raw, include_steps=True)
        assert all(isinstance(r, SacctRow) for r in rows)
