"""Node tier, issue 14 item 2: the small-file fast path (blobs written straight into the snapshot's
temp tree, names resolved against directory descriptors) keeps every safety rule of the old path."""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slurm_bt.errors import CacheIntegrityError, StorageError
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_cache import SMALL_BATCH_MIN, NodeCache
from tests.unit.test_cache_node import _cluster
from tests.unit.test_cache_support import allow, make_manifest, random_bytes


def _small_files(n: int, size: int = 4096, seed: int = 0) -> dict[str, bytes]:
    return {f"tok/{i // 10:03d}/{i:05d}.txt": random_bytes(size, seed * 100_000 + i) for i in range(n)}


def _blob_names(n: NodeCache) -> set[str]:
    return {p.name for p in n.layout.blobs.iterdir()} if n.layout.blobs.exists() else set()


def _assert_nothing_left(n: NodeCache, m: Manifest) -> None:
    """No blob, no snapshot (final or temp tree), no temp, no marker, no lease."""
    assert _blob_names(n) == set()
    assert list(n.layout.snapshots.iterdir()) == []
    assert list(n.layout.tmp.iterdir()) == []
    assert not n.layout.is_complete(m) and n.leases(m.manifest_id) == []


def _replace_blob(c: ClusterCache, sha: str, make: str) -> None:
    p = c.layout.blob(sha)
    os.chmod(p, 0o644)
    os.unlink(p)
    if make == "symlink":
        target = p.with_name("elsewhere")
        target.write_bytes(b"x" * 4096)
        os.symlink(target, p)
    elif make == "fifo":
        os.mkfifo(p)
    elif make == "dir":
        os.mkdir(p)
    else:
        raise AssertionError(make)


@contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    """Fail instead of hanging (a FIFO opened without O_NONBLOCK blocks forever)."""

    def boom(_sig: int, _frame: object) -> None:
        raise AssertionError(f"still blocked after {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_small_blob_is_written_once_and_linked_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path's shape: one create and one link per small file (the old path made a temp in
    .tmp, linked it to blobs/, unlinked it and linked the blob into the snapshot: 2 links and an
    unlink each). The snapshot file is the blob (same inode), modes as before, nothing left over."""
    files = _small_files(60)
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)
    links, unlinks = [0], [0]
    real_link, real_unlink = os.link, os.unlink

    def counting_link(*a: object, **k: object) -> None:
        links[0] += 1
        real_link(*a, **k)  # type: ignore[arg-type]

    def counting_unlink(*a: object, **k: object) -> None:
        unlinks[0] += 1
        real_unlink(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "link", counting_link)
    monkeypatch.setattr(os, "unlink", counting_unlink)
    snap = n.stage(m, c, "1", authorize=allow)
    monkeypatch.undo()
    # (+ the lock files, made by link(2) too)
    assert len(files) <= links[0] < len(files) + 5, f"{links[0]} links for {len(files)} small files"
    assert unlinks[0] < 10, f"{unlinks[0]} unlinks: temps should not be made and removed per file"
    for f in m.files:
        st, blob = (snap / f.path).stat(), n.layout.blob(f.sha256).stat()
        assert (snap / f.path).read_bytes() == files[f.path]
        assert (st.st_ino, st.st_nlink, st.st_mode & 0o777) == (blob.st_ino, 2, 0o444)
    assert (snap / "tok").stat().st_mode & 0o777 == 0o555
    assert sorted(p.name for p in n.layout.snapshots.iterdir()) == [m.manifest_id]  # no temp tree
    assert list(n.layout.tmp.iterdir()) == []


@pytest.mark.parametrize("make", ["symlink", "fifo", "dir"])
def test_non_regular_source_in_a_batch_is_refused_and_nothing_published(tmp_path: Path, make: str) -> None:
    """A symlink, FIFO or directory at a team-tier blob name in the middle of a small-file batch:
    the stage fails (never follows, never blocks) and nothing of the batch has a name: no blob, no
    temp tree under snapshots/, no temp."""
    c, m = _cluster(tmp_path, _small_files(40))
    _replace_blob(c, m.files[23].sha256, make)
    n = NodeCache(tmp_path / "n", 1 << 30)
    with _alarm(20), pytest.raises(StorageError, match=r"regular file|cannot open"):
        n.stage(m, c, "1", authorize=allow)
    _assert_nothing_left(n, m)


def test_grown_source_in_a_batch_is_refused_unless_another_tier_has_it(tmp_path: Path) -> None:
    """A source one byte longer than pinned (read with one byte to spare) is a mismatch, also from a
    trusted tier; the next tier's right copy is used, else the stage fails with nothing published."""
    files = _small_files(30)
    c, m = _cluster(tmp_path, files, name="team")
    bad = m.files[7]
    p = c.layout.blob(bad.sha256)
    os.chmod(p, 0o644)
    with open(p, "ab") as fh:
        fh.write(b"!")
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(CacheIntegrityError):
        n.stage(m, ClusterCache(c.root, trusted_copy=True), "1", authorize=allow)
    _assert_nothing_left(n, m)
    good, _ = _cluster(tmp_path, files, name="good")
    snap = n.stage(m, [ClusterCache(c.root, trusted_copy=True), good], "2", authorize=allow)
    assert (snap / bad.path).read_bytes() == files[bad.path]


