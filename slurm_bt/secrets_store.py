"""A per-user secret store: one 0600 file per secret in a 0700 directory.

``SecretReference(name=...)`` in a config names a secret; its value is looked up **at run time on
the compute node, as the job user**, never at submit time, so no value
ever reaches sbatch's argv, the script, the comment or the submit environment. Compute nodes may
run the job without ``$HOME`` set, so the default location comes from the passwd entry of the
current uid. Sites may pass another root (the site config names one).

Reading is paranoid because the store is a path a user controls and another user might have
prepared: the directory and the file are opened with ``O_NOFOLLOW`` and checked with ``fstat``
(real directory / regular file, owned by the current uid, no group or other access). Anything
else is refused with a message saying how to fix it. Writing goes through
:func:`slurm_bt.atomic.write_file_atomic` (unique ``O_EXCL|O_NOFOLLOW`` temp file + rename), so a
planted symlink or hard link at the secret's path is replaced, never written through, and the
file is 0600 whatever the umask.

No secret value ever appears in an exception message, a log line or a ``repr``: errors name the
store and the secret, and encoding errors (whose args carry the raw value) are never chained
or kept as ``__context__``.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from slurm_bt.atomic import fsync_dir, make_private_dir, write_file_atomic
from slurm_bt.errors import Problem, SecretError

__all__ = [
    "DEFAULT_STORE_SUBDIR",
    "MAX_SECRET_BYTES",
    "SECRET_NAME_PATTERN",
    "SecretStore",
    "check_secret_name",
]

SECRET_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Valid secret names; the first character rules out hidden files (temp files start with a dot)."""

DEFAULT_STORE_SUBDIR = Path(".config", "slurm-bt", "secrets")
"""The default store, relative to the current user's home directory (from passwd)."""

MAX_SECRET_BYTES = 1024 * 1024
"""Secrets are tokens and small JSON keys; a larger file is a mistake, not a secret."""

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted under a secret's name must not hang the job at open().
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def check_secret_name(name: str) -> str | None:
    """Why ``name`` is not a valid secret name, or None when it is.

    Config validation uses this to report a bad ``SecretReference`` with its own field path.
    """
    if not isinstance(name, str) or not SECRET_NAME_PATTERN.fullmatch(name):
        return (
            f"invalid secret name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit (no '/', no absolute paths)"
        )
    if ".." in name:
        return f"invalid secret name {name!r}: must not contain '..'"
    return None


class _Missing(Exception):
    """The secret (or the whole store) does not exist."""


