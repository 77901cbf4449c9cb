"""fd-relative filesystem operations for root-owned trees: open, create (don't adopt), delete.

Why not paths: a root process that acts on ``/scratch/123/a/b`` by name can be redirected by
anyone who can swap one component for a symlink between check and use (CVE-2023-41914,
systemd CVE-2018-6954, opentmpfiles CVE-2017-18188). Here every
step starts from a directory file descriptor we already hold and opens the next component with
``O_NOFOLLOW|O_DIRECTORY``; ownership and type are checked with ``fstat`` on the descriptor actually
opened; ``fchown``/``fchmod`` act on that descriptor. ``fs.protected_*`` sysctls are never relied on.

:func:`remove_tree_at` deletes a user-owned tree as root without ever following a symlink (a
symlink is unlinked, never traversed), without crossing into another filesystem or a mount point
(``st_dev`` and ``/proc/self/mountinfo``; it unmounts nothing), surviving a concurrent
directory↔symlink swap (``ELOOP``/``ENOTDIR``/``EISDIR`` are retried as the other type), handling
``chmod 000`` directories, and walking iteratively with a bounded number of open descriptors, so
neither deep nesting nor huge directories can exhaust the stack or the fd table.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "RemovalReport",
    "UnsafeEntry",
    "UntrustedPath",
    "ensure_dir_at",
    "open_dir_at",
    "open_trusted_dir",
    "remove_owned_tree",
    "remove_tree_at",
    "set_default_group_acl",
    "walk_dirs",
    "write_file_at",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_OPEN_FDS = 128
_MAX_SWAPS = 64
_MAX_RMDIR_RETRIES = 3
_MAX_SYMLINKS = 8


class UntrustedPath(OSError):
    """An admin-configured root (or one of its parents) could be replaced by a non-root user.

    This is a node fault: the fix is an admin's ``chown``/``chmod`` (``slurm-bt admin doctor``).
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(errno.EPERM, f"{path}: {reason}")
        self.path = path
        self.reason = reason


class UnsafeEntry(OSError):
    """An entry we were about to create already exists as something we must not adopt.

    Attributes:
        name: the entry's name inside its parent.
        reason: ``is a symlink``, ``is not a directory``, ``is owned by uid N``...
    """

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(errno.EEXIST, f"{name}: {reason}")
        self.name = name
        self.reason = reason


def _trusted_mode(st: os.stat_result, *, allow_sticky: bool) -> bool:
    if st.st_uid != 0:
        return False
    if stat.S_IMODE(st.st_mode) & 0o022 == 0:
        return True
    # A sticky, world-writable dir (like /tmp) lets others add entries but not replace ours.
    return allow_sticky and bool(st.st_mode & stat.S_ISVTX)


DirRule = Callable[[str, os.stat_result, bool], None]
"""The ownership rule of a walk: called with (path so far, ``fstat`` of the directory, whether it is
the last component); raises to refuse the directory."""


def walk_dirs(path: str, *, flags: int, refuse: Callable[[str, str], BaseException],
              rule: DirRule | None = None, follow_root_symlinks: bool = False, at: int | None = None) -> int:
    """Open the directory ``path`` by walking from ``/`` one component at a time, never following a
    symlink a non-root user could have made: the one ``O_NOFOLLOW`` walk of slurm-bt's safe filesystem.

    Each component is opened relative to the descriptor of its parent, so nothing can be swapped in
    between; ``rule`` (the ownership rule, which differs per caller) sees the ``fstat`` of the
    descriptor actually opened. Callers: :func:`open_trusted_dir` (root-owned admin directories:
    ``flags`` with ``O_DIRECTORY``, a symlink or non-directory refused through ``ELOOP``/``ENOTDIR``)
    and ``slurm_bt.posix.user_files`` (directories of a job: ``O_PATH`` without ``O_DIRECTORY``, so a
    symlink is seen and followed only when root owns it, at most ``_MAX_SYMLINKS`` of them, an
    absolute target restarting from ``/``; ``..`` goes back to the descriptor already held), and the
    epilog's check for a job's kept checkpoints (``at``: below the scratch root it holds open).

    Args:
        path: absolute path of a directory, or relative to ``at``.
        flags: ``os.open`` flags of every step (must hold ``O_NOFOLLOW``).
        refuse: builds the exception for (path so far, reason).
        rule: the ownership rule (None: any owner).
        follow_root_symlinks: follow a root-owned symlink instead of refusing it.
        at: start from this directory descriptor (the caller keeps it) instead of ``/``; ``..`` never
            goes above it.

    Returns:
        a descriptor of the final directory opened with ``flags`` (the caller closes it).

    Raises:
        FileNotFoundError: a component is missing.
        BaseException: what ``refuse`` or ``rule`` raise.
    """
    parts = [p for p in path.split("/") if p not in ("", ".")]
    stack = [os.open("/", flags | os.O_DIRECTORY) if at is None else os.dup(at)]
    shown = ""
    hops = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            shown += "/" + name
            try:
                fd = os.open(name, flags, dir_fd=stack[-1])
            except OSError as exc:
                if flags & os.O_DIRECTORY and exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise refuse(shown, "is a symlink or not a directory") from exc
                raise
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                stack.append(fd)
                if rule is not None:
                    rule(shown, st, not parts)
                continue
            try:
                if not stat.S_ISLNK(st.st_mode):
                    raise refuse(shown, f"component {name!r} is not a directory")
                if not follow_root_symlinks or st.st_uid != 0:
                    raise refuse(shown, f"component {name!r} is a symlink owned by uid {st.st_uid} (not followed)")
                hops += 1
                if hops > _MAX_SYMLINKS:
                    raise refuse(shown, "too many symlinks")
                target = os.readlink("", dir_fd=fd)  # the link itself, race-free: fd is O_PATH to it
            finally:
                os.close(fd)
            if target.startswith("/"):
                for other in stack[1:]:
                    os.close(other)
                del stack[1:]
            parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


