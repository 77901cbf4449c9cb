"""Checkpoint uploads against a real S3 server (SeaweedFS on loopback): multipart integrity, kill -9 and rerun.

SeaweedFS checks per-part checksums and returns S3's COMPOSITE checksum, unlike moto, so this is
where multipart integrity is tested.
"""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import open_store
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader, read_job_index
from slurm_bt.errors import StorageError
from slurm_bt.storage.credentials import Credentials
from tests.servers.fixtures import seaweed  # noqa: F401  (session fixture)
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

BUCKET = "ckpt-it"


def _creds(key: str, secret: str) -> Credentials:
    return Credentials(aws_access_key_id=key, aws_secret_access_key=secret)


def _uri(server: SeaweedS3, extra: str = "") -> str:
    return f"s3://{BUCKET}/store?endpoint_url={server.endpoint}&part_size_mib=8{extra}"


@pytest.fixture(scope="module")
def s3(seaweed: SeaweedS3) -> SeaweedS3:  # noqa: F811
    seaweed.create_bucket(BUCKET)
    return seaweed


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_multipart_upload_is_verified_and_downloads_identically(s3: SeaweedS3, tmp_path: Path) -> None:
    store = open_store(_uri(s3), credentials=_creds(ACCESS_KEY, SECRET_KEY))
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(21 * 1024 * 1024 + 123))
    fd = os.open(src, os.O_RDONLY)
    try:
        res = store.upload_file(fd, src.stat().st_size, "t/big.bin")
        assert res.sha256 == _sha(src)
        assert res.verified.startswith("composite-") or res.verified.startswith("full-"), res.verified
        again = store.upload_file(fd, src.stat().st_size, "t/big.bin", expect_sha256=res.sha256)
        assert again.skipped, "the stored object's checksums match: not sent again"
    finally:
        os.close(fd)
    head = s3.client().head_object(Bucket=BUCKET, Key="store/t/big.bin", ChecksumMode="ENABLED")
    assert head["ETag"].strip('"').endswith("-3"), "multipart (its ETag is not an MD5, and is never used)"
    dest = tmp_path / "dl/big.bin"
    store.download_file("t/big.bin", dest, size=src.stat().st_size, sha256=res.sha256)
    assert _sha(dest) == res.sha256
    store.close()


