"""The origin's own checksums: hash functions on known vectors, which check is picked, and that a body
that does not match is refused by the download engine with nothing published (issue 8, item 3).

The loopback-server versions of these (fake Hub, SeaweedFS, fake-gcs-server) are in
tests/integration/test_sources_verify.py; the staging job on the real cluster in
tests/integration/hostile/test_source_verify.py.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import itertools
import os
import random
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from slurm_bt.errors import IntegrityError
from slurm_bt.storage import checksums
from slurm_bt.storage.base import Listing, RemoteFile, TransportOptions
from slurm_bt.storage.checksums import (
    OriginChecksum,
    b64_to_hex,
    git_blob_hasher,
    git_blob_sha1,
    new_hasher,
    pick_check,
    s3_etag_md5,
)
from slurm_bt.storage.url import StorageUrl
from slurm_bt.weights.download import DownloadOptions, fetch_file, hash_remote_file
from slurm_bt.weights.manifest import ManifestFile

MiB = 1 << 20
OPTS = DownloadOptions(part_size=1 * MiB, parallel_threshold=2 * MiB, max_workers=4, backoff_base_s=0.0)


# -- hash functions -------------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "oid"), [
    (b"", "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"),  # git's empty blob
    (b"hello world\n", "3b18e512dba79e4c8300dd08aeb37f8e728b8dad"),
    (b"test content\n", "d670460b4b4aece5915caf5c68d12f560a9fe3e4"),
])
def test_git_blob_sha1_known_vectors(data: bytes, oid: str) -> None:
    assert git_blob_sha1(data) == oid
    h = git_blob_hasher(len(data))  # streamed in pieces, as the download engine feeds it
    for i in range(0, len(data), 5):
        h.update(data[i : i + 5])
    assert h.hexdigest() == oid


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_blob_sha1_matches_git_hash_object() -> None:
    data = random.Random(3).randbytes(70_001) + b"\0\n\r"
    out = subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
    assert git_blob_sha1(data) == out.stdout.decode().strip()


def test_crc_and_md5_known_vectors() -> None:
    check = b"123456789"  # the standard CRC check input
    crc32 = new_hasher(OriginChecksum("crc32", "00000000", "t"), len(check))
    assert crc32 is not None
    crc32.update(check)
    assert crc32.hexdigest() == "cbf43926"
    md5 = new_hasher(OriginChecksum("md5", "0" * 32, "t"), 0)
    assert md5 is not None and md5.hexdigest() == "d41d8cd98f00b204e9800998ecf8427e"
    crc32c = new_hasher(OriginChecksum("crc32c", "00000000", "t"), len(check))
    if crc32c is None:
        pytest.skip("google-crc32c (C extension) not installed")
    crc32c.update(check)
    assert crc32c.hexdigest() == "e3069283"
    crc64 = new_hasher(OriginChecksum("crc64nvme", "0" * 16, "t"), len(check))
    assert crc64 is not None
    crc64.update(check[:4])
    crc64.update(memoryview(check)[4:])
    assert crc64.hexdigest() == "ae8b14860a799888"  # CRC-64/NVME's check value
    # As S3 (x-amz-checksum-crc32) and GCS (crc32c) spell them: base64 of the big-endian value.
    assert b64_to_hex(base64.b64encode(zlib.crc32(check).to_bytes(4, "big")).decode()) == "cbf43926"
    assert b64_to_hex("yZRlqg==") == "c99465aa"  # GCS's crc32c of b"hello world"


def test_s3_etag_md5() -> None:
    md5 = hashlib.md5(b"x", usedforsecurity=False).hexdigest()
    assert s3_etag_md5(f'"{md5}"') == md5
    assert s3_etag_md5(f'"{md5.upper()}"') == md5
    assert s3_etag_md5(f'"{md5}-3"') is None  # multipart: md5 of the part md5s, not of the content
    assert s3_etag_md5('"abc"') is None and s3_etag_md5(None) is None and s3_etag_md5("") is None


def test_origin_checksum_rejects_malformed_values() -> None:
    with pytest.raises(ValueError):
        OriginChecksum("md5", "xyz", "ETag")
    with pytest.raises(ValueError):
        OriginChecksum("git-sha1", "E69DE29BB2D1D6434B8B29AE775AD8C2E48C5391", "oid")  # not lower-case


def test_pick_check_prefers_the_cheapest_and_md5_only_as_last_resort(monkeypatch: pytest.MonkeyPatch) -> None:
    md5 = OriginChecksum("md5", "0" * 32, "md5Hash")
    crc32c = OriginChecksum("crc32c", "0" * 8, "crc32c")
    crc32 = OriginChecksum("crc32", "0" * 8, "x-amz-checksum-crc32")
    git = OriginChecksum("git-sha1", "0" * 40, "git blob id")
    assert pick_check(()) is None
    assert pick_check((md5,)) == md5
    assert pick_check((md5, crc32)) == crc32
    assert pick_check((git,)) == git
    if checksums._crc32c_module() is not None:
        assert pick_check((md5, crc32c)) == crc32c
    crc64 = OriginChecksum("crc64nvme", "0" * 16, "x-amz-checksum-crc64nvme")
    assert pick_check((md5, crc32c, crc32, crc64)) == crc64  # awscrt is part of the s3 extra
    per_part = OriginChecksum("crc32", "0" * 8, "x-amz-checksum-crc32 (composite, 2 parts)", part_sizes=(5, 3))
    assert pick_check((per_part, crc32)) == crc32 and pick_check((per_part, md5)) == per_part
    monkeypatch.setattr(checksums, "_crc32c_module", lambda: None)  # google-crc32c not installed...
    assert pick_check((md5, crc32c)) == crc32c  # ...awscrt computes it
    monkeypatch.setattr(checksums, "_awscrt_checksums", lambda: None)  # ...nor awscrt
    assert pick_check((md5, crc32c)) == md5
    assert pick_check((crc32c,)) is None and pick_check((crc64,)) is None


# -- the download engine refuses a mismatch -------------------------------------------------------------


class _Stream:
    def __init__(self, data: bytes) -> None:
        self.partial = True
        self._data, self._pos = data, 0

    def read(self, n: int) -> bytes:
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def close(self) -> None:
        pass


class MemSource:
    """Serves ``body`` for every file (ranges honoured); optionally answers ``etag_is_md5``."""

    def __init__(self, body: bytes, etag_is_md5: bool | None = None, parts: tuple[int, ...] | None = None) -> None:
        self.uri = StorageUrl("s3", "bkt", "models")
        self.body = body
        self.asked: list[str] = []
        if parts is not None:  # the real part lengths, as S3Backend.exact_check asks them
            def exact(file: RemoteFile, check: OriginChecksum) -> OriginChecksum | None:
                self.asked.append(f"parts of {file.path}")
                return dataclasses.replace(check, part_sizes=parts, layout_assumed=False)
            self.exact_check = exact
        if etag_is_md5 is not None:
            def confirm(file: RemoteFile) -> bool:
                self.asked.append(file.path)
                return etag_is_md5
            self.etag_is_md5 = confirm

    def list_files(self) -> Listing:
        raise NotImplementedError

    def open_range(self, file: ManifestFile, start: int, end: int | None) -> _Stream:
        return _Stream(self.body[start : len(self.body) if end is None else end])

    def close(self) -> None:
        pass


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


def _checks_for(data: bytes) -> dict[str, OriginChecksum]:
    return {
        "git-sha1": OriginChecksum("git-sha1", git_blob_sha1(data), "git blob id"),
        "md5": OriginChecksum("md5", hashlib.md5(data, usedforsecurity=False).hexdigest(), "ETag",
                              maybe_not_content_hash=True),
        "crc32": OriginChecksum("crc32", f"{zlib.crc32(data):08x}", "x-amz-checksum-crc32"),
        "crc32c": OriginChecksum("crc32c", "00000000", "crc32c"),  # value filled below when computable
    }


@pytest.mark.parametrize("kind", ["git-sha1", "md5", "crc32", "crc32c"])
@pytest.mark.parametrize("size", [0, 1000, 5 * MiB + 3])  # empty, one small read, parallel parts
def test_fetch_file_refuses_a_body_that_does_not_match_the_origin_checksum(kind: str, size: int,
                                                                          tmp_path: Path) -> None:
    good = random.Random(size).randbytes(size)
    check = _checks_for(good)[kind]
    if kind == "crc32c":
        h = new_hasher(check, size)
        if h is None:
            pytest.skip("google-crc32c (C extension) not installed")
        h.update(good)
        check = OriginChecksum("crc32c", h.hexdigest(), "crc32c")
    rf = RemoteFile("dir/file.bin", size, None, etag='"e"', checksums=(check,))
    got = fetch_file(MemSource(good), rf, tmp_path, options=OPTS)
    assert got.sha256 == hashlib.sha256(good).hexdigest() and got.path is not None
    assert got.path.read_bytes() == good
    assert hash_remote_file(MemSource(good), rf, options=OPTS) == got.sha256
    if size == 0:
        return
    got.path.chmod(0o644)
    got.path.unlink()
    bad = _flip(good, size // 2)
    with pytest.raises(IntegrityError) as err:
        fetch_file(MemSource(bad, etag_is_md5=True), rf, tmp_path, options=OPTS)
    msg = str(err.value)
    assert "'dir/file.bin'" in msg and check.value in msg and check.label in msg and "not published" in msg
    assert err.value.expected == check.value and err.value.actual != check.value
    assert os.listdir(tmp_path) == []  # neither a blob nor a temp file
    with pytest.raises(IntegrityError):
        hash_remote_file(MemSource(bad, etag_is_md5=True), rf, options=OPTS)


def test_etag_that_is_not_an_md5_is_accepted_only_when_the_source_says_so(tmp_path: Path) -> None:
    body = random.Random(1).randbytes(3 * MiB)
    kms_etag = OriginChecksum("md5", "0123456789abcdef0123456789abcdef", "ETag", maybe_not_content_hash=True)
    rf = RemoteFile("enc.bin", len(body), None, etag='"0123456789abcdef0123456789abcdef"', checksums=(kms_etag,))
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    kms = MemSource(body, etag_is_md5=False)  # e.g. S3 says ServerSideEncryption: aws:kms
    assert fetch_file(kms, rf, tmp_path, options=OPTS).sha256 == hashlib.sha256(body).hexdigest()
    assert kms.asked == ["enc.bin"]
    for source in (MemSource(body, etag_is_md5=True), MemSource(body)):  # plain object; a source that cannot tell
        with pytest.raises(IntegrityError, match="ETag"):
            fetch_file(source, rf, tmp_path / "x", options=OPTS)
    # A definite checksum (not an ETag guess) is never waived, whatever the source answers.
    definite = OriginChecksum("md5", kms_etag.value, "md5Hash")
    with pytest.raises(IntegrityError, match="md5Hash"):
        fetch_file(kms, RemoteFile("enc.bin", len(body), None, checksums=(definite,)), tmp_path / "y", options=OPTS)


def _per_part(kind: str, body: bytes, sizes: tuple[int, ...]) -> str:
    """S3's definition, written out: the digest of the concatenated raw digests of the parts."""
    cuts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    parts = [body[a:b] for a, b in itertools.pairwise(cuts)]
    if kind == "md5":
        return hashlib.md5(b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts),
                           usedforsecurity=False).hexdigest()
    return f"{zlib.crc32(b''.join(zlib.crc32(p).to_bytes(4, 'big') for p in parts)):08x}"


