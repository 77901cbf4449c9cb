"""S3 and R2 sources against SeaweedFS on loopback; GCS against fake-gcs-server."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError
from slurm_bt.storage.base import TransportOptions
from slurm_bt.storage.credentials import parse_credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.weights.download import DownloadOptions, download_manifest
from slurm_bt.weights.resolve import resolve
from tests.servers.fixtures import fake_gcs, seaweed  # noqa: F401 - registered here until conftest imports them
from tests.servers.gcs import FakeGcs
from tests.servers.seaweed import ACCESS_KEY, READ_ONLY_KEY, READ_ONLY_SECRET, SECRET_KEY, SeaweedS3

MiB = 1024 * 1024
OPTS = DownloadOptions(part_size=1 * MiB, parallel_threshold=2 * MiB, max_workers=4, backoff_base_s=0.01,
                       transport=TransportOptions(read_timeout_s=5, connect_timeout_s=2, list_retries=2))
ACCT = "0123456789abcdef0123456789abcdef"


def creds(key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> object:
    return parse_credentials("s3", json.dumps({"aws_access_key_id": key, "aws_secret_access_key": secret}),
                             source="s3://x", secret_name="aws")


def ep(server: SeaweedS3) -> StorageEndpoints:
    return StorageEndpoints(s3_endpoint_url=server.endpoint, s3_addressing_style="path",
                           r2_endpoint_template=server.endpoint)


@pytest.fixture(scope="module")
def objects(seaweed: SeaweedS3) -> dict[str, bytes]:  # noqa: F811
    rnd = random.Random(7)
    data = {"models/llama/model.safetensors": rnd.randbytes(6 * MiB + 11),
            "models/llama/config.json": b'{"a": 1}',
            "models/llama/sub/tok.txt": b"t" * 999,
            "models/llama/empty.txt": b"",
            "models/llama-2/other.bin": b"not me"}
    client = seaweed.client()
    for key, body in data.items():
        client.put_object(Bucket="weights", Key=key, Body=body)
    return data


def test_resolve_and_download(seaweed: SeaweedS3, objects: dict[str, bytes], tmp_path: Path) -> None:  # noqa: F811
    c = creds()
    m = resolve("s3://weights/models/llama/", credentials=c, endpoints=ep(seaweed), options=OPTS)  # type: ignore[arg-type]
    assert m.source == "s3://weights/models/llama" and m.kind == "s3"
    want = {k.removeprefix("models/llama/"): v for k, v in objects.items() if k.startswith("models/llama/")}
    assert {f.path: f.sha256 for f in m.files} == {p: hashlib.sha256(v).hexdigest() for p, v in want.items()}
    assert all(f.etag for f in m.files)
    out = download_manifest(m, tmp_path, credentials=c, endpoints=ep(seaweed), options=OPTS)  # type: ignore[arg-type]
    for path, blob in out.items():
        assert blob.read_bytes() == want[path]


def test_mirror_during_resolve(seaweed: SeaweedS3, objects: dict[str, bytes], tmp_path: Path) -> None:  # noqa: F811
    """With mirror_dir, the one resolve-time stream is the mirror download (no second read)."""
    m = resolve("s3://weights/models/llama", allow=["*.safetensors"], credentials=creds(),  # type: ignore[arg-type]
                endpoints=ep(seaweed), options=OPTS, mirror_dir=tmp_path)
    (f,) = m.files
    assert os.listdir(tmp_path) == [f.sha256]
    assert (tmp_path / f.sha256).read_bytes() == objects["models/llama/model.safetensors"]


def test_r2_scheme_through_endpoint_template(seaweed: SeaweedS3, objects: dict[str, bytes]) -> None:  # noqa: F811
    m = resolve(f"r2://{ACCT}.weights/models/llama", allow=["config.json"], credentials=creds(),  # type: ignore[arg-type]
                endpoints=ep(seaweed), options=OPTS)
    assert m.kind == "r2" and m.source == f"r2://{ACCT}.weights/models/llama"
    assert m.files[0].sha256 == hashlib.sha256(b'{"a": 1}').hexdigest()


def test_object_replaced_after_resolve_is_never_mixed(
    seaweed: SeaweedS3, objects: dict[str, bytes], tmp_path: Path  # noqa: F811
) -> None:
    client = seaweed.client()
    client.put_object(Bucket="weights", Key="swap/w.bin", Body=b"A" * (3 * MiB))
    m = resolve("s3://weights/swap", credentials=creds(), endpoints=ep(seaweed), options=OPTS)  # type: ignore[arg-type]
    client.put_object(Bucket="weights", Key="swap/w.bin", Body=b"B" * (3 * MiB))
    with pytest.raises(SourceError, match="changed since it was resolved") as info:
        download_manifest(m, tmp_path, credentials=creds(), endpoints=ep(seaweed), options=OPTS)  # type: ignore[arg-type]
    assert "w.bin" in str(info.value)
    assert os.listdir(tmp_path) == []


def test_not_authorized_and_not_found(seaweed: SeaweedS3, objects: dict[str, bytes]) -> None:  # noqa: F811
    with pytest.raises(SourceAccessError, match="not authorized for s3://weights/models/llama"):
        resolve("s3://weights/models/llama", credentials=creds(ACCESS_KEY, "wrong"),  # type: ignore[arg-type]
                endpoints=ep(seaweed), options=OPTS)
    with pytest.raises(SourceAccessError, match="not authorized for s3://weights"):
        resolve("s3://weights/models/llama", credentials=creds(READ_ONLY_KEY, READ_ONLY_SECRET),  # type: ignore[arg-type]
                endpoints=ep(seaweed), options=OPTS)
    with pytest.raises(SourceNotFoundError, match="s3://no-such-bucket"):
        resolve("s3://no-such-bucket/x", credentials=creds(), endpoints=ep(seaweed), options=OPTS)  # type: ignore[arg-type]
    with pytest.raises(SourceNotFoundError, match="no object under this prefix"):
        resolve("s3://weights/models/nothing", credentials=creds(), endpoints=ep(seaweed), options=OPTS)  # type: ignore[arg-type]


def test_prefix_naming_one_object(seaweed: SeaweedS3, objects: dict[str, bytes]) -> None:  # noqa: F811
    m = resolve("s3://weights/models/llama-2/other.bin", credentials=creds(), endpoints=ep(seaweed),  # type: ignore[arg-type]
                options=OPTS)
    assert m.source == "s3://weights/models/llama-2" and [f.path for f in m.files] == ["other.bin"]


def test_gcs_resolve_and_download(fake_gcs: FakeGcs, tmp_path: Path) -> None:  # noqa: F811
    rnd = random.Random(3)
    data = {"m/a.safetensors": rnd.randbytes(5 * MiB + 1), "m/b/config.json": b"{}", "mx/c": b"no"}
    for key, body in data.items():
        fake_gcs.upload("gweights", key, body)
    endpoints = StorageEndpoints(gcs_endpoint=fake_gcs.endpoint)
    m = resolve("gs://gweights/m", endpoints=endpoints, options=OPTS)
    assert m.kind == "gs" and [f.path for f in m.files] == ["a.safetensors", "b/config.json"]
    assert all(f.etag and f.etag.isdigit() for f in m.files)  # generations pin the versions
    out = download_manifest(m, tmp_path, endpoints=endpoints, options=OPTS)
    assert out["a.safetensors"].read_bytes() == data["m/a.safetensors"]
    with pytest.raises(SourceNotFoundError, match="gs://gweights/nothing"):
        resolve("gs://gweights/nothing", endpoints=endpoints, options=OPTS)
    with pytest.raises(SourceNotFoundError, match="gs://no-bucket-here"):
        resolve("gs://no-bucket-here/x", endpoints=endpoints, options=OPTS)