def test_rank_uploader_on_s3(s3: SeaweedS3, tmp_path: Path) -> None:
    store = open_store(_uri(s3), credentials=_creds(ACCESS_KEY, SECRET_KEY))
    ckpt = tmp_path / "ckpt"
    (ckpt / "checkpoint-5/sub").mkdir(parents=True)
    (ckpt / "checkpoint-5/model.bin").write_bytes(os.urandom(9 * 1024 * 1024))
    (ckpt / "checkpoint-5/sub/a.json").write_text("{}")
    (ckpt / "checkpoint-5/.complete").touch()
    up = RankUploader(store=store, ident=JobIdentity("S3 Demo", "s3-demo", "9001", "alice", 0, 1, "btteam1"),
                      checkpoint_dir=ckpt, tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None)
    assert up.run_once() == ["checkpoint-5"]
    index = read_job_index(store, "s3-demo", "9001", team="btteam1")
    assert index is not None and index.latest() is not None
    job = "store/_teams/btteam1/s3-demo/9001"  # the team's namespace (docs/checkpoints.md)
    keys = {o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{job}/")["Contents"]}
    assert {f"{job}/index.json", f"{job}/ranks/rank-0.json", f"{job}/rank-0/checkpoint-5/model.bin",
            f"{job}/rank-0/checkpoint-5/sub/a.json"} <= keys
    store.close()


KILL_SCRIPT = """
import os, sys
from slurm_bt.checkpoints.store import open_store
from slurm_bt.storage.credentials import Credentials
store = open_store(sys.argv[1] + "&concurrency=1",
                   credentials=Credentials(aws_access_key_id=sys.argv[3], aws_secret_access_key=sys.argv[4]))
fd = os.open(sys.argv[2], os.O_RDONLY)
print("started", flush=True)
store.upload_file(fd, os.fstat(fd).st_size, "kill/victim.bin")
print("finished", flush=True)
"""


def test_kill_9_during_multipart_then_rerun(s3: SeaweedS3, tmp_path: Path) -> None:
    src = tmp_path / "victim.bin"
    src.write_bytes(os.urandom(96 * 1024 * 1024))
    client = s3.client()
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, _uri(s3), str(src), ACCESS_KEY, SECRET_KEY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until two parts are stored
            ups = client.list_multipart_uploads(Bucket=BUCKET, Prefix="store/kill/").get("Uploads", [])
            if ups and len(client.list_parts(Bucket=BUCKET, Key=ups[0]["Key"],
                                             UploadId=ups[0]["UploadId"]).get("Parts", [])) >= 2:
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    with pytest.raises(client.exceptions.ClientError):
        client.head_object(Bucket=BUCKET, Key="store/kill/victim.bin")  # nothing under the final key
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix="store/kill/").get("Uploads"), "left incomplete"
    store = open_store(_uri(s3), credentials=_creds(ACCESS_KEY, SECRET_KEY))
    fd = os.open(src, os.O_RDONLY)
    try:
        res = store.upload_file(fd, src.stat().st_size, "kill/victim.bin")
    finally:
        os.close(fd)
    assert res.sha256 == _sha(src)
    assert res.resumed_parts >= 2, res  # the parts stored before the kill were not sent again
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix="store/kill/").get("Uploads", []) == [], \
        "the killed upload was resumed and completed"
    dest = tmp_path / "back.bin"
    store.download_file("kill/victim.bin", dest, size=src.stat().st_size, sha256=res.sha256)
    assert _sha(dest) == _sha(src), "no missing or corrupt object after the rerun"
    store.close()


def test_resume_resends_parts_that_differ_from_the_local_file(s3: SeaweedS3, tmp_path: Path) -> None:
    """An interrupted upload whose stored parts are stale (file rewritten) or corrupt: only matching parts are kept."""
    from slurm_bt.storage.s3_upload import part_checksum_function

    crc = part_checksum_function("crc32c")
    part = 8 * 1024 * 1024  # the store's part_size_mib in _uri
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(3 * part + 1234))
    data = src.read_bytes()
    client = s3.client()
    key = "store/resume/model.bin"
    older = client.create_multipart_upload(Bucket=BUCKET, Key=key, ChecksumAlgorithm="CRC32C")["UploadId"]
    time.sleep(1.1)  # Initiated has one-second resolution
    up = client.create_multipart_upload(Bucket=BUCKET, Key=key, ChecksumAlgorithm="CRC32C")["UploadId"]
    stale = os.urandom(part)
    for number, body in ((1, data[:part]), (2, stale)):  # part 1 matches the file, part 2 is stale
        client.upload_part(Bucket=BUCKET, Key=key, UploadId=up, PartNumber=number, Body=body,
                           ChecksumCRC32C=base64.b64encode(crc(body)).decode())
    store = open_store(_uri(s3), credentials=_creds(ACCESS_KEY, SECRET_KEY))
    fd = os.open(src, os.O_RDONLY)
    try:
        res = store.upload_file(fd, len(data), "resume/model.bin")
    finally:
        os.close(fd)
    assert res.resumed_parts == 1 and res.sha256 == hashlib.sha256(data).hexdigest(), res
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix="store/resume/").get("Uploads", []) == []
    assert all(u["UploadId"] != older for u in client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []))
    back = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert back == data, "the object holds the local bytes, not the stale part"
    store.close()


def test_wrong_credentials_are_a_clear_error(s3: SeaweedS3, tmp_path: Path) -> None:
    store = open_store(_uri(s3), credentials=_creds("nobody", "wrong-secret"))
    with pytest.raises(StorageError, match=r"access denied|InvalidAccessKeyId|SignatureDoesNotMatch"):
        store.write_bytes("x/index.json", b"{}")
    store.close()
