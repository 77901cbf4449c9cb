"""The checkpoint store: a small interface, a ``file://`` backend, and a lazy registry for the rest.

Why a four-verb interface (:class:`CheckpointStore`): the uploader, the resolver and the CLI only
ever put a file, get a file, read/write a small JSON object and list "directories". Object-store
specifics (multipart, checksum headers, ranged GETs) stay inside :mod:`.s3` and :mod:`.gcs`, which
import their heavy clients only when a store of that scheme is opened.

Integrity (threats-and-faults.md R6): every backend hashes what it sends with sha256 *while
sending it* and returns that digest, which the caller records in the index; every download is
written to a unique temp file, sha256-verified against the index, fsynced and only then renamed
into place. Nothing ever trusts an ETag.

Credentials and trust (docs/checkpoints.md): ``file://`` stores are plain directories on shared
storage, written and read with the caller's own uid and groups, so the filesystem enforces who sees
what. Object stores use credentials from the *caller's* secret store (``?secret=NAME``), so the
bucket policy enforces it; ``?service_credentials=FILE`` is honoured only for root.
"""

from __future__ import annotations

import errno
import grp
import hashlib
import json
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slurm_bt.atomic import atomic_output
from slurm_bt.checkpoints.layout import StoreUri, parse_store_uri
from slurm_bt.errors import StorageError

__all__ = [
    "CHUNK_BYTES",
    "CheckpointStore",
    "FileStore",
    "StoreCredentials",
    "UploadResult",
    "credentials_for",
    "open_store",
    "sha256_fd",
    "team_gid",
]

CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class UploadResult:
    """What one verified upload produced.

    Attributes:
        sha256: hex digest of the bytes sent (computed while sending).
        size: bytes sent.
        verified: how the store confirmed it: ``sha256`` (the store checked our sha256),
            ``composite-crc32c`` / ``composite-crc32`` / ``composite-sha256`` (per-part checksums
            checked on receipt plus the object's composite checksum compared after completion),
            ``size`` (the store offers nothing better), ``local`` (``file://``: written and fsynced).
        skipped: the object was already there with the same content.
        resumed_parts: parts of an interrupted multipart upload that were verified against the
            local bytes and kept instead of being sent again.
    """

    sha256: str
    size: int
    verified: str
    skipped: bool = False
    resumed_parts: int = 0


@dataclass(frozen=True, repr=False)
class StoreCredentials:
    """Credentials for one object store; ``repr`` never shows values."""

    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    gcs_service_account: dict[str, object] | None = None

    def __repr__(self) -> str:
        kind = "aws-keys" if self.aws_access_key_id else "gcs-key" if self.gcs_service_account else "default-chain"
        return f"StoreCredentials({kind}, values hidden)"


class CheckpointStore(Protocol):
    """What the checkpoint code needs from a store. Keys are ``/``-separated, relative to the URI."""

    uri: StoreUri

    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Send ``size`` bytes of the open file ``fd`` to ``key``; skip when already identical."""
        ...

    def download_file(self, key: str, dest: Path, *, size: int, sha256: str) -> None:
        """Fetch ``key`` into ``dest`` (temp + verify + fsync + rename)."""
        ...

    def read_bytes(self, key: str) -> bytes | None:
        """A small object's content, or None when absent."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None:
        """Replace a small object atomically."""
        ...

    def list_dirs(self, prefix: str) -> list[str]:
        """Names of the immediate "subdirectories" of ``prefix``."""
        ...

    def close(self) -> None:
        """Release connections and threads."""
        ...


def sha256_fd(fd: int, size: int | None = None) -> str:
    """Hash an open file from offset 0 (``pread``: the caller's offset is untouched)."""
    h = hashlib.sha256()
    offset = 0
    while size is None or offset < size:
        want = CHUNK_BYTES if size is None else min(CHUNK_BYTES, size - offset)
        chunk = os.pread(fd, want, offset)
        if not chunk:
            break
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def team_gid(account: str | None) -> int:
    """The group that shares a user's checkpoints in a ``file://`` store.

    ``account`` is the team group the root prolog resolved for the job (docs/admin.md §Teams) or,
    without the prolog, the Slurm account. It is used only if it names a Unix group the current user
    belongs to (the kernel decides); otherwise the user's primary group.
    """
    pw = pwd.getpwuid(os.getuid())
    if account:
        try:
            gr = grp.getgrnam(account)
        except KeyError:
            gr = None
        if gr is not None and (gr.gr_gid == pw.pw_gid or gr.gr_gid in os.getgroups() or pw.pw_name in gr.gr_mem):
            return gr.gr_gid
    return pw.pw_gid


