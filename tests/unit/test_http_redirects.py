"""open_http_range's redirects against real loopback servers: followed only when asked, bounded,
never https -> http, and the Authorization header kept to the origin the caller named."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slurm_bt.errors import SourceError
from slurm_bt.storage._http import MAX_REDIRECTS, make_pool, open_http_range

BODY = bytes(range(256)) * 40


class _Server:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, str | None]] = []  # (path, Authorization, Range)
        self.routes: dict[str, tuple[int, dict[str, str]]] = {}
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                srv.seen.append((self.path, self.headers.get("Authorization"), self.headers.get("Range")))
                status, headers = srv.routes.get(self.path.split("?")[0], (404, {}))
                body = b""
                if status == 200:
                    rng = self.headers.get("Range")
                    body = BODY
                    if rng:
                        a, _, b = rng.removeprefix("bytes=").partition("-")
                        body = BODY[int(a): int(b) + 1 if b else None]
                        status = 206
                        headers = {**headers, "Content-Range": f"bytes {a}-{int(a) + len(body) - 1}/{len(BODY)}"}
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()


def _get(server: _Server, path: str, *, follow: bool, start: int = 0, end: int | None = None) -> bytes:
    pool = make_pool(2.0, 2.0, 4)
    body = open_http_range(pool, f"http://127.0.0.1:{server.port}{path}", uri="hf://acme/m", file="w.bin",
                           start=start, end=end, headers={"Authorization": "Bearer tok"},
                           follow_redirects=follow)
    try:
        return body.read(1 << 20)
    finally:
        body.close()


def test_same_origin_redirect_keeps_token_cross_origin_drops_it(server: _Server) -> None:
    server.routes["/a"] = (302, {"Location": "/b"})  # same origin (relative)
    server.routes["/b"] = (307, {"Location": f"http://localhost:{server.port}/c?X-Sig=s"})  # another origin
    server.routes["/c"] = (200, {})
    assert _get(server, "/a", follow=True, start=10, end=20) == BODY[10:20]
    assert [(p.split("?")[0], auth, rng) for p, auth, rng in server.seen] == [
        ("/a", "Bearer tok", "bytes=10-19"), ("/b", "Bearer tok", "bytes=10-19"), ("/c", None, "bytes=10-19")]


def test_redirect_not_followed_unless_asked(server: _Server) -> None:
    server.routes["/a"] = (307, {"Location": "/c"})
    server.routes["/c"] = (200, {})
    with pytest.raises(SourceError, match="unexpected HTTP 307"):
        _get(server, "/a", follow=False)
    assert [p for p, _, _ in server.seen] == ["/a"]


def test_redirect_loop_missing_location_and_downgrade_refused(server: _Server) -> None:
    server.routes["/loop"] = (302, {"Location": "/loop"})
    with pytest.raises(SourceError, match=f"more than {MAX_REDIRECTS} redirects"):
        _get(server, "/loop", follow=True)
    assert len(server.seen) == MAX_REDIRECTS + 1
    server.routes["/nowhere"] = (302, {})
    with pytest.raises(SourceError, match="redirect without a Location"):
        _get(server, "/nowhere", follow=True)
    server.routes["/ftp"] = (302, {"Location": "ftp://127.0.0.1/x?X-Sig=secret"})
    with pytest.raises(SourceError, match="refused") as info:
        _get(server, "/ftp", follow=True)
    assert "secret" not in str(info.value)  # a signed Location is a credential: never in a message
