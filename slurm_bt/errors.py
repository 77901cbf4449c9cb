"""One error tree for slurm-bt; the CLI maps it to messages and exit codes in one place.

    BtError
     ├── UserError            exit 2: the user's input is wrong; nothing was submitted or written
     │    ├── ConfigError       a config.py problem (one or more, each with a field path)
     │    ├── SiteConfigError   the admin's site file is missing, unreadable or invalid
     │    ├── SecretError       a SecretReference names a secret the user's store lacks
     │    ├── SnapshotError     the config folder cannot be snapshotted (too big, bad workspace)
     │    └── SourceSpecError   a weights source URI, pattern or secret format is malformed
     └── RuntimeFailure       exit 1: something outside the input failed; the message says what to do
          ├── SlurmCommandError  a Slurm client command failed (argv, returncode, stderr)
          ├── StorageError       a filesystem or object-store operation failed
          │    ├── CacheFullError       a weights cache cannot hold what is needed (need X, free Y)
          │    ├── CacheIntegrityError  content does not match its pinned sha256/size; never served
          │    └── SourceError          a weights source failed (uri, file, offset, transient)
          │         ├── SourceAccessError      401/403: not authorized for <source>
          │         ├── SourceNotFoundError    404: repo, revision, bucket or object missing
          │         ├── SourceUnavailableError unreachable, stalled or 5xx after retries
          │         └── IntegrityError         size or sha256 mismatch; nothing published
          ├── RemoteError        SSH to a login node failed (host, what failed) (ConnectionError)
          │    └── HostKeyError      unknown or changed host key: refused unless asked otherwise
          └── CacheLockTimeout   a cache lock was not obtained within its hard timeout (TimeoutError)

Each user error carries a list of :class:`Problem` so that *every* problem is reported at once,
one line each, as ``<file>: <field>: <message>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "BtError",
    "CacheFullError",
    "CacheIntegrityError",
    "CacheLockTimeout",
    "ConfigError",
    "HostKeyError",
    "IntegrityError",
    "Problem",
    "RemoteError",
    "RuntimeFailure",
    "SecretError",
    "SiteConfigError",
    "SlurmCommandError",
    "SnapshotError",
    "SourceAccessError",
    "SourceError",
    "SourceNotFoundError",
    "SourceSpecError",
    "SourceUnavailableError",
    "StorageError",
    "UserError",
]


@dataclass(frozen=True)
class Problem:
    """One problem with user input.

    Attributes:
        loc: dotted field path (``job.compute.accelerator.accelerator``), or ``""`` when the problem
            is about the file as a whole (for example an exception raised while importing it).
        message: one line saying what is wrong, never containing a secret value.
    """

    loc: str
    message: str


class BtError(Exception):
    """Root of every error slurm-bt raises on purpose."""

    exit_code = 1

    def lines(self) -> list[str]:
        """The message as the CLI prints it: one line per problem."""
        return [str(self)]


class UserError(BtError):
    """Bad input from the user or admin: exit code 2, nothing submitted, nothing half-written."""

    exit_code = 2

    def __init__(self, source: str, problems: Sequence[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        """``<source>: <loc>: <message>`` per problem (``<source>: <message>`` without a loc)."""
        out = []
        for p in self.problems:
            msg = " ".join(p.message.split())  # one line each, whatever pydantic or the user produced
            out.append(f"{self.source}: {p.loc}: {msg}" if p.loc else f"{self.source}: {msg}")
        return out


class ConfigError(UserError, ValueError):
    """A config.py could not be loaded or validated."""


class SiteConfigError(UserError, ValueError):
    """The site configuration file is missing, unreadable or invalid."""


class SecretError(UserError, KeyError):
    """A referenced secret is missing from, or cannot be read from, the user's secret store."""

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return "\n".join(self.lines())


class SnapshotError(UserError, ValueError):
    """The config folder could not be snapshotted for submission."""


class RuntimeFailure(BtError, RuntimeError):
    """Something outside the user's input failed: exit code 1."""


class SlurmCommandError(RuntimeFailure):
    """A Slurm client command failed.

    Attributes:
        argv: the command that ran.
        returncode: its exit status.
        stderr: what it printed on stderr (trimmed).
        hint: what the user can do about it.
    """

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, hint: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.hint = hint
        detail = self.stderr.splitlines()[-1] if self.stderr else f"exit status {returncode}"
        msg = f"{self.argv[0]} failed: {detail}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class StorageError(RuntimeFailure, OSError):
    """A filesystem or object-store operation failed.

    Attributes:
        uri: the path or URI involved.
    """

    def __init__(self, uri: str, message: str) -> None:
        self.uri = uri
        super().__init__(f"{uri}: {message}")

    def __str__(self) -> str:
        return str(self.args[0])


class SourceSpecError(UserError, ValueError):
    """A weights source is malformed: bad URI, bad patterns, no file matched, or a badly formed secret.

    Raised at submit time, before anything is fetched, so the user fixes the config (exit 2).
    """


