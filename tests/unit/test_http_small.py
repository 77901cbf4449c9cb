"""The lean small-object GET path (slurm_bt/storage/_http.py ``SmallGets``) against real loopback servers.

Every answer here comes over a real TCP socket from a scripted server (no mocks): short bodies,
wrong lengths, a connection cut mid-body, 5xx then success, a kept-alive connection the server
closed while idle, redirects and framings only urllib3 handles (which then answers, as before), and
the same through ``S3Backend.open_range`` + ``fetch_small``, byte-verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.errors import (
    IntegrityError,
    SourceAccessError,
    SourceError,
    SourceNotFoundError,
    SourceUnavailableError,
)
from slurm_bt.storage._http import SmallGets
from slurm_bt.storage.base import RemoteFile, TransportOptions
from slurm_bt.storage.checksums import OriginChecksum
from slurm_bt.weights.download import DownloadOptions, fetch_small

Reply = Callable[[bytes, int], tuple[bytes, bool]]
"""``reply(request, n)`` -> (bytes to send, close the connection after them); ``n`` counts requests."""


class Scripted:
    """A loopback HTTP/1.1 server whose every answer is written by ``reply`` (raw bytes)."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.requests: list[bytes] = []
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    try:
                        chunk = conn.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    data += chunk
                request, data = data.split(b"\r\n\r\n", 1)
                self.requests.append(request)
                out, close = self.reply(request, len(self.requests))
                try:
                    conn.sendall(out)
                except OSError:
                    return
                if close:
                    with contextlib.suppress(OSError):
                        conn.shutdown(socket.SHUT_RDWR)
                    return

    def close(self) -> None:
        self._stop = True
        self._sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Reply], Scripted]]:
    servers: list[Scripted] = []

    def make(reply: Reply) -> Scripted:
        servers.append(Scripted(reply))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def ok(body: bytes, *, status: str = "200 OK", extra: str = "", length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return f"HTTP/1.1 {status}\r\nContent-Length: {n}\r\n{extra}\r\n".encode() + body


def _range_of(request: bytes) -> int:
    for line in request.split(b"\r\n"):
        if line.lower().startswith(b"range: bytes="):
            return int(line.split(b"=", 1)[1].split(b"-", 1)[0])
    return 0


BODY = random.Random(7).randbytes(5000)


def _get(gets: SmallGets, url: str, *, start: int = 0, limit: int = len(BODY)) -> Any:
    return gets.get(url + "/bkt/key?X-Amz-Signature=abc", uri="s3://bkt", file="key", start=start, end=None,
                    headers={"If-Match": '"e"', "Accept-Encoding": "identity"}, limit=limit)


def test_one_connection_serves_every_request_and_the_request_is_exact(serve: Any) -> None:
    server = serve(lambda req, n: (ok(BODY), False))
    gets = SmallGets(5, 5)
    for _ in range(5):
        body = _get(gets, server.url)
        assert body.read(1 << 20) == BODY and body.read(10) == b"" and body.partial is False
    assert server.connections == 1  # kept alive
    assert server.requests[0] == (f"GET /bkt/key?X-Amz-Signature=abc HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                                  "If-Match: \"e\"\r\nAccept-Encoding: identity").encode()
    gets.close()


def test_a_cut_body_delivers_its_bytes_then_fails_transiently_at_the_byte_reached(serve: Any) -> None:
    # Announces 5000 bytes, sends 1000 and closes: the engine must resume at 1000 with Range.
    server = serve(lambda req, n: (ok(BODY[:1000], length=len(BODY)), True))
    gets = SmallGets(5, 5)
    body = _get(gets, server.url)
    assert body.read(1 << 20) == BODY[:1000]
    with pytest.raises(SourceUnavailableError) as err:
        body.read(1 << 20)
    assert err.value.transient and err.value.offset == 1000
    assert "Signature" not in str(err.value)  # the presigned URL never reaches a message
    gets.close()


def test_a_body_longer_than_the_limit_is_cut_there_and_its_connection_not_reused(serve: Any) -> None:
    big = random.Random(8).randbytes(200_000)
    server = serve(lambda req, n: (ok(big), False))
    gets = SmallGets(5, 5)
    assert _get(gets, server.url, limit=5000).read(1 << 20) == big[:5000]
    assert _get(gets, server.url, limit=300_000).read(1 << 20) == big
    assert server.connections == 2  # the first connection still had 195,000 bytes on it


@pytest.mark.parametrize(("status", "error"), [
    ("503 Slow Down", SourceUnavailableError), ("500 Internal Server Error", SourceUnavailableError),
    ("403 Forbidden", SourceAccessError), ("404 Not Found", SourceNotFoundError),
    ("412 Precondition Failed", SourceError), ("416 Range Not Satisfiable", SourceError),
])
def test_statuses_map_like_urllib3_and_the_connection_survives_a_read_error_body(
        serve: Any, status: str, error: type[Exception]) -> None:
    xml = b"<Error><Code>x</Code></Error>"
    server = serve(lambda req, n: (ok(xml, status=status) if n == 1 else ok(BODY), False))
    gets = SmallGets(5, 5)
    with pytest.raises(error) as err:
        _get(gets, server.url)
    assert str(status.split()[0]) in str(err.value)
    assert _get(gets, server.url).read(1 << 20) == BODY
    assert server.connections == 1


def test_fetch_small_retries_a_5xx_and_a_cut_body_then_verifies(serve: Any, tmp_path: Path) -> None:
    def reply(req: bytes, n: int) -> tuple[bytes, bool]:
        if n == 1:
            return ok(b"busy", status="503 Slow Down"), False
        if n == 2:
            return ok(BODY[:3000], length=len(BODY)), True  # dies after 3000 bytes
        start = _range_of(req)
        assert start == 3000, "the resume asks for the rest only"
        return ok(BODY[start:], status="206 Partial Content",
                  extra=f"Content-Range: bytes {start}-{len(BODY) - 1}/{len(BODY)}\r\n"), False

    server = serve(reply)
    backend = _s3_backend(server.url)
    rf = RemoteFile("key", len(BODY), None, etag='"e"', checksums=(OriginChecksum("md5", hashlib.md5(BODY).hexdigest(),
                                                                                 "ETag"),))
    got = fetch_small(backend, rf, tmp_path, options=DownloadOptions(backoff_base_s=0.0))
    assert got.path is not None and got.path.read_bytes() == BODY
    assert got.sha256 == hashlib.sha256(BODY).hexdigest()
    assert len(server.requests) == 3 and backend._small is not None and not backend._small.disabled
    backend.close()


def test_a_wrong_body_is_refused_before_anything_is_written(serve: Any, tmp_path: Path) -> None:
    bad = bytes([BODY[0] ^ 1]) + BODY[1:]
    server = serve(lambda req, n: (ok(bad), False))
    backend = _s3_backend(server.url)
    rf = RemoteFile("key", len(BODY), None, etag='"e"',
                    checksums=(OriginChecksum("md5", hashlib.md5(BODY).hexdigest(), "ETag"),))
    with pytest.raises(IntegrityError):
        fetch_small(backend, rf, tmp_path, options=DownloadOptions(backoff_base_s=0.0))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    backend.close()


def test_a_short_body_on_a_kept_alive_connection_is_retried_and_refused_after_bounded_attempts(
        serve: Any, tmp_path: Path) -> None:
    # The server always claims 5000 bytes and sends 10, then keeps the connection: the next request's
    # answer would be read as the rest of this body unless the connection is dropped.
    server = serve(lambda req, n: (ok(BODY[:10], length=len(BODY)), True))
    backend = _s3_backend(server.url)
    rf = RemoteFile("key", len(BODY), None, etag='"e"')
    with pytest.raises(SourceUnavailableError, match="gave up after"):
        fetch_small(backend, rf, tmp_path, options=DownloadOptions(backoff_base_s=0.0, max_retries=2))
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
    backend.close()


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error(serve: Any) -> None:
    # Answer, then close the connection silently (an idle timeout): the next request on it gets
    # nothing back, which is resent once on a new connection.
    server = serve(lambda req, n: (ok(BODY, extra="Connection: keep-alive\r\n"), True))
    gets = SmallGets(5, 5)
    assert _get(gets, server.url).read(1 << 20) == BODY
    time.sleep(0.05)
    assert _get(gets, server.url).read(1 << 20) == BODY
    assert server.connections == 2
    gets.close()


def test_a_fresh_connection_that_answers_nothing_is_an_error_not_a_loop(serve: Any) -> None:
    server = serve(lambda req, n: (b"", True))
    gets = SmallGets(5, 5)
    with pytest.raises(SourceUnavailableError):
        _get(gets, server.url)
    assert len(server.requests) == 1
    gets.close()


def test_silence_times_out_with_the_read_timeout(serve: Any) -> None:
    server = serve(lambda req, n: (ok(BODY)[:30], False))  # part of the head, then nothing
    gets = SmallGets(5, 0.3)
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailableError, match=r"no progress for 0\.3 s"):
        _get(gets, server.url)
    assert time.monotonic() - t0 < 3
    gets.close()


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1388\r\n" + BODY + b"\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY,  # no Content-Length: the body runs to the close
    b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nContent-Length: 4000\r\n\r\n" + BODY,
])
def test_answers_only_urllib3_frames_go_to_urllib3_which_answers_as_before(serve: Any, answer: bytes) -> None:
    def reply(req: bytes, n: int) -> tuple[bytes, bool]:
        return (ok(BODY), False) if n > 1 else (answer, True)

    server = serve(reply)
    backend = _s3_backend(server.url)
    rf = RemoteFile("key", len(BODY), None, etag='"e"')
    stream = backend.open_range(rf, 0, None)
    got = b"".join(iter(lambda: stream.read(1 << 20), b""))
    stream.close()
    assert backend._small is not None and backend._small.disabled  # urllib3 from now on
    if b"Content-Length: 4000" not in answer:
        assert got == BODY
    backend.close()


