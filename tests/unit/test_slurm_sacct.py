"""sacct's grammar (argv and the text parser) and the shared value grammar, over real 22.05
recordings (tests/data/sacct) and hypothesis fuzzing: the parsers must never raise."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_bt.slurm.job_ids import JobId
from slurm_bt.slurm.sacct import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    JobRow,
    build_sacct_argv,
    latest_runs,
    parse_sacct,
)
from slurm_bt.slurm.values import ParsedRows, parse_elapsed, parse_exit_code, parse_slurm_time, parse_tres

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"
UTC = timezone.utc


def text(name: str) -> str:
    return (DATA / name).read_text()


def by_id(rows: list[JobRow]) -> dict[str, JobRow]:
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
    ):
        assert rows.skipped >= 0
        assert all(isinstance(r, JobRow) for r in rows)


def test_parsed_rows_keep_at_most_20_reasons() -> None:
    rows = parse_sacct("x\n" * 50, ["JobID", "State"])
    assert isinstance(rows, ParsedRows) and rows.skipped == 50 and len(rows.warnings) == 20
