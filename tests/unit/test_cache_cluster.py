"""Cluster tier: verified publish, single-flight ensure (flock on/off/none), kill -9 recovery, authorization."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_bt.errors import CacheIntegrityError, StorageError
from slurm_bt.storage.checksums import sha256_fd
from slurm_bt.weights.cache_layout import CACHEDIR_TAG
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.locks import LockOptions
from slurm_bt.weights.manifest import Manifest
from tests.unit.test_cache_support import DirFetcher, allow, deny, make_manifest, random_bytes, write_origin

FILES = {
    "config.json": b'{"a": 1}',
    "model-00001-of-00002.safetensors": random_bytes(3 << 20, 1),
    "model-00002-of-00002.safetensors": random_bytes(2 << 20, 2),
    "tok/vocab.json": random_bytes(5000, 3),
    "copy/config.json": b'{"a": 1}',  # same content at two paths: one blob
}


def _assert_entry_ok(cache: ClusterCache, files: dict[str, bytes]) -> None:
    m = make_manifest(files)
    assert cache.has(m)
    snap = cache.snapshot_path(m)
    for p, b in files.items():
        assert (snap / p).read_bytes() == b
        assert (snap / p).stat().st_mode & 0o777 == 0o444
    for blob in cache.layout.blobs.iterdir():
        fd = os.open(blob, os.O_RDONLY)
        try:
            assert sha256_fd(fd)[0] == blob.name
        finally:
            os.close(fd)
    assert list(cache.layout.tmp.iterdir()) == []
    assert not [p for p in cache.layout.snapshots.iterdir() if p.name.startswith(".")]


def test_layout_and_hardlinked_snapshot(tmp_path: Path) -> None:
    write_origin(tmp_path / "origin", FILES)
    c = ClusterCache(tmp_path / "c")
    m = make_manifest(FILES)
    snap = c.ensure(m, DirFetcher(tmp_path / "origin"), authorize=allow)
    assert snap == c.layout.snapshots / m.manifest_id
    assert (c.root / "CACHEDIR.TAG").read_bytes() == CACHEDIR_TAG
    assert (c.layout.manifests / f"{m.manifest_id}.json").read_bytes() == m.canonical_json()
    f = next(x for x in m.files if x.path.endswith("00001-of-00002.safetensors"))
    assert os.stat(snap / f.path).st_ino == os.stat(c.layout.blob(f.sha256)).st_ino
    assert len(list(c.layout.blobs.iterdir())) == 4
    _assert_entry_ok(c, FILES)
    info = c.inspect(m.manifest_id)
    assert info is not None and info.files == 5 and info.source == "hf://org/model"
    st = c.stat()
    assert st.blobs == 4 and st.temp_entries == 0 and [e.manifest_id for e in st.entries] == [m.manifest_id]


def test_authorize_runs_on_hit_and_blocks(tmp_path: Path) -> None:
    write_origin(tmp_path / "origin", FILES)
    c = ClusterCache(tmp_path / "c")
    m = make_manifest(FILES)
    c.ensure(m, DirFetcher(tmp_path / "origin"), authorize=allow)
    calls: list[str] = []

    def recording_deny(mm: Manifest) -> None:
        calls.append(mm.source)
        deny(mm)

    with pytest.raises(PermissionError, match="not authorized for hf://org/model"):
        c.ensure(m, DirFetcher(tmp_path / "origin"), authorize=recording_deny)
    assert calls == ["hf://org/model"]
    # and on a miss nothing is fetched for an unauthorized user
    c2 = ClusterCache(tmp_path / "c2")
    with pytest.raises(PermissionError):
        c2.ensure(m, DirFetcher(tmp_path / "origin", log_dir=tmp_path), authorize=deny)
    assert not c2.root.exists() or not any(c2.layout.blobs.iterdir())


def test_corrupt_download_is_never_published(tmp_path: Path) -> None:
    write_origin(tmp_path / "origin", FILES)
    c = ClusterCache(tmp_path / "c")
    m = make_manifest(FILES)
    with pytest.raises(CacheIntegrityError) as ei:
        c.ensure(m, DirFetcher(tmp_path / "origin", corrupt=True), authorize=allow)
    assert ei.value.expected_sha256 != ei.value.actual_sha256
    assert ei.value.expected_sha256 in str(ei.value) and ei.value.actual_sha256 in str(ei.value)
    assert not c.has(m) and list(c.layout.blobs.iterdir()) == [] and list(c.layout.tmp.iterdir()) == []


def test_publish_blob_rejects_wrong_size_and_keeps_existing(tmp_path: Path) -> None:
    c = ClusterCache(tmp_path / "c")
    c.layout.ensure()
    data = random_bytes(1000, 9)
    m = make_manifest({"x": data})
    f = m.files[0]
    t = c.layout.tmp / "t1"
    t.write_bytes(data + b"!")
    with pytest.raises(CacheIntegrityError):
        c.publish_blob(t, f.sha256, f.size)
    assert not t.exists()
    t.write_bytes(data)
    assert c.publish_blob(t, f.sha256, f.size).read_bytes() == data
    with pytest.raises(StorageError, match="missing"):
        c.add_manifest(make_manifest({"y": b"other"}))


def test_manifest_whose_content_does_not_match_its_name_is_ignored(tmp_path: Path) -> None:
    write_origin(tmp_path / "origin", FILES)
    c = ClusterCache(tmp_path / "c")
    m = make_manifest(FILES)
    c.ensure(m, DirFetcher(tmp_path / "origin"), authorize=allow)
    other = make_manifest({"evil.bin": b"x"}, source="hf://mallory/evil")
    mf = c.layout.manifest_file(m.manifest_id)
    mf.chmod(0o644)
    mf.write_bytes(other.canonical_json())  # a tenant swaps the marker's content
    assert not c.has(m)
    assert c.layout.read_manifest(m.manifest_id) is None
    assert c.entries() == []


def _ensure_worker(root: str, origin: str, log_dir: str, mode: str, out: str) -> None:
    opts = {
        "flock": LockOptions(timeout_s=60, poll_s=0.005),
        "noflock": LockOptions(use_flock=False, timeout_s=60, poll_s=0.005),
        "nolocks": LockOptions(use_flock=False, use_lockfile=False),
    }[mode]
    c = ClusterCache(Path(root), lock_options=opts)
    try:
        snap = c.ensure(make_manifest(FILES), DirFetcher(Path(origin), Path(log_dir)), authorize=allow)
        Path(out).write_text(str(snap))
    except BaseException as exc:  # report to the parent
        Path(out).write_text(f"ERROR {exc!r}")
        raise


@pytest.mark.parametrize("mode", ["flock", "noflock", "nolocks"])
def test_16_concurrent_ensure(tmp_path: Path, mode: str) -> None:
    write_origin(tmp_path / "origin", FILES)
    log_dir = tmp_path / "fetches"
    log_dir.mkdir()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_ensure_worker, args=(str(tmp_path / "c"), str(tmp_path / "origin"), str(log_dir),
                                                      mode, str(tmp_path / f"out{i}")))
             for i in range(16)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outs = {(tmp_path / f"out{i}").read_text() for i in range(16)}
    assert all(p.exitcode == 0 for p in procs), outs
    m = make_manifest(FILES)
    assert outs == {str(tmp_path / "c" / "snapshots" / m.manifest_id)}
    c = ClusterCache(tmp_path / "c")
    _assert_entry_ok(c, FILES)
    fetches = [p.name.split(".")[0] for p in log_dir.iterdir()]
    if mode != "nolocks":  # locks work (flock, or the O_EXCL lock file alone): one fetch per blob
        assert sorted(fetches) == sorted({f.sha256 for f in m.files})
    else:  # no locks at all: duplicates allowed, corruption not
        assert set(fetches) == {f.sha256 for f in m.files}


_SLOW_PUBLISHER = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, random_bytes
from tests.unit.test_cache_cluster import FILES
from slurm_bt.weights.cluster_cache import ClusterCache

class Slow(DirFetcher):
    def __call__(self, f, tmp_dir):
        dst = tmp_dir / "download"
        with open(dst, "wb") as out:
            data = (self.origin / f.path).read_bytes()
            out.write(data[: len(data) // 2]); out.flush()
            print("HALF", flush=True)
            time.sleep(60)
            out.write(data[len(data) // 2 :])
        return dst

ClusterCache(Path({root!r})).ensure(make_manifest(FILES), Slow(Path({origin!r})), authorize=allow)
"""


