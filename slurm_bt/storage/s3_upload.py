"""Resumable verified uploads to S3, R2 and CoreWeave: parallel multipart with per-part checksums.

This is where the storage layer goes below s3fs (docs/storage.md): s3fs's writer sends parts
without per-part checksums, cannot resume another process's multipart upload and never checks the
composite checksum of the completed object.

Why not ``boto3.upload_file``: its defaults (8 MiB parts, 10 threads, the SDK's own checksum and,
over plain http, a SigV4 sha256 of every part) spend the CPU of a two-core node on work we do anyway
and give no sha256 of the whole file. Here each file is read once, in order, by the calling thread:

* each part is ``pread`` into memory, its CRC32C (or the store's configured ``part_checksum``) is
  computed, and the part goes to a shared thread pool that sends it with that checksum in the
  header, so the server rejects a part corrupted in flight;
* the same bytes feed the file's sha256 (recorded in the index) while earlier parts are on the
  wire, so hashing is pipelined with the network;
* after ``CompleteMultipartUpload`` a ``HeadObject(ChecksumMode=ENABLED)`` must return the size and
  the composite checksum we expect (``base64(crc32c(part digests))-N``); a multipart ETag is never
  read as an MD5.

Small files go in one ``PutObject`` with ``ChecksumSHA256`` = our sha256, so the server itself
verifies the digest we record. Payload signing is off (the per-part checksums protect the bytes).

Resumability: a rerun whose object already has the expected size and checksum is skipped. A
multipart upload interrupted by ``kill -9``, a node crash or an epilog's time budget is resumed at
part granularity: the newest incomplete upload of the same key is found (``ListMultipartUploads``;
older ones are aborted), its parts listed, and each part is kept only if its size matches our
layout and its checksum (or, where the server lists none, its ETag = MD5) equals that of the local
bytes read now; every other part is sent again. The file is still read and hashed whole, and the
completed object must still show the composite checksum of the *local* parts, so a stale or foreign
part can cost a re-send but never end up in the object. Nothing is ever visible under the final key
before ``CompleteMultipartUpload``. A failed upload is left incomplete for the next attempt to
resume (a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` reclaims abandoned ones).
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from slurm_bt.errors import IntegrityError, StorageError
from slurm_bt.storage.transfer import UploadOptions, UploadResult

__all__ = ["S3Uploader", "composite_checksum", "part_checksum_function", "running_checksum"]

_MiB = 1024 * 1024
_MAX_PARTS = 10_000


def part_checksum_function(name: str) -> Callable[[bytes], bytes]:
    """The digest function (raw bytes) for a ``part_checksum`` name."""
    if name == "crc32c":
        try:
            import google_crc32c

            if google_crc32c.implementation == "c":
                return lambda data: int(google_crc32c.value(data)).to_bytes(4, "big")
        except ImportError:
            pass
        raise StorageError("crc32c", "CRC32C needs the google-crc32c C extension")
    if name == "crc32":
        return lambda data: zlib.crc32(data).to_bytes(4, "big")
    if name == "sha256":
        return lambda data: hashlib.sha256(data).digest()
    raise StorageError(name, "part_checksum must be crc32c, crc32 or sha256")


def running_checksum(name: str) -> Callable[[int, bytes], int]:
    """``update(state, data) -> state`` for the whole-object (FULL_OBJECT) form of a CRC algorithm."""
    if name == "crc32c":
        import google_crc32c

        return lambda crc, data: int(google_crc32c.extend(crc, data))
    return lambda crc, data: zlib.crc32(data, crc)


def composite_checksum(name: str, part_digests: list[bytes]) -> str:
    """S3's COMPOSITE multipart checksum: ``base64(H(d1 || d2 || ...))-N`` with H = the part algorithm."""
    fn = part_checksum_function(name)
    return f"{base64.b64encode(fn(b''.join(part_digests))).decode()}-{len(part_digests)}"


def _default_part_checksum(scheme: str) -> str:
    if scheme == "r2":
        return "sha256"  # R2 has rejected CRC headers more than once
    try:
        part_checksum_function("crc32c")
        return "crc32c"
    except StorageError:
        return "crc32"


