"""One error tree for slurm-bt; the CLI maps it to messages and exit codes in one place.

    BtError
     ├── UserError            exit 2: the user's input is wrong; nothing was submitted or written
     │    ├── ConfigError       a config.py problem (one or more, each with a field path)
     │    ├── SiteConfigError   the admin's site file is missing, unreadable or invalid
     │    ├── SecretError       a SecretReference names a secret the user's store lacks
     │    ├── SnapshotError     the config folder cannot be snapshotted (too big, bad workspace)
     │    └── SourceSpecError   a weights source URI, pattern or secret format is malformed
     ├── RuntimeFailure       exit 1: something outside the input failed; the message says what to do
     │    ├── SlurmCommandError  a Slurm client command failed (argv, returncode, stderr)
     │    ├── StorageError       a filesystem or object-store operation failed
     │    │    ├── MissingExtraError    a storage scheme's optional package is not installed:
     │    │    │                        "pip install 'slurm-bt[extra]'" (exit 1, never "internal error")
     │    │    ├── CacheFullError       a weights cache cannot hold what is needed (need X, free Y)
     │    │    ├── IntegrityError       bytes do not match their expected sha256/size/checksum;
     │    │    │    │                   nothing published or served (checkpoints, uploads, caches)
     │    │    │    ├── CacheIntegrityError    a cached blob differs from its manifest pin
     │    │    │    └── SourceIntegrityError   (also a SourceError) a weights origin sent other bytes
     │    │    ├── UntrustedLocation    a checkpoint store path is not what slurm-bt would have made
     │    │    └── SourceError          a weights source failed (uri, file, offset, transient)
     │    │         ├── SourceAccessError      401/403: not authorized for <source>
     │    │         ├── SourceNotFoundError    404: repo, revision, bucket or object missing
     │    │         ├── SourceUnavailableError unreachable, stalled or 5xx after retries
     │    │         └── SourceIntegrityError   (see IntegrityError)
     │    ├── RemoteError        SSH to a login node failed (host, what failed) (ConnectionError)
     │    │    └── HostKeyError      unknown or changed host key: refused unless asked otherwise
     │    ├── CacheLockTimeout   a cache lock was not obtained within its hard timeout (TimeoutError)
     │    ├── DeadlineExceeded   a checkpoint upload's time budget ran out between two files
     │    └── PrologRefusedError step 1 found the prolog's refusal note for this job on this node
     └── HookError            raised inside a root prolog/epilog step; hooks/runner.py's exit policy
          ├── HookUserError      the job's user or input is at fault: fail this job, keep the node
          │    └── WeightsJobError  this job's weights cannot be delivered on this node
          └── NodeFault          this node is broken: drain it, saying what broke and how to fix it

    HookDeadline (a BaseException, outside the tree on purpose): the hook's own SIGALRM deadline,
    which no ``except Exception`` in a hook step may swallow.

Exceptions private to one module (``_Moved``, ``_Aborted``...) are control flow, not errors, and
stay there; so do the ``ValueError``/``OSError`` subclasses of the base layer that callers catch by
their builtin type (:mod:`slurm_bt.posix`'s ``UntrustedPath``, ``UnsafeFile``, ``ChildError``...).

Each user error carries a list of :class:`Problem` so that *every* problem is reported at once,
one line each, as ``<file>: <field>: <message>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "OPTIONAL_EXTRAS",
    "BtError",
    "CacheFullError",
    "CacheIntegrityError",
    "CacheLockTimeout",
    "ConfigError",
    "DeadlineExceeded",
    "HookDeadline",
    "HookError",
    "HookUserError",
    "HostKeyError",
    "IntegrityError",
    "MissingExtraError",
    "NodeFault",
    "Problem",
    "PrologRefusedError",
    "RegistryToolError",
    "RemoteError",
    "RuntimeFailure",
    "SecretError",
    "SiteConfigError",
    "SlurmCommandError",
    "SnapshotError",
    "SourceAccessError",
    "SourceError",
    "SourceIntegrityError",
    "SourceNotFoundError",
    "SourceSpecError",
    "SourceUnavailableError",
    "StorageError",
    "UntrustedLocation",
    "UserError",
    "WeightsJobError",
    "extra_for_module",
]

OPTIONAL_EXTRAS: dict[str, str] = {
    "boto3": "s3", "botocore": "s3", "s3transfer": "s3",
    "huggingface_hub": "hf",
    "gcsfs": "gcs", "google": "gcs", "google_crc32c": "gcs",
    "adlfs": "azure", "azure": "azure",
    "urllib3": "https",
    "paramiko": "ssh",
}
"""Top-level module -> the pyproject extra that installs it (``[project.optional-dependencies]``)."""


def extra_for_module(name: str | None) -> str | None:
    """The extra that installs module ``name`` (``"botocore.session"`` -> ``"s3"``), or None."""
    return OPTIONAL_EXTRAS.get((name or "").split(".")[0])


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
    prolog says exactly what to look at.

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


class IntegrityError(StorageError):
    """Bytes do not match what they must be (size, sha256 or the store's own checksum); nothing was
    published, served or kept at the final path. The one integrity error of weights and checkpoints.

    Attributes:
        file: path of the file (or object key) involved, or None.
        offset: byte offset when known, or None.
        expected: the expected sha256 (or size, as text).
        actual: what the bytes hash to (or their size).
        transient: always False: retrying the same bytes gives the same answer.
    """

    def __init__(
        self, uri: str, message: str, *, file: str | None, expected: str, actual: str, offset: int | None = None
    ) -> None:
        self.file = file
        self.offset = offset
        self.expected = expected
        self.actual = actual
        self.transient = False
        where = ""
        if file is not None:
            where += f" file {file!r}"
        if offset is not None:
            where += f" at byte {offset}"
        text = f"{message} (expected {expected}, got {actual})"
        # StorageError's, not the next class in the MRO: SourceIntegrityError is also a SourceError,
        # whose constructor takes other arguments.
        StorageError.__init__(self, uri, f"{where.strip()}: {text}" if where else text)


class SourceIntegrityError(IntegrityError, SourceError):
    """A weights origin sent bytes that do not match its manifest or its own checksum.

    Both an :class:`IntegrityError` and a :class:`SourceError`, so the weights code that handles
    every source failure alike (``except SourceError``) keeps doing so.
    """


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


class CacheIntegrityError(IntegrityError):
    """A blob's content does not match the sha256 (or size) pinned in its manifest.

    The bad copy is deleted and never published or served (docs/weights-cache.md).

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
        self.file = None
        self.offset = None
        self.expected = expected_sha256
        self.actual = actual_sha256
        self.transient = False
        StorageError.__init__(
            self,
            uri,
            f"content mismatch: expected sha256 {expected_sha256} ({expected_size} bytes), "
            f"got {actual_sha256 or 'unhashed'} ({actual_size} bytes)",
        )


class CacheLockTimeout(RuntimeFailure, TimeoutError):
    """A cache lock was still held by a live owner when the hard timeout expired.

    Hooks must never hang on a lock (a hook past its deadline drains the node); the lock only saves
    bandwidth, so the caller may also retry without it.

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


class RegistryToolError(RuntimeFailure):
    """A registry tool (skopeo) failed.

    ``kind`` is ``auth``, ``not_found``, ``integrity``, ``timeout`` or ``unreachable``, classified from
    the tool's stderr (slurm_bt/images/skopeo.py); images/pin.py and images/mirror.py turn it into the
    error of the config field it concerns (exit 2 for the user's reference or credentials, else 1).
    """

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class MissingExtraError(StorageError):
    """A storage scheme's optional package is not installed; the message names the extra to install.

    The CLI prints it like any runtime failure (exit 1), never as an internal error.
    """

    def __init__(self, url: str, scheme: str, extra: str, missing: str | None) -> None:
        self.extra = extra
        super().__init__(url, f"{scheme}:// needs optional packages that are not installed "
                         f"({missing or 'import failed'}): pip install 'slurm-bt[{extra}]'")


class UntrustedLocation(StorageError):
    """A directory or file of a ``file://`` checkpoint store is not what slurm-bt would have made.

    Raised instead of using it (docs/checkpoints.md §Trust model): a project directory another team
    created first (a squat), a job directory of another user, a symlink, FIFO or device anywhere
    below the store root. The message names the path and the fix.
    """


class DeadlineExceeded(RuntimeFailure):
    """A checkpoint upload's time budget ran out between two files; what is left stays on disk."""


class PrologRefusedError(RuntimeFailure):
    """The slurm-bt prolog refused this job on this node; the message says why and what to do."""


class HookError(BtError):
    """Raised by a step of a root prolog or epilog; hooks/runner.py decides what it does to the job
    and the node (docs/architecture.md, prolog/README.md)."""


class HookUserError(HookError):
    """A problem caused by the job's user or input: fail this job with ``reason``, keep the node."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class WeightsJobError(HookUserError):
    """This job's weights cannot be delivered on this node (fail the job, keep the node)."""


class NodeFault(HookError):
    """Something is wrong with this node: drain it, saying what broke and how to fix it."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"{what}; fix: {fix}")
        self.what = what
        self.fix = fix


class HookDeadline(BaseException):
    """The hook's internal deadline expired (raised from the SIGALRM handler).

    A ``BaseException`` so that ``except Exception`` in hook-point code cannot swallow it.
    """