@pytest.mark.parametrize("kind", ["md5", "crc32"])
def test_per_part_digest_is_the_digest_of_the_parts_digests_whatever_the_chunking(kind: str) -> None:
    sizes = (7, 7, 3)
    data = random.Random(kind).randbytes(sum(sizes))
    want = _per_part(kind, data, sizes)
    check = OriginChecksum(kind, want, "t", part_sizes=sizes)  # type: ignore[arg-type]
    for step in (1, 2, 5, 7, 17, 100):
        h = new_hasher(check, len(data))
        assert h is not None
        for i in range(0, len(data), step):
            h.update(data[i : i + step])
        assert h.hexdigest() == want, step
    for wrong in (data[:-1], data + b"x"):  # a short or long body never matches
        h = new_hasher(check, len(data))
        assert h is not None
        h.update(wrong)
        assert h.hexdigest() != want
    with pytest.raises(ValueError):
        OriginChecksum("git-sha1", "0" * 40, "t", part_sizes=(1,))
    with pytest.raises(ValueError):
        OriginChecksum("md5", "0" * 32, "t", part_sizes=(4, 0))


@pytest.mark.parametrize("size", [600_000, 5 * MiB + 3])  # fetch_small (in memory), fetch_file (temp file)
def test_per_part_mismatch_over_an_assumed_layout_asks_the_real_one(size: int, tmp_path: Path) -> None:
    """An uploader that cut 2 + 1 + 2 (+3 bytes) looks like 2 + 2 + 1 from part 1's length and the
    part count: the mismatch asks every part's length and recomputes before refusing anything."""
    body = random.Random(size).randbytes(size)
    unit = size // 5
    real = (2 * unit, unit, size - 3 * unit)
    assumed = (2 * unit, 2 * unit, size - 4 * unit)
    check = OriginChecksum("md5", _per_part("md5", body, real), "ETag (multipart, 3 parts)",
                           maybe_not_content_hash=True, part_sizes=assumed, layout_assumed=True)
    rf = RemoteFile("w.bin", size, None, etag='"x-3"', checksums=(check,))
    opts = dataclasses.replace(OPTS, small_file_max=MiB)
    from slurm_bt.weights.download import fetch_small

    fetch = fetch_small if size <= MiB else fetch_file
    source = MemSource(body, parts=real)
    assert fetch(source, rf, tmp_path, options=opts).sha256 == hashlib.sha256(body).hexdigest()
    assert source.asked == ["parts of w.bin"]
    assert hash_remote_file(MemSource(body, parts=real), rf, options=opts) == hashlib.sha256(body).hexdigest()
    for f in tmp_path.rglob("*"):
        if f.is_file():
            f.chmod(0o644)
            f.unlink()
    # Corrupted: refused over the real layout too; and a source that cannot tell refuses at once.
    for bad_source in (MemSource(_flip(body, size - 10), etag_is_md5=True, parts=real),
                       MemSource(body, etag_is_md5=True)):
        with pytest.raises(IntegrityError, match=r"per-part md5 .* ETag \(multipart, 3 parts\)"):
            fetch(bad_source, rf, tmp_path, options=opts)
    assert not [f for f in tmp_path.rglob("*") if f.is_file()]


