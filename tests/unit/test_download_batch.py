"""Remote -> cluster cache at the native clients' speed without giving up verification (issue 14, item 2).

* small files: :func:`fetch_small` verifies in memory before writing, :class:`BlobBatch` publishes a
  batch with one ``syncfs`` before any final name and one fsync of ``blobs/`` after: a crash, a
  corrupted object or a failed ``syncfs`` leaves nothing under a final name;
* S3 presigning: :class:`_FastPresigner` signs byte-identically to botocore or is not used.

The loopback-server versions (SeaweedFS, fake Hub) are tests/integration/test_sources_s3.py,
test_sources_hf.py and test_sources_verify.py.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.errors import IntegrityError, SourceUnavailableError, StorageError
from slurm_bt.storage.base import Listing, RemoteFile, TransportOptions
from slurm_bt.storage.checksums import OriginChecksum, git_blob_sha1
from slurm_bt.storage.url import StorageUrl
from slurm_bt.weights import cache_layout, cluster_cache
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.download import DownloadOptions, fetch_small
from slurm_bt.weights.manifest import ManifestFile

OPTS = DownloadOptions(backoff_base_s=0.0, max_retries=3)


class _Stream:
    def __init__(self, data: bytes, *, partial: bool = True, fail_after: int | None = None) -> None:
        self.partial = partial
        self._data, self._pos, self._fail_after = data, 0, fail_after

    def read(self, n: int) -> bytes:
        if self._fail_after is not None and self._pos >= self._fail_after:
            raise SourceUnavailableError("s3://bkt/models", "connection reset", transient=True)
        stop = self._pos + n if self._fail_after is None else min(self._pos + n, self._fail_after)
        out = self._data[self._pos:stop]
        self._pos += len(out)
        return out

    def close(self) -> None:
        pass


class Source:
    """Serves ``bodies[path]``; the first ``flaky`` requests die after ``fail_after`` bytes."""

    def __init__(self, bodies: dict[str, bytes], *, flaky: int = 0, fail_after: int = 0,
                 honour_range: bool = True) -> None:
        self.uri = StorageUrl("s3", "bkt", "models")
        self.bodies = bodies
        self.flaky, self.fail_after, self.honour_range = flaky, fail_after, honour_range
        self.requests: list[tuple[str, int]] = []

    def list_files(self) -> Listing:
        raise NotImplementedError

    def open_range(self, file: ManifestFile, start: int, end: int | None) -> _Stream:
        self.requests.append((file.path, start))
        body = self.bodies[file.path]
        partial = self.honour_range or start == 0
        data = body[start:end] if partial else body
        fail = self.fail_after if len(self.requests) <= self.flaky else None
        return _Stream(data, partial=partial, fail_after=fail)

    def close(self) -> None:
        pass


def _remote(path: str, body: bytes, **kw: Any) -> RemoteFile:
    return RemoteFile(path, len(body), None, etag='"e"',
                      checksums=(OriginChecksum("git-sha1", git_blob_sha1(body), "git blob id"),), **kw)


def _files(root: Path) -> list[Path]:
    return sorted(Path(d) / f for d, _, names in os.walk(root) for f in names)


def _bodies(n: int, size: int = 4096) -> dict[str, bytes]:
    rnd = random.Random(n)
    return {f"f/{i:04d}.txt": rnd.randbytes(size) for i in range(n)}


# -- fetch_small ----------------------------------------------------------------------------------------------


def test_fetch_small_writes_verified_bytes_to_a_temp_name_only(tmp_path: Path) -> None:
    body = random.Random(1).randbytes(5000)
    got = fetch_small(Source({"a": body}), _remote("a", body), tmp_path, options=OPTS)
    assert got.sha256 == hashlib.sha256(body).hexdigest() and got.path is not None
    assert got.path.parent.parent == tmp_path and got.path.name != got.sha256  # not published: a temp name
    assert got.path.parent.name == f".fan-{got.sha256[0]}"  # creations spread over 16 subdirectories
    assert got.path.read_bytes() == body and (got.path.stat().st_mode & 0o777) == 0o444
    assert _files(tmp_path) == [got.path]


@pytest.mark.parametrize("honour_range", [True, False])
def test_fetch_small_resumes_after_a_reset(tmp_path: Path, honour_range: bool) -> None:
    body = random.Random(2).randbytes(100_000)
    src = Source({"a": body}, flaky=2, fail_after=30_000, honour_range=honour_range)
    got = fetch_small(src, _remote("a", body), tmp_path, options=OPTS)
    assert got.path is not None and got.path.read_bytes() == body
    if honour_range:  # the bytes already received are not fetched again
        assert [s for _, s in src.requests] == [0, 30_000, 60_000]


def test_fetch_small_gives_up_after_bounded_retries(tmp_path: Path) -> None:
    body = b"x" * 1000
    src = Source({"a": body}, flaky=100, fail_after=0)
    with pytest.raises(SourceUnavailableError, match="gave up after"):
        fetch_small(src, _remote("a", body), tmp_path, options=OPTS)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("known_sha", [True, False])
def test_fetch_small_refuses_a_corrupted_body_before_writing(tmp_path: Path, known_sha: bool) -> None:
    good = random.Random(3).randbytes(4096)
    bad = good[:100] + bytes([good[100] ^ 1]) + good[101:]
    rf = (RemoteFile("a", len(good), hashlib.sha256(good).hexdigest(), etag='"e"') if known_sha
          else _remote("a", good))
    with pytest.raises(IntegrityError, match="not published"):
        fetch_small(Source({"a": bad}), rf, tmp_path, options=OPTS)
    assert os.listdir(tmp_path) == []
    with pytest.raises(SourceUnavailableError, match="body ended before the expected size"):
        fetch_small(Source({"a": good[:-1]}), _remote("a", good), tmp_path, options=OPTS)
    assert os.listdir(tmp_path) == []


def test_fetch_small_empty_file_is_checked_too(tmp_path: Path) -> None:
    src = Source({"e": b""})
    got = fetch_small(src, _remote("e", b""), tmp_path, options=OPTS)
    assert got.sha256 == hashlib.sha256(b"").hexdigest() and src.requests == []
    wrong = RemoteFile("e", 0, None, checksums=(OriginChecksum("git-sha1", "0" * 40, "git blob id"),))
    (tmp_path / "x").mkdir()
    with pytest.raises(IntegrityError):
        fetch_small(src, wrong, tmp_path / "x", options=OPTS)
    assert os.listdir(tmp_path / "x") == []


# -- BlobBatch -----------------------------------------------------------------------------------------------


def _fetch_into(cache: ClusterCache, wdir: Path, bodies: dict[str, bytes]) -> list[tuple[Path, ManifestFile]]:
    out = []
    src = Source(bodies)
    for path, body in bodies.items():
        got = fetch_small(src, _remote(path, body), wdir, options=OPTS)
        assert got.path is not None
        out.append((got.path, ManifestFile(path=path, size=len(body), sha256=got.sha256)))
    return out


def _published(cache: ClusterCache) -> set[str]:
    return {n for n in os.listdir(cache.layout.blobs) if not n.startswith(".")}


def test_batch_publishes_with_syncfs_before_the_first_link_and_after_the_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ClusterCache(tmp_path / "tier")
    events: list[str] = []
    real_syncfs, real_link, real_dirsync = cache_layout.syncfs, os.link, cache_layout.fsync_dir
    monkeypatch.setattr(cache_layout, "syncfs", lambda fd: (events.append("syncfs"), real_syncfs(fd))[1])
    monkeypatch.setattr(cache_layout, "fsync_dir", lambda d: (events.append("dirsync"), real_dirsync(d))[1])

    def link(src: Any, dst: Any) -> None:
        events.append("link")
        real_link(src, dst)

    monkeypatch.setattr(cluster_cache.os, "link", link)
    bodies = _bodies(25)
    with cache.writer_dir() as wdir, cache.fetched_batch(max_items=10) as batch:
        for path, f in _fetch_into(cache, wdir, bodies):
            batch.add(path, f)
    assert _published(cache) == {hashlib.sha256(b).hexdigest() for b in bodies.values()}
    # Batches of at least 10 (the background publisher takes what is queued) and the rest at exit:
    # each is one syncfs (the bytes), its links, one fsync of blobs/ (the names); never a link outside.
    trace = "".join({"syncfs": "s", "link": "l", "dirsync": "d"}[e] for e in events)
    batches = [b[1:-1] for b in re.findall(r"sl+d", trace)]
    assert "".join(f"s{b}d" for b in batches) == trace, events
    assert sum(map(len, batches)) == 25 and all(len(b) >= 10 for b in batches[:-1])
    for sha in _published(cache):
        assert cache.layout.blob(sha).read_bytes() in bodies.values()
        assert (cache.layout.blob(sha).stat().st_mode & 0o777) == 0o444
    assert batch.published == 25


def test_crash_between_write_and_link_leaves_no_blob_under_its_final_name(tmp_path: Path) -> None:
    cache = ClusterCache(tmp_path / "tier")
    bodies = _bodies(5)
    pid = os.fork()
    if pid == 0:  # the stager: writes every temp file, then dies where the batch would publish
        try:
            cache_layout.syncfs = lambda fd: os._exit(9)
            with cache.writer_dir() as wdir, cache.fetched_batch() as batch:
                for path, f in _fetch_into(cache, wdir, bodies):
                    batch.add(path, f)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 9
    assert _published(cache) == set()
    writers = os.listdir(cache.layout.tmp)  # the dead writer's debris, which gc_temp collects
    assert len(writers) == 1
    assert len(_files(cache.layout.tmp / writers[0])) == 5
    cache.gc_temp(older_than_s=0)
    assert os.listdir(cache.layout.tmp) == []


def test_corrupted_small_object_is_rejected_and_nothing_of_it_published(tmp_path: Path) -> None:
    cache = ClusterCache(tmp_path / "tier")
    bodies = _bodies(4)
    bad_path = "f/0002.txt"
    good = bodies[bad_path]
    served = {**bodies, bad_path: good[:10] + bytes([good[10] ^ 0x80]) + good[11:]}
    src = Source(served)
    with cache.writer_dir() as wdir, cache.fetched_batch() as batch:
        for path, body in bodies.items():
            rf = _remote(path, body)  # the listing's checksum is the real object's
            if path == bad_path:
                with pytest.raises(IntegrityError):
                    fetch_small(src, rf, wdir, options=OPTS)
                continue
            got = fetch_small(src, rf, wdir, options=OPTS)
            assert got.path is not None
            batch.add(got.path, ManifestFile(path=path, size=len(body), sha256=got.sha256))
        assert len(_files(wdir)) == 3  # no temp file of the corrupted one either
    published = _published(cache)
    assert len(published) == 3
    assert hashlib.sha256(served[bad_path]).hexdigest() not in published
    assert hashlib.sha256(good).hexdigest() not in published


@pytest.mark.parametrize("max_items", [1000, 2])  # the final flush; the background publisher
def test_syncfs_failure_is_an_error_and_nothing_is_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             max_items: int) -> None:
    cache = ClusterCache(tmp_path / "tier")

    def failing(fd: int) -> None:
        raise StorageError(f"/proc/self/fd/{fd}", "syncfs failed: Input/output error")

    monkeypatch.setattr(cache_layout, "syncfs", failing)
    with pytest.raises(StorageError, match="syncfs failed"):
        with cache.writer_dir() as wdir, cache.fetched_batch(max_items=max_items) as batch:
            for path, f in _fetch_into(cache, wdir, _bodies(7)):
                batch.add(path, f)
    assert _published(cache) == set()
    assert os.listdir(cache.layout.tmp) == []  # the writer dir and its temps are removed


def test_batch_refuses_a_temp_file_swapped_for_another_size(tmp_path: Path) -> None:
    cache = ClusterCache(tmp_path / "tier")
    with cache.writer_dir() as wdir:
        (path, f), = _fetch_into(cache, wdir, _bodies(1))
        path.chmod(0o644)
        path.write_bytes(b"short")
        with pytest.raises(StorageError, match="not the 4096 bytes"):
            with cache.fetched_batch() as batch:
                batch.add(path, f)
    assert _published(cache) == set()


def test_an_exception_inside_the_batch_publishes_nothing_more(tmp_path: Path) -> None:
    cache = ClusterCache(tmp_path / "tier")
    with pytest.raises(RuntimeError), cache.writer_dir() as wdir, cache.fetched_batch() as batch:
        for path, f in _fetch_into(cache, wdir, _bodies(3)):
            batch.add(path, f)
        raise RuntimeError("another file failed")
    assert _published(cache) == set()


# -- S3 presigning ---------------------------------------------------------------------------------------------


def _backend(endpoint: str | None, region: str, style: str, creds: Any) -> Any:
    from slurm_bt.storage.endpoints import StorageEndpoints
    from slurm_bt.storage.s3 import S3Backend
    from slurm_bt.storage.url import parse_source_uri

    ep = StorageEndpoints(s3_endpoint_url=endpoint, s3_region=region, s3_addressing_style=style)
    return S3Backend(parse_source_uri("s3://bucket/pre"), credentials=creds, endpoints=ep, options=TransportOptions())


@pytest.mark.parametrize(("endpoint", "region", "style"), [
    ("http://127.0.0.1:8333", "us-east-1", "path"),
    (None, "us-east-1", "auto"),
    (None, "eu-west-3", "virtual"),
    ("https://acct.r2.cloudflarestorage.com", "auto", "path"),
])
@pytest.mark.parametrize("token", [None, "FwoG/tok+en=="])
def test_fast_presigner_signs_exactly_like_botocore(endpoint: str | None, region: str, style: str,
                                                    token: str | None) -> None:
    from slurm_bt.storage.credentials import Credentials

    creds = Credentials(aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="wJalr/K7MDENG+bPxRfiCY",
                        aws_session_token=token)
    backend = _backend(endpoint, region, style, creds)
    backend._get_url("pre/warm")
    fast = backend._fast
    assert fast, "the probe must accept botocore's SigV4 presigning for this setup"
    client = backend._presign_client()
    for key in ["pre/model.safetensors", "pre/a b/c+d=e&f", "pre/ü/日本.txt", "pre/%2F~x", "pre/tab\tx", "pre/"]:
        ref = client.generate_presigned_url("get_object", Params={"Bucket": "bucket", "Key": key}, ExpiresIn=3600)
        stamp = ref.split("X-Amz-Date=", 1)[1].split("&", 1)[0]
        assert fast.url(key, amz_date=stamp) == ref, key
    backend.close()


def test_fast_presigner_is_not_used_when_it_cannot_prove_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_bt.storage.credentials import Credentials
    from slurm_bt.storage.s3 import _FastPresigner

    backend = _backend("http://127.0.0.1:8333", "us-east-1", "path",
                       Credentials(aws_access_key_id="AK", aws_secret_access_key="SK"))
    client = backend._presign_client()
    real = client.generate_presigned_url
    # A presigner this module does not reproduce (here: a different signature) keeps botocore.
    monkeypatch.setattr(client, "generate_presigned_url",
                        lambda *a, **kw: real(*a, **kw).replace("X-Amz-Signature=", "X-Amz-Signature=0"))
    assert _FastPresigner.probe(client, backend._session, "bucket", True) is False
    url = backend._get_url("pre/x")
    assert backend._fast is False and "X-Amz-Signature=0" in url
    backend.close()


def test_anonymous_store_gets_plain_urls() -> None:
    backend = _backend("http://127.0.0.1:8333", "us-east-1", "path", None)
    assert backend._get_url("pre/a b") == "http://127.0.0.1:8333/bucket/pre/a%20b"
    assert backend._fast
    backend.close()


# -- big files: bodies read into a reused buffer ---------------------------------------------------------------


def _serve(body: bytes, *, claim: int | None = None) -> tuple[str, Any]:
    """A loopback HTTP server answering every GET with ``body`` (announcing ``claim`` bytes if given)."""
    import http.server
    import socketserver
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(claim if claim is not None else len(body)))
            self.end_headers()
            self.wfile.write(body)
            if claim is not None:
                self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/x", server


def test_http_body_readinto_gives_the_exact_bytes_and_stops_at_a_cut_body() -> None:
    from slurm_bt.storage._http import make_pool, open_http_range

    body = random.Random(5).randbytes(3 * (1 << 20) + 17)
    url, server = _serve(body)
    pool = make_pool(5, 10, 4)
    try:
        stream = open_http_range(pool, url, uri="https://x", file="f", start=0, end=None, headers={})
        buf = memoryview(bytearray(1 << 20))
        got = bytearray()
        while n := stream.readinto(buf):  # type: ignore[attr-defined]
            got += buf[:n]
        stream.close()
        assert bytes(got) == body
    finally:
        server.shutdown()
    url, server = _serve(body[:1000], claim=len(body))  # the origin dies after 1000 bytes
    try:
        stream = open_http_range(pool, url, uri="https://x", file="f", start=0, end=None, headers={})
        total = 0
        while n := stream.readinto(buf):  # type: ignore[attr-defined]
            total += n
        assert total == 1000  # a cut body ends early; the engine calls that a transient short body
        stream.close()
    finally:
        server.shutdown()
        pool.clear()


class _IntoStream(_Stream):
    """Like _Stream, with readinto returning short counts (as a socket does)."""

    def readinto(self, buf: memoryview) -> int:
        data = self.read(min(len(buf), 70_000))
        buf[:len(data)] = data
        return len(data)


class IntoSource(Source):
    def open_range(self, file: ManifestFile, start: int, end: int | None) -> _IntoStream:
        self.requests.append((file.path, start))
        body = self.bodies[file.path][start:end]
        fail = self.fail_after if len(self.requests) <= self.flaky else None
        return _IntoStream(body, fail_after=fail)


def test_fetch_file_through_readinto_resumes_and_verifies(tmp_path: Path) -> None:
    from slurm_bt.weights.download import fetch_file

    body = random.Random(6).randbytes(5 * (1 << 20) + 3)
    opts = DownloadOptions(part_size=1 << 20, parallel_threshold=2 << 20, max_workers=3, backoff_base_s=0.0)
    src = IntoSource({"m": body}, flaky=2, fail_after=300_000)
    got = fetch_file(src, _remote("m", body), tmp_path, options=opts)
    assert got.path is not None and got.path.read_bytes() == body
    bad = body[:4_000_000] + bytes([body[4_000_000] ^ 1]) + body[4_000_001:]
    (tmp_path / "x").mkdir()
    with pytest.raises(IntegrityError):
        fetch_file(IntoSource({"m": bad}), _remote("m", body), tmp_path / "x", options=opts)
    assert os.listdir(tmp_path / "x") == []


# -- the staging loop's threads ------------------------------------------------------------------------------


def test_each_in_threads_keeps_order_and_stops_handing_out_after_a_failure() -> None:
    import threading
    import time

    from slurm_bt.weights.download import each_in_threads

    seen: set[str] = set()

    def square(x: int) -> int:
        seen.add(threading.current_thread().name)
        time.sleep(0.001)
        return x * x

    assert each_in_threads(square, list(range(200)), 4) == [x * x for x in range(200)]
    assert 1 < len(seen) <= 4  # the work was shared, by no more threads than asked
    started: list[int] = []

    def fail_at_3(x: int) -> int:
        started.append(x)
        if x == 3:
            raise ValueError("boom")
        time.sleep(0.01)
        return x

    with pytest.raises(ValueError, match="boom"):
        each_in_threads(fail_at_3, list(range(1000)), 2)
    assert len(started) < 10  # nothing more was handed out once an item failed
    assert each_in_threads(lambda x: x, [], 8) == []


def test_each_streamed_runs_items_while_they_are_produced_and_stops_on_either_failure() -> None:
    import threading

    from slurm_bt.weights.download import each_streamed

    first_done = threading.Event()

    def produce(submit: Any) -> str:
        submit(1)
        assert first_done.wait(10)  # a worker ran item 1 while the producer was still producing
        for x in range(2, 50):
            submit(x)
        return "listed"

    def work(x: int) -> int:
        first_done.set()
        return -x

    assert each_streamed(work, produce, 4) == ("listed", [-x for x in range(1, 50)])
    # The producer's failure stops the hand-out and is raised once the items already started have
    # finished (each_streamed joins its threads first: nothing runs on behind the caller's back).
    started: list[int] = []
    finished: list[int] = []
    running = threading.Event()

    def produce_then_fail(submit: Any) -> None:
        for x in range(50):
            submit(x)
        assert running.wait(10)
        raise SourceUnavailableError("s3://bkt/models", "listing page 2 failed")

    def slow(x: int) -> None:
        import time

        started.append(x)
        running.set()
        time.sleep(0.05)
        finished.append(x)

    with pytest.raises(SourceUnavailableError, match="listing page 2"):
        each_streamed(slow, produce_then_fail, 2)
    assert started and sorted(finished) == sorted(started) and len(started) < 50
    # A worker's failure stops the producer at its next submit, and is what is raised.
    submitted: list[int] = []

    def produce_forever(submit: Any) -> None:
        x = 0
        while True:
            submit(x)
            submitted.append(x)
            x += 1
            if x > 100_000:
                raise AssertionError("the producer was never stopped")
            if x % 100 == 0:
                import time

                time.sleep(0.01)

    def fail_at_3(x: int) -> int:
        if x == 3:
            raise ValueError("boom")
        return x

    with pytest.raises(ValueError, match="boom"):
        each_streamed(fail_at_3, produce_forever, 2)
    assert len(submitted) < 100_000


def test_the_writer_dir_spreads_its_subdirectories_where_the_filesystem_can(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl
    import struct

    from slurm_bt.weights.cluster_cache import spread_subdirs

    probe = tmp_path / "probe"
    probe.mkdir()
    if not spread_subdirs(probe):
        pytest.skip("this filesystem has no FS_TOPDIR_FL (ext4 has)")
    with ClusterCache(tmp_path / "tier").writer_dir() as wdir:
        fd = os.open(wdir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags = struct.unpack("i", fcntl.ioctl(fd, 0x80086601, b"\0" * 4))[0]
        finally:
            os.close(fd)
        assert flags & 0x00020000  # chattr +T: ext4 spreads the .fan-* subdirectories over block groups

    def refuse(*args: Any) -> bytes:
        raise OSError(25, "Inappropriate ioctl for device")

    monkeypatch.setattr(fcntl, "ioctl", refuse)  # a filesystem without the flag: only a hint, no error
    with ClusterCache(tmp_path / "tier2").writer_dir() as wdir:
        assert wdir.is_dir()