class SecretStore:
    """The secrets of the current user, one file per secret under ``root``.

    Every method works from the uid alone; nothing reads ``$HOME`` or other environment.
    """

    def __init__(self, root: Path) -> None:
        """Use the store at ``root`` (created by :meth:`set` when missing)."""
        self._root = Path(root)

    @classmethod
    def default(cls) -> SecretStore:
        """The store under the current uid's home directory from passwd, not ``$HOME``.

        Raises:
            SecretError: the uid has no passwd entry.
        """
        uid = os.getuid()
        try:
            home = pwd.getpwuid(uid).pw_dir
        except KeyError:
            msg = f"uid {uid} has no passwd entry, so its secret store cannot be found"
            raise SecretError("secret store", [Problem("", msg)]) from None
        return cls(Path(home) / DEFAULT_STORE_SUBDIR)

    @property
    def root(self) -> Path:
        """The store directory."""
        return self._root

    def __repr__(self) -> str:
        return f"SecretStore(root={str(self._root)!r})"

    # --- public operations --------------------------------------------------------------------

    def set(self, name: str, value: str) -> None:
        """Create or replace secret ``name`` atomically (file 0600 in a 0700 directory).

        Raises:
            SecretError: bad name, or a value that is empty, too large, contains NUL (it could not
                be passed in an environment variable) or is not encodable as UTF-8.
            StorageError: the store directory is a symlink, not ours, or cannot be written.
        """
        self._require_name(name)
        # The error is raised outside the except block so that it neither chains to nor keeps as
        # __context__ the UnicodeEncodeError, whose args hold the whole value.
        data: bytes | None
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            data = None
        if data is None:
            self._fail(name, "the value is not valid Unicode text (it cannot be encoded as UTF-8)")
        if not data:
            self._fail(name, "the value is empty")
        if b"\0" in data:
            self._fail(name, "the value contains a NUL character")
        if len(data) > MAX_SECRET_BYTES:
            self._fail(name, f"the value is larger than {MAX_SECRET_BYTES} bytes")
        make_private_dir(self._root, 0o700, parents=True)
        write_file_atomic(self._root / name, data, mode=0o600)

    def get(self, name: str) -> str:
        """The value of secret ``name``, after checking the directory and file are private.

        Raises:
            SecretError: bad name, no such secret, or the directory or file is a symlink, not owned
                by the current uid or accessible by group or others (the message says how to fix).
        """
        self._require_name(name)
        try:
            dir_fd = self._open_dir()
        except _Missing:
            self._fail(name, self._missing_message(name))
        try:
            try:
                fd = self._open_secret(dir_fd, name)
            except _Missing:
                self._fail(name, self._missing_message(name))
            try:
                data = self._read(fd, name)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass  # raised below, outside this block: the UnicodeDecodeError holds the raw bytes
        self._fail(name, "the secret file is not valid UTF-8 text; set it again")

    def names(self) -> list[str]:
        """Sorted names of the secrets in the store (empty when the store does not exist).

        Raises:
            SecretError: the store directory is not private (see :meth:`get`).
        """
        try:
            dir_fd = self._open_dir()
        except _Missing:
            return []
        try:
            found = []
            for entry in os.listdir(dir_fd):
                if check_secret_name(entry) is not None:
                    continue  # temp files of an interrupted set, editor leftovers, ...
                try:
                    st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found.append(entry)
        finally:
            os.close(dir_fd)
        return sorted(found)

    def remove(self, name: str) -> None:
        """Delete secret ``name``.

        Raises:
            SecretError: bad name, no such secret, or the store is not private.
        """
        self._require_name(name)
        try:
            dir_fd = self._open_dir()
        except _Missing:
            self._fail(name, self._missing_message(name))
        try:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                self._fail(name, self._missing_message(name))
            except OSError as exc:
                self._fail(name, f"cannot remove the secret file: {exc.strerror}")
        finally:
            os.close(dir_fd)
        fsync_dir(self._root)

    def missing(self, names: Iterable[str]) -> list[str]:
        """Which of ``names`` the store lacks, in the given order without repeats.

        Submission calls this to reject unknown ``SecretReference`` names early. Present secrets
        are opened and checked as :meth:`get` would (but not read), so a store that would be
        refused at run time is refused now.

        Raises:
            SecretError: an invalid name, or a store or secret file that is not private; every
                problem is listed.
        """
        wanted = list(dict.fromkeys(names))
        problems = [Problem("", why) for n in wanted if (why := check_secret_name(n)) is not None]
        if problems:
            raise SecretError(str(self._root), problems)
        try:
            dir_fd = self._open_dir()
        except _Missing:
            return wanted
        absent: list[str] = []
        try:
            for name in wanted:
                try:
                    os.close(self._open_secret(dir_fd, name))
                except _Missing:
                    absent.append(name)
        finally:
            os.close(dir_fd)
        return absent

    # --- checks -------------------------------------------------------------------------------

    def _fail(self, loc: str, message: str) -> NoReturn:
        raise SecretError(str(self._root), [Problem(loc, message)])

    def _require_name(self, name: str) -> None:
        why = check_secret_name(name)
        if why is not None:
            self._fail("", why)

    def _missing_message(self, name: str) -> str:
        return f"no such secret; add it with: slurm-bt secrets set {name}"

    def _open_dir(self) -> int:
        """An fd on the store directory, after checking it is a private directory of ours."""
        try:
            fd = os.open(self._root, _OPEN_DIR)
        except FileNotFoundError:
            raise _Missing from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._fail(
                    "",
                    "the store is a symlink or not a directory; refusing to use it. "
                    f"Replace it with a real directory: mkdir -m 700 {self._root}",
                )
            self._fail("", f"cannot open the store directory: {exc.strerror}")
        try:
            st = os.fstat(fd)
            self._check_owner_and_mode(st, "", f"chmod 700 {self._root}")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_secret(self, dir_fd: int, name: str) -> int:
        """An fd on the secret file, after checking it is a private regular file of ours."""
        path = self._root / name
        try:
            fd = os.open(name, _OPEN_FILE, dir_fd=dir_fd)
        except FileNotFoundError:
            raise _Missing from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._fail(
                    name,
                    f"the secret file {path} is a symlink; refusing to follow it. "
                    f"Remove it and set the secret again: rm {path}",
                )
            self._fail(name, f"cannot open the secret file {path}: {exc.strerror}")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._fail(name, f"{path} is not a regular file; remove it and set the secret again")
            self._check_owner_and_mode(st, name, f"chmod 600 {path}")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_owner_and_mode(self, st: os.stat_result, loc: str, fix: str) -> None:
        what = "the secret file" if loc else "the store directory"
        uid = os.getuid()
        if st.st_uid != uid:
            self._fail(
                loc, f"{what} is owned by uid {st.st_uid}, not by you (uid {uid}); refusing to read it"
            )
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o077:
            self._fail(loc, f"{what} is accessible by group or others (mode {mode:04o}); fix with: {fix}")

    def _read(self, fd: int, name: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError as exc:
                self._fail(name, f"cannot read the secret file: {exc.strerror}")
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_SECRET_BYTES:
                self._fail(name, f"the secret file is larger than {MAX_SECRET_BYTES} bytes")
            chunks.append(chunk)