def test_known_sha256_is_what_is_checked_and_origin_checksums_add_no_work(tmp_path: Path) -> None:
    body = b"x" * 1000
    wrong_md5 = OriginChecksum("md5", "0" * 32, "md5Hash")
    rf = RemoteFile("a", len(body), hashlib.sha256(body).hexdigest(), checksums=(wrong_md5,))
    assert fetch_file(MemSource(body), rf, tmp_path, options=OPTS).sha256 == rf.sha256


# -- what each backend's listing vouches for ----------------------------------------------------------------


def test_s3_listing_checksums(monkeypatch: pytest.MonkeyPatch) -> None:
    """Single-part ETag -> MD5 (flagged: may be SSE-KMS); multipart -> the ETag or a COMPOSITE checksum over
    the part layout one HEAD of part 1 gives (nothing from a store without part HEADs); listed CRC32 on a big
    object -> one HEAD of the listed version -> CRC32; SHA256 -> the sha256 itself; ETag checks can be
    switched off for S3-compatibles whose ETags are something else."""
    from botocore.stub import Stubber

    from slurm_bt.storage.credentials import Credentials
    from slurm_bt.storage.endpoints import StorageEndpoints
    from slurm_bt.storage.s3 import S3Backend

    md5 = hashlib.md5(b"small", usedforsecurity=False).hexdigest()
    crc = zlib.crc32(b"big").to_bytes(4, "big")

    def listing(endpoints: StorageEndpoints, heads: list[dict[str, object]], *, check_params: bool = True,
                multi_head: dict[str, object] | None = None,
                multi_part: dict[str, object] | int | None = None) -> dict[str, RemoteFile]:
        multi_head = multi_head or {}
        src = S3Backend(StorageUrl("s3", "bkt", "m"), credentials=Credentials(aws_access_key_id="a",
                       aws_secret_access_key="b"), endpoints=endpoints,
                       options=TransportOptions(max_connections=1))  # HEADs in listing order
        with Stubber(src._meta) as stub:
            stub.add_response("list_objects_v2", {"Contents": [
                {"Key": "m/small.json", "Size": 5, "ETag": f'"{md5}"'},
                {"Key": "m/multi.bin", "Size": 20 * MiB, "ETag": f'"{md5}-3"'},
                {"Key": "m/big.bin", "Size": 100 * MiB, "ETag": f'"{md5}"', "ChecksumAlgorithm": ["CRC32"]},
                {"Key": "m/small-crc.bin", "Size": 10, "ETag": f'"{md5}"', "ChecksumAlgorithm": ["CRC32"]},
            ], "IsTruncated": False}, {"Bucket": "bkt", "Prefix": "m/"})
            # multi.bin: multipart and nothing listed; the store may still keep a full-object checksum
            stub.add_response("head_object", multi_head, {"Bucket": "bkt", "Key": "m/multi.bin",
                                                          "ChecksumMode": "ENABLED", "IfMatch": f'"{md5}-3"'})
            # ...and without one, the HEAD of part 1 gives the part layout (or a 400: not supported)
            part_params = {"Bucket": "bkt", "Key": "m/multi.bin", "PartNumber": 1, "IfMatch": f'"{md5}-3"'}
            if isinstance(multi_part, int):
                stub.add_client_error("head_object", "InvalidArgument", http_status_code=multi_part,
                                      expected_params=part_params)
            elif multi_part is not None:
                stub.add_response("head_object", multi_part, part_params)
            for head in heads:
                stub.add_response("head_object", head, {"Bucket": "bkt", "Key": "m/big.bin", "ChecksumMode": "ENABLED",
                                                        "IfMatch": f'"{md5}"'} if check_params else None)
            files = {f.path: f for f in src.list_files().files}
            stub.assert_no_pending_responses()
        return files

    # s3_data_plane=boto3: botocore lists (the Stubber answers); the presigned plane lists with its own
    # parser (tests/unit/test_s3_listing.py) and shares the checksum logic tested here.
    ep = StorageEndpoints(s3_endpoint_url="http://127.0.0.1:9", s3_addressing_style="path", s3_data_plane="boto3")
    full_crc: dict[str, object] = {"ChecksumCRC32": base64.b64encode(crc).decode(), "ChecksumType": "FULL_OBJECT"}
    layout = {"ContentLength": 8 * MiB, "PartsCount": 3}
    files = listing(ep, [full_crc], multi_part=layout)
    etag = OriginChecksum("md5", md5, "ETag", maybe_not_content_hash=True)
    assert files["small.json"].checksums == (etag,)
    # multipart, nothing full-object: the ETag over parts of 8 + 8 + 4 MiB (equal but the last: assumed)
    parts = (8 * MiB, 8 * MiB, 4 * MiB)
    multi_etag = OriginChecksum("md5", md5, "ETag (multipart, 3 parts)", maybe_not_content_hash=True,
                                part_sizes=parts, layout_assumed=True)
    assert files["multi.bin"].checksums == (multi_etag,)
    assert listing(ep, [full_crc], multi_part=400)["multi.bin"].checksums == ()  # no part HEADs: unchecked
    # a part 1 of 7 MiB cannot be 3 equal parts of 20 MiB: every part's length is asked
    files = listing(ep, [full_crc], multi_part={"ContentLength": 6 * MiB, "PartsCount": 1})
    assert files["multi.bin"].checksums == ()  # and a one-part layout must be the whole object
    composite_multi: dict[str, object] = {"ChecksumCRC32": base64.b64encode(crc).decode() + "-3",
                                          "ChecksumType": "COMPOSITE"}
    files = listing(ep, [full_crc], multi_head=composite_multi, multi_part=layout)
    per_part_crc = OriginChecksum("crc32", crc.hex(), "x-amz-checksum-crc32 (composite, 3 parts)", part_sizes=parts,
                                  layout_assumed=True)
    assert files["multi.bin"].checksums == (per_part_crc, multi_etag)
    assert pick_check(files["multi.bin"].checksums) == per_part_crc  # a CRC over parts beats their MD5s
    full: dict[str, object] = {"ChecksumCRC32": base64.b64encode(crc).decode(), "ChecksumType": "FULL_OBJECT"}
    files = listing(ep, [full], multi_head=full)
    assert files["multi.bin"].checksums == (OriginChecksum("crc32", crc.hex(), "x-amz-checksum-crc32"),)
    assert files["big.bin"].checksums == (OriginChecksum("crc32", crc.hex(), "x-amz-checksum-crc32"), etag)
    assert pick_check(files["big.bin"].checksums).kind == "crc32"  # type: ignore[union-attr]
    assert files["small-crc.bin"].checksums == (etag,)  # small and MD5 ETag: no HEAD for a CRC
    composite: dict[str, object] = {"ChecksumCRC32": base64.b64encode(crc).decode() + "-3", "ChecksumType": "COMPOSITE"}
    assert listing(ep, [composite], multi_part=layout)["big.bin"].checksums == (etag,)  # single-part: no layout
    off = StorageEndpoints(s3_endpoint_url="http://127.0.0.1:9", s3_addressing_style="path", s3_etag_md5=False,
                           s3_data_plane="boto3")
    files = listing(off, [composite, composite], check_params=False)  # no MD5 ETag: HEAD every CRC object
    assert all(f.checksums == () for f in files.values())  # and no part HEAD: nothing per part to check


def test_hf_and_gcs_listing_checksums() -> None:
    from slurm_bt.storage.endpoints import StorageEndpoints
    from slurm_bt.storage.gcs import GcsBackend

    src = GcsBackend(StorageUrl("gs", "bkt", ""), credentials=None, endpoints=StorageEndpoints(),
                    options=OPTS.transport)
    assert src._checksums({"name": "a", "crc32c": "yZRlqg==", "md5Hash": "XrY7u+Ae7tCTyyK7j1rNww=="}) == (
        OriginChecksum("crc32c", "c99465aa", "crc32c"),
        OriginChecksum("md5", hashlib.md5(b"hello world", usedforsecurity=False).hexdigest(), "md5Hash"))
    assert src._checksums({"name": "composite", "crc32c": "yZRlqg=="}) == (
        OriginChecksum("crc32c", "c99465aa", "crc32c"),)
    from slurm_bt.errors import SourceError

    with pytest.raises(SourceError, match="malformed md5Hash"):
        src._checksums({"name": "x", "md5Hash": "AAAA"})
