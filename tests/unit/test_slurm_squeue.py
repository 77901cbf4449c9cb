"""squeue's grammar: the live-job fallback's argv and parser, over real 22.05 recordings
(tests/data/sacct/2205_squeue_*) and hypothesis fuzzing: the parser must never raise."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_bt.slurm.sacct import JobRow
from slurm_bt.slurm.squeue import SQUEUE_FORMAT, build_squeue_argv, parse_squeue

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"


def text(name: str) -> str:
    return (DATA / name).read_text()


def by_id(rows: list[JobRow]) -> dict[str, JobRow]:
    return {str(r.job_id): r for r in rows}


def test_build_squeue_argv() -> None:
    assert build_squeue_argv(["5", "14_2"]) == [
        "squeue",
        "--noheader",
        f"--format={SQUEUE_FORMAT}",
        "--jobs=5,14_2",
    ]
    assert build_squeue_argv(["5"], all_states=True)[-2:] == ["--states=all", "--jobs=5"]


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


_alphabet = st.text(alphabet=st.sampled_from(list("0123456789_[]%-+.|:,=abcdeNUKPDR( )\n")), max_size=400)


@settings(max_examples=300)
@given(st.one_of(st.text(), _alphabet))
def test_squeue_parser_never_raises(blob: str) -> None:
    for rows in (parse_squeue(blob), parse_squeue(blob, "%i|%t|%Q|%k")):
        assert rows.skipped >= 0
        assert all(isinstance(r, JobRow) for r in rows)