def test_duplicate_content_and_already_present_blobs(tmp_path: Path) -> None:
    """Two paths with the same bytes are one blob linked twice; blobs already on the node (another
    entry's) are linked, not copied again."""
    files = _small_files(30)
    dup = {"copy/of/first.txt": files["tok/000/00000.txt"]}
    c, m = _cluster(tmp_path, {**files, **dup})
    n = NodeCache(tmp_path / "n", 1 << 30)
    m_first = make_manifest(dict(list(files.items())[:20]), source="hf://org/other")
    c2, _ = _cluster(tmp_path, dict(list(files.items())[:20]), name="c2")
    n.stage(m_first, c2, "0", authorize=allow)
    before = {sha: n.layout.blob(sha).stat().st_ino for sha in _blob_names(n)}
    snap = n.stage(m, c, "1", authorize=allow)
    for p, b in {**files, **dup}.items():
        assert (snap / p).read_bytes() == b
    assert (snap / "copy/of/first.txt").stat().st_ino == (snap / "tok/000/00000.txt").stat().st_ino
    assert all(n.layout.blob(sha).stat().st_ino == ino for sha, ino in before.items())  # kept, not replaced
    assert _blob_names(n) == {f.sha256 for f in m.files}


def test_writer_tree_mode_shares_a_blob_published_meanwhile(tmp_path: Path) -> None:
    """Another stage published the same blob between our write and our publish: the tree file is
    replaced by a link to that blob (one inode per blob, counted once), the blob is not replaced."""
    from slurm_bt.weights.cache_layout import SmallBlobWriter, new_snapshot_tree

    m = make_manifest({"a/x.txt": b"alpha", "b.txt": b"beta"})
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    fa, fb = m.files
    tree = new_snapshot_tree(n.layout, m.manifest_id)
    with SmallBlobWriter(n.layout, tree=tree) as w:
        w.add(fa, b"alpha")
        w.add(fb, b"beta")
        n.layout.blob(fa.sha256).write_bytes(b"alpha")  # the other stager's blob
        ino = n.layout.blob(fa.sha256).stat().st_ino
        assert w.publish() == [fb.sha256]
        assert sorted(w.placed) == ["a/x.txt", "b.txt"]
    assert (tree / "a/x.txt").stat().st_ino == ino == n.layout.blob(fa.sha256).stat().st_ino
    assert (tree / "b.txt").stat().st_ino == n.layout.blob(fb.sha256).stat().st_ino
    assert list(n.layout.tmp.iterdir()) == []


def test_writer_tree_mode_refuses_a_file_swapped_before_publish(tmp_path: Path) -> None:
    """A tree file replaced by a symlink between write and publish is never named under blobs/."""
    from slurm_bt.weights.cache_layout import SmallBlobWriter, new_snapshot_tree

    m = make_manifest({"a.txt": b"alpha"})
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    (fa,) = m.files
    tree = new_snapshot_tree(n.layout, m.manifest_id)
    with SmallBlobWriter(n.layout, tree=tree) as w:
        w.add(fa, b"alpha")
        os.unlink(tree / "a.txt")
        os.symlink("/etc/passwd", tree / "a.txt")
        with pytest.raises(StorageError, match="not the 5 bytes written"):
            w.publish()
        assert w.published == [] and w.placed == []
    assert _blob_names(n) == set() and not os.path.lexists(tree / "a.txt")


def test_damaged_snapshot_is_rebuilt_through_the_temp_path(tmp_path: Path) -> None:
    """A snapshot already under its name (not intact, no marker) keeps the .tmp/ temp path for new
    blobs and is rebuilt whole."""
    files = _small_files(SMALL_BATCH_MIN + 4)
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    (n.layout.snapshot(m.manifest_id) / "junk").mkdir(parents=True)
    snap = n.stage(m, c, "1", authorize=allow)
    for p, b in files.items():
        assert (snap / p).read_bytes() == b
    assert not (snap / "junk").exists() and list(n.layout.tmp.iterdir()) == []


def test_read_small_at_checks(tmp_path: Path) -> None:
    from slurm_bt.weights.cache_layout import read_small_at

    (tmp_path / "f").write_bytes(b"hello")
    os.symlink(tmp_path / "f", tmp_path / "l")
    os.mkfifo(tmp_path / "p")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_small_at(fd, "f", 4, "f") == b"hell"
        assert read_small_at(fd, "f", 6, "f") == b"hello"
        with pytest.raises(FileNotFoundError):
            read_small_at(fd, "missing", 6, "missing")
        with pytest.raises(StorageError, match="cannot open"):
            read_small_at(fd, "l", 6, "l")  # O_NOFOLLOW: ELOOP
        with _alarm(10), pytest.raises(StorageError, match="regular file"):
            read_small_at(fd, "p", 6, "p")
    finally:
        os.close(fd)


def test_no_hard_links_falls_back_to_rename_and_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filesystem without hard links (EPERM from link): each tree file is renamed to its blob name
    and the snapshot gets a copy, as the old path did."""
    files = _small_files(20)
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)
    real_link = os.link
    node_root = str(n.root)

    def no_links(src: object, dst: object, *a: object, **k: object) -> None:
        d = k.get("dst_dir_fd")
        where = os.readlink(f"/proc/self/fd/{d}") if isinstance(d, int) else str(dst)
        if where.startswith(node_root) and "/.locks" not in where:  # blobs/ and snapshots/
            raise OSError(errno.EPERM, "Operation not permitted")
        real_link(src, dst, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "link", no_links)
    snap = n.stage(m, c, "1", authorize=allow)
    monkeypatch.undo()
    for f in m.files:
        assert (snap / f.path).read_bytes() == files[f.path]
        assert n.layout.blob(f.sha256).read_bytes() == files[f.path]
    assert list(n.layout.tmp.iterdir()) == []
