"""Weights tiers against hostile users (issue #8 items 2, 7 and 8), in-process.

* item 2: a credentialed entry lands in the team's private node subtree (``root:<gid> 0750``, blobs
  0440 and snapshot dirs 0550 with the team's group), another audience never gets a hit on it, and
  space, eviction, leases and temp collection span every subtree;
* item 7: a team tier not created for the team (a squat) and a shared tier not created by root are
  never trusted: the stager refuses the squat naming the directory and the fix, a user-made shared
  tier holds nothing for anyone;
* item 8: temp files of writers that are provably dead (same host: pid gone or reused; another
  host: heartbeat stale) are collected, live writers' never.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import socket
import stat
import time
from pathlib import Path

import pytest

from slurm_bt.errors import StorageError
from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.posix.squat_records import read_squats
from slurm_bt.weights.cache_layout import parse_tmp_name, tmp_name
from slurm_bt.weights.cluster_cache import ClusterCache, shared_tier_problem, team_tier_problem
from slurm_bt.weights.locks import process_start_time, writer_is_dead
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_cache import NodeAudience, NodeCache
from slurm_bt.weights.stage_job import ensure_team_root
from tests.unit import test_hooks_prolog as hp
from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, random_bytes, write_origin
from tests.unit.test_hooks_env import hook_environ

site = hp.site  # the throwaway roots, users and hook files of test_hooks_prolog
fake_flush = hp.fake_flush  # autouse there: no hook here may upload

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the node tier is root's; chown needs root")
TEAM_GID = 4242  # any group: root can give files a group that has no name


def _cluster(tmp_path: Path, files: dict[str, bytes], name: str) -> tuple[ClusterCache, Manifest]:
    origin = tmp_path / f"origin-{name}"
    write_origin(origin, files)
    m = make_manifest(files, source=f"hf://org/{name}")
    c = ClusterCache(tmp_path / f"cluster-{name}")
    c.ensure(m, DirFetcher(origin), authorize=allow)
    return c, m


# -- item 2: the node tier keeps a credentialed entry's audience ------------------------------------------


@root_only
def test_private_entry_is_readable_by_its_team_group_only_and_hits_only_there(tmp_path: Path) -> None:
    files = {"config.json": b"{}", "model.bin": random_bytes(300_000, 3), "sub/tok.txt": b"t"}
    cluster, m = _cluster(tmp_path, files, "secret")
    team = NodeCache(tmp_path / "n", 1 << 30, audience=NodeAudience("team1", TEAM_GID))
    snap = team.stage(m, cluster, "101", authorize=allow)

    private = tmp_path / "n" / "private" / "team1"
    assert snap == private / "snapshots" / m.manifest_id
    st = os.lstat(private)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, TEAM_GID, 0o750)
    assert stat.S_IMODE(os.lstat(tmp_path / "n" / "private").st_mode) == 0o755
    for f in m.files:
        fst = os.stat(snap / f.path)
        assert (fst.st_gid, stat.S_IMODE(fst.st_mode)) == (TEAM_GID, 0o440), f.path
        assert (snap / f.path).read_bytes() == files[f.path]
    for d in (snap, snap / "sub"):
        dst = os.lstat(d)
        assert (dst.st_gid, stat.S_IMODE(dst.st_mode)) == (TEAM_GID, 0o550)
    # nothing of it in the node-wide public layout (not even its manifest or blob names)
    assert not list((tmp_path / "n" / "blobs").iterdir())
    assert not list((tmp_path / "n" / "manifests").iterdir())

    public = NodeCache(tmp_path / "n", 1 << 30)
    other = NodeCache(tmp_path / "n", 1 << 30, audience=NodeAudience("team2", TEAM_GID + 1))
    assert team.is_ready(m) and not public.is_ready(m) and not other.is_ready(m)
    # the other team stages its own copy (from its own tier): a separate subtree, no shared inode
    snap2 = other.stage(m, cluster, "102", authorize=allow)
    assert os.stat(snap2 / "model.bin").st_ino != os.stat(snap / "model.bin").st_ino
    assert os.stat(snap2 / "model.bin").st_gid == TEAM_GID + 1


@root_only
def test_squatted_private_dir_is_refused(tmp_path: Path) -> None:
    files = {"a": b"a" * 10}
    cluster, m = _cluster(tmp_path, files, "sq")
    (tmp_path / "n" / "private").mkdir(parents=True)
    (tmp_path / "n" / "private" / "team1").mkdir()
    os.chown(tmp_path / "n" / "private" / "team1", 1234, 1234)  # cannot happen under a root-only parent
    node = NodeCache(tmp_path / "n", 1 << 30, audience=NodeAudience("team1", TEAM_GID))
    with pytest.raises(StorageError, match="not a directory owned by uid 0"):
        node.stage(m, cluster, "1", authorize=allow)


@root_only
def test_space_eviction_leases_and_listing_span_every_subtree(tmp_path: Path) -> None:
    MiB = 1 << 20
    pub_c, pub_m = _cluster(tmp_path, {"p": random_bytes(MiB, 1)}, "pub")
    priv_c, priv_m = _cluster(tmp_path, {"s": random_bytes(MiB, 2)}, "priv")
    cap = 2 * MiB + MiB // 2
    public = NodeCache(tmp_path / "n", cap)
    team = NodeCache(tmp_path / "n", cap, audience=NodeAudience("team1", TEAM_GID))
    public.stage(pub_m, pub_c, "1", authorize=allow)
    team.stage(priv_m, priv_c, "2", authorize=allow)
    assert public.usage_bytes() == team.usage_bytes() == 2 * MiB
    ids = {e.manifest_id for e in public.entries()}
    assert ids == {pub_m.manifest_id, f"private/team1/{priv_m.manifest_id}"}
    assert public.release("2") == [f"private/team1/{priv_m.manifest_id}"]
    public.release("1")
    time.sleep(0.01)
    os.utime(tmp_path / "n" / "private" / "team1" / "leases" / priv_m.manifest_id, (1, 1))  # private is LRU
    # a third entry needs room: the least recently used entry goes, whichever subtree it is in
    third_c, third_m = _cluster(tmp_path, {"t": random_bytes(MiB, 3)}, "third")
    public.stage(third_m, third_c, "3", authorize=allow)
    assert not team.is_ready(priv_m) and public.is_ready(pub_m) and public.is_ready(third_m)
    assert not (tmp_path / "n" / "private" / "team1" / "blobs" / priv_m.files[0].sha256).exists()
    assert public.usage_bytes() == 2 * MiB


# -- item 7: squatted team tier, user-made shared tier ----------------------------------------------------


def _other_group() -> int:
    mine = {os.getgid(), *os.getgroups()}
    return next(g.gr_gid for g in grp.getgrall() if g.gr_gid not in mine)


@root_only
def test_stager_refuses_a_team_dir_someone_else_created_first(tmp_path: Path) -> None:
    base = tmp_path / "weights"
    (base / "teams").mkdir(parents=True)
    my_team = grp.getgrgid(os.getgid()).gr_name
    tier = ClusterCache.for_team(base, my_team)
    os.mkdir(tier.root, 0o700)
    os.chown(tier.root, 65534, _other_group())  # a squatter: another user, their own group
    os.chmod(tier.root, 0o2770)
    with pytest.raises(StorageError) as exc:
        ensure_team_root(base, tier)
    text = str(exc.value)
    assert str(tier.root) in text and "rm -rf" in text and "not created for team group" in text


@root_only
def test_stager_creates_the_team_dir_with_the_team_group_and_accepts_it(tmp_path: Path) -> None:
    base = tmp_path / "weights"
    gid = os.getgid()
    tier = ClusterCache.for_team(base, grp.getgrgid(gid).gr_name)
    ensure_team_root(base, tier)
    st = os.lstat(tier.root)
    assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, 0o2770)
    assert stat.S_IMODE(os.lstat(base / "teams").st_mode) == 0o1777
    ensure_team_root(base, tier)  # idempotent: its own directory is accepted


def test_team_tier_problem_wants_the_team_group_and_no_access_for_others(tmp_path: Path) -> None:
    gid = os.getgid()
    d = tmp_path / "t"
    assert team_tier_problem(d, gid) is None  # absent: nothing to refuse
    d.mkdir()
    os.chmod(d, 0o2770)
    assert team_tier_problem(d, gid) is None
    os.chmod(d, 0o2775)
    assert "not created for team group" in (team_tier_problem(d, gid) or "")
    os.chmod(d, 0o2770)
    assert team_tier_problem(d, gid + 1) is not None  # another team's group
    link = tmp_path / "l"
    link.symlink_to(d)
    assert "symlink" in (team_tier_problem(link, gid) or "")


@root_only
def test_user_made_shared_tier_holds_nothing_and_says_why(tmp_path: Path) -> None:
    files = {"w": random_bytes(1000, 5)}
    origin = tmp_path / "o"
    write_origin(origin, files)
    m = make_manifest(files)
    base = tmp_path / "weights"
    base.mkdir()
    os.chmod(base, 0o1777)
    squat = ClusterCache(base / "shared")
    squat.ensure(m, DirFetcher(origin), authorize=allow)  # complete, as a squatter would plant it
    for dirpath, dirnames, filenames in os.walk(base / "shared"):
        for n in [*dirnames, *filenames, "."]:
            os.lchown(os.path.join(dirpath, n), 65534, 65534)
    shared = ClusterCache.shared(base)
    assert shared.refused is not None and "was not created by an admin" in shared.refused
    assert f"rm -rf {base / 'shared'}" in shared.refused
    assert not shared.has(m)
    with pytest.raises(FileNotFoundError):
        shared.open_blob(m.files[0])
    # the same tree made by root under a root-owned (sticky) parent is the admin's tier
    for dirpath, dirnames, filenames in os.walk(base / "shared"):
        for n in [*dirnames, *filenames, "."]:
            os.lchown(os.path.join(dirpath, n), 0, 0)
    assert ClusterCache.shared(base).has(m)
    os.chown(base, 65534, 65534)  # ...but not under a parent a user owns (they could swap it)
    assert "its parent" in (shared_tier_problem(base / "shared") or "")


# -- item 8: dead writers' temp files ---------------------------------------------------------------------


def test_tmp_name_records_host_pid_and_start_time() -> None:
    host, pid, start = parse_tmp_name(tmp_name("writer")) or ("", 0, None)
    assert (host, pid, start) == (socket.gethostname(), os.getpid(), process_start_time(os.getpid()))
    assert parse_tmp_name("blob.123.abcdef@h.example.org") == ("h.example.org", 123, None)  # older names
    assert parse_tmp_name("junk") is None


def test_writer_is_dead_same_host_other_host_and_pid_reuse() -> None:
    me, here = os.getpid(), socket.gethostname()
    start = process_start_time(me)
    now = time.time()
    assert not writer_is_dead(here, me, start, now, stale_after_s=600)
    assert writer_is_dead(here, me, (start or 0) + 1, now, stale_after_s=600)  # pid reused
    assert not writer_is_dead(here, me, None, now, stale_after_s=600)  # no start time: alive since before
    assert writer_is_dead(here, me, None, now - 10 * 365 * 86400, stale_after_s=600)  # started after the write
    gone = _dead_pid()
    assert writer_is_dead(here, gone, None, now, stale_after_s=600)
    assert not writer_is_dead("elsewhere", gone, None, now - 60, stale_after_s=600)  # heartbeat fresh
    assert writer_is_dead("elsewhere", me, start, now - 601, stale_after_s=600)  # heartbeat stale


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_killed_writer_dir_is_collected_live_ones_are_not(tmp_path: Path) -> None:
    c = ClusterCache(tmp_path / "team", dir_mode=0o2770)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a stager killed with SIGKILL in the middle of a preallocated download
        os.close(r)
        with c.writer_dir() as wdir:
            fd = os.open(wdir / ".abc.tmp-1-ff", os.O_WRONLY | os.O_CREAT, 0o600)
            os.posix_fallocate(fd, 0, 4 << 20)
            os.write(w, str(wdir).encode())
            os.kill(os.getpid(), signal.SIGKILL)
    os.close(w)
    dead_dir = Path(os.read(r, 4096).decode())
    os.close(r)
    os.waitpid(pid, 0)
    assert dead_dir.is_dir() and dead_dir.parent == c.layout.tmp
    assert stat.S_IMODE(os.lstat(dead_dir).st_mode) == 0o2770  # teammates can empty it
    with c.writer_dir() as live:
        other_host = c.layout.tmp / f"writer.{pid}_1.abc@another-host"
        other_host.mkdir()
        old_other = c.layout.tmp / f"writer.{pid}_1.abd@another-host"
        old_other.mkdir()
        os.utime(old_other, (time.time() - 700, time.time() - 700))
        legacy_old = c.layout.blobs / f".{'a' * 64}.tmp-{pid}-0a1b"
        legacy_old.write_bytes(b"x")
        os.utime(legacy_old, (1, 1))
        legacy_new = c.layout.blobs / f".{'b' * 64}.tmp-{pid}-0a1c"
        legacy_new.write_bytes(b"x")
        removed = c.gc_temp()
        assert sorted(removed) == sorted([dead_dir, old_other, legacy_old])
        assert live.is_dir() and other_host.is_dir() and legacy_new.exists()
    assert not live.exists()  # a writer removes its own dir on the way out


@root_only
def test_node_gc_covers_private_subtrees(tmp_path: Path) -> None:
    files = {"a": b"abc"}
    cluster, m = _cluster(tmp_path, files, "g")
    team = NodeCache(tmp_path / "n", 1 << 30, audience=NodeAudience("team1", TEAM_GID))
    team.stage(m, cluster, "1", authorize=allow)
    gone = _dead_pid()
    debris = team.layout.tmp / f"blob.{gone}_5.abc@{socket.gethostname()}"
    debris.write_bytes(b"x" * 100)
    assert NodeCache(tmp_path / "n", 1 << 30).gc_temp() == [debris]


# -- item 7: the staging job's prolog makes the tiers as root and sidesteps squats --------------------------


@root_only
def test_staging_prolog_makes_tiers_as_root_and_sidesteps_squats(site: hp.Site, tmp_path: Path) -> None:
    base = site.base / "shared" / "weights"
    site.site.write_text(site.site.read_text().replace("[storage]\n", f'[storage]\ncluster_cache = "{base}"\n'))
    u1, u2 = pwd.getpwnam("btu1"), pwd.getpwnam("btu2")
    team1 = grp.getgrnam("btteam1").gr_gid
    # what older stagers and a squatter left: base and teams/ 1777 owned by btu1, btu2's "btteam1", btu2's shared
    (base / "teams" / "btteam1").mkdir(parents=True)
    (base / "shared" / "manifests").mkdir(parents=True)
    for d in (base, base / "teams"):
        os.chown(d, u1.pw_uid, u1.pw_gid)
        os.chmod(d, 0o1777)
    for d in (base / "teams" / "btteam1", base / "shared", base / "shared" / "manifests"):
        os.chown(d, u2.pw_uid, u2.pw_gid)
        os.chmod(d, 0o2777)
    env = hook_environ("btu1", "77", SLURM_JOB_COMMENT="slurm-bt-staging:s1", SLURM_JOB_WORK_DIR=str(tmp_path))
    assert hp.run(site, "prolog", env) == 0
    for d, owner, mode in ((base, (0, 0), 0o755), (base / "teams", (0, 0), 0o755),
                           (base / "teams" / "btteam1", (0, team1), 0o2770), (base / "shared", (0, 0), 0o755)):
        st = os.lstat(d)
        assert ((st.st_uid, st.st_gid), stat.S_IMODE(st.st_mode)) == (owner, mode), d
    assert team_tier_problem(base / "teams" / "btteam1", team1) is None
    assert shared_tier_problem(base / "shared") is None
    squats = {s.path: s for s in read_squats("n1", site.state)}
    assert {str(base / "teams" / "btteam1"), str(base / "shared")} <= set(squats)
    assert squats[str(base / "shared")].owner_uid == u2.pw_uid
    assert not [n for n in os.listdir(base / "teams") if n.startswith(".slurm-bt-squatted-")]  # removed
    # a teammate-made team dir (member-owned, the team's group, closed to others) is the team's: kept
    os.rmdir(base / "teams" / "btteam1")
    os.mkdir(base / "teams" / "btteam1")
    os.chown(base / "teams" / "btteam1", u1.pw_uid, team1)
    os.chmod(base / "teams" / "btteam1", 0o2770)
    assert hp.run(site, "prolog", {**env, "SLURM_JOB_ID": "78"}) == 0
    assert os.lstat(base / "teams" / "btteam1").st_uid == u1.pw_uid
    assert read_hook_state("n1", "78", site.state).error is None


@root_only
def test_node_stat_counts_every_subtree(tmp_path: Path) -> None:
    pub_c, pub_m = _cluster(tmp_path, {"p": b"p" * 100}, "sp")
    priv_c, priv_m = _cluster(tmp_path, {"s": b"s" * 300}, "ss")
    NodeCache(tmp_path / "n", 1 << 30).stage(pub_m, pub_c, "1", authorize=allow)
    NodeCache(tmp_path / "n", 1 << 30, audience=NodeAudience("team1", TEAM_GID)).stage(priv_m, priv_c, "2",
                                                                                         authorize=allow)
    st = NodeCache(tmp_path / "n", 1 << 30).stat()
    assert (st.blobs, st.blob_bytes, len(st.entries)) == (2, 400, 2)


@root_only
def test_withdraw_removes_an_unleased_public_copy_only(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, {"a": b"a" * 50, "b": b"b" * 70}, "wd")
    public = NodeCache(tmp_path / "n", 1 << 30)
    public.stage(m, c, "1", authorize=allow)  # as an older version staged a credentialed entry
    assert not public.withdraw(m) and public.is_ready(m)  # leased by a running job: kept
    public.release("1")
    assert public.withdraw(m) and not public.is_ready(m)
    assert not list((tmp_path / "n" / "blobs").iterdir())
    assert not public.withdraw(m)
