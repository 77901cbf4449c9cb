"""slurm_bt/storage: the one URL grammar, secret formats per scheme, and the lazy registry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from slurm_bt.errors import SourceSpecError
from slurm_bt.storage.credentials import parse_credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.registry import REGISTRY
from slurm_bt.storage.url import SCHEMES, StorageUrl, parse_source_uri, parse_url

SECRET = "sk-CANARY-456"


@pytest.mark.parametrize(("text", "canonical", "key"), [
    ("azure://acct1/models/llama/", "azure://acct1/models/llama", "llama/x"),
    ("cw://bucket-1/p/q", "cw://bucket-1/p/q", "p/q/x"),
    ("https://Files.Example.com:8443/m/model.bin", "https://files.example.com:8443/m/model.bin", None),
    ("r2://" + "a" * 32 + ".bkt/p", "r2://" + "a" * 32 + ".bkt/p", "p/x"),
    ("file:///shared/ckpt/", "file:///shared/ckpt", None),
])
def test_canonical_forms(text: str, canonical: str, key: str | None) -> None:
    url = parse_url(text)
    assert url.canonical == canonical
    assert parse_url(url.canonical) == url
    if key is not None:
        assert url.key_for("x") == key


@pytest.mark.parametrize(("text", "why"), [
    ("azure://acct1", "container"),
    ("azure://AC/ct1/p", "storage account"),
    ("azure://acct1/c--x/p", "container"),
    ("https://host/p?X-Amz-Signature=1", "query"),
    ("https://user@host/p", "user@"),
    ("https://host/", "one file"),
    ("https://host/a/../b", "segments"),
    ("cw://b/a//b", "different objects"),
    ("cw://b/%2e%2e/x", "escapes"),
    ("azure://acct1/ct1/p@v1", "revision"),
])
def test_ambiguous_urls_are_refused(text: str, why: str) -> None:
    with pytest.raises(SourceSpecError, match=why):
        parse_url(text)


def test_weights_schemes() -> None:
    for text in ("azure://acct1/ct1/p", "cw://bk1/p", "https://h/p/f.bin", "hf://o/r@main", "s3://bk1/p", "gs://bk1/p"):
        assert parse_source_uri(text).canonical
    with pytest.raises(SourceSpecError, match="use https://"):
        parse_source_uri("http://h/f.bin")
    with pytest.raises(SourceSpecError, match="unsupported scheme 'file://'"):
        parse_source_uri("file:///etc")


def test_with_helpers() -> None:
    url = parse_url("hf://org/model@main")
    assert str(url) == "hf://org/model@main"
    assert url.with_container("Org/Model") == StorageUrl("hf", "Org/Model", revision="main")
    assert url.with_revision("0" * 40).revision == "0" * 40


def test_azure_secret_formats_never_leak() -> None:
    for field in ("account_key", "sas_token", "connection_string"):
        creds = parse_credentials("azure", json.dumps({field: SECRET}), source="azure://a/c", secret_name="az")
        assert SECRET not in repr(creds)
    assert parse_credentials("azure", json.dumps({"sas_token": "?sv=1"}), source="s",
                             secret_name="az").azure_sas_token == "sv=1"
    for bad in (SECRET, json.dumps({"account_key": SECRET, "sas_token": "x"}), json.dumps({"key": SECRET})):
        with pytest.raises(SourceSpecError) as info:
            parse_credentials("azure", bad, source="azure://a/c", secret_name="az")
        assert SECRET not in str(info.value)


def test_bearer_token_and_cw_keys() -> None:
    assert parse_credentials("https", f" {SECRET}\n", source="s", secret_name="t").token == SECRET
    keys = json.dumps({"aws_access_key_id": "AK", "aws_secret_access_key": SECRET})
    assert parse_credentials("cw", keys, source="s", secret_name="k").aws_secret_access_key == SECRET


def test_endpoint_templates() -> None:
    ep = StorageEndpoints(cw_endpoint_template="https://{region}.cw.example", cw_region="us-east-04a",
                          azure_endpoint_template="http://127.0.0.1:10000/{account}")
    assert ep.cw_endpoint() == "https://us-east-04a.cw.example"
    assert ep.azure_endpoint("dev") == "http://127.0.0.1:10000/dev"
    with pytest.raises(ValueError, match="absolute"):
        StorageEndpoints(https_ca_bundle="ca.pem")


def test_every_scheme_has_a_backend_and_an_extra() -> None:
    assert set(REGISTRY) == set(SCHEMES)
    assert {e.extra for s, e in REGISTRY.items() if s != "file"} <= {"s3", "gcs", "azure", "hf", "https"}


def test_importing_storage_imports_no_client_library() -> None:
    heavy = ("boto3", "botocore", "s3fs", "gcsfs", "adlfs", "azure", "huggingface_hub", "aiohttp", "urllib3", "fsspec")
    code = ("import sys, slurm_bt.storage, slurm_bt.storage.registry; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
