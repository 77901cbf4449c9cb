"""Node tier: verified staging, fast hits, leases, LRU eviction, disk full, authorization."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.errors import CacheFullError, CacheIntegrityError, StorageError
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_cache import NodeCache
from tests.unit.test_cache_support import DirFetcher, allow, deny, make_manifest, random_bytes, write_origin

MiB = 1 << 20


def _cluster(tmp_path: Path, files: dict[str, bytes], name: str = "c") -> tuple[ClusterCache, Manifest]:
    origin = tmp_path / f"origin-{name}-{len(files)}-{os.urandom(3).hex()}"
    write_origin(origin, files)
    c = ClusterCache(tmp_path / name)
    m = make_manifest(files, source=f"hf://org/{origin.name}")
    c.ensure(m, DirFetcher(origin), authorize=allow)
    return c, m


def _model(seed: int, mib: int = 1) -> dict[str, bytes]:
    return {"config.json": f'{{"seed": {seed}}}'.encode(), "model.safetensors": random_bytes(mib * MiB, seed)}


def test_stage_copies_verifies_and_hits_fast(tmp_path: Path) -> None:
    files = {"config.json": b"{}", "model-1.safetensors": random_bytes(40 * MiB, 1),
             "model-2.safetensors": random_bytes(40 * MiB, 2), "a/b/c.txt": b"deep"}
    c, m = _cluster(tmp_path, files)
    n = NodeCache(tmp_path / "n", 1 << 30)
    snap = n.stage(m, c, "100", authorize=allow)
    for p, b in files.items():
        assert (snap / p).read_bytes() == b
    assert (snap / "model-1.safetensors").stat().st_mode & 0o777 == 0o444
    assert (snap / "a").stat().st_mode & 0o777 == 0o555
    assert n.leases(m.manifest_id) == ["100"]
    best = min(_timed(lambda i=i: n.stage(m, c, f"20{i}", authorize=allow)) for i in range(5))
    assert best < 0.1, f"hit took {best:.3f} s"
    assert n.leases(m.manifest_id) == ["100", "200", "201", "202", "203", "204"]
    assert list(n.layout.tmp.iterdir()) == []


def _timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def test_hit_does_not_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = _cluster(tmp_path, _model(1))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.stage(m, c, "1", authorize=allow)
    from slurm_bt.storage import checksums
    from slurm_bt.weights import cache_layout, node_cache

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("blob hashing or copying on the hit path")

    for mod, name in [(cache_layout, "copy_and_hash"), (checksums, "sha256_fd"), (node_cache, "copy_and_hash")]:
        monkeypatch.setattr(mod, name, boom)
    n.stage(m, c, "2", authorize=allow)


def test_unauthorized_hit_gets_nothing(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, _model(1))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.stage(m, c, "alice1", authorize=allow)
    with pytest.raises(PermissionError, match="not authorized"):
        n.stage(m, c, "bob1", authorize=deny)
    assert n.leases(m.manifest_id) == ["alice1"]


def test_corrupt_cluster_blob_is_detected_and_not_served(tmp_path: Path) -> None:
    files = _model(3, 2)
    c, m = _cluster(tmp_path, files)
    f = next(x for x in m.files if x.path == "model.safetensors")
    blob = c.layout.blob(f.sha256)
    blob.chmod(0o644)
    with open(blob, "r+b") as fh:  # a tenant flips one byte in place, same length
        fh.seek(MiB)
        b = fh.read(1)
        fh.seek(MiB)
        fh.write(bytes([b[0] ^ 1]))
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(CacheIntegrityError) as ei:
        n.stage(m, c, "7", authorize=allow)
    assert ei.value.expected_sha256 == f.sha256
    assert not n.is_ready(m) and not n.layout.blob(f.sha256).exists()
    assert n.leases(m.manifest_id) == [] and list(n.layout.tmp.iterdir()) == []
    assert not n.layout.snapshot(m.manifest_id).exists()
    # a clean copy in another tier (e.g. the admin-curated shared tier) is used instead
    shared, _ = _cluster(tmp_path, files, name="shared")
    snap = n.stage(m, [c, shared], "8", authorize=allow)
    assert (snap / "model.safetensors").read_bytes() == files["model.safetensors"]


def test_blob_missing_everywhere(tmp_path: Path) -> None:
    c, _ = _cluster(tmp_path, _model(1))
    other = make_manifest(_model(2))
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(StorageError, match="in no cluster cache"):
        n.stage(other, c, "1", authorize=allow)
    assert n.leases(other.manifest_id) == []


def test_symlink_or_fifo_at_cluster_blob_is_refused(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, _model(1))
    f = next(x for x in m.files if x.path == "model.safetensors")
    blob = c.layout.blob(f.sha256)
    blob.unlink()
    os.mkfifo(blob)
    n = NodeCache(tmp_path / "n", 1 << 30)
    with pytest.raises(StorageError, match="not a regular file"):
        n.stage(m, c, "1", authorize=allow)
    blob.unlink()
    blob.symlink_to("/etc/passwd")
    with pytest.raises(StorageError):
        n.stage(m, c, "1", authorize=allow)


def _set_last_used(n: NodeCache, m: Manifest, t: float) -> None:
    os.utime(n.layout.leases / m.manifest_id, (t, t))


def test_lru_eviction_respects_leases_and_shared_blobs(tmp_path: Path) -> None:
    shared_blob = random_bytes(MiB, 99)
    models = [{**_model(i), "shared.bin": shared_blob} for i in range(4)]
    n = NodeCache(tmp_path / "n", 1 << 30)
    ms = []
    for i, files in enumerate(models):
        c, m = _cluster(tmp_path, files, name=f"c{i}")
        n.stage(m, c, f"{i}", authorize=allow)
        ms.append(m)
    for i in (0, 1, 2):
        n.release(str(i))
    for i, m in enumerate(ms):
        _set_last_used(n, m, 1000.0 + i)  # m0 oldest ... m3 newest (and leased)
    usage = n.usage_bytes()
    assert usage == 5 * MiB + sum(len(f"{{\"seed\": {i}}}") for i in range(4))
    plan = n.plan_eviction(usage - MiB)  # free one model: the oldest
    assert plan.manifests == (ms[0].manifest_id,) and plan.satisfied
    assert plan.bytes_freed >= MiB and make_manifest({"s": shared_blob}).files[0].sha256 not in plan.blobs
    assert any("evict entry" in line for line in plan.describe())
    assert n.is_ready(ms[0])  # planning changed nothing
    res = n.execute(plan)
    assert res.manifests == (ms[0].manifest_id,) and res.bytes_freed == plan.bytes_freed
    assert not n.is_ready(ms[0]) and not n.layout.snapshot(ms[0].manifest_id).exists()
    assert all(n.is_ready(m) for m in ms[1:])
    # evict everything possible: the leased m3 and the blob it shares stay
    plan = n.plan_eviction(0)
    assert ms[3].manifest_id not in plan.manifests and not plan.satisfied
    n.execute(plan)
    assert n.is_ready(ms[3]) and (n.snapshot_path(ms[3]) / "shared.bin").read_bytes() == shared_blob
    assert [e.manifest_id for e in n.entries()] == [ms[3].manifest_id]


def test_lease_taken_after_planning_is_honoured(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, _model(1))
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.stage(m, c, "1", authorize=allow)
    n.release("1")
    plan = n.plan_eviction(0)
    assert plan.manifests == (m.manifest_id,)
    n.stage(m, c, "2", authorize=allow)  # a job leases it between plan and execute
    res = n.execute(plan)
    assert res.skipped == (m.manifest_id,) and res.manifests == () and res.bytes_freed == 0
    assert n.is_ready(m)


def test_stage_evicts_lru_to_stay_under_max_bytes(tmp_path: Path) -> None:
    n = NodeCache(tmp_path / "n", int(2.5 * MiB))
    ms = []
    for i in range(3):
        c, m = _cluster(tmp_path, _model(i), name=f"c{i}")
        n.stage(m, c, f"{i}", authorize=allow)
        n.release(f"{i}")
        _set_last_used(n, m, 1000.0 + i)
        ms.append(m)
    assert not n.is_ready(ms[0]) and n.is_ready(ms[1]) and n.is_ready(ms[2])
    assert n.usage_bytes() <= 2.5 * MiB


def test_preflight_refuses_and_leaves_cache_intact(tmp_path: Path) -> None:
    n = NodeCache(tmp_path / "n", 2 * MiB + 100)
    c0, m0 = _cluster(tmp_path, _model(0), name="c0")
    n.stage(m0, c0, "0", authorize=allow)  # leased: cannot be evicted
    c1, m1 = _cluster(tmp_path, _model(1, 2), name="c1")
    before = sorted(p.relative_to(n.root) for p in n.root.rglob("*") if ".locks" not in p.parts)
    with pytest.raises(CacheFullError) as ei:
        n.stage(m1, c1, "1", authorize=allow)
    assert ei.value.need_bytes == m1.total_bytes
    assert f"need {m1.total_bytes} bytes, free" in str(ei.value) and "node cache full" in str(ei.value)
    after = sorted(p.relative_to(n.root) for p in n.root.rglob("*") if ".locks" not in p.parts)
    assert after == before and n.is_ready(m0)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {r.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_disk_full_preflight_on_small_tmpfs(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, _model(1, 2))
    with _tmpfs(tmp_path / "nvme", "1m") as nvme:
        n = NodeCache(nvme / "cache", 1 << 40)
        with pytest.raises(CacheFullError) as ei:
            n.stage(m, c, "1", authorize=allow)
        assert ei.value.need_bytes == m.total_bytes and ei.value.free_bytes < MiB
        assert list(n.layout.blobs.iterdir()) == [] and list(n.layout.tmp.iterdir()) == []


def test_default_cap_is_ninety_percent_of_the_filesystem(tmp_path: Path) -> None:
    """``max_bytes`` 0 (the site default) caps at 90% of the disk: here 3.6 of 4 MiB, so a second
    2 MiB entry evicts the first even though the disk itself would still have room for it."""
    with _tmpfs(tmp_path / "nvme", "4m") as nvme:
        n = NodeCache(nvme / "cache", 0)
        c0, m0 = _cluster(tmp_path, _model(0, 2), name="c0")
        n.stage(m0, c0, "0", authorize=allow)
        n.release("0")
        assert n.cap_bytes() == int(4 * MiB * 0.9)
        c1, m1 = _cluster(tmp_path, _model(1, 2), name="c1")
        n.stage(m1, c1, "1", authorize=allow)
        assert n.is_ready(m1) and not n.is_ready(m0) and n.usage_bytes() <= n.cap_bytes()


def test_enospc_mid_write_removes_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c, m = _cluster(tmp_path, {"small.json": b"{}", "big.bin": random_bytes(3 * MiB, 5)})
    with _tmpfs(tmp_path / "nvme", "2m") as nvme:
        n = NodeCache(nvme / "cache", 1 << 40, copy_workers=1)
        monkeypatch.setattr(NodeCache, "_fs_free", lambda self: 1 << 40)  # a lying statvfs (thin disk)
        monkeypatch.setattr(os, "posix_fallocate", lambda fd, off, n: None)
        with pytest.raises(CacheFullError, match=r"disk filled while writing big\.bin"):
            n.stage(m, c, "1", authorize=allow)
        assert list(n.layout.tmp.iterdir()) == []
        assert list(n.layout.blobs.iterdir()) == []  # blobs this stage published are rolled back
        assert list(n.layout.manifests.iterdir()) == [] and n.leases(m.manifest_id) == []


def test_release_prune_and_validation(tmp_path: Path) -> None:
    c, m = _cluster(tmp_path, _model(1))
    n = NodeCache(tmp_path / "n", 1 << 30)
    for j in ("1", "2", "3"):
        n.stage(m, c, j, authorize=allow)
    assert n.release("1") == [m.manifest_id]
    assert n.release("1") == []  # idempotent
    assert n.prune_leases(active_job_ids={"3"}) == [(m.manifest_id, "2")]
    assert n.leases(m.manifest_id) == ["3"]
    with pytest.raises(ValueError):
        n.stage(m, c, "../etc", authorize=allow)


def test_gc_removes_dead_writers_temp(tmp_path: Path) -> None:
    n = NodeCache(tmp_path / "n", 1 << 30)
    n.layout.ensure()
    p = subprocess.run(["python3", "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    dead = n.layout.tmp / f"blob.{int(p.stdout)}.abcdef@{socket.gethostname()}"
    dead.write_bytes(b"partial")
    live = n.layout.tmp / f"blob.{os.getpid()}.abcdef@{socket.gethostname()}"
    live.write_bytes(b"in flight")
    assert n.gc_temp() == [dead]
    assert live.exists()


def test_epilog_lru_prunes_a_crashed_jobs_lease_then_evicts_its_entry(tmp_path: Path) -> None:
    """A job whose epilog never ran (node crash: no note of it is left on the host) keeps no entry for
    ever: the next epilog's LRU pass drops its lease, then evicts the entry; a running job's lease
    (its note is there) and a young lease without a note (a race, not a crash) stay."""
    from slurm_bt.site.settings import SiteSettings
    from slurm_bt.weights.node_stage import LEASE_PRUNE_MIN_AGE_S, epilog_enforce_lru

    c, crashed = _cluster(tmp_path, _model(11))
    _, running = _cluster(tmp_path, _model(12), name="c2")
    _, young = _cluster(tmp_path, _model(13), name="c3")
    root = tmp_path / "node" / "n7" / "weights"
    root.parent.mkdir(parents=True)
    n = NodeCache(root, 1 << 30)
    n.stage(crashed, c, "77", authorize=allow)
    n.stage(running, ClusterCache(tmp_path / "c2"), "78", authorize=allow)
    n.stage(young, ClusterCache(tmp_path / "c3"), "79", authorize=allow)
    old = time.time() - LEASE_PRUNE_MIN_AGE_S - 60
    for m, job in ((crashed, "77"), (running, "78")):
        os.utime(n.layout.leases / m.manifest_id / job, (old, old))
    state = tmp_path / "run"
    (state / "n7" / "jobs" / "78").mkdir(parents=True)  # job 78 runs on this host; 77 and 79 have no note
    site = SiteSettings.model_validate({
        "storage": {"node_cache": str(tmp_path / "node" / "%n" / "weights")},
        "weights": {"node_cache_max_bytes": 3 * MiB, "node_cache_reserve_bytes": 0}})
    environ = {"SLURM_JOB_ID": "90", "SLURM_JOB_UID": str(os.getuid()), "SLURMD_NODENAME": "n7"}

    pruned = epilog_enforce_lru(environ, 30.0, site, state_root=str(state))

    assert pruned == [(crashed.manifest_id, "77")]
    assert n.leases(crashed.manifest_id) == [] and not n.is_ready(crashed)  # evicted: over the cap, lease-free
    assert n.leases(running.manifest_id) == ["78"] and n.is_ready(running)
    assert n.leases(young.manifest_id) == ["79"] and n.is_ready(young)
