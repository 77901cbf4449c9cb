"""Node tier, issue 14 item 2: small blobs published in batches (one syncfs), and the hashed copy of
big blobs hashing exactly what it wrote, even when the source changes under it."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import pytest

from slurm_bt.atomic import syncfs as real_syncfs
from slurm_bt.errors import CacheFullError, CacheIntegrityError, StorageError
from slurm_bt.weights import cache_layout, node_cache
from slurm_bt.weights.cache_layout import SmallBlobWriter, copy_and_hash, hash_prefix
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.node_cache import SMALL_BATCH_MIN, NodeCache
from tests.unit.test_cache_node import _cluster, _tmpfs
from tests.unit.test_cache_support import SyncCounts, allow, fill_cancelled_after, make_manifest, random_bytes

MiB = 1 << 20


def _small_files(n: int, size: int = 4096, seed: int = 0) -> dict[str, bytes]:
    """``n`` distinct small files over several folders (a tokenizer/vocab tree)."""
    return {f"vocab/{i // 10:03d}/{i:05d}.txt": random_bytes(size, seed * 100_000 + i) for i in range(n)}


def _blob_names(n: NodeCache) -> set[str]:
    return {p.name for p in n.layout.blobs.iterdir()}


def _corrupt(c: ClusterCache, sha: str, data: bytes) -> None:
    p = c.layout.blob(sha)
    os.chmod(p, 0o644)
    p.write_bytes(data)


class _Count:
    def __init__(self) -> None:
        self.n = 0


def test_small_blobs_share_one_syncfs_and_no_per_file_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {**_small_files(60), "model.safetensors": random_bytes(3 * MiB, 7)}
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)
    counts = SyncCounts(monkeypatch)
    snap = n.stage(m, c, "1", authorize=allow)
    for p, b in files.items():
        assert (snap / p).read_bytes() == b
        assert (snap / p).stat().st_mode & 0o777 == 0o444
        assert (snap / p).stat().st_nlink == 2  # the snapshot file is the blob (hard link)
    assert _blob_names(n) == {f.sha256 for f in m.files}
    # one syncfs for the 60 small blobs; the snapshot (7 dirs) is fsynced dir by dir
    assert 1 <= counts.syncfs <= 2
    assert counts.fsync < 20, f"{counts.fsync} fsyncs for 60 small blobs: the batch should need a handful"
    assert list(n.layout.tmp.iterdir()) == []


@pytest.mark.parametrize("kind", ["small", "medium"])
def test_few_blobs_keep_the_per_blob_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Below ``SMALL_BATCH_MIN`` small / ``MEDIUM_BATCH_MIN`` medium blobs no syncfs: it would flush
    every other writer's dirty pages too."""
    from slurm_bt.weights.node_cache import MEDIUM_BATCH_MIN
    from tests.unit.test_node_cache_medium import _shards

    files = _small_files(SMALL_BATCH_MIN - 1) if kind == "small" else _shards(MEDIUM_BATCH_MIN - 1)
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)

    def no_syncfs(fd: int) -> None:
        raise AssertionError("syncfs for a handful of blobs")

    monkeypatch.setattr("slurm_bt.weights.cache_layout.syncfs", no_syncfs)
    n.stage(m, c, "1", authorize=allow)
    assert n.is_ready(m)


@pytest.mark.parametrize("when", ["before the syncfs", "after the syncfs, before any rename"])
def test_crash_between_write_and_rename_leaves_no_blob_under_its_name(tmp_path: Path, when: str) -> None:
    """kill -9 of the writer with every small blob written (into the snapshot's temp tree): nothing
    is under a final name (no blob, no snapshot, no marker), the tree is a dead writer's debris that
    gc_temp removes at once, and the next stage publishes everything."""
    c, m = _cluster(tmp_path, _small_files(40))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    pid = os.fork()
    if pid == 0:  # the writer: dies where the test says, with SIGKILL (no cleanup runs)
        try:
            def crash(fd: int) -> None:
                if when.startswith("after"):
                    real_syncfs(fd)
                os.kill(os.getpid(), signal.SIGKILL)

            setattr(cache_layout, "syncfs", crash)  # in this child only
            n.stage(m, c, "1", authorize=allow)
        finally:
            os._exit(3)  # never reached after SIGKILL; a stage that did not crash fails the test
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert _blob_names(n) == set()
    assert not n.layout.snapshot(m.manifest_id).exists() and not n.layout.is_complete(m)
    assert list(n.layout.tmp.iterdir()) == []
    trees = list(n.layout.snapshots.iterdir())  # the files were written into the snapshot's temp tree
    assert len(trees) == 1 and trees[0].name.startswith(f".{m.manifest_id}.snap.{pid}_")
    assert sum(1 for p in trees[0].rglob("*") if p.is_file()) == 40
    assert n.gc_temp() == trees  # the writer is provably dead: its tree goes at once
    n.stage(m, c, "2", authorize=allow)
    assert n.is_ready(m) and _blob_names(n) == {f.sha256 for f in m.files}