def test_kill_9_mid_write_then_rerun(tmp_path: Path) -> None:
    write_origin(tmp_path / "origin", FILES)
    root = tmp_path / "c"
    repo = str(Path(__file__).resolve().parents[2])
    code = _SLOW_PUBLISHER.format(repo=repo, root=str(root), origin=str(tmp_path / "origin"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=repo)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "HALF"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    c = ClusterCache(root, lock_options=LockOptions(timeout_s=10))
    m = make_manifest(FILES)
    assert not c.has(m)
    assert list(c.layout.blobs.iterdir()) == []  # nothing at a final path
    leftovers = list(c.layout.tmp.iterdir())
    assert leftovers  # the killed writer's temp dir
    t = time.monotonic()
    c.ensure(m, DirFetcher(tmp_path / "origin"), authorize=allow)  # dead holder's lock is broken at once
    assert time.monotonic() - t < 5
    assert sorted(c.gc_temp()) == sorted(leftovers)
    _assert_entry_ok(c, FILES)


def test_manifest_id_is_computed_once_and_copies_recompute_it() -> None:
    """A node hit asks for the id several times; at 10,000 files each serialisation costs ~40 ms."""
    m = make_manifest({"a.bin": b"x", "b.bin": b"y"})
    assert m.manifest_id == hashlib.sha256(m.canonical_json()).hexdigest()
    assert m.manifest_id is m.manifest_id and m.canonical_json() is m.canonical_json()  # cached
    moved = m.model_copy(update={"source": "hf://org/other"})
    assert moved.source == "hf://org/other"
    assert moved.manifest_id == hashlib.sha256(moved.canonical_json()).hexdigest() != m.manifest_id
    assert m.model_copy().manifest_id == m.manifest_id
    assert m == make_manifest({"a.bin": b"x", "b.bin": b"y"})  # the cache is not part of equality
    assert set(json.loads(m.model_dump_json())) == {"version", "kind", "source", "revision", "files"}
