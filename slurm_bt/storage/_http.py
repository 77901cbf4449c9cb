"""Plain-HTTP ranged reads over urllib3: the data plane of the hf, gs, https and s3 (presigned) backends.

Why below fsspec here: HfFileSystem, gcsfs and HTTPFileSystem read through aiohttp streams sized
for random access (block caches, one request per ``read``), check at most the size, and offer no
per-request ``If-Match``/generation pin we control. A raw urllib3 pool gives large reads,
kept-alive connections shared by all range workers of the download engine, per-read timeouts and
exact control of ``Range``/``If-Match``, which bench/results/weights.md measured faster. urllib3
ships with botocore and requests, so it adds no dependency; it is imported lazily like every client.

Small whole-object GETs (the 10,000-small-files case) skip urllib3 too: :class:`SmallGets` keeps
one HTTP/1.1 connection per thread and reads ``Content-Length`` bytes straight into memory. urllib3
costs ~0.44 ms of CPU per request on the bench VM (URL re-parsing and percent-normalizing of a
presigned query byte by byte, pool lookup, ``email`` header parsing, response objects), the lean
path ~0.14 ms; with 10,000 requests on two cores shared with the server that was most of the gap to
s5cmd. Anything it does not frame exactly (chunked or unframed bodies, ``1xx``) is answered by
urllib3 as before.
"""

from __future__ import annotations

import http.client
import re
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.storage.base import BodyStream

__all__ = ["SMALL_BODY_MAX", "SmallGets", "describe_error", "http_status_error", "make_pool", "open_http_range"]