def test_mismatching_small_blob_is_rejected_and_nothing_of_it_published(tmp_path: Path) -> None:
    files = _small_files(40)
    c, m = _cluster(tmp_path, files)
    bad = m.files[17]
    _corrupt(c, bad.sha256, random_bytes(bad.size, 999))  # same size, other bytes
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(CacheIntegrityError) as ei:
        n.stage(m, c, "1", authorize=allow)
    assert ei.value.expected_sha256 == bad.sha256 and ei.value.actual_sha256 != bad.sha256
    assert _blob_names(n) == set()  # neither the bad blob nor the batch it was in
    assert list(n.layout.tmp.iterdir()) == []
    assert not n.layout.snapshot(m.manifest_id).exists() and n.leases(m.manifest_id) == []


def test_mismatching_small_blob_is_taken_from_the_next_tier(tmp_path: Path) -> None:
    files = _small_files(30)
    shared, m = _cluster(tmp_path, files, name="shared")
    team, _ = _cluster(tmp_path, files, name="team")
    bad = m.files[3]
    _corrupt(shared, bad.sha256, random_bytes(bad.size + 1, 5))  # wrong size in the first tier
    n = NodeCache(tmp_path / "n", 1 << 30)
    snap = n.stage(m, [shared, team], "1", authorize=allow)
    assert (snap / bad.path).read_bytes() == files[bad.path]


def test_trusted_tier_small_blob_of_wrong_size_is_rejected(tmp_path: Path) -> None:
    """A trusted (shared) tier skips the hash, never the size check."""
    c, m = _cluster(tmp_path, _small_files(20))
    bad = m.files[0]
    _corrupt(c, bad.sha256, b"short")
    trusted = ClusterCache(c.root, trusted_copy=True)
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(CacheIntegrityError):
        n.stage(m, trusted, "1", authorize=allow)
    assert _blob_names(n) == set()


@pytest.mark.parametrize("kind", ["small", "medium"])
def test_syncfs_failure_is_an_error_and_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          kind: str) -> None:
    from tests.unit.test_node_cache_medium import _shards

    c, m = _cluster(tmp_path, _small_files(40) if kind == "small" else _shards(5))
    n = NodeCache(tmp_path / "n", 1 << 30)

    def failing(fd: int) -> None:
        raise StorageError(f"/proc/self/fd/{fd}", "syncfs failed: Input/output error")

    monkeypatch.setattr("slurm_bt.weights.cache_layout.syncfs", failing)
    with pytest.raises(StorageError, match="syncfs failed"):
        n.stage(m, c, "1", authorize=allow)
    assert _blob_names(n) == set()
    assert list(n.layout.tmp.iterdir()) == []
    assert not n.layout.is_complete(m) and n.leases(m.manifest_id) == []


def test_disk_full_in_a_batch_is_cache_full_and_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _small_files(40, size=64 << 10)  # 2.5 MiB on a 1 MiB disk
    c, m = _cluster(tmp_path, files)
    with _tmpfs(tmp_path / "nvme", "1m") as nvme:
        n = NodeCache(nvme / "cache", 1 << 40)
        monkeypatch.setattr(NodeCache, "_fs_free", lambda self: 1 << 40)  # a lying statvfs (thin disk)
        with pytest.raises(CacheFullError, match=r"disk filled while writing vocab/"):
            n.stage(m, c, "1", authorize=allow)
        assert _blob_names(n) == set() and list(n.layout.tmp.iterdir()) == []


def test_second_batch_failure_rolls_back_the_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blobs an earlier batch of the same stage published are removed when a later one fails."""
    monkeypatch.setattr(node_cache, "SMALL_BATCH_FILES", 20)
    files = _small_files(50)
    c, m = _cluster(tmp_path, files)
    _corrupt(c, m.files[45].sha256, random_bytes(4096, 12345))
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(CacheIntegrityError):
        n.stage(m, c, "1", authorize=allow)
    assert _blob_names(n) == set()


def test_cancelled_batch_leaves_no_temp_and_keeps_published_batches(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The node stager's cancellation (progress raises) mid-batch: earlier batches stay published
    (verified, durable: the next job resumes with them), the current batch's temps go."""
    monkeypatch.setattr(node_cache, "SMALL_BATCH_FILES", 20)
    c, m = _cluster(tmp_path, _small_files(50))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.join(m, "1", authorize=allow)
    fill_cancelled_after(n, m, c, 30)
    assert len(_blob_names(n)) == 20 and list(n.layout.tmp.iterdir()) == []
    assert list(n.layout.snapshots.iterdir()) == []  # the batch's temp snapshot tree went too
    assert n.missing_bytes(m) == 30 * 4096
    n.fill(m, [c])
    assert n.is_ready(m) and sorted(p.name for p in n.layout.snapshots.iterdir()) == [m.manifest_id]