class FileStore:
    """A checkpoint store in a shared directory.

    Permissions (the trust model for ``file://``): the store root is admin-made (``1777`` like
    ``/tmp``, or ``0755`` with pre-created project directories). A project directory is created
    ``2770`` with the team group (:func:`team_gid`), so teammates can add jobs and nobody else can
    even list it; job directories and everything below are ``2750`` / ``0640``: the team reads, only
    the job's user writes.
    """

    def __init__(self, uri: StoreUri, *, gid: int | None = None) -> None:
        """Open the store at ``uri.prefix``; creates the root (``1777``) when it is missing."""
        self.uri = uri
        self.root = Path(uri.prefix)
        self._gid = gid

    def _path(self, key: str) -> Path:
        parts = [p for p in key.split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise StorageError(key, "invalid key")
        return self.root.joinpath(*parts)

    def _ensure_root(self) -> None:
        if self.root.is_dir():
            return
        try:
            self.root.mkdir(parents=True, mode=0o700)
            os.chmod(self.root, 0o1777)  # noqa: S103 - sticky like /tmp: users add projects
        except FileExistsError:
            pass
        except OSError as exc:
            raise StorageError(str(self.root), f"cannot create the checkpoint store: {exc.strerror}") from exc

    def _make_dirs(self, path: Path) -> None:
        """Create ``path``'s missing directories below the root with the documented modes."""
        rel = path.relative_to(self.root).parts
        self._ensure_root()
        cur = self.root
        for depth, part in enumerate(rel):
            cur = cur / part
            try:
                os.mkdir(cur, 0o700)
            except FileExistsError:
                st = os.lstat(cur)
                if not stat.S_ISDIR(st.st_mode):
                    raise StorageError(str(cur), "exists and is not a directory") from None
                continue
            except PermissionError as exc:
                raise StorageError(str(cur), "permission denied: the project belongs to another team, "
                                   "or the store root is not writable") from exc
            mode = 0o2770 if depth == 0 else 0o2750
            if self._gid is not None:
                try:
                    os.chown(cur, -1, self._gid)
                except OSError:
                    pass
            os.chmod(cur, mode)

    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Copy ``fd`` to ``key`` (temp + fsync + rename + fsync dir), hashing what is written."""
        final = self._path(key)
        if expect_sha256 is not None:
            try:
                st = os.stat(final)
                if st.st_size == size:
                    with open(final, "rb") as fh:
                        if sha256_fd(fh.fileno(), size) == expect_sha256:
                            return UploadResult(expect_sha256, size, "local", skipped=True)
            except OSError:
                pass
        self._make_dirs(final.parent)
        h = hashlib.sha256()
        with atomic_output(final, mode=0o640) as out:
            offset = 0
            while offset < size:
                chunk = os.pread(fd, min(CHUNK_BYTES, size - offset), offset)
                if not chunk:
                    raise StorageError(str(final), f"source shrank while uploading (at byte {offset} of {size})")
                h.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
                offset += len(chunk)
        return UploadResult(h.hexdigest(), size, "local")

    def download_file(self, key: str, dest: Path, *, size: int, sha256: str) -> None:
        """Copy ``key`` to ``dest`` via a verified temp file."""
        src = self._path(key)
        try:
            fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise StorageError(str(src), f"cannot read checkpoint file: {exc.strerror}") from exc
        try:
            _copy_verified(fd, dest, size=size, sha256=sha256, uri=str(src))
        finally:
            os.close(fd)

    def read_bytes(self, key: str) -> bytes | None:
        """Small object content or None."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise StorageError(str(self._path(key)), "permission denied (another team's checkpoints?)") from exc
            raise StorageError(str(self._path(key)), exc.strerror or "cannot read") from exc

    def write_bytes(self, key: str, data: bytes) -> None:
        """Atomic replace, readable by the team (0640)."""
        path = self._path(key)
        self._make_dirs(path.parent)
        from slurm_bt.atomic import write_file_atomic

        write_file_atomic(path, data, mode=0o640)

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate subdirectories (unreadable ones, i.e. other teams' projects, are left out)."""
        try:
            return sorted(e.name for e in os.scandir(self._path(prefix)) if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []

    def close(self) -> None:
        """Nothing to release."""


def _copy_verified(fd: int, dest: Path, *, size: int, sha256: str, uri: str) -> None:
    """Copy an open file to ``dest``: sha256 while copying, verified before it is published."""
    from slurm_bt.errors import IntegrityError

    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with atomic_output(dest, mode=0o640) as out:
        offset = 0
        while True:
            chunk = os.pread(fd, CHUNK_BYTES, offset)
            if not chunk:
                break
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
            offset += len(chunk)
        if offset != size or h.hexdigest() != sha256:
            raise IntegrityError(uri, "checkpoint file does not match the index", file=dest.name,
                                 expected=f"{sha256} ({size} bytes)", actual=f"{h.hexdigest()} ({offset} bytes)")

def credentials_for(uri: StoreUri, secret_store_root: str | None) -> StoreCredentials | None:
    """The credentials the *current process* may use for ``uri``.

    Order: ``service_credentials`` (only when running as root: a root-owned 0600 JSON file; used by
    root hooks, never reaches a job), then ``secret`` from the current user's secret store, then
    None (boto3's / google-auth's default chain: environment, instance profile).

    Raises:
        StorageError: a configured source exists but cannot be read or parsed (no value is shown).
    """
    if uri.scheme == "file":
        return None
    service = uri.options.get("service_credentials")
    if service and os.geteuid() == 0:
        try:
            fd = os.open(service, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if st.st_uid != 0 or st.st_mode & 0o077:
                    raise StorageError(service, "service credentials must be owned by root with mode 0600")
                raw = os.read(fd, 1 << 20).decode()
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(service, f"cannot read service credentials: {exc.strerror}") from exc
        return _parse_credentials(uri, raw, service)
    name = uri.options.get("secret")
    if name and secret_store_root:
        from slurm_bt.secrets_store import SecretStore

        value = SecretStore(Path(secret_store_root)).get(name)
        return _parse_credentials(uri, value, f"secret {name!r}")
    return None


def _parse_credentials(uri: StoreUri, raw: str, what: str) -> StoreCredentials:
    try:
        data = json.loads(raw)
    except ValueError:
        raise StorageError(uri.display(), f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise StorageError(uri.display(), f"{what} must be a JSON object")
    if uri.scheme == "gs":
        return StoreCredentials(gcs_service_account=data)
    key, secret = data.get("aws_access_key_id"), data.get("aws_secret_access_key")
    if not isinstance(key, str) or not isinstance(secret, str):
        raise StorageError(uri.display(), f"{what} must hold aws_access_key_id and aws_secret_access_key")
    token = data.get("aws_session_token")
    return StoreCredentials(key, secret, token if isinstance(token, str) else None)


def open_store(uri: str | StoreUri, *, credentials: StoreCredentials | None = None,
               gid: int | None = None) -> CheckpointStore:
    """Open the store named by ``uri`` (the backend's client library is imported here, lazily)."""
    parsed = parse_store_uri(uri) if isinstance(uri, str) else uri
    if parsed.scheme == "file":
        return FileStore(parsed, gid=gid)
    if parsed.scheme in ("s3", "r2"):
        try:
            from slurm_bt.checkpoints.s3 import S3Store
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise StorageError(parsed.display(), "boto3 is not installed: pip install 'slurm-bt[s3]'") from exc
        return S3Store(parsed, credentials=credentials)
    try:
        from slurm_bt.checkpoints.gcs import GcsStore
    except ImportError as exc:  # pragma: no cover
        raise StorageError(parsed.display(),
                           "google-cloud-storage is not installed: pip install 'slurm-bt[gcs]'") from exc
    return GcsStore(parsed, credentials=credentials)
