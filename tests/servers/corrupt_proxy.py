"""A loopback HTTP proxy in front of a real server that flips bytes of chosen response bodies.

It stands for an origin that serves content different from what its metadata says (bit rot,
a broken cache or gateway): listings, HEADs and headers pass through unchanged, so an S3 object
keeps the ETag (the MD5 of the original) while its body differs. Requests are forwarded with
their own ``Host`` header, so SigV4 signatures and presigned URLs made for the proxy's address
verify at SeaweedFS unchanged.

Use: ``proxy = CorruptingProxy(upstream).start()``; ``proxy.corrupt["/weights/key"] = offset``
flips the byte at file ``offset`` in every GET body of that path (ranged replies included);
``proxy.stop()``.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from tests.servers._proc import HOST

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class CorruptingProxy:
    """The proxy and its rules (path -> file offset to flip); thread-safe enough for tests."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname is not None and parts.port is not None, upstream
        self.upstream = (parts.hostname, parts.port)
        self.corrupt: dict[str, int] = {}
        self.flipped: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._server is not None
        return f"http://{HOST}:{self._server.server_address[1]}"

    def start(self) -> CorruptingProxy:
        """Listen on a free 127.0.0.1 port in a daemon thread."""
        proxy = self

        class Handler(_Handler):
            pass

        Handler.proxy = proxy
        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="corrupt-proxy").start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Handler(BaseHTTPRequestHandler):
    proxy: CorruptingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        conn = http.client.HTTPConnection(*self.proxy.upstream, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP | {"content-length"}]
            status = resp.status
        finally:
            conn.close()
        path = unquote(urlsplit(self.path).path)
        offset = self.proxy.corrupt.get(path)
        if self.command == "GET" and offset is not None and status in (200, 206) and data:
            start = 0
            content_range = dict((k.lower(), v) for k, v in out_headers).get("content-range")
            if status == 206 and content_range:
                start = int(content_range.split()[1].split("-")[0])
            if start <= offset < start + len(data):
                buf = bytearray(data)
                buf[offset - start] ^= 0xFF
                data = bytes(buf)
                self.proxy.flipped.append(path)
        self.send_response(status)
        for k, v in out_headers:
            self.send_header(k, v)
        upstream_length = resp.getheader("Content-Length")
        self.send_header("Content-Length", (upstream_length or "0") if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward
