"""SlurmHookEnv: only slurmd's variables are trusted, and they are validated.

Also home of :func:`ensure_test_users`, shared by the hooks tests: real users and groups created
with useradd/groupadd (btu1 in btteam1 plus the supplementary group btextra, btu2 in btteam2).
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess

import pytest

from slurm_bt.posix.hook_env import HookEnvError, SlurmHookEnv

USERS = {"btu1": "btteam1", "btu2": "btteam2"}
EXTRA_GROUP = "btextra"


def ensure_test_users() -> dict[str, pwd.struct_passwd]:
    """Create btu1/btu2 and their groups if missing (root only; skips otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create test users")
    for group in [*USERS.values(), EXTRA_GROUP]:
        try:
            grp.getgrnam(group)
        except KeyError:
            subprocess.run(["groupadd", group], check=True, capture_output=True)
    for user, group in USERS.items():
        try:
            pwd.getpwnam(user)
        except KeyError:
            extra = ["-G", EXTRA_GROUP] if user == "btu1" else []
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-g", group, *extra, user], check=True,
                           capture_output=True)
    # The dev cluster's shared_fs_identity (gluster mode: devcluster.py) must be in every team group, as a
    # site's admin adds it to each new team; it only exists once `up --shared gluster` ran.
    try:
        pwd.getpwnam("slurmbt")
    except KeyError:
        pass
    else:
        teams = [*USERS.values(), EXTRA_GROUP]
        if not all("slurmbt" in grp.getgrnam(g).gr_mem for g in teams):
            subprocess.run(["usermod", "-aG", ",".join(teams), "slurmbt"], check=True, capture_output=True)
    return {u: pwd.getpwnam(u) for u in USERS}


def hook_environ(user: str = "btu1", job_id: str = "4242", **extra: str) -> dict[str, str]:
    """A prolog environment as slurmd builds it for ``user``."""
    pw = pwd.getpwnam(user)
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(pw.pw_uid), "SLURM_JOB_GID": str(pw.pw_gid),
           "SLURM_JOB_USER": user, "SLURMD_NODENAME": "n1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
           "SLURM_CLUSTER_NAME": "btdev"}
    env.update(extra)
    return env


def test_valid_environment_is_parsed() -> None:
    env = SlurmHookEnv.from_environ({
        "SLURM_JOB_ID": "17", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
        "SLURMD_NODENAME": "n1", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_COMMENT": "slurm-bt:x",
        "SLURM_JOB_WORK_DIR": "/tmp/w", "SLURM_JOB_ACCOUNT": "acct", "PATH": "/evil"})
    assert (env.job_id, env.uid, env.user, env.node, env.home) == ("17", 0, "root", "n1", "/root")
    assert env.untrusted_comment == "slurm-bt:x" and env.untrusted_work_dir == "/tmp/w"
    assert env.to_environ()["SLURM_JOB_ACCOUNT"] == "acct" and "PATH" not in env.to_environ()


@pytest.mark.parametrize("key,value", [
    ("SLURM_JOB_ID", "../1"), ("SLURM_JOB_ID", "0"), ("SLURM_JOB_ID", "12_3"), ("SLURM_JOB_UID", "-1"),
    ("SLURM_JOB_UID", "1e3"), ("SLURM_JOB_USER", "../root"), ("SLURMD_NODENAME", "n1/../x"),
    ("SLURM_SCRIPT_CONTEXT", "prolog_task"), ("SLURM_JOB_USER", "nobody"),
])
def test_malformed_trusted_variables_are_refused(key: str, value: str) -> None:
    base = {"SLURM_JOB_ID": "17", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
            "SLURMD_NODENAME": "n1"}
    base[key] = value
    with pytest.raises(HookEnvError):
        SlurmHookEnv.from_environ(base)


def test_missing_variable_is_refused() -> None:
    with pytest.raises(HookEnvError, match="SLURM_JOB_UID"):
        SlurmHookEnv.from_environ({"SLURM_JOB_ID": "1", "SLURM_JOB_GID": "0", "SLURM_JOB_USER": "root",
                                   "SLURMD_NODENAME": "n1"})


def test_oversized_hints_are_dropped() -> None:
    env = SlurmHookEnv.from_environ({"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
                                     "SLURM_JOB_USER": "root", "SLURMD_NODENAME": "n1",
                                     "SLURM_JOB_COMMENT": "x" * 10000})
    assert env.untrusted_comment == ""
