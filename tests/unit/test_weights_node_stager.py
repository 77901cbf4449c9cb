"""Node misses outside the prolog's clock (slurm_bt/weights/node_stager.py), in-process hooks as root.

The hook policy caps the stager's rate (``weights_stage_rate_mib_s``) and sets the prolog's wait to 0
so a 4 MiB entry takes seconds to copy: long enough to watch it, cancel it and kill it mid-copy.
Real jobs on the dev cluster: tests/integration/test_weights_node_stager.py.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.units import format_bytes
from slurm_bt.weights.cache_layout import CacheLayout
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_stage import read_node_record, wait_for_node_copies
from slurm_bt.weights.node_stager import process_running, read_progress
from tests.unit import test_hooks_prolog as _hooks_tests
from tests.unit import test_hooks_prolog_weights as _w
from tests.unit.test_cache_support import random_bytes
from tests.unit.test_hooks_prolog import Site, as_user, job_env, run

site = _hooks_tests.site
fake_flush = _hooks_tests.fake_flush

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")

FILES = {f"model-{i}.safetensors": random_bytes(1 << 20, 40 + i) for i in range(4)} | {"config.json": b"{}"}


def _slow_site(site: Site, rate_mib_s: float = 1.0) -> Path:
    node_root = _w._weights_site(site)
    site.hooks.write_text(site.hooks.read_text().replace(
        "scratch_min_free_mib = 0\n",
        f"scratch_min_free_mib = 0\nweights_prolog_wait_s = 0\nweights_stage_rate_mib_s = {rate_mib_s}\n"))
    return node_root


def _entry(site: Site, name: str) -> Manifest:
    from slurm_bt.weights.cluster_cache import ClusterCache
    from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, write_origin

    origin = site.base / f"origin-{name}"
    write_origin(origin, FILES)
    m = make_manifest(FILES, source=f"hf://org/{name}")
    (site.base / "shared" / "weights" / "teams").mkdir(parents=True, exist_ok=True)
    tier = ClusterCache.for_team(site.base / "shared" / "weights", "btteam1")
    tier.ensure(m, DirFetcher(origin), authorize=allow)
    import grp

    os.chown(tier.root, 0, grp.getgrnam("btteam1").gr_gid)
    os.chmod(tier.root, 0o3770)
    return m


def _prolog(site: Site, m: Manifest, name: str, job: str) -> tuple[Path, float]:
    work = _w._weights_job(site, "btu1", m, name, f"w{job}")
    t0 = time.monotonic()
    assert run(site, "prolog", job_env(site, "btu1", job, work)) == 0
    return work, time.monotonic() - t0


def _record(node_root: Path, job: str) -> list[dict[str, Any]]:
    rec = read_node_record(node_root, job)
    assert rec is not None
    return rec


def _state(node_root: Path, key: str) -> Any:
    return (read_progress(node_root, key) or {}).get("state")


def _wait_done(node_root: Path, key: str) -> bool:
    """The stager writes its "done" record just *after* it publishes the snapshot (the job's wait
    ends on the snapshot): a test that saw the snapshot waits for the record too."""
    return _wait_until(lambda: _state(node_root, key) == "done", 10)


def _wait_until(pred: Any, timeout_s: float = 20.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _stager_lines(site: Site, key: str, word: str) -> int:
    log = site.base / "log" / "hooks.log"
    return sum(1 for line in log.read_text().splitlines() if "node-stager" in line and key in line and word in line)


def _epilog(site: Site, job: str, work: Path) -> None:
    assert run(site, "epilog", job_env(site, "btu1", job, work, SLURM_SCRIPT_CONTEXT="epilog_slurmd")) == 0


def test_miss_is_copied_outside_the_prolog_and_step1_waits_with_progress(site: Site) -> None:
    node_root = _slow_site(site)
    m = _entry(site, "big1")
    work, _ = _prolog(site, m, "big1", "41")
    rec = _record(node_root, "41")
    assert rec[0]["tier"] == "node-staging" and rec[0]["stager"] == f"pub-{m.manifest_id}"
    key = rec[0]["stager"]
    # the copy (~4 s at 1 MiB/s) outlives the prolog: it was not the prolog's work
    assert _state(node_root, key) in ("starting", "running")
    assert _wait_until(lambda: _state(node_root, key) == "running", 15)
    mid_copy = read_progress(node_root, key) or {}
    assert mid_copy["total_bytes"] == m.total_bytes and mid_copy["done_bytes"] < m.total_bytes

    def step1() -> tuple[list[dict[str, Any]], str]:
        out = io.StringIO()
        entries = [dict(e) for e in _record(node_root, "41")]
        wait_for_node_copies(entries, str(node_root), "41", str(work), "n1", out, poll_s=0.2, log_every_s=1.0)
        return entries, out.getvalue()

    result = as_user("btu1", step1)
    assert isinstance(result, list | tuple)
    entries, log = result
    assert entries[0]["tier"] == "cluster-hit" and "stager" not in entries[0]
    assert "waiting for the node copy of hf://org/big1" in log and "MiB/s" in log and "ETA" in log, log
    snap = node_root / "jobs" / "41" / "w0"
    for p, b in FILES.items():
        assert (snap / p).read_bytes() == b
    assert _wait_done(node_root, key)
    assert not (node_root / "stagers" / f"{key}.json").exists()  # the request (a whole manifest) is dropped
    _epilog(site, "41", work)


def test_two_jobs_share_one_copy(site: Site) -> None:
    node_root = _slow_site(site)
    m = _entry(site, "big2")
    w1, _ = _prolog(site, m, "big2", "51")
    w2, _ = _prolog(site, m, "big2", "52")
    key = f"pub-{m.manifest_id}"
    assert _record(node_root, "52")[0]["stager"] == key
    assert sorted(os.listdir(node_root / "leases" / m.manifest_id)) == [".manifest.json", "51", "52"]
    assert _wait_until(lambda: (node_root / "snapshots" / m.manifest_id).is_dir(), 20)
    assert _wait_until(lambda: _stager_lines(site, key, "done:") == 1, 10)
    assert _stager_lines(site, key, "copying") == 1  # the second job started no second copy
    for job, work in (("51", w1), ("52", w2)):
        _epilog(site, job, work)


def test_cancelled_job_stops_its_copy_and_publishes_nothing(site: Site) -> None:
    node_root = _slow_site(site)
    m = _entry(site, "big3")
    work, _ = _prolog(site, m, "big3", "61")
    key = f"pub-{m.manifest_id}"
    assert _wait_until(lambda: _state(node_root, key) == "running", 15)
    _epilog(site, "61", work)  # the job ended while waiting: its lease goes
    assert _wait_until(lambda: _state(node_root, key) == "cancelled", 15)
    assert not (node_root / "snapshots" / m.manifest_id).exists()
    assert not CacheLayout(node_root).manifest_file(m.manifest_id).exists()
    assert _wait_until(lambda: os.listdir(node_root / ".tmp") == [], 3), os.listdir(node_root / ".tmp")
    rec = read_progress(node_root, key) or {}
    assert rec["done_bytes"] < m.total_bytes


def test_killed_stager_resumes_on_the_next_job(site: Site) -> None:
    node_root = _slow_site(site)
    m = _entry(site, "big4")
    work, _ = _prolog(site, m, "big4", "71")
    key = f"pub-{m.manifest_id}"
    assert _wait_until(lambda: ((read_progress(node_root, key) or {}).get("done_bytes") or 0) >= 2 << 20, 10)
    pid = (read_progress(node_root, key) or {})["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)

    def step1() -> str:
        try:
            wait_for_node_copies([dict(e) for e in _record(node_root, "71")], str(node_root), "71", str(work), "n1",
                                 io.StringIO(), poll_s=0.2)
        except Exception as exc:
            return str(exc)
        return "no error"

    err = as_user("btu1", step1)
    assert isinstance(err, str) and "stager is gone" in err and "continues from there" in err, err
    _epilog(site, "71", work)
    kept = sum(e.stat().st_size for e in os.scandir(node_root / "blobs") if not e.name.startswith("."))
    assert kept >= 1 << 20  # verified blobs published before the kill stay (not an entry: no snapshot)
    assert not (node_root / "snapshots" / m.manifest_id).exists()
    work2, _ = _prolog(site, m, "big4", "72")
    assert _wait_until(lambda: (node_root / "snapshots" / m.manifest_id).is_dir(), 20)
    assert _wait_done(node_root, key)
    rec = read_progress(node_root, key) or {}
    assert rec["resumed_bytes"] == kept, rec
    for p, b in FILES.items():
        assert (node_root / "jobs" / "72" / "w0" / p).read_bytes() == b
    _epilog(site, "72", work2)
    assert CacheLayout(node_root).is_complete(m)


def test_status_shows_deploying_with_progress_while_step1_waits() -> None:
    from slurm_bt.weights.delivery_report import summary_lines, with_node_copy_state

    entry: dict[str, Any] = {
        "index": 0, "source": "hf://org/big@0123456789ab", "tier": "node-staging", "bytes": 4 << 30,
        "progress": {"state": "running", "done_bytes": 1 << 30, "total_bytes": 4 << 30,
                     "rate_bytes_s": 512 << 20, "eta_s": 6.0}}
    waiting: dict[str, Any] = {"staging": [], "nodes": {"n1": [entry]}}
    row = with_node_copy_state({"current_status": "TRAINING_JOB_RUNNING", "detail": "RUNNING", "weights": waiting})
    assert row["current_status"] == "TRAINING_JOB_DEPLOYING" and "copying weights to n1" in row["detail"]
    assert summary_lines(waiting) == [
        "weights: hf://org/big@0123456789ab node-staging (n1) n1 1.0 GiB/4.0 GiB (25%) 512.0 MiB/s ETA 6 s"]
    done = {"staging": [], "nodes": {"n1": [dict(entry, tier="cluster-hit")]}}
    row = with_node_copy_state({"current_status": "TRAINING_JOB_RUNNING", "detail": "RUNNING", "weights": done})
    assert row["current_status"] == "TRAINING_JOB_RUNNING"


def test_doctor_names_the_bounds_that_remain(tmp_path: Path) -> None:
    from slurm_bt.site.hook_settings import HookSettings
    from slurm_bt.weights.node_stager import node_bounds, policy_from_settings

    policy = policy_from_settings(HookSettings(weights_stage_rate_mib_s=100))
    ok, line = node_bounds(str(tmp_path), 200 << 30, 1 << 30, policy)
    assert ok and "largest entry this node can take" in line and "node_cache_max_bytes 200.0 GiB" in line
    # 0 (the site default): 90% of the filesystem, never more than the free space.
    vfs = os.statvfs(tmp_path)
    ok, line = node_bounds(str(tmp_path), 0, 0, policy)
    cap = format_bytes(int(vfs.f_blocks * vfs.f_frsize * 0.9))
    assert ok and f"node_cache_max_bytes 0 = 90% of the filesystem = {cap}" in line
    assert "1 TB: 26.7 h" in line and "capped at 100.0 MiB/s" in line
    ok, line = node_bounds(str(tmp_path), 1 << 20, 0, policy)
    assert not ok and "largest entry this node can take: 1.0 MiB" in line


def test_credentialed_entry_is_copied_into_the_teams_private_subtree(site: Site) -> None:
    import grp

    node_root = _slow_site(site, rate_mib_s=4.0)
    m = _entry(site, "priv1")
    work = _w._weights_job(site, "btu1", m, "priv1", "w81")
    data = json.loads((work / "job.json").read_text())
    data["weights"][0]["auth_secret_name"] = "hf_token"  # credentialed: the team's audience only
    (work / "job.json").write_text(json.dumps(data))
    assert run(site, "prolog", job_env(site, "btu1", "81", work)) == 0
    rec = _record(node_root, "81")
    assert rec[0]["tier"] == "node-staging" and rec[0]["stager"] == f"team-btteam1-{m.manifest_id}", rec
    private = node_root / "private" / "btteam1"
    assert _wait_until(lambda: (private / "snapshots" / m.manifest_id).is_dir(), 20)
    assert not (node_root / "snapshots" / m.manifest_id).exists()
    blob = next(e for e in os.scandir(private / "blobs") if not e.name.startswith("."))
    st = os.lstat(blob.path)
    assert st.st_gid == grp.getgrnam("btteam1").gr_gid and stat.S_IMODE(st.st_mode) == 0o440

    def step1() -> str:
        entries = [dict(e) for e in _record(node_root, "81")]
        wait_for_node_copies(entries, str(node_root), "81", str(work), "n1", io.StringIO(), poll_s=0.2)
        return str(entries[0]["tier"]) + ":" + (node_root / "jobs" / "81" / "w0" / "config.json").read_text()

    assert as_user("btu1", step1) == "cluster-hit:{}"
    key = f"team-btteam1-{m.manifest_id}"
    assert as_user("btu1", lambda: _wait_done(node_root, key))
    assert as_user("btu2", lambda: read_progress(node_root, key)) is None  # another team: not even the sizes
    _epilog(site, "81", work)


def test_old_stager_records_are_swept(tmp_path: Path) -> None:
    from slurm_bt.weights.node_stager import _sweep_old

    d = tmp_path / "stagers"
    d.mkdir()
    old = time.time() - 2 * 86400
    for name in ("pub-a.progress", "pub-a.json", "pub-b.progress", "other.txt"):
        (d / name).write_text('{"state": "done", "pid": 1, "start_time": 0}')
    for name in ("pub-a.progress", "pub-a.json", "other.txt"):
        os.utime(d / name, (old, old))
    _sweep_old(d)
    assert sorted(os.listdir(d)) == ["other.txt", "pub-b.progress"]


def test_killed_copy_of_one_big_file_resumes_inside_the_file(site: Site) -> None:
    """A single 320 MiB blob: the next stager continues after the killed one's durable prefix."""
    from slurm_bt.weights.cluster_cache import ClusterCache
    from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, write_origin

    node_root = _slow_site(site, rate_mib_s=64.0)
    big = {"model.gguf": random_bytes(320 << 20, 99), "config.json": b"{}"}
    origin = site.base / "origin-gguf"
    write_origin(origin, big)
    m = make_manifest(big, source="hf://org/gguf")
    (site.base / "shared" / "weights" / "teams").mkdir(parents=True, exist_ok=True)
    tier = ClusterCache.for_team(site.base / "shared" / "weights", "btteam1")
    tier.ensure(m, DirFetcher(origin), authorize=allow)
    import grp

    os.chown(tier.root, 0, grp.getgrnam("btteam1").gr_gid)
    os.chmod(tier.root, 0o3770)
    work, _ = _prolog(site, m, "gguf", "91")
    key = f"pub-{m.manifest_id}"
    sha = next(f.sha256 for f in m.files if f.path == "model.gguf")
    mark = node_root / ".tmp" / f"partial-{sha}.mark"
    assert _wait_until(mark.exists, 20)  # 256 MiB made durable and recorded
    pid = (read_progress(node_root, key) or {})["pid"]
    os.kill(pid, signal.SIGKILL)
    assert _wait_until(lambda: not process_running(pid, (read_progress(node_root, key) or {}).get("start_time")), 10)
    done = json.loads(mark.read_text())["done"]
    assert done >= 256 << 20 and not CacheLayout(node_root).blob(sha).exists()
    _epilog(site, "91", work)
    work2, _ = _prolog(site, m, "gguf", "92")
    assert _wait_until(lambda: (node_root / "snapshots" / m.manifest_id).is_dir(), 30), \
        (site.base / "log" / "hooks.log").read_text()[-3000:]
    assert _wait_done(node_root, key)
    rec = read_progress(node_root, key) or {}
    assert rec["resumed_bytes"] >= done, (rec, done)
    assert (node_root / "jobs" / "92" / "w0" / "model.gguf").read_bytes() == big["model.gguf"]
    assert not mark.exists() and not (node_root / ".tmp" / f"partial-{sha}").exists()
    _epilog(site, "92", work2)
