"""The checkpoint store: a small interface, a ``file://`` backend, and a lazy registry for the rest.

Why a four-verb interface (:class:`CheckpointStore`): the uploader, the resolver and the CLI only
ever put a file, get a file, read/write a small JSON object and list "directories". Object stores
are :class:`~slurm_bt.checkpoints.object_store.ObjectStore`, an adapter over the one storage layer
(:mod:`slurm_bt.storage`: clients, credentials, multipart, checksum headers, ranged GETs), whose
client libraries are imported only when a store of that scheme is opened.

Integrity: every backend hashes what it sends with sha256 *while
sending it* and returns that digest, which the caller records in the index; every download is
written to a unique temp file, sha256-verified against the index, fsynced and only then renamed
into place. Nothing ever trusts an ETag.

Credentials and trust (docs/checkpoints.md): ``file://`` stores are plain directories on shared
storage, written and read with the caller's own uid and groups, so the filesystem enforces who sees
what; and because a shared root is world-writable, :class:`FileStore` uses a project or job
directory only if it is what slurm-bt would have made for that team or user (never a squat or a
symlink; see the class). Object stores use credentials from the *caller's* secret store (``?secret=NAME``), so the
bucket policy enforces it; ``?service_credentials=FILE`` is honoured only for root.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import hashlib
import json
import os
import pwd
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from slurm_bt.atomic import atomic_output
from slurm_bt.checkpoints.locations import TEAMS_DIR, parse_store_uri, project_prefix
from slurm_bt.errors import StorageError, UntrustedLocation
from slurm_bt.posix.safefs import remove_tree_at, walk_dirs
from slurm_bt.posix.teams import team_slug
from slurm_bt.posix.user_files import read_fd_capped
from slurm_bt.storage.checksums import CHUNK_BYTES, sha256_fd
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.transfer import UploadResult
from slurm_bt.storage.url import StoreUrl
from slurm_bt.trusted_files import describe_owner, is_team_dir

__all__ = [
    "SMALL_OBJECT_MAX_BYTES",
    "CheckpointStore",
    "FileStore",
    "UploadResult",
    "caller_teams",
    "check_upload_location",
    "credentials_for",
    "open_store",
    "team_gid",
    "team_group",
]


class CheckpointStore(Protocol):
    """What the checkpoint code needs from a store. Keys are ``/``-separated, relative to the URI."""

    uri: StoreUrl

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

    def delete_tree(self, key: str) -> None:
        """Delete ``key`` and everything below it (retention; only the caller's own job directory)."""
        ...

    def close(self) -> None:
        """Release connections and threads."""
        ...


def team_group(account: str | None) -> tuple[str, int]:
    """The team that shares a user's checkpoints: its slug (the namespace ``_teams/<slug>``) and its gid.

    ``account`` is the team group the root prolog resolved for the job (docs/admin.md §Teams) or,
    without the prolog, the Slurm account. It is used only if it names a Unix group the current user
    belongs to (the kernel decides); otherwise the user's primary group. The slug is
    :func:`slurm_bt.posix.teams.team_slug` of that group's name, the spelling the weights cache and
    the resolver at submit (``weights.plan.team_for_user``) use for the same team.
    """
    pw = pwd.getpwuid(os.getuid())
    if account:
        try:
            gr = grp.getgrnam(account)
        except KeyError:
            gr = None
        if gr is not None and (gr.gr_gid == pw.pw_gid or gr.gr_gid in os.getgroups() or pw.pw_name in gr.gr_mem):
            return team_slug(gr.gr_name), gr.gr_gid
    return team_slug(_group_name(pw.pw_gid)), pw.pw_gid


def team_gid(account: str | None) -> int:
    """The group that shares a user's checkpoints in a ``file://`` store (:func:`team_group`)."""
    return team_group(account)[1]


def caller_teams() -> list[str]:
    """The slugs of every group the calling process is in (its own group first): the namespaces it may read."""
    out: list[str] = []
    for gid in (os.getegid(), *os.getgroups()):
        slug = team_slug(_group_name(gid))
        if slug not in out:
            out.append(slug)
    return out


_DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ENTRY_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
SMALL_OBJECT_MAX_BYTES = 64 << 20
"""Largest index (``read_bytes``) read from a ``file://`` store: far above any real index."""


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _layout_identity_uid() -> int | None:
    """The uid of hooks.toml's ``shared_fs_identity``, or None (none named, or the file cannot be read).

    Where the shared filesystem squashes root, the prolog creates the shared layout, ``_teams``
    included, as this service identity (docs/admin.md, "Root-squashed shared filesystems"): only the
    admin controls it, so it may own ``_teams`` as root may. hooks.toml is root-owned and only ever
    read here (never a user's file).
    """
    from slurm_bt.site.hook_settings import HookConfigError, load_hook_settings

    try:
        name = load_hook_settings().shared_fs_identity
    except (HookConfigError, OSError):
        return None
    if name is None:
        return None
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _in_group(gid: int) -> bool:
    """Whether the caller may act for group ``gid`` (root may for any: it can read everything anyway)."""
    return os.geteuid() == 0 or gid == os.getegid() or gid in os.getgroups()


def _readable_project(st: os.stat_result) -> bool:
    """The read rule for a project directory: a team directory (:func:`is_team_dir`) of a team the caller is in.

    Root reads any team's (it can anyway); everybody else only their own teams', so a directory
    another user made under a project name never feeds their loads.
    """
    return _in_group(st.st_gid) and is_team_dir(st, st.st_gid)


# What each component of a key is, from the top (FileStore._roles): the rule and the creation mode
# depend on it, not on the depth alone, since the two layouts nest projects at different depths.
_TEAMS, _TEAM, _PROJECT, _JOB, _BELOW = "teams", "team", "project", "job", "below"


class FileStore:
    """A checkpoint store in a shared directory.

    Layout (:mod:`.locations`): ``<root>/_teams/<team>/<project>/<job>/...`` for every upload, and the
    legacy ``<root>/<project>/<job>/...`` of stores written before team namespaces, still read.

    Permissions (the trust model for ``file://``, docs/checkpoints.md): the store root and
    ``<root>/_teams`` are admin-made (``1777`` like ``/tmp``, or ``0755`` with pre-created team
    directories). A team directory ``_teams/<team>`` is ``2770`` with the team's group (made by the
    root prolog or an admin, or by the team's first upload when ``_teams`` is ``1777``); a project
    directory in it is created ``2770`` with the team group (:func:`team_gid`), so teammates can add
    jobs and nobody else can even list it; job directories and everything below are ``2750`` /
    ``0640``: the team reads, only the job's user writes. ``_teams`` itself is never created by a
    user (its owner could rename every team's directory away): a missing one fails the upload with
    the admin's command, or is created by root (an admin's upload, the tests) as ``install -d -m 1777``
    would.

    Trust (why every access walks the path itself): the root is world-writable, so any user can
    create a directory under any project or team name first, and teammates can rename job
    directories. So each access opens the path one component at a time from the root, never
    following a symlink (``O_NOFOLLOW`` relative to the parent's descriptor, so nothing can be
    swapped in between), and uses a component only if it is exactly what slurm-bt would have created:

    * ``_teams``: like the root, a directory of root's (or of the root's owner, who could rename it
      anyway, or of the site's shared-layout identity that the prolog acts as where root is
      squashed), not writable by others unless sticky;
    * team directory ``_teams/<team>``: a team directory (:func:`slurm_bt.trusted_files.is_team_dir`)
      of the group whose slug is ``<team>``: for a store opened for a team (``gid``: the uploader, the
      flush) and for every write, that team's group; for other reads, a group the reader is in;
    * project directory: the team-directory rule of the team weights tier: for a store opened for a
      team and for every write, of that team group; for other reads (loads, CLI), of a team the
      reader belongs to;
    * job directory and everything below: owned by one user (for writes, the caller) and writable by
      nobody else; a file must be a regular file of that same user (never a FIFO, device or link).

    Anything else raises :class:`UntrustedLocation` naming the path and the fix; nothing is ever
    written into, or read from, such a place. Whose the job is (the index's ``user`` must own the
    job directory) is checked by the reader (:mod:`.resolve`) through :meth:`job_owner`.
    """

    def __init__(self, uri: StoreUrl, *, gid: int | None = None) -> None:
        """Open the store at ``uri.prefix``; creates the root (``1777``) on the first write when missing."""
        self.uri = uri
        self.root = Path(uri.prefix)
        self._gid = gid
        self._layout_uids: frozenset[int] | None = None

    def _layout_owners(self, root_uid: int) -> frozenset[int]:
        """Who may own ``_teams``: root, the store root's owner (it could rename ``_teams`` anyway) and
        the site's shared-layout identity (:func:`_layout_identity_uid`), looked up once per store."""
        if self._layout_uids is None:
            identity = _layout_identity_uid()
            self._layout_uids = frozenset({0, *(() if identity is None else (identity,))})
        return self._layout_uids | {root_uid}

    def _parts(self, key: str) -> list[str]:
        parts = [p for p in key.split("/") if p]
        if any(p in (".", "..") or "\0" in p for p in parts):
            raise StorageError(key, "invalid key")
        return parts

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*self._parts(key))

    @staticmethod
    def _roles(parts: list[str]) -> list[str]:
        """What each component of ``parts`` is: ``_teams/<team>/<project>/<job>/...`` or ``<project>/<job>/...``."""
        head = [_TEAMS, _TEAM] if parts and parts[0] == TEAMS_DIR else []
        roles = [*head, _PROJECT, _JOB]
        return (roles + [_BELOW] * len(parts))[:len(parts)]

    def _write_gid(self) -> int:
        """The team group this process writes projects for (without one: its own group)."""
        return self._gid if self._gid is not None else os.getegid()

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

    def _open_root(self, *, create: bool) -> tuple[int, int]:
        """An ``O_PATH`` descriptor of the store root and its owner, after checking nobody but root (or us) controls it.

        The root's path is the admin's (site file); a symlink there is followed only if root owns it
        (``/shared -> /lustre/shared``), not one a user planted in a world-writable parent. A root
        owned by another user, or writable by others without the sticky bit, lets its owner (or
        anyone) rename project directories away and put others in their place.
        """
        root = str(self.root)
        try:
            lst = os.lstat(root)
        except FileNotFoundError:
            if not create:
                raise
            self._ensure_root()
            lst = os.lstat(root)
        if stat.S_ISLNK(lst.st_mode) and lst.st_uid != 0:
            raise UntrustedLocation(root, f"is a symlink owned by {_user_name(lst.st_uid)}, not by root; the "
                                    f"checkpoint store root must be made by an admin: install -d -m 1777 {root}")
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        st = os.fstat(fd)
        problem = None
        if st.st_uid not in (0, os.geteuid()):
            problem = "is owned by another user, not root: its owner could rename any project away"
        elif stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
            problem = "is writable by others without the sticky bit: anyone could rename or replace a project"
        if problem is not None:
            os.close(fd)
            raise UntrustedLocation(root, f"{problem} ({describe_owner(st)}); an admin must fix it: "
                                    f"chown root:root {root} && chmod 1777 {root}")
        return fd, st.st_uid

    def _team_problem(self, st: os.stat_result, name: str, *, write: bool) -> str | None:
        """Why ``_teams/<name>`` must not be used: it must be a team directory of the group whose slug is ``name``.

        The slug check matters as much as the group's: a directory of team B renamed to A's name (by
        whoever owns ``_teams``) is B's, and must not receive A's uploads or feed A's loads.
        """
        if write or self._gid is not None:
            gid = self._write_gid()
            group = _group_name(gid)
            if is_team_dir(st, gid) and team_slug(group) == name:
                return None
            if team_slug(group) != name:
                return (f"is the checkpoint namespace of team {name!r}, not of your team group {group} "
                        f"({describe_owner(st)}): refusing to use it")
            return (f"is not the checkpoint namespace of your team group {group} ({describe_owner(st)}; it must be "
                    f"<member or root>:{group} 2770): another user or team created it first, so nothing is "
                    f"uploaded into it. Fix: an admin removes it and creates it for your team: rm -rf <dir> && "
                    f"install -d -m 2770 -g {group} <dir>")
        if _in_group(st.st_gid) and is_team_dir(st, st.st_gid) and team_slug(_group_name(st.st_gid)) == name:
            return None
        return (f"is not the checkpoint namespace of a team {name!r} you belong to ({describe_owner(st)}; it must "
                f"be <member or root>:<team group> 2770): nothing is loaded from it. If the team is yours, an admin "
                "must remove it and create it for the team: rm -rf <dir> && install -d -m 2770 -g <team group> <dir>")

    def _dir_problem(self, st: os.stat_result, role: str, name: str, owner: int | None, *, write: bool,
                     root_uid: int = 0) -> str | None:
        """Why a directory in ``role`` must not be used (None: it is what slurm-bt or an admin makes).

        ``root_uid``: the owner of the store root (:meth:`_layout_owners`).
        """
        if not stat.S_ISDIR(st.st_mode):
            return "is not a directory"
        if role == _TEAMS:
            if st.st_uid not in self._layout_owners(root_uid):
                return (f"is owned by {_user_name(st.st_uid)}, not by root ({describe_owner(st)}): its owner could "
                        "rename any team's checkpoints away. An admin removes it and creates it: "
                        "rm -rf <dir> && install -d -m 1777 <dir>")
            if stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
                return (f"is writable by others without the sticky bit ({describe_owner(st)}): anyone could rename "
                        "a team's checkpoints away; an admin must fix it: chmod 1777 <dir>")
            return None
        if role == _TEAM:
            return self._team_problem(st, name, write=write)
        if role == _PROJECT:
            # A store opened for a team (the uploader, the epilog's flush) holds every project
            # directory to that team's rule, reads included: it reads back its own index there.
            if write or self._gid is not None:
                gid = self._write_gid()
                if is_team_dir(st, gid):
                    return None
                team = _group_name(gid)
                return (f"is not a checkpoint project directory of your team group {team} ({describe_owner(st)}; "
                        f"slurm-bt creates it as <member>:{team} 2770): another user or team created this project "
                        "name first, so nothing is uploaded into it. Fix: an admin removes it "
                        f"(rm -rf <dir>) or creates it for your team (install -d -m 2770 -g {team} <dir>), "
                        "or use another TrainingProject name")
            if _readable_project(st):
                return None
            return (f"is not a checkpoint project directory of a team you belong to ({describe_owner(st)}; slurm-bt "
                    "creates it as <member>:<team group> 2770): nothing is loaded from it. If the project is "
                    "yours, another user created the name first: an admin must remove it (rm -rf <dir>)")
        if stat.S_IMODE(st.st_mode) & 0o022:
            return (f"can be written by others than its owner ({describe_owner(st)}; slurm-bt creates job "
                    "directories 2750): refusing to use it; an admin must remove it (rm -rf <dir>)")
        want = os.geteuid() if write else owner
        if want is not None and st.st_uid != want:
            return (f"belongs to {_user_name(st.st_uid)}, not {_user_name(want)} ({describe_owner(st)}): refusing to "
                    f"{'write into' if write else 'read'} another user's job directory; an admin must remove it "
                    "(rm -rf <dir>)")
        return None

    def _step(self, parent: int, name: str, path: Path, role: str, *, create: bool) -> int:
        """A descriptor of ``name`` in ``parent`` (never through a symlink); created when ``create``.

        The open is :func:`~slurm_bt.posix.safefs.walk_dirs` one component below ``parent``: the one
        ``O_NOFOLLOW`` walk; what this adds is creating the component and the role-dependent rule.
        """
        def refuse(_shown: str, _why: str) -> UntrustedLocation:
            hint = ", or use another TrainingProject name" if role == _PROJECT else ""
            return UntrustedLocation(str(path), "is a symlink or not a directory (never followed; another user "
                                     f"may have created the name first): an admin must remove it (rm -rf {path})"
                                     f"{hint}")

        try:
            return walk_dirs(name, flags=_DIR_PATH, refuse=refuse, at=parent)
        except FileNotFoundError:
            if not create:
                raise
        if role == _TEAMS and os.geteuid() != 0:
            # Never a user's: whoever owns _teams could rename every team's directory away. Root
            # (an admin's own upload) makes it as the admin would.
            raise StorageError(str(path), "is missing: this checkpoint store has no team namespaces yet (the "
                               "slurm-bt prolog makes them); an admin runs slurm-bt admin install, or "
                               f"install -d -m 1777 {path} where jobs run without the prolog")
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:  # made meanwhile by someone else: checked like any existing one
            return self._step(parent, name, path, role, create=False)
        except PermissionError as exc:
            why = {_TEAM: "your team has no checkpoint namespace yet and _teams is not writable by you; an admin "
                          f"creates it: install -d -m 2770 -g {_group_name(self._write_gid())} {path}",
                   _PROJECT: "the store root is not writable (an admin makes it 1777)" if path.parent == self.root
                   else "the team namespace is not your team's",
                   _JOB: "the project belongs to another team"}.get(role, "its parent directory is not writable")
            raise StorageError(str(path), f"permission denied: {why}") from exc
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            if role == _TEAMS:  # only as root: what an admin's install -d -m 1777 makes
                os.fchmod(fd, 0o1777)
            elif role in (_TEAM, _PROJECT):
                os.fchown(fd, -1, self._write_gid())
                os.fchmod(fd, 0o2770)
            else:
                os.fchmod(fd, 0o2750)
        except OSError:
            pass  # the checks that follow decide whether it is usable
        return fd

    @contextlib.contextmanager
    def _walk(self, parts: list[str], *, create: bool, write: bool) -> Iterator[tuple[int, int | None]]:
        """A descriptor of ``root/parts`` with every component checked, and the job directory's owner.

        Each step opens its component with :func:`slurm_bt.posix.safefs.walk_dirs` (see
        :meth:`_step`); the loop is here because it creates missing components and its rule depends on
        the component's role (:meth:`_roles`) and on the owner found one step earlier
        (docs/architecture.md, "The safe-filesystem rules, once").

        Raises:
            FileNotFoundError: a component is missing (and ``create`` is false).
            UntrustedLocation: a component is not what slurm-bt would have made.
            StorageError: ``_teams`` is missing and ``create`` is true (only an admin makes it).
        """
        fd, root_uid = self._open_root(create=create)
        owner: int | None = None
        path = self.root
        try:
            for role, name in zip(self._roles(parts), parts, strict=True):
                path = path / name
                child = self._step(fd, name, path, role, create=create)
                try:
                    st = os.fstat(child)
                    problem = self._dir_problem(st, role, name, owner, write=write, root_uid=root_uid)
                    for _ in range(20):
                        # Another node of this job (same uid) may have just made it: mkdir 0700, then
                        # fchown/fchmod. Give it a moment before calling it foreign.
                        if problem is None or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                            break
                        time.sleep(0.1)
                        st = os.fstat(child)
                        problem = self._dir_problem(st, role, name, owner, write=write, root_uid=root_uid)
                    if problem is not None:
                        raise UntrustedLocation(str(path), problem.replace("<dir>", str(path)))
                except BaseException:
                    os.close(child)
                    raise
                os.close(fd)
                fd = child
                if role == _JOB:
                    owner = st.st_uid
            yield fd, owner
        finally:
            os.close(fd)

    def _open_file(self, dirfd: int, name: str, path: Path, owner: int | None, *,
                   max_bytes: int | None = None) -> int:
        """Open a store file for reading: a regular file of the job directory's owner, never a link, FIFO or device.

        ``O_PATH`` first and ``fstat``: a FIFO or device is never opened, so its driver never runs
        and nothing blocks; then the very inode checked is reopened through ``/proc/self/fd``.
        """
        pfd = os.open(name, _ENTRY_PATH, dir_fd=dirfd)
        try:
            st = os.fstat(pfd)
            want = os.geteuid() if owner is None else owner
            if not stat.S_ISREG(st.st_mode):
                raise UntrustedLocation(str(path), "is not a regular file (a symlink, FIFO or device is never read)")
            if st.st_uid != want or stat.S_IMODE(st.st_mode) & 0o022:
                raise UntrustedLocation(str(path), f"was not written by the job's user {_user_name(want)} "
                                        f"({describe_owner(st)}); refusing to read it")
            if max_bytes is not None and st.st_size > max_bytes:
                raise UntrustedLocation(str(path), f"is {st.st_size} bytes, more than the {max_bytes} allowed")
            fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        finally:
            os.close(pfd)
        again = os.fstat(fd)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
            os.close(fd)
            raise UntrustedLocation(str(path), "changed while being opened")
        return fd

    @contextlib.contextmanager
    def _atomic(self, dirfd: int, name: str, final: Path, mode: int) -> Iterator[int]:
        """:func:`~slurm_bt.atomic.atomic_output` into the checked directory ``dirfd``, not a path a
        teammate could swap meanwhile (``/proc/self/fd/N`` names the very directory we checked)."""
        via = Path(f"/proc/self/fd/{dirfd}")
        try:
            with atomic_output(via / name, mode=mode) as out:
                yield out
        except StorageError as exc:
            text = str(exc)
            if text.startswith(f"{exc.uri}: "):
                text = text[len(exc.uri) + 2:]
            raise StorageError(str(final), text.replace(str(via), str(final.parent))) from exc

    def job_owner(self, project_id: str, job_id: str, *, team: str | None) -> int | None:
        """The uid owning the job directory (checked like any read), or None when there is none.

        ``team``: the namespace (:func:`~slurm_bt.checkpoints.locations.project_prefix`; None: legacy).

        Raises:
            UntrustedLocation: the team, project or job directory is not what slurm-bt would have made.
        """
        try:
            with self._walk(self._parts(f"{project_prefix(project_id, team=team)}/{job_id}"), create=False,
                            write=False) as (_, owner):
                return owner
        except FileNotFoundError:
            return None

    def check_upload_location(self, project_id: str, job_id: str, *, team: str) -> None:
        """Claim ``_teams/<team>/<project_id>`` for this job's team (created when missing) and check the job directory.

        Called before the start commands (:mod:`slurm_bt.node.prepare`), so a squatted team or project
        name, or a store without ``_teams``, fails the job at once instead of after hours of training.

        Raises:
            UntrustedLocation: the team or project directory is another team's or user's, or the job
                directory (when it exists) is not this user's.
            StorageError: the store cannot be written, or it has no ``_teams`` yet (the message says
                what an admin runs).
        """
        project = self._parts(project_prefix(project_id, team=team))
        try:
            with self._walk(project, create=True, write=True):
                pass
            with self._walk([*project, job_id], create=False, write=True):
                pass
        except FileNotFoundError:
            return
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(str(self.root.joinpath(*project)), exc.strerror or "cannot be checked") from exc

    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        """Copy ``fd`` to ``key`` (temp + fsync + rename + fsync dir), hashing what is written."""
        parts = self._parts(key)
        final = self.root.joinpath(*parts)
        try:
            with self._walk(parts[:-1], create=True, write=True) as (dirfd, _):
                if expect_sha256 is not None:
                    try:
                        old = self._open_file(dirfd, parts[-1], final, os.geteuid())
                    except OSError:
                        old = -1  # absent, or an odd entry that the rename below replaces
                    if old >= 0:
                        try:
                            if os.fstat(old).st_size == size and sha256_fd(old, size)[0] == expect_sha256:
                                return UploadResult(expect_sha256, size, "local", skipped=True)
                        finally:
                            os.close(old)
                h = hashlib.sha256()
                with self._atomic(dirfd, parts[-1], final, 0o640) as out:
                    offset = 0
                    while offset < size:
                        chunk = os.pread(fd, min(CHUNK_BYTES, size - offset), offset)
                        if not chunk:
                            raise StorageError(str(final), "source shrank while uploading "
                                               f"(at byte {offset} of {size})")
                        h.update(chunk)
                        view = memoryview(chunk)
                        while view:
                            view = view[os.write(out, view):]
                        offset += len(chunk)
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(str(final), f"cannot write: {exc.strerror}") from exc
        return UploadResult(h.hexdigest(), size, "local")

    def download_file(self, key: str, dest: Path, *, size: int, sha256: str) -> None:
        """Copy ``key`` to ``dest`` via a verified temp file."""
        parts = self._parts(key)
        src = self.root.joinpath(*parts)
        try:
            with self._walk(parts[:-1], create=False, write=False) as (dirfd, owner):
                fd = self._open_file(dirfd, parts[-1], src, owner)
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(str(src), f"cannot read checkpoint file: {exc.strerror}") from exc
        try:
            _copy_verified(fd, dest, size=size, sha256=sha256, uri=str(src))
        finally:
            os.close(fd)

    def read_bytes(self, key: str) -> bytes | None:
        """Small object content or None (absent)."""
        parts = self._parts(key)
        path = self.root.joinpath(*parts)
        try:
            with self._walk(parts[:-1], create=False, write=False) as (dirfd, owner):
                fd = self._open_file(dirfd, parts[-1], path, owner, max_bytes=SMALL_OBJECT_MAX_BYTES)
            try:
                data = read_fd_capped(fd, SMALL_OBJECT_MAX_BYTES)
            finally:
                os.close(fd)
        except StorageError:
            raise
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise StorageError(str(path), "permission denied (another team's checkpoints?)") from exc
            raise StorageError(str(path), exc.strerror or "cannot read") from exc
        if data is None:
            raise UntrustedLocation(str(path), f"grew past {SMALL_OBJECT_MAX_BYTES} bytes while being read")
        return data

    def write_bytes(self, key: str, data: bytes) -> None:
        """Atomic replace, readable by the team (0640)."""
        parts = self._parts(key)
        path = self.root.joinpath(*parts)
        try:
            with self._walk(parts[:-1], create=True, write=True) as (dirfd, _), \
                    self._atomic(dirfd, parts[-1], path, 0o640) as out:
                view = memoryview(data)
                while view:
                    view = view[os.write(out, view):]
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(str(path), f"cannot write: {exc.strerror}") from exc

    def delete_tree(self, key: str) -> None:
        """Remove ``root/key`` and everything below it, in a job directory of the caller's own.

        The parent is reached by the checked walk for writing (so only the caller's own job
        directory, never through a symlink), then :func:`~slurm_bt.posix.safefs.remove_tree_at`
        removes the entry fd-relative without following anything in it.

        Raises:
            UntrustedLocation: a component is not the caller's.
            StorageError: something could not be removed.
        """
        parts = self._parts(key)
        if not parts or self._roles(parts)[-1] != _BELOW:  # never a team, project or job directory
            raise StorageError(key, "refusing to delete above a job's checkpoint")
        path = self.root.joinpath(*parts)
        try:
            with self._walk(parts[:-1], create=False, write=True) as (dirfd, _):
                real = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
                try:
                    report = remove_tree_at(real, parts[-1])
                finally:
                    os.close(real)
        except FileNotFoundError:
            return
        except StorageError:
            raise
        except OSError as exc:
            raise StorageError(str(path), f"cannot delete: {exc.strerror}") from exc
        if report.leftovers:
            shown = ", ".join(f"{p} ({why})" for p, why in report.leftovers[:3])
            raise StorageError(str(path), f"not fully deleted: {shown}")

    def list_dirs(self, prefix: str) -> list[str]:
        """Immediate subdirectories; symlinks, and team or project directories the caller may not read, are left out.

        At the top these are the legacy projects (``_teams`` is not one); below ``_teams`` the team
        namespaces of the caller's teams; below one of those, its projects.

        Raises:
            UntrustedLocation: ``prefix`` itself is not what slurm-bt would have made (a squatted project).
        """
        parts = self._parts(prefix)
        try:
            with self._walk(parts, create=False, write=False) as (dirfd, _):
                rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
                try:
                    with os.scandir(rfd) as it:
                        names = [e.name for e in it if e.is_dir(follow_symlinks=False)]
                    if not parts:
                        names = [n for n in names if n != TEAMS_DIR]
                    role = self._roles([*parts, "child"])[-1]  # what the listed names are
                    if role in (_TEAM, _PROJECT):  # only those of a team the caller is in
                        names = [n for n in names if self._listed(rfd, n, role)]
                finally:
                    os.close(rfd)
        except StorageError:
            raise
        except OSError:  # absent, or not readable by you
            return []
        return sorted(names)

    def _listed(self, dirfd: int, name: str, role: str) -> bool:
        try:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        except OSError:  # removed meanwhile
            return False
        return stat.S_ISDIR(st.st_mode) and self._dir_problem(st, role, name, None, write=False) is None

    def close(self) -> None:
        """Nothing to release."""


