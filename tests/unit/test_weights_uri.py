"""Source URI parsing and canonicalisation."""

from __future__ import annotations

import pytest

from slurm_bt.errors import SourceSpecError
from slurm_bt.storage.url import StorageUrl, is_commit, parse_source_uri

ACCT = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "canonical", "revision"),
    [
        ("hf://org/repo", "hf://org/repo", None),
        ("hf://Org/Model@main", "hf://Org/Model", "main"),  # case kept; resolve uses the Hub's id
        ("hf://gpt2", "hf://gpt2", None),
        ("hf://org/repo@refs/pr/1", "hf://org/repo", "refs/pr/1"),
        ("hf://org/repo@" + "a" * 40, "hf://org/repo", "a" * 40),
        ("s3://bucket", "s3://bucket", None),
        ("s3://bucket/", "s3://bucket", None),
        ("s3://bucket/models/llama", "s3://bucket/models/llama", None),
        ("s3://bucket/models/llama/", "s3://bucket/models/llama", None),  # prefixes are directories
        ("gs://my_bucket/p", "gs://my_bucket/p", None),
        (f"r2://{ACCT}.weights/m", f"r2://{ACCT}.weights/m", None),
    ],
)
def test_valid(text: str, canonical: str, revision: str | None) -> None:
    uri = parse_source_uri(text)
    assert uri.canonical == canonical
    assert uri.revision == revision
    assert parse_source_uri(uri.canonical).canonical == canonical  # idempotent


@pytest.mark.parametrize(
    "text",
    [
        "hf://org/../x", "hf://a/b/c/d", "hf://a/b/c", "hf:///org/repo", "hf://", "hf://org/repo@",
        "hf://a/b@c@d", "hf://org/re po", "hf://org--x/y", "hf://org/repo.git", "hf://org/repo@../main",
        "HF://org/repo", "http://x/y", "https://host/", "file:///etc/passwd", "azure://acct/c",
        "cw://b/k", "org/repo",
        "s3://", "s3:///k", "s3://b", "s3://Bucket/k", "s3://b//k", "s3://bkt//k", "s3://bkt/a//b",
        "s3://bkt/%2e%2e/k", "s3://bkt/../k", "s3://bkt/./k", "s3://bkt/k@v1", "s3://bkt/a\nb",
        "gs://bkt/..", "gs://bkt/a/../b",
        "r2://weights/m", "r2://notanaccount.weights/m", f"r2://{ACCT}/m", f"r2://{ACCT}.B/m",
    ],
)
def test_rejected(text: str) -> None:
    with pytest.raises(SourceSpecError) as info:
        parse_source_uri(text)
    assert text.split("\n")[0][:20] in str(info.value) or "source" in str(info.value)


def test_double_slash_is_not_collapsed() -> None:
    """s3://b//k names key '/k', a different object from 'k': refuse rather than share a key."""
    with pytest.raises(SourceSpecError, match="different objects"):
        parse_source_uri("s3://bkt//k")


def test_keys_stay_under_the_prefix() -> None:
    uri = parse_source_uri("s3://bkt/models/llama")
    assert uri.key_for("a/b.bin") == "models/llama/a/b.bin"
    assert parse_source_uri("s3://bkt").key_for("x") == "x"


def test_truss_schemes_accepted_and_http_refused() -> None:
    # azure://, cw:// and https:// were refused ("accepted by truss, not supported") before
    # slurm_bt/storage; plain http:// stays refused (no integrity in transit).
    assert parse_source_uri("azure://acct/container/p").account == "acct"
    assert parse_source_uri("cw://bucket/p").canonical == "cw://bucket/p"
    assert parse_source_uri("https://host/m.bin").canonical == "https://host/m.bin"
    with pytest.raises(SourceSpecError, match="use https://"):
        parse_source_uri("http://host/m.bin")


def test_str_and_with_container() -> None:
    uri = parse_source_uri("hf://org/model@main")
    assert str(uri) == "hf://org/model@main"
    assert uri.with_container("Org/Model") == StorageUrl("hf", "Org/Model", revision="main")
    assert is_commit("0" * 40) and not is_commit("main")
