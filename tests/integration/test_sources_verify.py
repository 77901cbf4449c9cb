"""Every byte verified, not only LFS files (issue 8, item 3), against the real loopback servers.

Each origin serves a body that does not match what its listing vouches for, and the staging path
(``stage_source``, what the staging job runs) and ``resolve(mirror_dir=...)`` must refuse it with the
file and both checksums named, leaving nothing in the cluster cache:

* fake Hub: a non-LFS file's body flipped in transit (its tree ``oid`` is the git blob sha1);
* SeaweedFS behind a corrupting proxy: a single-part object whose ETag is the MD5 of the original,
  a multipart object with a full-object CRC32 or CRC64NVME (found by one HEAD: SeaweedFS does not
  list it), and multipart objects with only per-part values: the ETag (MD5 of the parts' MD5s) and
  boto3's COMPOSITE CRC32, checked over the part layout one HEAD of part 1 gives;
* fake-gcs-server: an object whose stored bytes rotted (listed crc32c of the original), and one whose
  listed md5Hash does not match (crc32c absent, as for objects some tools write).

On main before this change all of these were published under the sha256 of the corrupted bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.errors import IntegrityError, SourceError
from slurm_bt.storage.base import TransportOptions
from slurm_bt.storage.checksums import git_blob_sha1
from slurm_bt.storage.credentials import Credentials, parse_credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.download import DownloadOptions
from slurm_bt.weights.plan import SourcePin, list_selected, pin_key
from slurm_bt.weights.resolve import resolve
from slurm_bt.weights.stage_job import stage_source
from tests.servers.corrupt_proxy import CorruptingProxy
from tests.servers.gcs import FakeGcs
from tests.servers.hf_hub import FakeHub, Faults
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

MiB = 1 << 20
OPTS = DownloadOptions(part_size=1 * MiB, parallel_threshold=2 * MiB, max_workers=4, backoff_base_s=0.01,
                       transport=TransportOptions(read_timeout_s=5, connect_timeout_s=2, list_retries=2))


def _stage(source: str, endpoints: StorageEndpoints, creds: Credentials | None, root: Path) -> ClusterCache:
    """Pin ``source`` as bt-sbatch does and stage it into a fresh team tier at ``root``."""
    cache = ClusterCache(root, dir_mode=0o755)
    listing, files, revision = list_selected(source, allow=None, ignore=None, credentials=creds, endpoints=endpoints)
    pin = SourcePin(index=0, declared=source, kind=listing.uri.kind, source=listing.uri.canonical, revision=revision,
                    mount_location="/w", pin_key=pin_key(listing.uri.kind, listing.uri.canonical, revision, files),
                    files=tuple(files))
    with open(os.devnull, "w") as out:
        stage_source(pin, cache, ClusterCache(root.parent / f"{root.name}-shared"), credentials=creds,
                     endpoints=endpoints, options=OPTS, out=out)
    return cache


def _assert_nothing_published(root: Path, bad: bytes) -> None:
    """No blob of the bad bytes, no temp file, no manifest, no snapshot anywhere under ``root``."""
    names = [p.name for p in root.rglob("*") if p.is_file()]
    assert hashlib.sha256(bad).hexdigest() not in names, names
    assert not [n for n in names if ".tmp-" in n], names
    for sub in ("manifests", "snapshots"):
        assert not [p for p in (root / sub).rglob("*") if p.is_file()], sub


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1 :]


# -- hf:// non-LFS -----------------------------------------------------------------------------------


def test_hf_non_lfs_body_corrupted_in_transit_is_refused(fake_hub: FakeHub, tmp_path: Path) -> None:
    rnd = random.Random(8)
    config = json.dumps({"hidden": 16, "pad": "x" * 3000}).encode()
    files = {"config.json": config, "tokenizer.json": b'{"v": 1}', "model.safetensors": rnd.randbytes(MiB + 5)}
    tag = rnd.randbytes(4).hex()
    fake_hub.add_repo(f"Org/Verify-{tag}", files)
    ep = StorageEndpoints(hf_endpoint=fake_hub.endpoint)
    source = f"hf://Org/Verify-{tag}"
    oid = git_blob_sha1(config)
    with fake_hub.faults(Faults(paths={"config.json"}, corrupt_offset=1234, times=-1)):
        with pytest.raises(IntegrityError) as err:
            _stage(source, ep, None, tmp_path / "team")
        mirror = tmp_path / "mirror"
        mirror.mkdir()
        with pytest.raises(IntegrityError, match="git blob id"):
            resolve(source, endpoints=ep, mirror_dir=mirror, options=OPTS)
    msg = str(err.value)
    assert "'config.json'" in msg and oid in msg and "git blob id" in msg and "not published" in msg, msg
    assert err.value.actual == git_blob_sha1(_flip(config, 1234))
    bad = _flip(config, 1234)
    _assert_nothing_published(tmp_path / "team", bad)
    _assert_nothing_published(mirror, bad)
    # The same source served correctly stages, and config.json is the original bytes.
    cache = _stage(source, ep, None, tmp_path / "team")
    assert (cache.layout.blobs / hashlib.sha256(config).hexdigest()).read_bytes() == config


# -- s3:// single-part objects (ETag = MD5) -----------------------------------------------------------


@pytest.fixture
def proxy(seaweed: SeaweedS3) -> Iterator[CorruptingProxy]:
    p = CorruptingProxy(seaweed.endpoint).start()
    try:
        yield p
    finally:
        p.stop()


def _s3_creds() -> Credentials:
    return parse_credentials("s3", json.dumps({"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}),
                             source="s3://weights", secret_name="aws")


@pytest.mark.parametrize("plane", ["presigned", "boto3"])
def test_s3_single_part_object_not_matching_its_etag_is_refused(seaweed: SeaweedS3, proxy: CorruptingProxy,
                                                                tmp_path: Path, plane: str) -> None:
    rnd = random.Random(plane)
    prefix = f"verify-{rnd.randbytes(4).hex()}"
    big = rnd.randbytes(3 * MiB + 1)  # several ranged parts
    client = seaweed.client()
    client.put_object(Bucket="weights", Key=f"{prefix}/model.bin", Body=big)
    client.put_object(Bucket="weights", Key=f"{prefix}/config.json", Body=b'{"a": 1}')
    md5 = hashlib.md5(big, usedforsecurity=False).hexdigest()
    assert client.head_object(Bucket="weights", Key=f"{prefix}/model.bin")["ETag"] == f'"{md5}"'
    ep = StorageEndpoints(s3_endpoint_url=proxy.endpoint, s3_addressing_style="path", s3_data_plane=plane)
    proxy.corrupt[f"/weights/{prefix}/model.bin"] = 2 * MiB + 17
    with pytest.raises(IntegrityError) as err:
        _stage(f"s3://weights/{prefix}", ep, _s3_creds(), tmp_path / "team")
    assert proxy.flipped, "the proxy never corrupted anything: the test proves nothing"
    msg = str(err.value)
    assert "'model.bin'" in msg and md5 in msg and "ETag" in msg and "not published" in msg, msg
    _assert_nothing_published(tmp_path / "team", _flip(big, 2 * MiB + 17))
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with pytest.raises(IntegrityError, match="ETag"):
        resolve(f"s3://weights/{prefix}", credentials=_s3_creds(), endpoints=ep, mirror_dir=mirror, options=OPTS)
    _assert_nothing_published(mirror, _flip(big, 2 * MiB + 17))
    proxy.corrupt.clear()
    cache = _stage(f"s3://weights/{prefix}", ep, _s3_creds(), tmp_path / "team")
    assert (cache.layout.blobs / hashlib.sha256(big).hexdigest()).read_bytes() == big


def _multipart(client: Any, key: str, chunks: list[bytes], **create: Any) -> None:
    """Upload ``chunks`` as the parts of one multipart object (``create``: e.g. ChecksumAlgorithm)."""
    up = client.create_multipart_upload(Bucket="weights", Key=key, **create)
    parts = []
    for n, chunk in enumerate(chunks, 1):
        extra = {"ChecksumAlgorithm": create["ChecksumAlgorithm"]} if "ChecksumAlgorithm" in create else {}
        r = client.upload_part(Bucket="weights", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=chunk, **extra)
        parts.append({"ETag": r["ETag"], "PartNumber": n,
                      **{k: v for k, v in r.items() if k.startswith("Checksum") and k != "ChecksumType"}})
    client.complete_multipart_upload(Bucket="weights", Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": parts})


def _refused_then_staged(proxy: CorruptingProxy, prefix: str, key: str, body: bytes, bad_at: int, root: Path,
                         *expected: str) -> None:
    """Staging ``s3://weights/<prefix>`` through ``proxy`` with the byte at ``bad_at`` of ``key`` flipped
    fails with every ``expected`` text in the error and publishes nothing; unflipped, it stages ``body``."""
    ep = StorageEndpoints(s3_endpoint_url=proxy.endpoint, s3_addressing_style="path")
    proxy.corrupt[f"/weights/{key}"] = bad_at
    with pytest.raises(IntegrityError) as err:
        _stage(f"s3://weights/{prefix}", ep, _s3_creds(), root)
    assert proxy.flipped, "the proxy never corrupted anything: the test proves nothing"
    assert all(text in str(err.value) for text in expected), (expected, str(err.value))
    _assert_nothing_published(root, _flip(body, bad_at))
    proxy.corrupt.clear()
    cache = _stage(f"s3://weights/{prefix}", ep, _s3_creds(), root)
    assert (cache.layout.blobs / hashlib.sha256(body).hexdigest()).read_bytes() == body


# Equal parts but the last (what every common uploader cuts); unequal ones whose sizes fit that
# pattern (9 + 5 + 6 MiB looks like 9 + 9 + 2: the real lengths are asked after the mismatch); and
# unequal ones that do not (6 + 6 + 8: asked at listing).
_LAYOUTS = {"equal": (8, 8, 3), "unequal-fits": (9, 5, 6), "unequal": (6, 6, 8)}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_s3_multipart_object_is_checked_against_its_etag_part_by_part(seaweed: SeaweedS3, proxy: CorruptingProxy,
                                                                     tmp_path: Path, layout: str) -> None:
    """A multipart ETag is the MD5 of the parts' MD5s: with the part lengths known (HEAD of part 1,
    its length and the part count) it covers every byte. On main before this change such an object
    (every big file boto3, the AWS CLI or s5cmd uploads) was checked against nothing."""
    rnd = random.Random(layout)
    chunks = [rnd.randbytes(n * MiB) for n in _LAYOUTS[layout]]
    chunks[-1] += b"tail"
    body = b"".join(chunks)
    prefix = f"verify-mp-{rnd.randbytes(4).hex()}"
    client = seaweed.client()
    key = f"{prefix}/shard.bin"
    _multipart(client, key, chunks)
    etag = client.head_object(Bucket="weights", Key=key)["ETag"]
    part_md5s = b"".join(hashlib.md5(c, usedforsecurity=False).digest() for c in chunks)
    assert etag == f'"{hashlib.md5(part_md5s, usedforsecurity=False).hexdigest()}-3"'  # what S3 defines
    _refused_then_staged(proxy, prefix, key, body, len(body) - 3 * MiB, tmp_path / "team",
                         "per-part md5", "ETag (multipart, 3 parts)", etag.strip('"').split("-")[0])
    # resolve's hash-only pass (no temp file to re-read: an assumed layout is streamed again) too.
    ep = StorageEndpoints(s3_endpoint_url=proxy.endpoint, s3_addressing_style="path")
    proxy.corrupt[f"/weights/{key}"] = 5
    with pytest.raises(IntegrityError, match=r"per-part md5 .* ETag \(multipart, 3 parts\)"):
        resolve(f"s3://weights/{prefix}", credentials=_s3_creds(), endpoints=ep, options=OPTS)
    proxy.corrupt.clear()
    assert resolve(f"s3://weights/{prefix}", credentials=_s3_creds(), endpoints=ep, options=OPTS
                   ).files[0].sha256 == hashlib.sha256(body).hexdigest()


def test_s3_boto3_upload_file_object_is_checked_against_its_composite_crc32(
        seaweed: SeaweedS3, proxy: CorruptingProxy, tmp_path: Path) -> None:
    """boto3's ``upload_file`` (8 MiB parts, CRC32 by default) leaves a COMPOSITE checksum: the CRC32
    of the parts' CRC32s. It is checked (cheaper than the ETag's MD5s) and a corrupted body refused."""
    from slurm_bt.storage.checksums import b64_to_hex

    rnd = random.Random(32)
    body = rnd.randbytes(19 * MiB + 5)
    src = tmp_path / "upload.bin"
    src.write_bytes(body)
    prefix = f"verify-composite-{rnd.randbytes(4).hex()}"
    client = seaweed.client()
    client.upload_file(str(src), "weights", f"{prefix}/model.bin")
    head = client.head_object(Bucket="weights", Key=f"{prefix}/model.bin", ChecksumMode="ENABLED")
    assert head["ChecksumType"] == "COMPOSITE" and head["ChecksumCRC32"].endswith("-3"), head
    import zlib

    parts = [body[i:i + 8 * MiB] for i in range(0, len(body), 8 * MiB)]
    composite = zlib.crc32(b"".join(zlib.crc32(p).to_bytes(4, "big") for p in parts))
    assert b64_to_hex(head["ChecksumCRC32"].split("-")[0]) == f"{composite:08x}"
    _refused_then_staged(proxy, prefix, f"{prefix}/model.bin", body, 17 * MiB + 1, tmp_path / "team",
                         "per-part crc32", "x-amz-checksum-crc32 (composite, 3 parts)", f"{composite:08x}")


def test_s3_object_with_full_object_crc64nvme_is_checked(seaweed: SeaweedS3, proxy: CorruptingProxy,
                                                         tmp_path: Path) -> None:
    """CRC64NVME, what AWS S3 keeps for new objects by default (always full-object, multipart too),
    computed with awscrt (the ``s3`` extra): it wins over the composite values and the ETag."""
    from awscrt import checksums as crt

    rnd = random.Random(64)
    chunks = [rnd.randbytes(5 * MiB), rnd.randbytes(MiB + 9)]
    body = b"".join(chunks)
    prefix = f"verify-crc64-{rnd.randbytes(4).hex()}"
    _multipart(seaweed.client(), f"{prefix}/w.bin", chunks, ChecksumAlgorithm="CRC64NVME", ChecksumType="FULL_OBJECT")
    _refused_then_staged(proxy, prefix, f"{prefix}/w.bin", body, 5 * MiB + 3, tmp_path / "team",
                         "x-amz-checksum-crc64nvme", f"{crt.crc64nvme(body):016x}")


def test_s3_multipart_object_with_full_object_crc32_is_checked(seaweed: SeaweedS3, proxy: CorruptingProxy,
                                                                 tmp_path: Path) -> None:
    """SeaweedFS keeps a FULL_OBJECT CRC32 of a multipart upload but does not list it: one HEAD finds it."""
    import zlib

    prefix = f"verify-crc-{random.Random().randbytes(4).hex()}"
    client = seaweed.client()
    key = f"{prefix}/shard.bin"
    chunks = [random.Random(1).randbytes(5 * MiB), random.Random(2).randbytes(MiB + 7)]
    body = b"".join(chunks)
    up = client.create_multipart_upload(Bucket="weights", Key=key, ChecksumAlgorithm="CRC32",
                                        ChecksumType="FULL_OBJECT")
    parts = []
    for n, chunk in enumerate(chunks, 1):
        r = client.upload_part(Bucket="weights", Key=key, UploadId=up["UploadId"], PartNumber=n, Body=chunk,
                               ChecksumAlgorithm="CRC32")
        parts.append({"ETag": r["ETag"], "PartNumber": n, "ChecksumCRC32": r["ChecksumCRC32"]})
    client.complete_multipart_upload(Bucket="weights", Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": parts})
    _refused_then_staged(proxy, prefix, key, body, 5 * MiB + 1, tmp_path / "team",
                         "x-amz-checksum-crc32", f"{zlib.crc32(body):08x}")


# -- gs:// ----------------------------------------------------------------------------------------------


def test_gcs_object_not_matching_its_crc32c_or_md5_is_refused(fake_gcs: FakeGcs, tmp_path: Path) -> None:
    rnd = random.Random(11)
    prefix = f"verify-{rnd.randbytes(4).hex()}"
    body = rnd.randbytes(2 * MiB + 9)
    fake_gcs.upload("gweights", f"{prefix}/rot/model.bin", body)
    fake_gcs.upload("gweights", f"{prefix}/md5/model.bin", body)
    ep = StorageEndpoints(gcs_endpoint=fake_gcs.endpoint)
    # 1. bit rot at the origin: stored bytes changed, listing still has the original crc32c/md5Hash
    fake_gcs.corrupt_on_disk("gweights", f"{prefix}/rot/model.bin", MiB + 3)
    with pytest.raises(IntegrityError) as err:
        _stage(f"gs://gweights/{prefix}/rot", ep, None, tmp_path / "rot")
    assert "'model.bin'" in str(err.value) and "crc32c" in str(err.value), err.value
    _assert_nothing_published(tmp_path / "rot", _flip(body, MiB + 3))
    # 2. a listed md5Hash the content does not have, and no crc32c to prefer over it
    wrong = hashlib.md5(b"something else", usedforsecurity=False).digest()
    fake_gcs.set_listed_checksums("gweights", f"{prefix}/md5/model.bin",
                                  md5_b64=base64.b64encode(wrong).decode(), crc32c_b64=None)
    with pytest.raises(IntegrityError) as err:
        _stage(f"gs://gweights/{prefix}/md5", ep, None, tmp_path / "md5")
    msg = str(err.value)
    assert "md5Hash" in msg and wrong.hex() in msg and hashlib.md5(body, usedforsecurity=False).hexdigest() in msg
    _assert_nothing_published(tmp_path / "md5", body)
    with pytest.raises(SourceError, match="md5Hash"):
        resolve(f"gs://gweights/{prefix}/md5", endpoints=ep, options=OPTS)  # hash-only resolve checks too
