"""fd-relative create and delete for root-owned trees.

The removal tests build user-owned scratch trees holding symlinks to /etc and to another user's
directory, swap a directory for a symlink while the removal runs, use chmod 000 directories and
3000-deep nesting, and check that the targets are untouched (tree hashes) and nothing is left.
"""

from __future__ import annotations

import ctypes
import hashlib
import multiprocessing
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.mountinfo import mount_points_under
from slurm_bt.posix.privdrop import run_as_job_user
from slurm_bt.posix.safefs import (
    UnsafeEntry,
    UntrustedPath,
    ensure_dir_at,
    open_trusted_dir,
    remove_tree_at,
)
from tests.unit.test_hooks_env import ensure_test_users, hook_environ

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root-owned trees need root")


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            p = Path(dirpath, name)
            st = p.lstat()
            h.update(f"{p.relative_to(root)}|{st.st_mode}|{st.st_uid}|{st.st_size}".encode())
            if stat.S_ISREG(st.st_mode):
                h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture()
def root() -> Iterator[Path]:
    """A root-owned 0755 scratch root in a root-owned 0755 parent under /tmp (users can traverse it)."""
    base = Path(tempfile.mkdtemp(prefix="bt-hooks-", dir="/tmp"))
    os.chmod(base, 0o755)
    scratch = base / "scratch"
    scratch.mkdir(mode=0o755)
    yield scratch
    subprocess.run(["chmod", "-R", "u+rwx", str(base)], capture_output=True, check=False)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def users() -> dict[str, int]:
    pws = ensure_test_users()
    return {u: pw.pw_uid for u, pw in pws.items()}


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.lchown(Path(dirpath, name), uid, gid)
    os.lchown(path, uid, gid)


def _victim(tmp_path: Path, uid: int) -> Path:
    """Another user's directory (btu2's), which must survive every removal."""
    v = tmp_path / "victim"
    (v / "sub").mkdir(parents=True)
    (v / "secret.txt").write_text("bob's data")
    (v / "sub" / "f").write_text("x")
    _chown_tree(v, uid, uid)
    return v


def test_remove_never_follows_symlinks(root: Path, users: dict[str, int]) -> None:
    victim = _victim(root.parent, users["btu2"])
    job = root / "101"
    (job / "a" / "b" / "c").mkdir(parents=True)
    (job / "a" / "file").write_text("data")
    os.symlink("/etc", job / "etc-link")
    os.symlink("/etc/security", job / "a" / "b" / "deep-etc")
    os.symlink(victim, job / "a" / "b" / "c" / "victim-link")
    os.symlink(victim / "secret.txt", job / "a" / "secret-link")
    os.mkfifo(job / "a" / "fifo")
    _chown_tree(job, users["btu1"], users["btu1"])
    os.link(victim / "secret.txt", job / "a" / "hardlink")  # only the link goes, never the inode's data
    before_etc, before_victim = tree_hash(Path("/etc/security")), tree_hash(victim)
    fd = open_trusted_dir(str(root))
    try:
        report = remove_tree_at(fd, "101")
    finally:
        os.close(fd)
    assert report.complete, report.leftovers
    assert not job.exists()
    assert tree_hash(Path("/etc/security")) == before_etc and tree_hash(victim) == before_victim
    assert (victim / "secret.txt").read_text() == "bob's data"