@pytest.mark.parametrize("kind", ["small", "medium"])
def test_group_sealed_batched_blobs(tmp_path: Path, kind: str) -> None:
    """Credentialed entries (private/<team>): batched small and medium blobs are 0440 with the team's group too."""
    from slurm_bt.weights.node_cache import NodeAudience
    from tests.unit.test_node_cache_medium import _shards

    c, m = _cluster(tmp_path, _small_files(20) if kind == "small" else _shards(4))
    gid = 4242
    n = NodeCache(tmp_path / "n", 1 << 30, audience=NodeAudience("team-a", gid))
    snap = n.stage(m, c, "1", authorize=allow)
    for f in m.files:
        st = (snap / f.path).stat()
        assert (st.st_mode & 0o777, st.st_gid) == (0o440, gid)


def test_writer_unit_refuses_bad_bytes_and_cleans_up(tmp_path: Path) -> None:
    m = make_manifest({"a.txt": b"alpha", "b.txt": b"beta"})
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    fa, fb = m.files
    with SmallBlobWriter(n.layout) as w:
        w.add(fa, b"alpha")
        with pytest.raises(CacheIntegrityError):
            w.add(fb, b"BETA")
        assert len(w) == 1 and len(list(n.layout.tmp.iterdir())) == 1
    assert list(n.layout.tmp.iterdir()) == [] and _blob_names(n) == set()  # closed unpublished
    with SmallBlobWriter(n.layout) as w:
        w.add(fa, b"alpha")
        w.add(fb, b"beta")
        assert w.publish() == [fa.sha256, fb.sha256]
    with SmallBlobWriter(n.layout) as w:  # already there: kept, not replaced, temp dropped
        w.add(fa, b"alpha")
        ino = n.layout.blob(fa.sha256).stat().st_ino
        assert w.publish() == []
    assert n.layout.blob(fa.sha256).stat().st_ino == ino and list(n.layout.tmp.iterdir()) == []


# -- the hashed copy of big blobs ---------------------------------------------------------------------------


def test_hash_is_of_what_was_written_when_the_source_is_rewritten_mid_copy(tmp_path: Path) -> None:
    """A tenant rewrites the (team-tier) source between our chunks: the digest returned must be
    the digest of the destination's bytes, whatever mix of old and new bytes those are, so the
    manifest check that follows can only accept bytes that are really on the node."""
    size = 8 * MiB
    src_path, dst_path = tmp_path / "src", tmp_path / "dst"
    original = random_bytes(size, 1)
    src_path.write_bytes(original)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(dst_path, os.O_RDWR | os.O_CREAT, 0o600)
    calls = _Count()

    def tenant_rewrites(_n: int) -> None:
        calls.n += 1
        if calls.n == 1:
            with open(src_path, "r+b") as fh:  # same inode, new content
                fh.write(random_bytes(size, 2))

    try:
        digest, n = copy_and_hash(src, dst, size, chunk_bytes=1 * MiB, progress=tenant_rewrites)
    finally:
        os.close(src)
        os.close(dst)
    written = dst_path.read_bytes()
    assert n == size and calls.n >= 2
    assert digest == hashlib.sha256(written).hexdigest()
    assert written != original  # the rewrite did land in the copy: the manifest check will catch it
    assert digest != hashlib.sha256(original).hexdigest()


def test_copy_and_hash_resume_and_short_source(tmp_path: Path) -> None:
    size = 5 * MiB + 123
    data = random_bytes(size, 3)
    (tmp_path / "src").write_bytes(data)
    src = os.open(tmp_path / "src", os.O_RDONLY)
    dst = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        digest, n = copy_and_hash(src, dst, 2 * MiB, chunk_bytes=1 * MiB)  # a first, partial copy
        assert n == 2 * MiB and digest == hashlib.sha256(data[: 2 * MiB]).hexdigest()
        digest, n = copy_and_hash(src, dst, size, chunk_bytes=1 * MiB, start=2 * MiB,
                                  hasher=hash_prefix(dst, 2 * MiB))
        assert (digest, n) == (hashlib.sha256(data).hexdigest(), size)
        os.truncate(tmp_path / "src", 3 * MiB)  # the source shrank: a short count, never a hang
        digest, n = copy_and_hash(src, dst, size, chunk_bytes=1 * MiB)
        assert n == 3 * MiB
    finally:
        os.close(src)
        os.close(dst)