class S3Uploader:
    """Multipart uploads into the bucket of an :class:`~slurm_bt.storage.s3.S3Backend`.

    Its client comes from the backend's one client setup (:func:`slurm_bt.storage.s3.boto_config`)
    with upload settings: payload signing off (the per-part checksums protect the bytes), the SDK's
    own checksums off (we always send ours), longer read timeout and more retries.
    """

    def __init__(self, backend: Any, client: Any, options: UploadOptions) -> None:
        """Bind to ``backend``'s bucket with ``client`` (built by the backend); no request yet."""
        self.backend = backend
        self.bucket: str = backend.url.container
        self.part_checksum = options.part_checksum or _default_part_checksum(backend.url.scheme)
        self._digest = part_checksum_function(self.part_checksum)
        self._alg = self.part_checksum.upper()
        self.part_size = options.part_size
        self.concurrency = max(1, options.concurrency)
        self._client = client
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="bt-s3")
        self._slots = threading.BoundedSemaphore(self.concurrency + 2)

    # -- helpers -------------------------------------------------------------------------------
    def _err(self, exc: Exception, key: str, what: str) -> StorageError:
        code = ""
        response = getattr(exc, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
        where = f"{self.backend.url.scheme}://{self.bucket}/{key}"
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StorageError(where, f"{what}: access denied ({code}); check the checkpoint-store credentials")
        return StorageError(where, f"{what}: {code or type(exc).__name__}: {exc}")

    def _part_size_for(self, size: int) -> int:
        part = self.part_size
        while (size + part - 1) // part > _MAX_PARTS:
            part *= 2
        return part

    def head(self, key: str) -> dict[str, Any] | None:
        """``HeadObject`` with checksums (``key`` is absolute in the bucket), or None when absent."""
        from botocore.exceptions import ClientError

        try:
            return dict(self._client.head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED"))
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._err(exc, key, "HeadObject failed") from exc

    def abort_incomplete(self, key: str) -> int:
        """Abort every incomplete multipart upload of exactly ``key`` (absolute; left by a killed uploader)."""
        from botocore.exceptions import ClientError

        try:
            ups = self._incomplete_uploads(key)
            for up in ups:
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=up["UploadId"])
        except ClientError as exc:
            raise self._err(exc, key, "cannot list or abort incomplete uploads") from exc
        return len(ups)

    def _incomplete_uploads(self, key: str) -> list[dict[str, Any]]:
        """Incomplete multipart uploads of exactly ``key`` (``Prefix`` also matches longer keys), oldest first."""
        listed = self._client.list_multipart_uploads(Bucket=self.bucket, Prefix=key).get("Uploads", [])
        return sorted((u for u in listed if u.get("Key") == key), key=lambda u: str(u.get("Initiated", "")))

    def _local_composite(self, fd: int, size: int) -> str:
        part = self._part_size_for(size)
        digests = []
        for off in range(0, size, part):
            digests.append(self._digest(os.pread(fd, min(part, size - off), off)))
        return composite_checksum(self.part_checksum, digests)

    def _already_there(self, fd: int, size: int, key: str, sha256: str) -> bool:
        head = self.head(key)
        if head is None or int(head.get("ContentLength", -1)) != size:
            return False
        if size <= self.part_size:
            return bool(head.get("ChecksumSHA256") == base64.b64encode(bytes.fromhex(sha256)).decode()
                        or head.get("Metadata", {}).get("bt-sha256") == sha256)
        stored = head.get(f"Checksum{self._alg}")
        if not stored:
            return False
        if "-" not in str(stored):
            return False  # a FULL_OBJECT CRC: cheaper to re-send than to prove equal here
        return bool(stored == self._local_composite(fd, size))

    # -- uploads -------------------------------------------------------------------------------
    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Upload ``size`` bytes of ``fd`` to ``key`` (absolute in the bucket) and verify the stored object."""
        if expect_sha256 is not None and self._already_there(fd, size, key, expect_sha256):
            return UploadResult(expect_sha256, size, "existing", skipped=True)
        if size <= self.part_size:
            return self._put_single(fd, size, key)
        return self._put_multipart(fd, size, key)

    def _put_single(self, fd: int, size: int, key: str) -> UploadResult:
        from botocore.exceptions import BotoCoreError, ClientError

        data = os.pread(fd, size, 0) if size else b""
        if len(data) != size:
            raise StorageError(key, f"source shrank while uploading ({len(data)} of {size} bytes)")
        digest = hashlib.sha256(data).digest()
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256",
                                    ChecksumSHA256=base64.b64encode(digest).decode(),
                                    Metadata={"bt-sha256": digest.hex()})
        except (ClientError, BotoCoreError) as exc:
            raise self._err(exc, key, "PutObject failed") from exc
        return UploadResult(digest.hex(), size, "sha256")

    def _resumable(self, key: str) -> tuple[str, dict[int, dict[str, Any]]] | None:
        """The newest incomplete upload of exactly ``key`` and its parts; older ones are aborted."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket = self.bucket
        try:
            ups = self._incomplete_uploads(key)
            if not ups:
                return None
            for old in ups[:-1]:
                self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=old["UploadId"])
            upload_id = str(ups[-1]["UploadId"])
            parts: dict[int, dict[str, Any]] = {}
            marker = 0
            while True:
                resp = self._client.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, PartNumberMarker=marker)
                for part in resp.get("Parts", []):
                    parts[int(part["PartNumber"])] = part
                if not resp.get("IsTruncated") or int(resp.get("NextPartNumberMarker", 0)) <= marker:
                    break
                marker = int(resp["NextPartNumberMarker"])
            algorithm = resp.get("ChecksumAlgorithm")
            if algorithm and str(algorithm).upper() != self._alg:  # begun under another part_checksum
                self._client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
                return None
        except (ClientError, BotoCoreError) as exc:
            raise self._err(exc, key, "cannot list or abort incomplete uploads") from exc
        return upload_id, parts

    def _same_part(self, listed: dict[str, Any] | None, data: bytes, digest: bytes) -> bool:
        """Whether a listed part of an earlier attempt holds exactly ``data``."""
        if listed is None or int(listed.get("Size", -1)) != len(data):
            return False
        stored = listed.get(f"Checksum{self._alg}")
        if stored:
            return bool(stored == base64.b64encode(digest).decode())
        etag = str(listed.get("ETag", "")).strip('"')
        return len(etag) == 32 and etag == hashlib.md5(data, usedforsecurity=False).hexdigest()

    def _put_multipart(self, fd: int, size: int, key: str) -> UploadResult:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket = self.bucket
        part_size = self._part_size_for(size)
        resumed = self._resumable(key)
        earlier: dict[int, dict[str, Any]] = {}
        if resumed is not None:
            upload_id, earlier = resumed
        else:
            try:
                upload_id = self._client.create_multipart_upload(
                    Bucket=bucket, Key=key, ChecksumAlgorithm=self._alg)["UploadId"]
            except (ClientError, BotoCoreError) as exc:
                raise self._err(exc, key, "CreateMultipartUpload failed") from exc
        h = hashlib.sha256()
        futures: list[Future[dict[str, Any]]] = []
        kept = 0
        digests: list[bytes] = []
        # Some S3-compatible servers store a whole-object (FULL_OBJECT) CRC instead of S3's
        # COMPOSITE one; keep the running CRC too so either form can be checked.
        full_update = running_checksum(self.part_checksum) if self.part_checksum != "sha256" else None
        full = 0
        try:
            for number, offset in enumerate(range(0, size, part_size), start=1):
                length = min(part_size, size - offset)
                self._slots.acquire()
                try:
                    data = os.pread(fd, length, offset)
                    if len(data) != length:
                        raise StorageError(key, f"source shrank while uploading (part {number})")
                    digest = self._digest(data)
                except BaseException:
                    self._slots.release()
                    raise
                digests.append(digest)
                if self._same_part(earlier.get(number), data, digest):
                    self._slots.release()
                    done: Future[dict[str, Any]] = Future()
                    done.set_result({"PartNumber": number, "ETag": earlier[number]["ETag"],
                                     f"Checksum{self._alg}": base64.b64encode(digest).decode()})
                    futures.append(done)
                    kept += 1
                else:
                    futures.append(self._pool.submit(self._send_part, key, upload_id, number, data, digest))
                h.update(data)  # hashed while earlier parts are on the wire
                if full_update is not None:
                    full = full_update(full, data)
                del data
            parts = [f.result() for f in futures]
            self._client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                                   MultipartUpload={"Parts": parts})
        except BaseException as exc:
            for f in futures:
                if f.cancel():
                    self._slots.release()  # never ran, so _send_part did not release its slot
            # The upload stays incomplete: the next attempt resumes it (module docstring).
            if isinstance(exc, (ClientError, BotoCoreError)):
                raise self._err(exc, key, "multipart upload failed") from exc
            raise
        expected = composite_checksum(self.part_checksum, digests)
        head = self.head(key)
        if head is None or int(head.get("ContentLength", -1)) != size:
            raise StorageError(key, f"uploaded object is missing or has the wrong size (expected {size})")
        stored = head.get(f"Checksum{self._alg}")
        how = "size"
        if stored:
            if "-" in str(stored):
                how = f"composite-{self.part_checksum}"
            else:  # FULL_OBJECT form
                expected = base64.b64encode(h.digest() if full_update is None else full.to_bytes(4, "big")).decode()
                how = f"full-{self.part_checksum}"
            if stored != expected:
                raise IntegrityError(self.backend.url.canonical, "stored checksum differs from what was sent", file=key,
                                     expected=expected, actual=str(stored))
        return UploadResult(h.hexdigest(), size, how, resumed_parts=kept)

    def _send_part(self, key: str, upload_id: str, number: int, data: bytes, digest: bytes) -> dict[str, Any]:
        try:
            checksum = base64.b64encode(digest).decode()
            resp = self._client.upload_part(Bucket=self.bucket, Key=key, UploadId=upload_id,
                                            PartNumber=number, Body=data, **{f"Checksum{self._alg}": checksum})
            return {"PartNumber": number, "ETag": resp["ETag"], f"Checksum{self._alg}": checksum}
        finally:
            self._slots.release()

    def close(self) -> None:
        """Stop the part pool."""
        self._pool.shutdown(wait=True, cancel_futures=True)