def _swapper(a: str, b: str, stop: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, exchange = -100, 2
    while not stop.is_set():
        libc.renameat2(at_fdcwd, a.encode(), at_fdcwd, b.encode(), exchange)


def test_remove_survives_dir_symlink_swaps(root: Path, users: dict[str, int]) -> None:
    victim = _victim(root.parent, users["btu2"])
    for i in range(40):
        (victim / f"bulk{i}").write_text("keep me")
    before = tree_hash(victim)
    ctx = multiprocessing.get_context("fork")
    for run in range(15):
        job = root / f"2{run:02d}"
        for d in range(60):
            (job / "a" / f"d{d}").mkdir(parents=True)
            (job / "a" / f"d{d}" / "f").write_text("x")
        os.symlink(victim, job / "link")
        stop = ctx.Event()
        proc = ctx.Process(target=_swapper, args=(str(job / "a"), str(job / "link"), stop))
        proc.start()
        try:
            fd = open_trusted_dir(str(root))
            try:
                remove_tree_at(fd, job.name)
            finally:
                os.close(fd)
        finally:
            stop.set()
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        # Whatever the race did, nothing outside the job dir was touched; a second pass finishes.
        assert tree_hash(victim) == before, f"victim changed in run {run}"
        fd = open_trusted_dir(str(root))
        try:
            remove_tree_at(fd, job.name)
        finally:
            os.close(fd)
        assert not job.exists()
    assert tree_hash(victim) == before


def test_chmod_000_dirs_removed_as_the_user(root: Path, users: dict[str, int]) -> None:
    """Without root's DAC override (as the owner), locked directories are unlocked through O_PATH."""
    job = root / "301"
    (job / "locked" / "inner").mkdir(parents=True)
    (job / "locked" / "inner" / "f").write_text("x")
    _chown_tree(job, users["btu1"], users["btu1"])
    os.chmod(job / "locked" / "inner", 0)
    os.chmod(job / "locked", 0)
    os.chmod(root, 0o777)  # let the user remove its own entry in this throwaway root
    env = SlurmHookEnv.from_environ(hook_environ("btu1"))

    def remove() -> list[list[str]]:
        fd = os.open(str(job), os.O_RDONLY | os.O_DIRECTORY)
        try:
            rep = remove_tree_at(fd, "locked")
        finally:
            os.close(fd)
        return [list(x) for x in rep.leftovers]

    assert run_as_job_user(remove, env, timeout_s=30) == []
    assert not (job / "locked").exists()


def test_deep_nesting_has_no_recursion_or_fd_limit(root: Path) -> None:
    job = root / "401"
    job.mkdir()
    fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # deeper than PATH_MAX: only fd-relative calls can build it
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
        f.write("x")
    os.close(fd)
    rfd = open_trusted_dir(str(root))
    try:
        report = remove_tree_at(rfd, "401")
    finally:
        os.close(rfd)
    assert report.complete and report.dirs == 3001 and report.files == 1
    assert not job.exists()


def test_keep_preserves_checkpoints_and_their_parents(root: Path) -> None:
    job = root / "501"
    (job / "mnt" / "checkpoints" / "c1").mkdir(parents=True)
    (job / "mnt" / "checkpoints" / "c1" / "w").write_text("weights")
    (job / "mnt" / "other").mkdir()
    (job / "tmp").mkdir()
    fd = open_trusted_dir(str(root))
    try:
        for _ in range(2):  # idempotent
            report = remove_tree_at(fd, "501", keep=frozenset({("mnt", "checkpoints")}))
            assert report.complete and report.kept == ["mnt/checkpoints"]
    finally:
        os.close(fd)
    assert sorted(p.name for p in job.iterdir()) == ["mnt"]
    assert (job / "mnt" / "checkpoints" / "c1" / "w").read_text() == "weights"
    assert not (job / "mnt" / "other").exists()


def test_mount_points_are_neither_crossed_nor_unmounted(root: Path) -> None:
    job = root / "601"
    mnt = job / "m"
    mnt.mkdir(parents=True)
    (job / "f").write_text("x")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount tmpfs here")
    try:
        (mnt / "inside").write_text("must stay")
        rels = frozenset(tuple(m[len(str(job)) + 1:].split("/")) for m in mount_points_under(str(job)))
        assert rels == {("m",)}
        fd = open_trusted_dir(str(root))
        try:
            report = remove_tree_at(fd, "601", mount_points=rels)
            report2 = remove_tree_at(fd, "601")  # without the mountinfo hint: st_dev stops it
        finally:
            os.close(fd)
        assert [r for r, _ in report.leftovers] == ["m", "."] or report.leftovers[0][0] == "m"
        assert any("another filesystem" in why for _, why in report2.leftovers)
        assert (mnt / "inside").read_text() == "must stay"
        assert not (job / "f").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_ensure_dir_creates_and_refuses_what_it_must_not_adopt(root: Path, users: dict[str, int]) -> None:
    fd = open_trusted_dir(str(root))
    try:
        d, created = ensure_dir_at(fd, "job", uid=users["btu1"], gid=users["btu1"], mode=0o700)
        os.close(d)
        assert created
        st = os.lstat(root / "job")
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (users["btu1"], 0o700)
        d, created = ensure_dir_at(fd, "job", uid=users["btu1"], gid=users["btu1"], mode=0o700)
        os.close(d)
        assert not created  # rerun: ours, accepted
        os.symlink("/etc", root / "link")
        with pytest.raises(UnsafeEntry, match="symlink"):
            ensure_dir_at(fd, "link", uid=users["btu1"], gid=users["btu1"], mode=0o700)
        os.mkfifo(root / "fifo")
        with pytest.raises(UnsafeEntry):
            ensure_dir_at(fd, "fifo", uid=users["btu1"], gid=users["btu1"], mode=0o700)
        (root / "mallory").mkdir()
        os.chown(root / "mallory", users["btu2"], users["btu2"])
        with pytest.raises(UnsafeEntry, match="owned by uid"):
            ensure_dir_at(fd, "mallory", uid=users["btu1"], gid=users["btu1"], mode=0o700)
        assert stat.S_IMODE(os.stat("/etc").st_mode) == 0o755 and os.stat("/etc").st_uid == 0
        assert os.stat(root / "mallory").st_uid == users["btu2"]
    finally:
        os.close(fd)


def test_ensure_dir_waits_for_a_concurrent_root_creator_instead_of_calling_it_a_squat(
        root: Path, users: dict[str, int]) -> None:
    """Two prologs of one user create the same runtime directory at once: the loser of the mkdir race sees
    the winner's directory before its fchown (root-owned) and must adopt it once chowned, not move it aside."""
    import threading
    import time

    uid = users["btu1"]
    os.mkdir(root / "racing", 0o700)  # the winner's mkdir: root-owned, not yet the user's
    chowned = threading.Timer(0.1, os.chown, (root / "racing", uid, uid))
    fd = open_trusted_dir(str(root))
    try:
        chowned.start()
        t0 = time.monotonic()
        d, created = ensure_dir_at(fd, "racing", uid=uid, gid=uid, mode=0o700)
        os.close(d)
        assert not created and 0.05 < time.monotonic() - t0 < 0.5
        assert os.lstat(root / "racing").st_uid == uid
        os.mkdir(root / "stuck", 0o700)  # a root-owned directory that never becomes the user's: refused
        t0 = time.monotonic()
        with pytest.raises(UnsafeEntry, match="owned by uid 0"):
            ensure_dir_at(fd, "stuck", uid=uid, gid=uid, mode=0o700)
        assert time.monotonic() - t0 < 2.0
    finally:
        chowned.cancel()
        os.close(fd)


def test_open_trusted_dir_refuses_user_controlled_components(tmp_path: Path, users: dict[str, int]) -> None:
    os.chmod(tmp_path, 0o755)
    (tmp_path / "u" / "scratch").mkdir(parents=True)
    os.chown(tmp_path / "u", users["btu1"], users["btu1"])
    with pytest.raises(UntrustedPath):
        os.close(open_trusted_dir(str(tmp_path / "u" / "scratch")))
    (tmp_path / "w").mkdir(mode=0o777)
    os.chmod(tmp_path / "w", 0o777)
    with pytest.raises(UntrustedPath):
        os.close(open_trusted_dir(str(tmp_path / "w")))
    os.chmod(tmp_path / "w", 0o1777)
    os.close(open_trusted_dir(str(tmp_path / "w"), allow_sticky_final=True))