def open_trusted_dir(path: str, *, allow_sticky_final: bool = False) -> int:
    """Open an admin-configured directory, proving no non-root user can redirect it.

    The path is resolved once (admins may use root-owned symlinks such as ``/scratch -> /nvme``),
    then walked from ``/`` with ``O_NOFOLLOW`` (:func:`walk_dirs`); every component must be
    root-owned and not group- or world-writable, except that sticky directories are accepted as
    intermediate components.

    Returns:
        an ``O_DIRECTORY|O_CLOEXEC`` descriptor of the final directory (the caller closes it).

    Raises:
        FileNotFoundError: a component is missing.
        UntrustedPath: a component is a symlink after resolution, not a directory, or could be
            replaced by someone other than root.
    """
    def root_owned(shown: str, st: os.stat_result, final: bool) -> None:
        if not _trusted_mode(st, allow_sticky=allow_sticky_final or not final):
            raise UntrustedPath(shown, f"must be owned by root and not writable by others "
                                       f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")

    return walk_dirs(os.path.realpath(path), flags=_DIR_FLAGS, refuse=UntrustedPath, rule=root_owned)


def open_dir_at(parent_fd: int, name: str) -> int:
    """Open ``name`` inside ``parent_fd`` as a directory without following a symlink.

    Raises:
        UnsafeEntry: it is a symlink or not a directory.
        FileNotFoundError: it does not exist.
    """
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeEntry(name, "is a symlink or not a directory") from exc
        raise


_OWNER_SETTLE_S = 0.5


def _owner_settled(fd: int, st: os.stat_result, uid: int) -> os.stat_result:
    """``fstat`` of ``fd`` once a root-owned directory another root process is creating for ``uid`` is chowned.

    Why: two root hooks can create the same per-user directory at once (two jobs of one user whose
    prologs start together on a node, or the dev cluster's two slurmd sharing ``/dev/shm``). The
    loser of the ``mkdir`` race sees the winner's directory between its ``mkdir`` and its
    ``fchown``: root-owned, not yet the user's. Taken for a squat, it was renamed aside under the
    running job. No user can create a root-owned entry, so a root-owned directory is waited for
    (briefly, on the same inode); one still root's after that is refused as before.
    """
    deadline = time.monotonic() + _OWNER_SETTLE_S
    while st.st_uid == 0 and uid != 0 and stat.S_ISDIR(st.st_mode) and time.monotonic() < deadline:
        time.sleep(0.005)
        st = os.fstat(fd)
    return st


def ensure_dir_at(parent_fd: int, name: str, *, uid: int, gid: int, mode: int,
                  adopt_modes: bool = True) -> tuple[int, bool]:
    """Create directory ``name`` in ``parent_fd`` owned ``uid:gid`` with ``mode``, or accept ours.

    Create, don't adopt: an existing entry is accepted only if
    it is a real directory already owned by ``uid`` (for root-owned targets: by root, whose group
    and mode are then corrected). A symlink, FIFO, file or a directory owned by anyone else is
    refused and never chowned or chmodded.

    Args:
        parent_fd: a directory descriptor from :func:`open_trusted_dir` or this function.
        name: one path component (no ``/``, not ``.`` or ``..``).
        uid, gid, mode: the wanted owner and permission bits (setgid allowed).
        adopt_modes: fix the mode of an existing directory that is ours.

    Returns:
        ``(fd, created)``: an open descriptor of the directory (caller closes) and whether it was
        created now.

    Raises:
        UnsafeEntry: the entry exists and is not ours.
        ValueError: ``name`` is not a single safe component.
    """
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a single path component: {name!r}")
    created = True
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        created = False
    fd = open_dir_at(parent_fd, name)
    try:
        st = os.fstat(fd)
        if created:
            if st.st_uid != 0 and os.geteuid() == 0:
                # Not a race in practice: a filesystem that squashes root (NFS root_squash, GlusterFS
                # server.root-squash) made it as nobody. Take it back (it is ours and empty), so that
                # no stray directory of nobody's blocks the name for root or the site's identity.
                with contextlib.suppress(OSError):
                    os.rmdir(name, dir_fd=parent_fd)
                raise UnsafeEntry(name, f"was created as uid {st.st_uid}, not root: root is squashed on this "
                                        "filesystem (docs/admin.md \"Root-squashed shared filesystems\")")
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)  # after fchown: chown clears the setgid bit
        elif st.st_uid != uid and (st := _owner_settled(fd, st, uid)).st_uid != uid:
            raise UnsafeEntry(name, f"already exists and is owned by uid {st.st_uid}, not uid {uid}")
        else:
            if st.st_gid != gid and uid == 0:
                os.fchown(fd, uid, gid)
            if adopt_modes and stat.S_IMODE(st.st_mode) != mode:
                os.fchmod(fd, mode)
        return fd, created
    except BaseException:
        os.close(fd)
        raise


def write_file_at(dir_fd: int, name: str, data: bytes, *, uid: int = 0, gid: int = 0, mode: int = 0o644) -> None:
    """Atomically replace ``name`` in a root-owned directory with ``data`` (temp, fsync, rename).

    The temp file is created ``O_EXCL|O_NOFOLLOW`` and owned/moded through its descriptor, so a
    planted symlink is never written through; readers see the old content or the new.
    """
    import secrets

    tmp = f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    try:
        os.fsync(dir_fd)
    except OSError:
        pass


def set_default_group_acl(fd: int) -> bool:
    """Give a shared directory the default ACL ``u::rwx,g::rwx,o::---`` (and the same access ACL).

    Why: jobs run with ``umask 0077`` (the batch script sets it), so files a team member writes
    into a 2770 team cache would otherwise be private to them. A default ACL makes new files and
    directories group-readable and -writable whatever the umask. Returns False when the filesystem
    has no POSIX ACLs (the admin guide then tells users to set ``umask 0007`` in start commands).
    """
    import struct

    undefined = 0xFFFFFFFF
    entries = [(0x01, 7, undefined), (0x04, 7, undefined), (0x20, 0, undefined)]  # USER_OBJ, GROUP_OBJ, OTHER
    blob = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", t, p, i) for t, p, i in entries)
    try:
        os.setxattr(fd, "system.posix_acl_default", blob)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS):
            return False
        raise
    return True