class SourceError(StorageError):
    """A weights source (HF Hub, S3, R2, GCS) could not be listed, resolved or delivered.

    The message names the source, and the file and byte offset when known, so that a failed
    prolog says exactly what to look at (threats-and-faults.md F02).

    Attributes:
        uri: the canonical source URI (``hf://org/repo``, ``s3://bucket/prefix``).
        file: path of the file inside the source, or None for source-wide failures.
        offset: byte offset reached in ``file`` when the failure happened, or None.
        transient: True when retrying later may succeed (unreachable, stalled, 5xx).
    """

    def __init__(
        self,
        uri: str,
        message: str,
        *,
        file: str | None = None,
        offset: int | None = None,
        transient: bool = False,
    ) -> None:
        self.file = file
        self.offset = offset
        self.transient = transient
        where = ""
        if file is not None:
            where += f" file {file!r}"
        if offset is not None:
            where += f" at byte {offset}"
        super().__init__(uri, f"{where.strip()}: {message}" if where else message)


class SourceAccessError(SourceError, PermissionError):
    """The origin refused our credentials (401/403): "not authorized for <source>"."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """The repository, revision, bucket, prefix or object does not exist (404)."""


class SourceUnavailableError(SourceError, ConnectionError):
    """The origin is unreachable, stalled or failing (5xx) after bounded retries; transient."""


class IntegrityError(SourceError):
    """Downloaded bytes do not match the manifest (size or sha256); nothing was published.

    Attributes:
        expected: the manifest's sha256 (or size, as text).
        actual: what the received bytes hash to (or their size).
    """

    def __init__(
        self, uri: str, message: str, *, file: str, expected: str, actual: str, offset: int | None = None
    ) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(uri, f"{message} (expected {expected}, got {actual})", file=file, offset=offset)


class CacheFullError(StorageError):
    """A weights cache cannot hold what a job needs, even after evicting every lease-free entry.

    Raised before anything is written (pre-flight) or after a mid-write ``ENOSPC``/``EDQUOT`` (the
    temp file is removed first); either way the cache is left as it was.

    Attributes:
        need_bytes: bytes that had to be written.
        free_bytes: bytes that were available (filesystem free space minus the reserve, or the
            room left under the cache's size limit, whichever is smaller).
    """

    def __init__(
        self, root: str, need_bytes: int, free_bytes: int, *, tier: str = "cache", detail: str = ""
    ) -> None:
        self.need_bytes = need_bytes
        self.free_bytes = free_bytes
        msg = f"{tier} full: need {need_bytes} bytes, free {free_bytes} bytes"
        super().__init__(root, msg + (f" ({detail})" if detail else ""))


class CacheIntegrityError(StorageError):
    """A blob's content does not match the sha256 (or size) pinned in its manifest.

    The bad copy is deleted and never published or served (threats-and-faults.md R6, F03, P10).

    Attributes:
        expected_sha256: the pinned digest.
        actual_sha256: the digest of what was read (``""`` when the size alone was wrong).
        expected_size: the pinned size.
        actual_size: the size that was read.
    """

    def __init__(
        self, uri: str, expected_sha256: str, actual_sha256: str, expected_size: int, actual_size: int
    ) -> None:
        self.expected_sha256 = expected_sha256
        self.actual_sha256 = actual_sha256
        self.expected_size = expected_size
        self.actual_size = actual_size
        super().__init__(
            uri,
            f"content mismatch: expected sha256 {expected_sha256} ({expected_size} bytes), "
            f"got {actual_sha256 or 'unhashed'} ({actual_size} bytes)",
        )


class CacheLockTimeout(RuntimeFailure, TimeoutError):
    """A cache lock was still held by a live owner when the hard timeout expired.

    Hooks must never hang on a lock (style.md §2.13); the lock only saves bandwidth, so the caller
    may also retry without it.

    Attributes:
        lock_path: the lock file.
        waited_s: how long we waited.
        holder: who held it (``host pid=N``), as far as the lock file said.
    """

    def __init__(self, lock_path: str, waited_s: float, holder: str) -> None:
        self.lock_path = lock_path
        self.waited_s = waited_s
        self.holder = holder
        super().__init__(f"{lock_path}: lock not obtained after {waited_s:.1f} s (held by {holder})")

    def __str__(self) -> str:
        return str(self.args[0])


class RemoteError(RuntimeFailure, ConnectionError):
    """Talking to the login node over SSH failed (connect, authenticate, upload, run).

    Attributes:
        host: the host as the user named it (an ssh config alias or ``user@host:port``).
    """

    def __init__(self, host: str, message: str) -> None:
        self.host = host
        super().__init__(f"ssh {host}: {message}")

    def __str__(self) -> str:
        return str(self.args[0])


class HostKeyError(RemoteError):
    """The login node's host key is unknown (or differs from known_hosts); nothing was sent."""
