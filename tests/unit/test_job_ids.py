"""Job id grammar: every form Slurm prints parses, formats back identically, and garbage is rejected."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm_bt.slurm.job_ids import JobId, format_job_id, parse_job_id, try_parse_job_id


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", JobId(123)),
        ("123_4", JobId(123, array_task=4)),
        ("123_[1-3%2]", JobId(123, array_spec="1-3%2")),
        ("14_[1,3,5-7:2]", JobId(14, array_spec="1,3,5-7:2")),
        ("123+0", JobId(123, het_offset=0)),
        ("123.batch", JobId(123, step="batch")),
        ("123.extern", JobId(123, step="extern")),
        ("123.interactive", JobId(123, step="interactive")),
        ("123.0", JobId(123, step="0")),
        ("123_4.batch", JobId(123, array_task=4, step="batch")),
        ("19+0.0", JobId(19, het_offset=0, step="0")),
        ("19+1.extern", JobId(19, het_offset=1, step="extern")),
        ("123.0+1", JobId(123, step="0+1")),
        ("  42\n", JobId(42)),
    ],
)
def test_parse_known_forms(text: str, expected: JobId) -> None:
    got = parse_job_id(text)
    assert got == expected
    assert format_job_id(got) == text.strip() == str(got)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "-a",
        "12a",
        "1_2_3",
        "123.",
        "123.foo",
        "123_[]",
        "123_[1-3",
        "1 2",
        "١٢٣",
        "1_000x",
        "123+",
        "+1",
        "123;cluster",
        "--jobs=1",
        "123_4_[1]",
        "12.batch.0",
    ],
)
def test_garbage_is_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_job_id(text)
    assert try_parse_job_id(text) is None


def test_properties() -> None:
    step = parse_job_id("123_4.batch")
    assert step.is_step and step.is_array
    assert step.job == JobId(123, array_task=4)
    assert not step.job.is_step
    assert parse_job_id("5").job is not None and not parse_job_id("5").is_array


def test_invalid_construction_rejected() -> None:
    with pytest.raises(ValueError):
        JobId(-1)
    with pytest.raises(ValueError):
        JobId(1, array_task=1, array_spec="1-2")
    with pytest.raises(ValueError):
        JobId(1, step="rm -rf")


_ids = st.builds(
    JobId,
    base=st.integers(0, 10**12),
    array_task=st.none() | st.integers(0, 10**6),
    het_offset=st.none() | st.integers(0, 64),
    step=st.none() | st.sampled_from(["batch", "extern", "interactive", "0", "17", "0+1"]),
) | st.builds(
    JobId,
    base=st.integers(0, 10**12),
    array_spec=st.from_regex(r"[0-9]{1,3}(-[0-9]{1,3})?(,[0-9]{1,3})*(%[0-9]{1,2})?", fullmatch=True),
)


@given(_ids)
def test_round_trip(job_id: JobId) -> None:
    assert parse_job_id(str(job_id)) == job_id


@given(st.text())
def test_try_parse_never_raises(text: str) -> None:
    result = try_parse_job_id(text)
    assert result is None or parse_job_id(str(result)) == result
