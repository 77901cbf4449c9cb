"""Who creates the directories of the shared layout that must belong to a team: root, or a site identity.

Why (docs/admin.md "Root-squashed shared filesystems"): on NFS with ``root_squash`` (the default),
Lustre nodemaps without ``admin``, GPFS remote clusters and GlusterFS ``server.root-squash``, root on
a compute node acts as ``nobody`` on the shared filesystem: it cannot create ``<cache>/teams/<team>``
or chown it to the team's group. The site names a service account instead (hooks.toml
``shared_fs_identity``): a dedicated user nobody logs in as, a member of every team group. The
prolog then does that part of its work in a child dropped to that identity (the drop of
:mod:`slurm_bt.posix.privdrop`: verified, ``no_new_privs``, bounded in memory, CPU and time), and the
directories it makes are ``<identity>:<team group>``. Without it, root does the work as before.

The trust rules do not change in kind: a directory that must be someone's is made by the layout
owner (root or the identity, which only the admin controls) under a parent that only the layout
owner can write; a team directory is trusted when its group is the team's and it is closed to others
(the identity is a member, so its directories pass ``trusted_files.is_team_dir``).
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slurm_bt.posix.privdrop import run_as_uid

__all__ = ["LayoutOwner", "LayoutOwnerError"]


class LayoutOwnerError(ValueError):
    """The named identity does not exist on this node or cannot own team directories (a node fault)."""


@dataclass(frozen=True)
class LayoutOwner:
    """The identity that creates team and project directories on the shared filesystem.

    Attributes:
        uid, gid: the identity (0, 0 for root).
        name: its user name (``root`` for root).
    """

    uid: int
    gid: int
    name: str

    @classmethod
    def resolve(cls, name: str | None) -> LayoutOwner:
        """Root when ``name`` is None, else the named user.

        Raises:
            LayoutOwnerError: the user does not exist here, or is root under another name.
        """
        if name is None:
            return cls(0, 0, "root")
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise LayoutOwnerError(f"shared_fs_identity {name!r} is not a user on this node") from None
        if pw.pw_uid == 0:
            raise LayoutOwnerError(f"shared_fs_identity {name!r} has uid 0; name a dedicated service account")
        return cls(pw.pw_uid, pw.pw_gid, pw.pw_name)

    @property
    def is_root(self) -> bool:
        """Root does the work in-process (no identity named)."""
        return self.uid == 0

    def member_of(self, gid: int) -> bool:
        """Whether the identity may give a directory group ``gid`` (root always may)."""
        return self.is_root or gid in os.getgrouplist(self.name, self.gid)

    def group_problem(self, gid: int) -> str | None:
        """Why the identity cannot make ``gid``'s team directories, or None."""
        if self.member_of(gid):
            return None
        try:
            group = grp.getgrgid(gid).gr_name
        except KeyError:
            group = str(gid)
        return (f"the shared-filesystem identity {self.name} is not a member of team group {group}, so it cannot "
                f"create that team's directories (an admin runs: usermod -aG {group} {self.name})")

    def run(self, fn: Callable[[], Any], *, timeout_s: float) -> Any:
        """``fn()`` as this identity: in-process for root, else in a dropped, bounded child.

        ``fn`` must return a JSON-serialisable value; in the child it cannot log or write root's
        files (its descriptors are closed), so it returns what the caller should log or record.

        Raises:
            slurm_bt.posix.privdrop.ChildError: the child failed, timed out or could not drop.
        """
        if self.is_root:
            return fn()
        return run_as_uid(fn, uid=self.uid, gid=self.gid, timeout_s=timeout_s)
