"""allow/ignore pattern semantics: only '*' is special and it matches '/'."""

from __future__ import annotations

import pytest

from slurm_bt.errors import SourceSpecError, UserError
from slurm_bt.weights.patterns import filter_paths, matches, select_paths

PATHS = ["config.json", "model-00001.safetensors", "sub/model.safetensors", "README.md", "a?b", "[x].txt"]


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.safetensors", "sub/dir/model.safetensors", True),  # '*' crosses '/'
        ("*.safetensors", "model.safetensors", True),
        ("sub/*", "sub/a/b/c", True),
        ("sub/*", "other/sub/a", False),
        ("config.json", "config.json", True),
        ("config.json", "sub/config.json", False),  # no '*': exact match only
        ("a?b", "a?b", True),  # '?' is literal
        ("a?b", "axb", False),
        ("[x].txt", "[x].txt", True),  # brackets are literal
        ("[x].txt", "x.txt", False),
        ("*", "", True),
        ("**", "a/b", True),
        ("*.md", "README.md.bak", False),
    ],
)
def test_matches(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected


def test_ignore_is_checked_first() -> None:
    assert filter_paths(PATHS, allow=["*.safetensors"], ignore=["sub/*"]) == ["model-00001.safetensors"]


def test_no_patterns_keeps_everything_in_order() -> None:
    assert filter_paths(PATHS) == PATHS
    assert filter_paths(PATHS, allow=[]) == PATHS  # empty allow list = no allow filter


def test_empty_result_is_a_user_error() -> None:
    with pytest.raises(SourceSpecError) as info:
        select_paths("hf://o/r", PATHS, allow=["*.gguf"])
    assert isinstance(info.value, UserError)
    assert "No files matched weights filters" in str(info.value)
    assert "hf://o/r" in str(info.value)


def test_empty_source_is_a_user_error() -> None:
    with pytest.raises(SourceSpecError, match="no files"):
        select_paths("s3://bkt/p", [])
