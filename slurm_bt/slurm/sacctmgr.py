"""``sacctmgr``: the submitting user's default Slurm account.

:class:`~slurm_bt.slurm.client.SlurmClient` runs it (``default_account``) when bt-sbatch must know
which account a job will be charged to without ``--account``: the prolog maps the job's account to
a team, and weights staging must publish into that same team's cache tier.
"""

from __future__ import annotations

import re

__all__ = ["build_default_account_argv", "parse_default_account"]

# POSIX portable user names (plus the trailing ``$`` of Samba machine accounts). sacctmgr reads
# ``name=value`` words as filters and ``-x`` as options, so anything else is refused before it runs.
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._\-]*\$?")


def build_default_account_argv(user: str) -> list[str]:
    """``sacctmgr -n -P show user USER format=DefaultAccount``.

    Raises:
        ValueError: ``user`` is not a plain user name.
    """
    if not _USER.fullmatch(user):
        raise ValueError(f"not a user name: {user!r}")
    return ["sacctmgr", "-n", "-P", "show", "user", user, "format=DefaultAccount"]


def parse_default_account(text: str) -> str | None:
    """The first non-blank line (the account), or ``None`` when sacctmgr printed none."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else None