def _copy_verified(fd: int, dest: Path, *, size: int, sha256: str, uri: str) -> None:
    """Copy an open file to ``dest``: sha256 while copying, verified before it is published.

    At most ``size + 1`` bytes are read: a store file larger than its index says is refused without
    copying all of it onto the node.
    """
    from slurm_bt.errors import IntegrityError

    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with atomic_output(dest, mode=0o640) as out:
        offset = 0
        while offset <= size:
            chunk = os.pread(fd, min(CHUNK_BYTES, size + 1 - offset), offset)
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


def credentials_for(uri: StoreUrl, secret_store_root: str | None) -> Credentials | None:
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


def _parse_credentials(uri: StoreUrl, raw: str, what: str) -> Credentials:
    try:
        data = json.loads(raw)
    except ValueError:
        raise StorageError(uri.display(), f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise StorageError(uri.display(), f"{what} must be a JSON object")
    if uri.scheme == "gs":
        return Credentials(gcs_service_account=data)
    key, secret = data.get("aws_access_key_id"), data.get("aws_secret_access_key")
    if not isinstance(key, str) or not isinstance(secret, str):
        raise StorageError(uri.display(), f"{what} must hold aws_access_key_id and aws_secret_access_key")
    token = data.get("aws_session_token")
    return Credentials(aws_access_key_id=key, aws_secret_access_key=secret,
                       aws_session_token=token if isinstance(token, str) else None)


def check_upload_location(store_uri: str, project_id: str, job_id: str, *, account: str | None) -> None:
    """Before training: a ``file://`` store's ``_teams/<team>/<project>`` is this job's team's (claimed
    when missing) and the job directory, if any, is the user's; other schemes have nothing to check
    (their access control is the bucket policy's).

    ``account``: the team group the prolog resolved, else the Slurm account (:func:`team_group`).

    Raises:
        UntrustedLocation: squatted or foreign (the message names the directory and the fix).
        StorageError: the store cannot be written, or has no ``_teams`` yet (the message names the fix).
    """
    uri = parse_store_uri(store_uri)
    if uri.scheme == "file":
        team, gid = team_group(account)
        FileStore(uri, gid=gid).check_upload_location(project_id, job_id, team=team)


def open_store(uri: str | StoreUrl, *, credentials: Credentials | None = None,
               gid: int | None = None) -> CheckpointStore:
    """Open the store named by ``uri`` (an object store's client library is imported here, lazily).

    Raises:
        MissingExtraError: the scheme's optional packages are not installed (names the extra).
    """
    parsed = parse_store_uri(uri) if isinstance(uri, str) else uri
    if parsed.scheme == "file":
        return FileStore(parsed, gid=gid)
    from slurm_bt.checkpoints.object_store import ObjectStore

    return ObjectStore(parsed, credentials=credentials)