def test_a_malformed_head_is_a_transient_error(serve: Any) -> None:
    for answer in (b"HTTX/1.1 200 OK\r\n\r\n", b"HTTP/1.1 2x0 OK\r\nContent-Length: 1\r\n\r\nx",
                   b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n", b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 9000):
        server = serve(lambda req, n, answer=answer: (answer, True))
        gets = SmallGets(5, 5)
        with pytest.raises(SourceUnavailableError):
            _get(gets, server.url)
        gets.close()


def test_header_values_with_line_breaks_are_never_sent(serve: Any) -> None:
    server = serve(lambda req, n: (ok(BODY), False))
    gets = SmallGets(5, 5)
    assert gets.get(server.url + "/k", uri="s3://b", file="k", start=0, end=None,
                    headers={"If-Match": '"e"\r\nX-Injected: 1'}, limit=10) is None  # urllib3 refuses it
    assert gets.get(server.url + "/k k", uri="s3://b", file="k", start=0, end=None, headers={}, limit=10) is None
    assert server.requests == []
    gets.close()


def test_s3_backend_reads_a_ranged_rest_with_the_lean_path(serve: Any) -> None:
    def reply(req: bytes, n: int) -> tuple[bytes, bool]:
        start = _range_of(req)
        return ok(BODY[start:], status="206 Partial Content"), False

    from slurm_bt.storage.credentials import Credentials

    server = serve(reply)
    backend = _s3_backend(server.url, Credentials(aws_access_key_id="AKID", aws_secret_access_key="SK"))
    stream = backend.open_range(RemoteFile("key", len(BODY), None, etag='"e"'), 1234, None)
    assert stream.partial and stream.read(1 << 20) == BODY[1234:]
    assert b"Range: bytes=1234-" in server.requests[0] and b"If-Match: \"e\"" in server.requests[0]
    assert b"X-Amz-Signature=" in server.requests[0]  # presigned
    backend.close()


def test_the_fast_presigner_without_a_given_date_matches_botocore() -> None:
    from slurm_bt.storage.credentials import Credentials

    backend = _s3_backend("http://127.0.0.1:9", Credentials(aws_access_key_id="AKID", aws_secret_access_key="SK"))
    backend._get_url("pre/warm")
    client = backend._presign_client()
    for _ in range(3):  # the two URLs must fall in the same second
        ref = client.generate_presigned_url("get_object", Params={"Bucket": "bkt", "Key": "a b/c"}, ExpiresIn=3600)
        mine = backend._get_url("a b/c")
        if ref.split("X-Amz-Date=")[1][:16] == mine.split("X-Amz-Date=")[1][:16]:
            assert mine == ref
            break
    else:
        pytest.fail("could not sign twice within one second")
    backend.close()


def _s3_backend(endpoint: str, creds: Any = None) -> Any:
    from slurm_bt.storage.endpoints import StorageEndpoints
    from slurm_bt.storage.s3 import S3Backend
    from slurm_bt.storage.url import parse_source_uri

    ep = StorageEndpoints(s3_endpoint_url=endpoint, s3_region="us-east-1", s3_addressing_style="path")
    return S3Backend(parse_source_uri("s3://bkt"), credentials=creds, endpoints=ep,
                     options=TransportOptions(connect_timeout_s=5, read_timeout_s=5))


def test_tls_is_verified_against_the_given_ca_only(tmp_path: Path) -> None:
    from tests.servers.https_server import start_https

    server = start_https(tmp_path / "tls")
    try:
        server.put("obj", BODY)
        url = server.url("obj")
        trusting = SmallGets(5, 5, ca_bundle=str(server.ca_bundle))
        for _ in range(2):
            body = trusting.get(url, uri="https://x", file="obj", start=0, end=None, headers={}, limit=len(BODY))
            assert body is not None and body.read(1 << 20) == BODY
        trusting.close()
        with pytest.raises(SourceError, match="TLS verification failed") as err:
            SmallGets(5, 5).get(url, uri="https://x", file="obj", start=0, end=None, headers={}, limit=len(BODY))
        assert not err.value.transient  # retrying cannot fix a certificate nobody vouches for
    finally:
        server.stop()


def test_a_redirect_is_refused_as_the_urllib3_pool_refuses_it(serve: Any) -> None:
    from slurm_bt.storage._http import make_pool, open_http_range

    redirect = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /elsewhere/key\r\nContent-Length: 0\r\n\r\n"
    server = serve(lambda req, n: (ok(BODY), False) if b"/elsewhere/" in req else (redirect, False))
    pool = make_pool(5, 5, 2)
    with pytest.raises(SourceError, match="unexpected HTTP 307") as before:
        open_http_range(pool, server.url + "/bkt/key", uri="s3://bkt", file="key", start=0, end=None, headers={})
    pool.clear()
    gets = SmallGets(5, 5)
    with pytest.raises(SourceError, match="unexpected HTTP 307") as now:
        _get(gets, server.url)
    assert str(now.value) == str(before.value) and not now.value.transient
    assert not gets.disabled and all(b"/elsewhere/" not in r for r in server.requests)  # never followed
    assert _get(gets, server.url + "/elsewhere").read(1 << 20) == BODY  # the connection is still good
    gets.close()


def test_no_error_message_carries_a_presigned_query() -> None:
    import urllib3.exceptions

    from slurm_bt.storage._http import describe_error

    exc = urllib3.exceptions.MaxRetryError(None, "/bkt/key?X-Amz-Credential=AKID%2F&X-Amz-Signature=s3cr3t",  # type: ignore[arg-type]
                                           ValueError("too many redirects"))
    text = describe_error(exc)
    assert "s3cr3t" not in text and "AKID" not in text and text.startswith("MaxRetryError: ")
