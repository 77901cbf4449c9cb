"""Secret formats and endpoint overrides for weights sources; secret values never leak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from slurm_bt.errors import SourceSpecError
from slurm_bt.secrets_store import SecretStore
from slurm_bt.storage.credentials import credentials_from_store, parse_credentials
from slurm_bt.storage.endpoints import StorageEndpoints

SECRET = "sk-CANARY-123"


def test_hf_token() -> None:
    creds = parse_credentials("hf", f"  {SECRET}\n", source="hf://o/r", secret_name="hf")
    assert creds.hf_token == SECRET
    assert SECRET not in repr(creds)


def test_aws_json() -> None:
    value = json.dumps({"aws_access_key_id": "AK", "aws_secret_access_key": SECRET, "aws_session_token": "T"})
    creds = parse_credentials("s3", value, source="s3://b/p", secret_name="aws")
    assert (creds.aws_access_key_id, creds.aws_secret_access_key, creds.aws_session_token) == ("AK", SECRET, "T")
    assert SECRET not in repr(creds)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("hf", ""),
        ("hf", "two tokens"),
        ("s3", SECRET),
        ("r2", json.dumps({"aws_access_key_id": "AK"})),
        ("s3", json.dumps({"aws_access_key_id": "AK", "aws_secret_access_key": SECRET, "aws_session_token": 3})),
        ("gs", json.dumps({"type": "authorized_user", "secret": SECRET})),
        ("gs", SECRET),
    ],
)
def test_bad_formats_never_echo_the_value(kind: str, value: str) -> None:
    with pytest.raises(SourceSpecError) as info:
        parse_credentials(kind, value, source="x://y", secret_name="mysecret")  # type: ignore[arg-type]
    assert SECRET not in str(info.value)
    assert "mysecret" in str(info.value)
    context = info.value.__context__
    assert context is None or SECRET not in str(context)


def test_from_store(tmp_path: Path) -> None:
    store = SecretStore(tmp_path / "secrets")
    store.set("hf_tok", SECRET)
    assert credentials_from_store(store, None, "hf", source="hf://o/r") is None
    creds = credentials_from_store(store, "hf_tok", "hf", source="hf://o/r")
    assert creds is not None and creds.hf_token == SECRET


def test_endpoints() -> None:
    ep = StorageEndpoints(s3_endpoint_url="http://127.0.0.1:9000/", hf_endpoint="http://127.0.0.1:1/")
    assert ep.s3_endpoint_url == "http://127.0.0.1:9000"
    assert ep.r2_endpoint("abc") == "https://abc.r2.cloudflarestorage.com"
    assert ep.r2_checksum_when_required and not ep.s3_checksum_when_required
    with pytest.raises(ValidationError):
        StorageEndpoints(gcs_endpoint="ftp://x")
    with pytest.raises(ValidationError):
        StorageEndpoints(unknown=1)  # type: ignore[call-arg]


def test_importing_sources_imports_no_heavy_client() -> None:
    import subprocess
    import sys

    code = ("import sys, slurm_bt.storage, slurm_bt.weights.resolve, slurm_bt.weights.download; "
            "print([m for m in ('boto3', 'huggingface_hub', 'google.auth', 'urllib3') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
