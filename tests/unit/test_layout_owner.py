"""The shared-filesystem identity (hooks.toml ``shared_fs_identity``): where root is squashed on the shared
filesystem, the prolog creates team and project directories as a service account in the team groups.

Runs the real prolog (as in test_hooks_prolog.py) with the identity named: what it creates belongs to the
identity and the team's group, what it cannot do fails the job (never the node) with the admin's fix, and
squats it sidesteps are still recorded for `admin doctor` (by root, from the identity's report).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.posix.layout_owner import LayoutOwner, LayoutOwnerError
from slurm_bt.posix.squat_records import read_squats
from slurm_bt.weights.cluster_cache import team_tier_problem
from tests.unit import test_hooks_prolog as hp
from tests.unit.test_hooks_env import hook_environ

site = hp.site  # the fixture
SVC = "btsvc"


@pytest.fixture(scope="module", autouse=True)
def service_account() -> None:
    ensure_service_account()


def ensure_service_account() -> None:
    """btsvc: a system account in btteam1 (what an admin names as shared_fs_identity)."""
    hp.ensure_test_users()
    try:
        pwd.getpwnam(SVC)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", SVC], check=True,
                       capture_output=True)
    # a member of btteam1 only: btteam2's jobs show the message an admin needs
    subprocess.run(["usermod", "-G", "btteam1", SVC], check=True, capture_output=True)


def _with_identity(site: hp.Site) -> None:
    text = site.hooks.read_text().replace("[team_groups]", f'shared_fs_identity = "{SVC}"\n[team_groups]')
    site.hooks.write_text(text)


def test_resolve_refuses_unknown_and_root_identities() -> None:
    assert LayoutOwner.resolve(None).is_root
    with pytest.raises(LayoutOwnerError, match="is not a user"):
        LayoutOwner.resolve("no-such-user-xyz")
    with pytest.raises(LayoutOwnerError, match="uid 0"):
        LayoutOwner.resolve("root")
    owner = LayoutOwner.resolve(SVC)
    assert owner.member_of(grp.getgrnam("btteam1").gr_gid)
    problem = owner.group_problem(grp.getgrnam("btteam2").gr_gid)
    assert problem is not None and f"usermod -aG btteam2 {SVC}" in problem


def test_caches_are_made_by_the_identity(site: hp.Site) -> None:
    _with_identity(site)
    svc = pwd.getpwnam(SVC)
    team1 = grp.getgrnam("btteam1").gr_gid
    work = hp.write_job(site, "btu1")
    # <cache> is root's 0755 and nobody gave the identity teams/: the job fails with the fix, the node stays
    assert hp.run(site, "prolog", hp.job_env(site, "btu1", "21", work)) == 0
    err = read_hook_state("n1", "21", site.state).error
    assert err is not None and "Permission denied" in err and "slurm-bt admin install" in err, err
    # what `admin install` does: teams/ belongs to the identity
    (site.cache / "teams").mkdir()
    os.chown(site.cache / "teams", svc.pw_uid, 0)
    assert hp.run(site, "prolog", hp.job_env(site, "btu1", "22", work)) == 0
    state = read_hook_state("n1", "22", site.state)
    assert state.error is None and state.record is not None, state
    team = site.cache / "teams" / "btteam1"
    for p, mode in ((team, 0o2750), (team / "shared", 0o2770), (team / "projects", 0o2750),
                    (team / "projects" / "proj-a", 0o2770)):
        st = p.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (svc.pw_uid, team1, mode), p
    # btu1 (a member) writes into its project cache, as with root-made caches
    hp.as_user("btu1", lambda: (team / "projects" / "proj-a" / "x").write_text("x"))
    # idempotent on requeue
    assert hp.run(site, "prolog", hp.job_env(site, "btu1", "22", work)) == 0
    assert read_hook_state("n1", "22", site.state).error is None
    # a team the identity is not in: that job fails with the admin's fix, nothing is created
    work2 = hp.write_job(site, "btu2")
    assert hp.run(site, "prolog", hp.job_env(site, "btu2", "23", work2)) == 0
    err = read_hook_state("n1", "23", site.state).error
    assert err is not None and f"usermod -aG btteam2 {SVC}" in err, err
    assert not (site.cache / "teams" / "btteam2").exists()


def test_staging_tiers_are_made_by_the_identity_and_squats_recorded(site: hp.Site, tmp_path: Path) -> None:
    _with_identity(site)
    svc, u2 = pwd.getpwnam(SVC), pwd.getpwnam("btu2")
    team1 = grp.getgrnam("btteam1").gr_gid
    base = site.base / "shared" / "weights"
    site.site.write_text(site.site.read_text().replace("[storage]\n", f'[storage]\ncluster_cache = "{base}"\n'))
    # the admin's layout: <cluster_cache> root 0755, teams/ the identity's; a squat where btteam1's tier belongs
    (base / "teams" / "btteam1").mkdir(parents=True)
    os.chmod(base, 0o755)
    os.chown(base / "teams", svc.pw_uid, 0)
    os.chmod(base / "teams", 0o755)
    os.chown(base / "teams" / "btteam1", u2.pw_uid, u2.pw_gid)
    os.chmod(base / "teams" / "btteam1", 0o2777)
    env = hook_environ("btu1", "77", SLURM_JOB_COMMENT="slurm-bt-staging:s1", SLURM_JOB_WORK_DIR=str(tmp_path))
    assert hp.run(site, "prolog", env) == 0
    st = os.lstat(base / "teams" / "btteam1")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (svc.pw_uid, team1, 0o2770)
    assert team_tier_problem(base / "teams" / "btteam1", team1) is None
    squats = {s.path: s for s in read_squats("n1", site.state)}
    assert squats[str(base / "teams" / "btteam1")].owner_uid == u2.pw_uid  # recorded by root for admin doctor
    assert not (base / "shared").exists()  # the shared tier is an admin's: the identity does not make it
    # a root-made team tier (an admin's, or from before the identity) is the team's: kept
    os.rmdir(base / "teams" / "btteam1")
    os.mkdir(base / "teams" / "btteam1")
    os.chown(base / "teams" / "btteam1", 0, team1)
    os.chmod(base / "teams" / "btteam1", 0o3770)
    assert hp.run(site, "prolog", {**env, "SLURM_JOB_ID": "78"}) == 0
    st = os.lstat(base / "teams" / "btteam1")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o3770)
