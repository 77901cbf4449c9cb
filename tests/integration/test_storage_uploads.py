"""Verified uploads and downloads of the storage layer on real loopback servers (SeaweedFS, fake-gcs)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from slurm_bt.errors import IntegrityError
from slurm_bt.storage import Credentials, StorageEndpoints, open_backend, parse_url
from slurm_bt.storage.gcs import GcsBackend
from slurm_bt.storage.s3 import S3Backend
from slurm_bt.storage.transfer import UploadOptions, download_to
from tests.servers.gcs import FakeGcs
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

MiB = 1024 * 1024


def _file(tmp_path: Path, size: int) -> tuple[int, bytes]:
    data = os.urandom(size)
    path = tmp_path / "src.bin"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY), data


def test_s3_multipart_upload_is_verified_and_resumable(seaweed: SeaweedS3, tmp_path: Path) -> None:
    url = parse_url(f"s3://weights/uploads-{os.urandom(3).hex()}")
    backend = open_backend(url, credentials=Credentials(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY),
                           endpoints=StorageEndpoints(s3_endpoint_url=seaweed.endpoint, s3_addressing_style="path"))
    assert isinstance(backend, S3Backend)
    up = backend.uploader(UploadOptions(part_size=5 * MiB, concurrency=2))
    fd, data = _file(tmp_path, 11 * MiB + 3)
    try:
        res = up.upload_file(fd, len(data), url.key_for("m/model.bin"))
        assert res.sha256 == hashlib.sha256(data).hexdigest() and not res.skipped
        again = up.upload_file(fd, len(data), url.key_for("m/model.bin"), expect_sha256=res.sha256)
        assert again.skipped
    finally:
        os.close(fd)
        up.close()
    download_to(backend, "m/model.bin", tmp_path / "dl/model.bin", size=len(data), sha256=res.sha256,
                part_size=4 * MiB)
    assert (tmp_path / "dl/model.bin").read_bytes() == data
    with pytest.raises(IntegrityError):
        download_to(backend, "m/model.bin", tmp_path / "dl/bad.bin", size=len(data), sha256="0" * 64)
    assert not (tmp_path / "dl/bad.bin").exists()
    backend.close()


def test_gcs_upload_checks_the_stored_crc32c(fake_gcs: FakeGcs, tmp_path: Path) -> None:
    fake_gcs.create_bucket("gup")
    url = parse_url("gs://gup/ckpt")
    backend = open_backend(url, endpoints=StorageEndpoints(gcs_endpoint=fake_gcs.endpoint))
    assert isinstance(backend, GcsBackend)
    fd, data = _file(tmp_path, 3 * MiB + 7)
    try:
        res = backend.upload_file(fd, len(data), "j/model.bin")
        assert res.sha256 == hashlib.sha256(data).hexdigest() and res.verified == "crc32c"
        assert backend.upload_file(fd, len(data), "j/model.bin", expect_sha256=res.sha256).skipped
    finally:
        os.close(fd)
    download_to(backend, "j/model.bin", tmp_path / "dl.bin", size=len(data), sha256=res.sha256, part_size=MiB)
    assert (tmp_path / "dl.bin").read_bytes() == data
    backend.close()
