"""The Slurm facts a root hook may trust, read once from the environment and validated.

Why so few: on 22.05 slurmd builds the Prolog/Epilog environment from scratch (docs/footguns.md),
but several of its variables are user-controlled (``SLURM_JOB_COMMENT``, ``SLURM_JOB_WORK_DIR``, the
stdio patterns, ``SPANK_*``) and the owner can rewrite the comment at any time. Only the job id,
uid, gid and user name, the node name, the script context and the cluster name come from slurmd or
the credential; everything else is carried here as an explicitly *untrusted* hint.
"""

from __future__ import annotations

import pwd
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["HookEnvError", "SlurmHookEnv"]

# Plain job ids only: array and het jobs still get a numeric SLURM_JOB_ID in the prolog.
_JOB_ID = re.compile(r"^[1-9][0-9]{0,15}$")
_ID = re.compile(r"^(0|[1-9][0-9]{0,9})$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_CONTEXTS = {"prolog_slurmd", "epilog_slurmd"}
_MAX_HINT = 4096


class HookEnvError(ValueError):
    """The hook environment lacks a trusted variable or holds a malformed one (not a user error)."""


@dataclass(frozen=True)
class SlurmHookEnv:
    """Validated identity of the job a hook runs for.

    Attributes:
        job_id: ``SLURM_JOB_ID`` (digits only; safe as a file name).
        uid: ``SLURM_JOB_UID``.
        gid: ``SLURM_JOB_GID`` (the job's primary group).
        user: ``SLURM_JOB_USER``; checked against the passwd entry of ``uid``.
        node: ``SLURMD_NODENAME``.
        context: ``SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd`` or ``epilog_slurmd``).
        cluster: ``SLURM_CLUSTER_NAME`` (``""`` when unset).
        home: the user's home directory from passwd (never ``$HOME``).
        untrusted_account: ``SLURM_JOB_ACCOUNT``: set by Slurm but chosen by the user at submit time
            (an association check happens only with AccountingStorageEnforce); used only as a key
            into the admin's account→group map, never as a path.
        untrusted_comment: ``SLURM_JOB_COMMENT``: the owner can change it at any time.
        untrusted_work_dir: ``SLURM_JOB_WORK_DIR``: a user path; open it only as the user.
    """

    job_id: str
    uid: int
    gid: int
    user: str
    node: str
    context: str
    cluster: str
    home: str
    untrusted_account: str
    untrusted_comment: str
    untrusted_work_dir: str

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> SlurmHookEnv:
        """Read and validate the hook environment.

        Raises:
            HookEnvError: a trusted variable is missing or malformed, or the uid has no passwd
                entry, or the user name does not match it.
        """

        def need(name: str, pattern: re.Pattern[str]) -> str:
            value = environ.get(name)
            if value is None:
                raise HookEnvError(f"{name} is not set (is this running as a Slurm Prolog/Epilog?)")
            if not pattern.match(value):
                raise HookEnvError(f"{name}={value[:80]!r} is malformed")
            return value

        job_id = need("SLURM_JOB_ID", _JOB_ID)
        uid = int(need("SLURM_JOB_UID", _ID))
        gid = int(need("SLURM_JOB_GID", _ID))
        user = need("SLURM_JOB_USER", _NAME)
        node = need("SLURMD_NODENAME", _NODE)
        context = environ.get("SLURM_SCRIPT_CONTEXT", "")
        if context and context not in _CONTEXTS:
            raise HookEnvError(f"SLURM_SCRIPT_CONTEXT={context[:40]!r} is not a slurmd prolog/epilog")
        cluster = environ.get("SLURM_CLUSTER_NAME", "")
        if cluster and not _NAME.match(cluster):
            raise HookEnvError(f"SLURM_CLUSTER_NAME={cluster[:80]!r} is malformed")
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise HookEnvError(f"uid {uid} has no passwd entry on this node") from None
        if pw.pw_name != user:
            raise HookEnvError(f"SLURM_JOB_USER={user!r} but uid {uid} is {pw.pw_name!r}")

        def hint(name: str) -> str:
            value = environ.get(name, "")
            return value if len(value) <= _MAX_HINT and "\0" not in value else ""

        return cls(job_id=job_id, uid=uid, gid=gid, user=user, node=node, context=context, cluster=cluster,
                   home=pw.pw_dir, untrusted_account=hint("SLURM_JOB_ACCOUNT"),
                   untrusted_comment=hint("SLURM_JOB_COMMENT"), untrusted_work_dir=hint("SLURM_JOB_WORK_DIR"))

    @classmethod
    def for_uid(cls, uid: int, gid: int) -> SlurmHookEnv:
        """An identity for root work that is not a hook invocation (no job, no node).

        Raises:
            KeyError: ``uid`` has no passwd entry.
        """
        pw = pwd.getpwuid(uid)
        return cls(job_id="0", uid=uid, gid=gid, user=pw.pw_name, node="", context="", cluster="",
                   home=pw.pw_dir, untrusted_account="", untrusted_comment="", untrusted_work_dir="")

    def to_environ(self) -> dict[str, str]:
        """The validated values under their Slurm names (for the features the epilog calls with an environ).

        The trusted variables, plus ``SLURM_JOB_WORK_DIR`` and ``SLURM_JOB_ACCOUNT`` as the hints
        they are (consumers must open the work dir only as the job user).
        """
        out = {"SLURM_JOB_ID": self.job_id, "SLURM_JOB_UID": str(self.uid), "SLURM_JOB_GID": str(self.gid),
               "SLURM_JOB_USER": self.user, "SLURMD_NODENAME": self.node}
        for key, value in (("SLURM_SCRIPT_CONTEXT", self.context), ("SLURM_CLUSTER_NAME", self.cluster),
                           ("SLURM_JOB_WORK_DIR", self.untrusted_work_dir),
                           ("SLURM_JOB_ACCOUNT", self.untrusted_account)):
            if value:
                out[key] = value
        return out