_QUERY = re.compile(r"\?[^\s'\"()]*")


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of a transport error with every URL query cut off.

    Why: urllib3 names the URL in some errors (``MaxRetryError``: "... with url: /key?X-Amz-...");
    a presigned URL's query is a credential (anyone holding it may read the object until it
    expires) and messages end up in job logs.
    """
    return f"{type(exc).__name__}: {_QUERY.sub('?…', str(exc))}"


def make_pool(connect_timeout_s: float, read_timeout_s: float, max_connections: int, *,
              ca_bundle: str | None = None) -> Any:
    """A urllib3 PoolManager with our timeouts and no automatic retries (the engine retries).

    ``ca_bundle``: PEM file of the CAs to trust instead of the system store; certificates are
    verified either way (urllib3's default ``CERT_REQUIRED``).
    """
    import urllib3

    extra: dict[str, Any] = {"ca_certs": ca_bundle} if ca_bundle else {}
    return urllib3.PoolManager(
        **extra,
        num_pools=8,
        maxsize=max_connections,
        block=False,
        timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
        retries=urllib3.Retry(total=False, redirect=5, raise_on_redirect=True),
    )


def http_status_error(status: int, uri: str, *, file: str | None, offset: int | None, what: str) -> SourceError:
    """Map an HTTP status to the error tree (401/403 access, 404 missing, 5xx/429 transient)."""
    if status in (401, 403):
        return SourceAccessError(
            uri, f"not authorized for {uri} (HTTP {status}); check the credentials (auth_secret_name / ?secret=) "
            "and access to it",
            file=file,
        )
    if status == 404:
        return SourceNotFoundError(uri, f"{what} not found (HTTP 404)", file=file)
    if status in (408, 429) or status >= 500:
        return SourceUnavailableError(uri, f"origin answered HTTP {status}", file=file, offset=offset, transient=True)
    if status == 412:
        return SourceError(uri, "object changed since it was resolved (HTTP 412); resolve the source again",
                           file=file, offset=offset)
    return SourceError(uri, f"unexpected HTTP {status} for {what}", file=file, offset=offset)


MAX_REDIRECTS = 5
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Sent to the origin the caller named, never to another one a redirect points at (a CDN).
_ORIGIN_ONLY_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


def _origin(parts: Any) -> tuple[str, str, int | None]:
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def _redirect_target(current: str, location: str | None, hop: int, *, uri: str, file: str) -> str:
    """Where a redirect from ``current`` leads, or a SourceError (no Location, a loop, a downgrade).

    The Location itself never reaches a message: a CDN's is usually signed (a credential).
    """
    if not location:
        raise SourceError(uri, f"redirect without a Location for file {file!r}", file=file)
    if hop >= MAX_REDIRECTS:
        raise SourceError(uri, f"more than {MAX_REDIRECTS} redirects for file {file!r}", file=file)
    target = urljoin(current, location)
    old, new = urlsplit(current), urlsplit(target)
    if new.scheme not in ("http", "https") or (old.scheme == "https" and new.scheme != "https"):
        raise SourceError(uri, f"redirect from https to {new.scheme or 'no scheme'} refused for file {file!r}",
                          file=file)
    return target


def open_http_range(
    pool: Any,
    url: str,
    *,
    uri: str,
    file: str,
    start: int,
    end: int | None,
    headers: Mapping[str, str],
    follow_redirects: bool = False,
) -> BodyStream:
    """GET ``url`` for bytes ``[start, end)``; ``partial`` tells whether the Range was honoured.

    ``follow_redirects``: follow up to :data:`MAX_REDIRECTS` redirects (the Hugging Face Hub answers
    ``resolve`` of every LFS file with a 302 to its CDN). ``Range`` travels on; ``Authorization``
    and cookies only while the origin (scheme, host, port) stays the one asked; https never
    leads to plain http. Without it a redirect is an "unexpected HTTP 3xx" error (object stores
    and presigned URLs do not redirect a GET that is right).

    Raises:
        SourceError: mapped from the status (see :func:`http_status_error`); connection failures
            are :class:`SourceUnavailableError`.
    """
    import urllib3.exceptions

    hdrs = dict(headers)
    if start > 0 or end is not None:
        hdrs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    target, first = url, _origin(urlsplit(url))
    for hop in range(MAX_REDIRECTS + 1):
        try:
            resp = pool.request("GET", target, headers=hdrs, preload_content=False, decode_content=False,
                                redirect=False)
        except urllib3.exceptions.SSLError as exc:
            # A certificate the trusted CAs do not vouch for is not transient: retrying cannot fix it.
            raise SourceError(uri, f"TLS verification failed: {exc}; trust the server's CA with "
                              "https_ca_bundle in the site file", file=file) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceUnavailableError(
                uri, f"origin unreachable: {describe_error(exc)}", file=file, offset=start, transient=True
            ) from exc
        if not (follow_redirects and resp.status in _REDIRECT_STATUSES):
            break
        location = resp.headers.get("Location")
        resp.drain_conn()
        resp.release_conn()
        target = _redirect_target(target, location, hop, uri=uri, file=file)
        if _origin(urlsplit(target)) != first:
            hdrs = {k: v for k, v in hdrs.items() if k.lower() not in _ORIGIN_ONLY_HEADERS}
    if resp.status not in (200, 206):
        resp.drain_conn()
        resp.release_conn()
        raise http_status_error(resp.status, uri, file=file, offset=start, what=f"file {file!r}")

    def close() -> None:  # never reuse a half-read socket
        resp.release_conn() if resp.isclosed() else resp.close()

    return _HttpBody(resp, close, partial=resp.status == 206, uri=uri, file=file, start=start,
                     errors=(urllib3.exceptions.HTTPError, http.client.HTTPException, OSError))


class _HttpBody(BodyStream):
    """A response body that can also ``readinto`` a caller's buffer without an intermediate copy.

    Why: urllib3's own ``readinto`` is ``read`` plus a copy, and each 1 MiB ``read`` allocates a
    fresh 1 MiB object (an ``mmap`` and 256 page faults in glibc); for a 4 GiB object that is
    4,096 of them plus 4 GiB of extra copying on the cores that also hash. The body is read through
    the standard library response under urllib3's (``decode_content=False`` is asked for, so the
    bytes are the same either way); urllib3 still owns the connection and its release.
    """

    def __init__(self, resp: Any, close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(resp.read, close, **kwargs)
        fp = getattr(resp, "_fp", None)  # the http.client response; a caller uses read or readinto, not both
        self._raw = fp if isinstance(fp, http.client.HTTPResponse) else None
        self._resp = resp

    def readinto(self, buf: memoryview) -> int:
        """Up to ``len(buf)`` bytes into ``buf``; 0 at end."""
        try:
            if self._raw is not None:
                n = self._raw.readinto(buf)
            else:
                data = self._resp.read(len(buf))
                n = len(data)
                buf[:n] = data
        except self._errors as exc:
            raise SourceUnavailableError(
                self._uri, f"connection failed while reading: {describe_error(exc)}",
                file=self._file, offset=self._pos, transient=True,
            ) from exc
        self._pos += n
        return n


SMALL_BODY_MAX = 1 << 20
"""Bodies up to this size may take :class:`SmallGets` (held in memory whole, like ``fetch_small`` does)."""
_HEAD_MAX = 64 << 10  # a response head larger than this is not an object store's answer
_ERROR_BODY_MAX = 64 << 10  # an error body up to this is read (and dropped) to keep the connection
_TARGET_OK = re.compile(r"/[!-~]*")  # printable ASCII, no space: a presigned path and query are all quoted
_VALUE_BAD = re.compile(r"[\x00-\x1f\x7f]")


class _NotMine(Exception):
    """The answer needs what only urllib3 does (redirects, chunked or unframed bodies, 1xx)."""


class _Stale(Exception):
    """A kept-alive connection was closed by the server before it answered (safe to resend once)."""


class _Conn:
    __slots__ = ("fresh", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fresh = True


class SmallGets:
    """Whole-body GETs of small objects, one kept-alive HTTP/1.1 connection per thread (no urllib3).

    The request is one ``sendall``; the head is received into a reused per-thread buffer and parsed
    by hand (status, ``Content-Length``, ``Transfer-Encoding``, ``Connection``); the body, at most
    ``limit`` bytes, is received whole before the caller sees it. What it answers is what
    :func:`open_http_range` would: the same status mapping (:func:`http_status_error`), ``partial``
    from 206, a short body delivered then failing as a transient read error at the byte reached (the
    engine resumes there with ``Range``), a redirect refused ("unexpected HTTP 307", as urllib3 with
    :func:`make_pool`'s settings answers it). A request on a kept-alive connection that the server had
    already closed is resent once on a new connection, as urllib3 does. The first answer it cannot
    frame exactly (chunked, no ``Content-Length``, 1xx, conflicting lengths) turns it off for good
    (:attr:`disabled`) and :meth:`get` returns None: the caller asks urllib3, which handles it as it
    always has.

    Bounds: a head above 64 KiB is a protocol error; nothing beyond ``limit`` body bytes is held
    (a longer body is cut there and its connection closed); error bodies above 64 KiB are not read.
    Timeouts: ``connect_timeout_s`` to connect (and TLS), then ``read_timeout_s`` per receive.
    Certificates are verified (the system store or ``ca_bundle``), like :func:`make_pool`.
    Credentials never reach a message: errors name the ``uri`` and the file, not the presigned URL.
    """

    def __init__(self, connect_timeout_s: float, read_timeout_s: float, *, ca_bundle: str | None = None) -> None:
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._ca_bundle = ca_bundle
        self._tls: ssl.SSLContext | None = None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.disabled = False

    # -- connections -------------------------------------------------------------------------------

    def _conns(self) -> dict[tuple[str, str], _Conn]:
        conns: dict[tuple[str, str], _Conn] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        return conns

    def _head_buffer(self) -> bytearray:
        buf: bytearray | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(_HEAD_MAX)
        return buf

    def _connect(self, scheme: str, netloc: str) -> socket.socket:
        parts = urlsplit(f"{scheme}://{netloc}")
        host = parts.hostname
        if not host:
            raise _NotMine()
        port = parts.port or (443 if scheme == "https" else 80)
        sock = socket.create_connection((host, port), timeout=self._connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request is one small write
            if scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context(cafile=self._ca_bundle)
                sock = self._tls.wrap_socket(sock, server_hostname=host)
            # The read timeout is the kernel's (SO_RCVTIMEO/SO_SNDTIMEO on a blocking socket), not
            # Python's: a socket with a Python timeout polls before every send and receive, two more
            # system calls (and GIL hand-offs) per request. A receive that times out fails with
            # EAGAIN (BlockingIOError), reported as a timeout.
            sock.settimeout(None)
            sec = int(self._read_timeout)
            tv = struct.pack("ll", sec, int((self._read_timeout - sec) * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            self._open.add(sock)
        return sock

    def _drop(self, key: tuple[str, str], conn: _Conn) -> None:
        conns = self._conns()
        if conns.get(key) is conn:
            del conns[key]
        with self._lock:
            self._open.discard(conn.sock)
        try:
            conn.sock.close()
        except OSError:
            pass

    def close(self) -> None:
        """Close every connection (of every thread)."""
        with self._lock:
            socks, self._open = list(self._open), set()
        for sock in socks:
            try:
                sock.close()
            except OSError:
                pass

    # -- one request -------------------------------------------------------------------------------

    def get(self, url: str, *, uri: str, file: str, start: int, end: int | None, headers: Mapping[str, str],
            limit: int) -> BodyStream | None:
        """GET bytes ``[start, end)`` of ``url`` into memory (at most ``limit`` bytes); None: ask urllib3.

        Raises:
            SourceError: the status mapped by :func:`http_status_error`; connection failures and
                malformed answers are :class:`SourceUnavailableError` (transient); a certificate
                the trusted CAs do not vouch for is a plain :class:`SourceError`.
        """
        if self.disabled:
            return None
        scheme, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        target = slash + path
        if scheme not in ("http", "https") or not netloc or "@" in netloc or not _TARGET_OK.fullmatch(target):
            return None
        lines = [f"GET {target} HTTP/1.1", f"Host: {netloc}"]
        for name, value in headers.items():
            if _VALUE_BAD.search(name) or _VALUE_BAD.search(value) or ":" in name:
                return None  # urllib3 refuses such a header, as it always did
            lines.append(f"{name}: {value}")
        if start > 0 or end is not None:
            lines.append(f"Range: bytes={start}-{'' if end is None else end - 1}")
        try:
            request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        except UnicodeEncodeError:
            return None
        key = (scheme, netloc)
        try:
            return self._exchange(key, request, uri=uri, file=file, start=start, limit=limit)
        except _NotMine:
            self.disabled = True
            return None
        except SourceError:
            raise  # a status answer (SourceAccessError and its siblings are OSErrors too)
        except ssl.SSLCertVerificationError as exc:
            raise SourceError(uri, f"TLS verification failed: {exc}; trust the server's CA with "
                              "https_ca_bundle in the site file", file=file) from exc
        except (OSError, ValueError, _Stale) as exc:
            raise SourceUnavailableError(uri, f"origin unreachable: {self._describe(exc)}", file=file,
                                         offset=start, transient=True) from exc

    def _describe(self, exc: BaseException) -> str:
        if isinstance(exc, BlockingIOError):  # SO_RCVTIMEO/SO_SNDTIMEO ran out (see _connect)
            return f"TimeoutError: no progress for {self._read_timeout:g} s"
        return describe_error(exc)

    def _exchange(self, key: tuple[str, str], request: bytes, *, uri: str, file: str, start: int,
                  limit: int) -> BodyStream:
        conns = self._conns()
        for _attempt in range(2):
            conn = conns.get(key)
            if conn is None:
                conn = conns[key] = _Conn(self._connect(*key))
            reused = not conn.fresh
            conn.fresh = False
            try:
                conn.sock.sendall(request)
                status, fields, head_end, got = self._read_head(conn.sock)
            except (_Stale, ConnectionResetError, BrokenPipeError):
                # Nothing of an answer arrived: on a kept-alive connection the server closed it
                # while idle (a GET is safe to send again), so one resend on a fresh connection.
                self._drop(key, conn)
                if reused:
                    continue
                raise
            except BaseException:
                self._drop(key, conn)
                raise
            try:
                return self._body(key, conn, status, fields, head_end, got, uri=uri, file=file, start=start,
                                  limit=limit)
            except SourceError:
                raise  # a status answer: _body kept the connection if its body was read whole
            except BaseException:
                self._drop(key, conn)
                raise
        raise _Stale("the server closed two connections in a row before answering")

    def _read_head(self, sock: socket.socket) -> tuple[int, dict[str, str], int, int]:
        """(status, lower-cased fields, end of the head in the thread buffer, bytes received so far)."""
        raw = self._head_buffer()
        buf = memoryview(raw)
        got = 0
        while True:
            n = sock.recv_into(buf[got:])
            if not n:
                if got == 0:
                    raise _Stale("connection closed before the answer")
                raise ValueError("connection closed in the middle of the answer's head")
            seek = max(0, got - 3)
            got += n
            end = raw.find(b"\r\n\r\n", seek, got)
            if end >= 0:
                break
            if got >= len(raw):
                raise ValueError(f"answer's head longer than {_HEAD_MAX} bytes")
        status_line, *field_lines = raw[:end].decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        code = rest[:3]
        if (version not in ("HTTP/1.1", "HTTP/1.0") or not (code.isascii() and code.isdigit())
                or (len(rest) > 3 and rest[3] != " ")):
            raise ValueError(f"malformed status line {status_line[:80]!r}")
        fields: dict[str, str] = {"": version}
        for line in field_lines:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip() or line[0] in " \t":
                raise ValueError("malformed header line in the answer")
            name = name.lower()
            value = value.strip()
            if name in fields and name in ("content-length", "transfer-encoding"):
                if fields[name] != value:
                    raise _NotMine()  # conflicting framing: leave it to urllib3's rules
            fields[name] = value
        return int(code), fields, end + 4, got

    def _body(self, key: tuple[str, str], conn: _Conn, status: int, fields: dict[str, str], head_end: int,
              got: int, *, uri: str, file: str, start: int, limit: int) -> BodyStream:
        if status < 200 or "transfer-encoding" in fields:
            raise _NotMine()
        # 3xx: refused like every status but 200/206, as the urllib3 pool does (make_pool: no redirects)
        length_field = fields.get("content-length")
        if length_field is None:
            raise _NotMine()  # the body would run to the connection's end: urllib3 reads that
        if not (length_field.isascii() and length_field.isdigit()):
            raise ValueError("malformed Content-Length in the answer")
        length = int(length_field)
        keep = fields.get("connection", "").lower() != "close" and (
            fields[""] == "HTTP/1.1" or fields.get("connection", "").lower() == "keep-alive")
        have = got - head_end  # body bytes already received with the head
        if status not in (200, 206):
            if have < length <= _ERROR_BODY_MAX:
                self._recv_exactly(conn.sock, bytearray(length - have))
            if not keep or length > _ERROR_BODY_MAX or have > length:
                self._drop(key, conn)
            raise http_status_error(status, uri, file=file, offset=start, what=f"file {file!r}")
        take = min(length, limit)
        received = memoryview(self._head_buffer())[head_end:head_end + min(have, take)]
        failure: str | None = None
        if len(received) == take:  # the usual small object: it came with the head
            data = bytes(received)
        else:
            body = bytearray(take)
            filled = len(received)
            body[:filled] = received
            view = memoryview(body)
            try:
                while filled < take:
                    n = conn.sock.recv_into(view[filled:])
                    if not n:
                        raise ConnectionResetError("connection closed in the middle of the body")
                    filled += n
            except OSError as exc:  # the bytes so far are delivered, then the read fails where it stopped
                failure = self._describe(exc)
            view.release()
            data = bytes(body[:filled]) if filled < take else bytes(body)
        received.release()
        if failure is not None or not keep or length > limit or have > length:
            self._drop(key, conn)  # never reuse a connection with bytes of this answer still on it
        return _BufferedBody(data, failure, partial=status == 206, uri=uri, file=file, start=start)

    @staticmethod
    def _recv_exactly(sock: socket.socket, into: bytearray) -> None:
        view = memoryview(into)
        while view:
            n = sock.recv_into(view)
            if not n:
                raise ConnectionResetError("connection closed in the middle of the body")
            view = view[n:]


class _BufferedBody(BodyStream):
    """A body already received whole (:class:`SmallGets`); a cut one fails after its last byte."""

    def __init__(self, data: bytes, failure: str | None, **kwargs: Any) -> None:
        super().__init__(self._take, _nothing, errors=(ConnectionError,), **kwargs)
        self._data = data
        self._at = 0
        self._failure = failure

    def _take(self, n: int) -> bytes:
        if self._at >= len(self._data):
            if self._failure is not None:
                raise ConnectionError(self._failure)  # BodyStream.read: a transient error at this offset
            return b""
        chunk = self._data[self._at:self._at + n]  # the whole body (the usual read) is not copied
        self._at += len(chunk)
        return chunk


def _nothing() -> None:
    """Closing a received body releases nothing: its connection is already reusable or closed."""
