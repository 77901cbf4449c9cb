"""Which Unix group owns a job's team and project caches, and whether the job's user is in it.

The team model (docs/admin.md §Teams): a team is a **Unix group**. The admin maps Slurm accounts to
groups in ``hooks.toml`` (``[team_groups]``); a job whose account is not mapped uses its primary
group (``SLURM_JOB_GID``). Membership comes from ``getgrouplist(user, gid)`` on the node, never from
the job's config: ``team_name`` in a truss config and the account string are user input
(CVE-2018-10995: authorise from numeric ids).

Why groups and not accounts: the kernel enforces groups (``2770 root:<group>`` directories give
members access and everyone else ``EACCES``), while an account is only a string in slurmdbd that
any user may name at submit time unless ``AccountingStorageEnforce`` is set.

A team's *slug* (:func:`team_slug`) is how its group name is spelled wherever it names a directory or
a key prefix shared by features: ``<cluster_cache>/teams/<slug>`` (weights) and
``<checkpoint store>/_teams/<slug>/`` (checkpoints). It lives here, below both features, so that
each side spells it the same way without importing the other.
"""

from __future__ import annotations

import grp
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm_bt.posix.hook_env import SlurmHookEnv

__all__ = ["TEAM_SLUG", "Team", "TeamError", "is_team_slug", "resolve_team", "team_slug"]

_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_TEAM_SLUG = re.compile(r"[^a-z0-9_.-]+")
TEAM_SLUG = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,63}")
"""What :func:`team_slug` returns (lower case, never ``.``, ``..`` or a leading ``-``); :func:`is_team_slug`."""


def team_slug(group: str) -> str:
    """The directory name of Unix group ``group``'s team: ``<cluster_cache>/teams/<slug>``, ``<store>/_teams/<slug>``.

    One function for every side: the staging job publishes into the tier ``weights.plan.team_for_user``
    names, the root prolog authorizes node staging against the tier of the team *it* resolved
    (:func:`resolve_team`), and the checkpoint uploader on the node and the resolver at submit name
    the same checkpoint namespace; all must spell the directory the same way.
    """
    slug = _TEAM_SLUG.sub("-", group.lower()).strip("-.") or "default"
    return slug[:64]


def is_team_slug(name: str) -> bool:
    """Whether ``name`` can be a team slug (a value read back from a file is checked with this)."""
    return bool(TEAM_SLUG.fullmatch(name))


class TeamError(ValueError):
    """The job cannot use the team its account maps to (a user-level problem: the job fails)."""


@dataclass(frozen=True)
class Team:
    """A job's team: the Unix group name (also the cache directory name) and its gid."""

    name: str
    gid: int
    via_account: bool


def resolve_team(env: SlurmHookEnv, team_groups: Mapping[str, str]) -> Team:
    """The team group of a job, after checking that the job's user belongs to it.

    ``team_groups`` is hooks.toml ``[team_groups]`` (Slurm account -> Unix group).

    Raises:
        TeamError: the mapped group does not exist here, its name cannot be a directory name, or
            the user is not a member.
    """
    account = env.untrusted_account
    mapped = team_groups.get(account) if account else None
    if mapped is not None:
        try:
            gr = grp.getgrnam(mapped)
        except KeyError:
            raise TeamError(f"account {account!r} maps to Unix group {mapped!r}, which does not exist on "
                            f"node {env.node}; ask an admin to fix [team_groups] in hooks.toml") from None
    else:
        try:
            gr = grp.getgrgid(env.gid)
        except KeyError:
            raise TeamError(f"the job's primary group {env.gid} has no name on node {env.node}; "
                            "ask an admin to map your account to a team group") from None
    if not _SAFE.match(gr.gr_name):
        raise TeamError(f"group name {gr.gr_name!r} cannot be used as a cache directory name")
    if gr.gr_gid not in os.getgrouplist(env.user, env.gid):
        raise TeamError(f"user {env.user} is not a member of group {gr.gr_name!r}, which owns the team cache "
                        f"of account {account!r}; ask an admin to add you, or submit with another account")
    return Team(name=gr.gr_name, gid=gr.gr_gid, via_account=mapped is not None)
