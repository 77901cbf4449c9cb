"""A small Hugging Face Hub look-alike on loopback, with fault injection (origin faults: errors, stalls, truncation).

It implements what huggingface_hub 2.x and our HF source need:

* ``GET /api/models/{repo}/revision/{rev}``: ``id`` (canonical case), ``sha`` and ``siblings``;
* ``GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=``: files with ``oid``, ``size``, ``lfs``;
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag``
  (sha256, LFS files only), ``X-Linked-Size``, ``Accept-Ranges``, ``Range`` → 206 (end clamped);
* auth like the Hub: a private repo without a reader token is 401 ``RepoNotFound``; a gated repo
  is 401 without a token and 403 ``GatedRepo`` with a token that lacks access;
* repo ids are looked up case-insensitively and answered in their canonical case;
* branches that tests can move (:meth:`FakeHub.commit`);
* with :attr:`FakeHub.lfs_cdn` set, like the real Hub: ``GET resolve`` of an LFS file answers 302
  to ``http://localhost:<port>/cdn-lfs/<sha256>?X-Sig=...`` (another origin: ``localhost``, not
  ``127.0.0.1``), which serves the bytes (``Range`` too); :attr:`FakeHub.cdn_auth` records the
  ``Authorization`` each CDN request carried.

Fault knobs (:class:`Faults`, set per test with :meth:`FakeHub.faults`): reset the connection
(RST) after N body bytes, flip one byte (same length), stall, ignore ``Range``, answer a status.
Each knob applies to ``times`` GET responses (``-1`` = all), optionally only for some paths.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from tests.servers._proc import ALT_HOST, HOST

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


@dataclass
class Faults:
    """Fault injection for GET ``resolve`` bodies.

    Attributes:
        paths: file paths the faults apply to (None = every file).
        reset_after: send this many body bytes, then reset the connection (RST).
        corrupt_offset: file offset whose byte is flipped in transit (same length).
        stall_after: send this many body bytes, then sleep ``stall_s``.
        stall_s: stall duration.
        ignore_range: answer 200 with the whole body even when a Range was asked.
        status: answer this HTTP status instead of the body.
        times: how many matching GET responses are affected (-1 = all).
    """

    paths: set[str] | None = None
    reset_after: int | None = None
    corrupt_offset: int | None = None
    stall_after: int | None = None
    stall_s: float = 0.0
    ignore_range: bool = False
    status: int | None = None
    times: int = 1


@dataclass
class _Repo:
    repo_id: str
    private: bool = False
    gated: bool = False
    readers: set[str] = field(default_factory=set)
    branches: dict[str, str] = field(default_factory=dict)
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)


def git_blob_oid(data: bytes) -> str:
    """The git blob sha1 of ``data`` (what the Hub reports for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def is_lfs(path: str, data: bytes) -> bool:
    """Our LFS rule: weight-like suffixes or anything of 1 MiB and more."""
    return path.endswith(LFS_SUFFIXES) or len(data) >= 1024 * 1024


class FakeHub:
    """The server plus its state; thread-safe; start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self) -> None:
        self._repos: dict[str, _Repo] = {}
        self._lock = threading.Lock()
        self._faults: Faults | None = None
        self._counter = 0
        self.requests: list[tuple[str, str, str | None]] = []
        self._server: ThreadingHTTPServer | None = None
        self._cdn_server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._sha_cache: dict[int, tuple[bytes, str]] = {}
        #: Redirect LFS downloads to the "CDN" route on another origin (see the module doc).
        self.lfs_cdn = False
        #: The ``Authorization`` header (or None) of every CDN request, in order.
        self.cdn_auth: list[str | None] = []
        self._cdn: dict[str, bytes] = {}

    # -- state -------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, files: dict[str, bytes], *, private: bool = False, gated: bool = False,
                 readers: set[str] | None = None, branch: str = "main") -> str:
        """Create a repo whose ``branch`` points at a commit holding ``files``; returns the commit."""
        with self._lock:
            self._repos[repo_id.lower()] = _Repo(repo_id, private, gated, set(readers or ()))
        return self.commit(repo_id, files, branch=branch)

    def commit(self, repo_id: str, files: dict[str, bytes], *, branch: str = "main") -> str:
        """Add a commit with exactly ``files`` and move ``branch`` to it; returns the commit id."""
        with self._lock:
            repo = self._repos[repo_id.lower()]
            self._counter += 1
            h = hashlib.sha1(f"{repo_id}:{self._counter}".encode(), usedforsecurity=False)
            for path in sorted(files):
                h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
            commit = h.hexdigest()
            repo.commits[commit] = dict(files)
            repo.branches[branch] = commit
            return commit

    @contextmanager
    def faults(self, faults: Faults) -> Iterator[Faults]:
        """Apply ``faults`` inside the ``with`` block."""
        with self._lock:
            self._faults = faults
            self.requests.clear()
        try:
            yield faults
        finally:
            with self._lock:
                self._faults = None

    def _take_fault(self, path: str) -> Faults | None:
        with self._lock:
            f = self._faults
            if f is None or f.times == 0 or (f.paths is not None and path not in f.paths):
                return None
            if f.times > 0:
                f.times -= 1
            return f

    def sha256_of(self, data: bytes) -> str:
        """sha256 hex (memoised by object identity: the big files are hashed once).

        The cache keeps a reference to ``data``: otherwise a freed object's id could be reused by
        new bytes (e.g. after :meth:`delete_repo`) and answer a stale hash.
        """
        key = id(data)
        cached = self._sha_cache.get(key)
        if cached is None or cached[0] is not data:
            cached = (data, hashlib.sha256(data).hexdigest())
            self._sha_cache[key] = cached
        return cached[1]

    def blob_oid_of(self, data: bytes) -> str:
        """git blob sha1 (memoised like :meth:`sha256_of`: listings must not re-hash big files)."""
        key = -id(data)
        cached = self._sha_cache.get(key)
        if cached is None or cached[0] is not data:
            cached = (data, git_blob_oid(data))
            self._sha_cache[key] = cached
        return cached[1]

    def delete_repo(self, repo_id: str) -> None:
        """Remove a repository: every later request for it answers 404 (a source vanishing after submit)."""
        with self._lock:
            self._repos.pop(repo_id.lower(), None)

    # -- server ------------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``."""
        assert self._server is not None
        return f"http://{HOST}:{self._server.server_address[1]}"

    def start(self) -> FakeHub:
        """Listen on a free 127.0.0.1 port in a daemon thread."""
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-hub")
        self._thread.start()
        if ALT_HOST != "localhost":  # the CDN's origin is another address: it needs a listener of its own
            self._cdn_server = ThreadingHTTPServer((ALT_HOST, 0), Handler)
            self._cdn_server.daemon_threads = True
            threading.Thread(target=self._cdn_server.serve_forever, daemon=True, name="fake-hub-cdn").start()
        return self

    @property
    def cdn_origin(self) -> str:
        """``http://localhost:<port>``: another origin than :attr:`endpoint` that serves the LFS bytes."""
        server = self._cdn_server or self._server
        assert server is not None
        return f"http://{ALT_HOST}:{server.server_address[1]}"

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._cdn_server is not None:
            self._cdn_server.shutdown()
            self._cdn_server.server_close()
            self._cdn_server = None
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- lookups used by the handler ---------------------------------------------------------------

    def lookup(self, repo_id: str, rev: str) -> tuple[_Repo | None, str | None]:
        with self._lock:
            repo = self._repos.get(repo_id.lower())
            if repo is None:
                return None, None
            commit = repo.branches.get(rev, rev if rev in repo.commits else None)
            return repo, commit


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in separate writes: no 40 ms delayed-ACK stalls

    def log_message(self, format: str, *args: object) -> None:
        pass

    # -- helpers -----------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              ctype: str = "application/json") -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(), {"X-Error-Code": code, "X-Error-Message": message})

    def _json(self, obj: object) -> None:
        self._send(200, json.dumps(obj).encode())

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        return auth[7:] if auth.startswith("Bearer ") else None

    def _authorize(self, repo: _Repo) -> bool:
        token = self._token()
        if repo.private and token not in repo.readers:
            self._error(401, "RepoNotFound", "Repository not found")
            return False
        if repo.gated and token not in repo.readers:
            if token is None:
                self._error(401, "GatedRepo", "Access to this repo is restricted; you must be authenticated")
            else:
                self._error(403, "GatedRepo", "Access to this gated repo is restricted; ask for access")
            return False
        return True

    def _resolve_repo(self, repo_id: str, rev: str) -> tuple[_Repo, str] | None:
        repo, commit = self.hub.lookup(repo_id, rev)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if not self._authorize(repo):
            return None
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo, commit

    # -- routes ------------------------------------------------------------------------------

    def do_HEAD(self) -> None:
        self._route()

    def do_GET(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.split("/")[1:]
        query = parse_qs(url.query)
        with self.hub._lock:
            self.hub.requests.append((self.command, self.path, self.headers.get("Range")))
        try:
            if parts[:2] == ["api", "models"]:
                rest = parts[2:]
                for kw in ("revision", "tree"):
                    for i in (1, 2):
                        if len(rest) > i and rest[i] == kw:
                            repo_id = "/".join(unquote(p) for p in rest[:i])
                            rev = unquote(rest[i + 1]) if len(rest) > i + 1 else "main"
                            sub = "/".join(unquote(p) for p in rest[i + 2 :])
                            return self._revision(repo_id, rev) if kw == "revision" else self._tree(
                                repo_id, rev, sub, query.get("recursive", ["false"])[0].lower() == "true")
                if len(rest) in (1, 2):
                    return self._revision("/".join(unquote(p) for p in rest), "main")
            if len(parts) == 2 and parts[0] == "cdn-lfs":
                return self._cdn_get(parts[1])
            for i in (1, 2):
                if len(parts) > i + 2 and parts[i] == "resolve":
                    repo_id = "/".join(unquote(p) for p in parts[:i])
                    return self._resolve(repo_id, unquote(parts[i + 1]), "/".join(unquote(p) for p in parts[i + 2 :]))
            self._error(404, "EntryNotFound", "no such route")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _entry(self, path: str, data: bytes) -> dict[str, object]:
        entry: dict[str, object] = {"type": "file", "path": path, "size": len(data), "oid": self.hub.blob_oid_of(data)}
        if is_lfs(path, data):
            entry["lfs"] = {"oid": self.hub.sha256_of(data), "size": len(data), "pointerSize": 134}
        return entry

    def _revision(self, repo_id: str, rev: str) -> None:
        found = self._resolve_repo(repo_id, rev)
        if found is None:
            return
        repo, commit = found
        files = repo.commits[commit]
        siblings = []
        for path, data in sorted(files.items()):
            sib: dict[str, object] = {"rfilename": path, "size": len(data), "blobId": self.hub.blob_oid_of(data)}
            if is_lfs(path, data):
                sib["lfs"] = {"sha256": self.hub.sha256_of(data), "size": len(data), "pointerSize": 134}
            siblings.append(sib)
        self._json({"_id": commit[:24], "id": repo.repo_id, "modelId": repo.repo_id, "sha": commit,
                    "private": repo.private, "gated": "auto" if repo.gated else False, "disabled": False,
                    "tags": [], "downloads": 0, "likes": 0, "siblings": siblings,
                    "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z"})

    def _tree(self, repo_id: str, rev: str, sub: str, recursive: bool) -> None:
        found = self._resolve_repo(repo_id, rev)
        if found is None:
            return
        repo, commit = found
        prefix = f"{sub}/" if sub else ""
        out: list[dict[str, object]] = []
        dirs: set[str] = set()
        for path, data in sorted(repo.commits[commit].items()):
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :]
            segs = rel.split("/")
            for depth in range(1, len(segs)):
                d = prefix + "/".join(segs[:depth])
                if d not in dirs and (recursive or depth == 1):
                    dirs.add(d)
                    out.append({"type": "directory", "path": d, "oid": hashlib.sha1(d.encode()).hexdigest()})
            if recursive or len(segs) == 1:
                out.append(self._entry(path, data))
        self._json(out)

    def _resolve(self, repo_id: str, rev: str, path: str) -> None:
        found = self._resolve_repo(repo_id, rev)
        if found is None:
            return
        repo, commit = found
        data = repo.commits[commit].get(path)
        if data is None:
            self._error(404, "EntryNotFound", f"{path} does not exist")
            return
        size = len(data)
        lfs = is_lfs(path, data)
        etag = self.hub.sha256_of(data) if lfs else self.hub.blob_oid_of(data)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if lfs:
            headers["X-Linked-Etag"] = f'"{etag}"'
            headers["X-Linked-Size"] = str(size)
        fault = self.hub._take_fault(path) if self.command == "GET" else None
        if fault is not None and fault.status is not None:
            self._error(fault.status, "Injected", "injected failure")
            return
        if lfs and self.hub.lfs_cdn and self.command == "GET":
            with self.hub._lock:
                self.hub._cdn[etag] = data
            self._send(302, b"", {**headers, "Location": f"{self.hub.cdn_origin}/cdn-lfs/{etag}?X-Sig=secret-sig"})
            return
        self._serve(data, headers, fault)

    def _cdn_get(self, sha: str) -> None:
        with self.hub._lock:
            self.hub.cdn_auth.append(self.headers.get("Authorization"))
            data = self.hub._cdn.get(sha)
        if data is None:
            self._error(404, "EntryNotFound", "no such CDN object")
            return
        self._serve(data, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"}, None)

    def _serve(self, data: bytes, headers: dict[str, str], fault: Faults | None) -> None:
        """The body (or the ``Range`` of it) with ``headers``; ``fault`` applied to the body."""
        size = len(data)
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng and not (fault is not None and fault.ignore_range):
            spec = rng.removeprefix("bytes=")
            a, _, b = spec.partition("-")
            if a == "":
                start, end = max(0, size - int(b)), size - 1
            else:
                start = int(a)
                end = min(int(b), size - 1) if b else size - 1  # clamp like the Hub (hf_transfer asks one past)
            if start >= size or start > end:
                self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if self.command == "HEAD":
            return
        self._body(data, start, end + 1, fault)

    def _body(self, data: bytes, start: int, stop: int, fault: Faults | None) -> None:
        view = memoryview(data)
        pos = start
        chunk = 1024 * 1024
        sent = 0
        stalled = False
        while pos < stop:
            n = min(chunk, stop - pos)
            if fault is not None and fault.reset_after is not None:
                n = min(n, max(1, fault.reset_after - sent))
            if fault is not None and fault.stall_after is not None and not stalled:
                n = min(n, max(1, fault.stall_after - sent))
            piece: bytes | memoryview = view[pos : pos + n]
            if fault is not None and fault.corrupt_offset is not None and pos <= fault.corrupt_offset < pos + n:
                buf = bytearray(piece)
                buf[fault.corrupt_offset - pos] ^= 0xFF
                piece = bytes(buf)
            self.wfile.write(piece)
            pos += n
            sent += n
            if fault is not None and fault.stall_after is not None and not stalled and sent >= fault.stall_after:
                stalled = True
                self.wfile.flush()
                time.sleep(fault.stall_s)
            if fault is not None and fault.reset_after is not None and sent >= fault.reset_after:
                self.wfile.flush()
                # Let the client read what was sent: an RST discards the peer's unread receive buffer,
                # which would make "reset after N bytes" depend on scheduling.
                time.sleep(0.3)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return


def _proc_free_port() -> int:
    """A free loopback port with nothing listening (for "origin unreachable" tests)."""
    from tests.servers._proc import free_port

    return free_port()