@dataclass
class RemovalReport:
    """What :func:`remove_tree_at` did.

    Attributes:
        files: non-directories unlinked (files, symlinks, FIFOs, sockets).
        dirs: directories removed.
        leftovers: ``(relative path, reason)`` for entries that could not or must not be removed
            (another filesystem, a mount point, ``chattr +i``, the deadline).
        kept: relative paths preserved on purpose (``keep``).
        timed_out: the deadline expired before the walk finished.
    """

    files: int = 0
    dirs: int = 0
    leftovers: list[tuple[str, str]] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def complete(self) -> bool:
        """True when nothing but the kept paths remains."""
        return not self.leftovers and not self.timed_out


@dataclass
class _Frame:
    name: str
    rel: tuple[str, ...]
    dev: int
    ino: int
    fd: int | None
    names: list[str] | None = None
    swaps: int = 0
    rmdir_tries: int = 0


class _Moved(Exception):
    """A directory we had left could not be reopened as the same inode."""


class _Walker:
    def __init__(self, parent_fd: int, root_dev: int, keep: frozenset[tuple[str, ...]],
                 skip: frozenset[tuple[str, ...]], deadline: float | None, report: RemovalReport,
                 make_writable: bool = False) -> None:
        self.parent_fd = parent_fd
        self.make_writable = make_writable
        self.root_dev = root_dev
        self.keep = keep
        self.kept: list[tuple[str, ...]] = []
        self.skip = skip
        self.deadline = deadline
        self.report = report
        self.stack: list[_Frame] = []

    # -- descriptors ------------------------------------------------------------------------------

    def _open_count(self) -> int:
        return sum(1 for f in self.stack if f.fd is not None)

    def _trim(self) -> None:
        """Keep at most _MAX_OPEN_FDS descriptors: close the shallowest ones except the top's."""
        excess = self._open_count() - _MAX_OPEN_FDS
        for frame in self.stack[1:-1]:
            if excess <= 0:
                break
            if frame.fd is not None:
                os.close(frame.fd)
                frame.fd = None
                excess -= 1

    def _fd(self, idx: int) -> int:
        """The descriptor of stack[idx], reopening down from the nearest open ancestor if needed."""
        frame = self.stack[idx]
        if frame.fd is not None:
            return frame.fd
        j = idx - 1
        while j >= 0 and self.stack[j].fd is None:
            j -= 1
        parent = self.parent_fd if j < 0 else self.stack[j].fd
        assert parent is not None
        for k in range(j + 1, idx + 1):
            f = self.stack[k]
            try:
                fd = os.open(f.name, _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise _Moved(f.rel) from exc
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (f.dev, f.ino):
                os.close(fd)
                raise _Moved(f.rel)
            f.fd = fd
            parent = fd
        self._trim()
        assert frame.fd is not None
        return frame.fd

    def close_all(self) -> None:
        for frame in self.stack:
            if frame.fd is not None:
                os.close(frame.fd)
                frame.fd = None

    # -- the walk ---------------------------------------------------------------------------------

    def _leftover(self, rel: tuple[str, ...], reason: str) -> None:
        self.report.leftovers.append(("/".join(rel) or ".", reason))

    def _holds_kept(self, rel: tuple[str, ...]) -> bool:
        return any(k[:len(rel)] == rel for k in self.kept)

    def _open_child(self, parent_fd: int, name: str, rel: tuple[str, ...]) -> int | None:
        """Open a subdirectory (None: it turned into something else or must not be entered)."""
        for attempt in range(2):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    return None  # swapped for a symlink or file: the caller unlinks it
                if exc.errno == errno.ENOENT:
                    return None
                if exc.errno == errno.EACCES and attempt == 0 and self._unlock_dir(parent_fd, name):
                    continue
                self._leftover(rel, exc.strerror or "cannot open")
                return -1
        return -1

    def _unlock_dir(self, parent_fd: int, name: str) -> bool:
        """chmod 000 directory without CAP_DAC_OVERRIDE: chmod u+rwx through an O_PATH descriptor."""
        try:
            pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        except OSError:
            return False
        try:
            st = os.fstat(pfd)
            if not stat.S_ISDIR(st.st_mode) or st.st_dev != self.root_dev:
                return False
            os.chmod(f"/proc/self/fd/{pfd}", 0o700)
            return True
        except OSError:
            return False
        finally:
            os.close(pfd)

    def _entered(self, fd: int) -> None:
        """With ``make_writable``: u+rwx on the directory just opened (through its descriptor, never
        a path), so a read-only (0555) directory of ours can be emptied without CAP_DAC_OVERRIDE."""
        if self.make_writable:
            with contextlib.suppress(OSError):
                os.fchmod(fd, 0o700)

    def _expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def run(self, name: str) -> None:
        fd = self._open_child(self.parent_fd, name, ())
        if fd is None:
            self._unlink(self.parent_fd, name, ())
            return
        if fd < 0:
            return
        st = os.fstat(fd)
        if st.st_dev != self.root_dev:
            os.close(fd)
            self._leftover((), "is on another filesystem (not crossed)")
            return
        self._entered(fd)
        self.stack.append(_Frame(name, (), st.st_dev, st.st_ino, fd))
        try:
            while self.stack:
                if self._expired():
                    self.report.timed_out = True
                    self._leftover(self.stack[-1].rel, "deadline reached; not removed")
                    return
                self._step()
        finally:
            self.close_all()

    def _unlink(self, dir_fd: int, entry: str, rel: tuple[str, ...]) -> bool:
        """Unlink a non-directory; returns False when it turned out to be a directory."""
        try:
            os.unlink(entry, dir_fd=dir_fd)
            self.report.files += 1
        except IsADirectoryError:
            return False
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno == errno.EPERM:
                # Linux returns EPERM for unlink() on a directory, and for chattr +i files.
                try:
                    if stat.S_ISDIR(os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                        return False
                except OSError:
                    pass
            self._leftover(rel, exc.strerror or "cannot unlink")
        return True

    def _step(self) -> None:
        idx = len(self.stack) - 1
        top = self.stack[idx]
        try:
            fd = self._fd(idx)
        except _Moved:
            self._leftover(top.rel, "moved away during removal (not followed)")
            self.stack.pop()
            return
        if top.names is None:
            top.names = os.listdir(fd)
        if top.names:
            entry = top.names.pop()
            rel = (*top.rel, entry)
            if rel in self.keep:
                self.kept.append(rel)
                self.report.kept.append("/".join(rel))
                return
            if rel in self.skip:
                self._leftover(rel, "is a mount point (not crossed, not unmounted)")
                return
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return
            if not stat.S_ISDIR(st.st_mode):
                if not self._unlink(fd, entry, rel):
                    self._retry(top, entry, rel)
                return
            if st.st_dev != self.root_dev:
                self._leftover(rel, "is on another filesystem (not crossed)")
                return
            child = self._open_child(fd, entry, rel)
            if child is None:  # became a symlink or file between lstat and open
                if self._unlink(fd, entry, rel) is False:
                    self._retry(top, entry, rel)
                return
            if child < 0:
                return
            cst = os.fstat(child)
            if not stat.S_ISDIR(cst.st_mode) or cst.st_dev != self.root_dev:
                os.close(child)
                self._leftover(rel, "is on another filesystem (not crossed)")
                return
            self._entered(child)
            self.stack.append(_Frame(entry, rel, cst.st_dev, cst.st_ino, child))
            self._trim()
            return
        # Empty: remove it from its parent.
        self.stack.pop()
        if top.fd is not None:
            os.close(top.fd)
            top.fd = None
        if self._holds_kept(top.rel):
            return
        if not self.stack:
            parent_fd = self.parent_fd
        else:
            try:
                parent_fd = self._fd(len(self.stack) - 1)
            except _Moved:
                self._leftover(top.rel, "parent moved away during removal")
                return
        try:
            os.rmdir(top.name, dir_fd=parent_fd)
            self.report.dirs += 1
        except FileNotFoundError:
            pass
        except NotADirectoryError:  # swapped for a symlink after we emptied it
            self._unlink(parent_fd, top.name, top.rel)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and top.rmdir_tries < _MAX_RMDIR_RETRIES:
                top.rmdir_tries += 1
                top.names = None  # something was added meanwhile: list and empty it again
                try:
                    top.fd = os.open(top.name, _DIR_FLAGS, dir_fd=parent_fd)
                except OSError:
                    self._leftover(top.rel, "changed during removal")
                    return
                st = os.fstat(top.fd)
                if (st.st_dev, st.st_ino) != (top.dev, top.ino):
                    os.close(top.fd)
                    top.fd = None
                    self._leftover(top.rel, "replaced during removal (not followed)")
                    return
                self.stack.append(top)
                return
            self._leftover(top.rel, exc.strerror or "cannot remove directory")

    def _retry(self, top: _Frame, entry: str, rel: tuple[str, ...]) -> None:
        top.swaps += 1
        if top.swaps > _MAX_SWAPS:
            self._leftover(rel, "kept changing type during removal")
            return
        assert top.names is not None
        top.names.append(entry)



def remove_tree_at(
    parent_fd: int,
    name: str,
    *,
    deadline: float | None = None,
    keep: frozenset[tuple[str, ...]] = frozenset(),
    mount_points: frozenset[tuple[str, ...]] = frozenset(),
    make_writable: bool = False,
) -> RemovalReport:
    """Remove ``name`` (inside the trusted directory ``parent_fd``) and everything below it.

    Args:
        parent_fd: descriptor of a root-owned directory (e.g. the scratch root).
        name: the entry to remove; a symlink or file there is simply unlinked.
        deadline: ``time.monotonic()`` value after which the walk stops (leftovers reported).
        keep: relative paths under ``name`` to preserve, e.g. ``{("mnt", "checkpoints")}``; their
            parents are then kept too.
        mount_points: relative paths under ``name`` that are mount points (from
            :func:`slurm_bt.posix.mountinfo.mount_points_below`); never entered, never unmounted.
        make_writable: make every directory entered ``0700`` first (through its descriptor): for a
            tree the caller owns with read-only directories in it (the weights caches' 0555
            snapshots, a copied config folder), removed without root's CAP_DAC_OVERRIDE.

    Returns:
        a :class:`RemovalReport`; it never raises for problems inside the tree.
    """
    if not name or name in (".", "..") or "/" in name:
        raise ValueError(f"not a single path component: {name!r}")
    report = RemovalReport()
    root_dev = os.fstat(parent_fd).st_dev
    walker = _Walker(parent_fd, root_dev, keep, mount_points, deadline, report, make_writable)
    walker.run(name)
    return report


def remove_owned_tree(path: str | os.PathLike[str]) -> None:
    """Delete a tree the caller owns, read-only directories included, never following a symlink.

    For the weights caches' trash and a partial config snapshot: :func:`remove_tree_at` with
    ``make_writable`` (each directory made 0700 through its descriptor before it is emptied). Unlike
    the ``shutil.rmtree`` it replaces, it does not descend into another filesystem mounted inside the
    tree (none is, in a cache or a snapshot) and a symlink found at ``path`` itself is unlinked
    rather than left. Errors are ignored: what cannot be removed stays.
    """
    text = os.fspath(path)
    parent_path, _, name = text.rstrip("/").rpartition("/")
    try:
        parent = os.open(parent_path or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        remove_tree_at(parent, name, make_writable=True)
    except ValueError:
        pass  # not a removable name ("", ".", ".."): nothing to do, as rmtree's ignored error
    finally:
        os.close(parent)
