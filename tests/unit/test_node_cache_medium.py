"""Node tier, issue 14 item 2: medium blobs (1-128 MiB) published in batches (one syncfs per
MEDIUM_BATCH_BYTES), not an fsync of each blob and of blobs/; safety as for the small-file batch."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from slurm_bt.atomic import syncfs as real_syncfs
from slurm_bt.errors import CacheIntegrityError
from slurm_bt.weights import cache_layout, node_cache
from slurm_bt.weights.node_cache import NodeCache
from tests.unit.test_cache_node import _cluster
from tests.unit.test_cache_support import SyncCounts, allow, fill_cancelled_after, random_bytes

MiB = 1 << 20


def _shards(n: int, mib: int = 2) -> dict[str, bytes]:
    return {f"model-{i:05d}.safetensors": random_bytes(mib * MiB + i, 500 + i) for i in range(n)}


def _blob_names(n: NodeCache) -> set[str]:
    return {p.name for p in n.layout.blobs.iterdir()} if n.layout.blobs.exists() else set()


def test_medium_blobs_share_one_syncfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_cache, "MEDIUM_BATCH_S", 3600.0)  # a slow test machine must not split it
    files = {**_shards(8), "config.json": b"{}"}
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)
    counts = SyncCounts(monkeypatch)
    snap = n.stage(m, c, "1", authorize=allow)
    monkeypatch.undo()
    for p, b in files.items():
        assert (snap / p).read_bytes() == b
        st = (snap / p).stat()
        assert (st.st_mode & 0o777, st.st_nlink) == (0o444, 2)
    assert _blob_names(n) == {f.sha256 for f in m.files}
    assert counts.syncfs == 1, "8 medium blobs (16 MiB) are one batch"
    # the old path: an fsync of each blob and of blobs/ (16 for 8 blobs) on top of ~9 for the rest
    # (config, lease, snapshot, marker: 26 in all); now one of blobs/ for the whole batch
    assert counts.fsync <= 12, f"{counts.fsync} fsyncs for 8 medium blobs"
    assert list(n.layout.tmp.iterdir()) == []


def test_batches_are_bounded_in_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_cache, "MEDIUM_BATCH_BYTES", 5 * MiB)
    monkeypatch.setattr(node_cache, "MEDIUM_BATCH_S", 3600.0)
    c, m = _cluster(tmp_path, _shards(8))
    n = NodeCache(tmp_path / "n", 1 << 30)
    counts = SyncCounts(monkeypatch)
    n.stage(m, c, "1", authorize=allow)
    monkeypatch.undo()
    assert n.is_ready(m)
    assert 3 <= counts.syncfs <= 4, f"{counts.syncfs} syncfs for 16 MiB in batches of >= 5 MiB"


def test_batches_are_bounded_in_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow (rate-capped) node stager makes its progress durable as it goes, not once at the end:
    with a bound of 0 s every blob is its own batch, published as soon as it is copied."""
    monkeypatch.setattr(node_cache, "MEDIUM_BATCH_S", 0.0)
    c, m = _cluster(tmp_path, _shards(5))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.join(m, "1", authorize=allow)
    named: list[int] = []  # blobs already under their name at each syncfs

    def recording_syncfs(fd: int) -> None:
        named.append(len(_blob_names(n)))
        real_syncfs(fd)

    monkeypatch.setattr("slurm_bt.weights.cache_layout.syncfs", recording_syncfs)
    n.fill(m, [c], progress=lambda _n: None)
    monkeypatch.undo()
    assert named == [0, 1, 2, 3, 4]
    assert n.is_ready(m)


def test_mismatching_medium_blob_fails_the_stage_and_nothing_stays(tmp_path: Path) -> None:
    """A corrupt medium blob in a team tier: the stage fails, no blob of it (or of its batch) is
    named, no temp is left; with a right copy in a later tier that one is used."""
    files = _shards(6)
    c, m = _cluster(tmp_path, files)
    bad = m.files[2]
    p = c.layout.blob(bad.sha256)
    os.chmod(p, 0o644)
    p.write_bytes(random_bytes(bad.size, 77))
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(CacheIntegrityError):
        n.stage(m, c, "1", authorize=allow)
    assert _blob_names(n) == set() and list(n.layout.tmp.iterdir()) == []
    assert not n.layout.is_complete(m) and n.leases(m.manifest_id) == []
    good, _ = _cluster(tmp_path, files, name="good")
    snap = n.stage(m, [c, good], "2", authorize=allow)
    assert (snap / bad.path).read_bytes() == files[bad.path]


def test_crash_before_the_medium_syncfs_names_nothing(tmp_path: Path) -> None:
    """kill -9 of the writer when its medium blobs are written but not flushed: no blob has a
    name, the temps are a dead writer's (gc_temp removes them at once), the next stage works."""
    c, m = _cluster(tmp_path, _shards(5))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    pid = os.fork()
    if pid == 0:
        try:
            def crash(_fd: int) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            setattr(cache_layout, "syncfs", crash)  # in this child only
            n.stage(m, c, "1", authorize=allow)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert _blob_names(n) == set() and not n.layout.is_complete(m)
    temps = list(n.layout.tmp.iterdir())
    assert len(temps) == 5 and all(f"blob.{pid}_" in t.name for t in temps)
    assert all(t.stat().st_mode & 0o777 == 0o444 for t in temps)  # sealed before the flush
    assert len(n.gc_temp()) == 5
    n.stage(m, c, "2", authorize=allow)
    assert n.is_ready(m)


def test_cancelled_fill_removes_unpublished_medium_temps(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, _shards(6))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.join(m, "1", authorize=allow)
    fill_cancelled_after(n, m, c, 4)
    assert _blob_names(n) == set() and list(n.layout.tmp.iterdir()) == []
    n.fill(m, [c])
    assert n.is_ready(m)
