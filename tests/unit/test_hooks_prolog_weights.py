"""The prolog's weights step in-process, as root, for a real non-root job user (btu1/btu2).

Covers: cluster tier → node cache (``cluster-hit``), then ``node-hit`` for a second job; the
root-owned record and links readable by the job user; the epilog (with a non-default ``--site``)
releasing leases and links; another team's job refused (job failure, node up); missing manifests,
a copy slower than the prolog's limit (job failure with the reason, never a drain); an unsafe node
cache parent (node fault); jobs without weights never reaching the weights code.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_bt.hooks import prolog
from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_stage import read_node_record
from tests.unit import test_hooks_prolog as _hooks_tests
from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, random_bytes, write_origin
from tests.unit.test_hooks_prolog import Site, as_user, job_env, run, write_job

site = _hooks_tests.site  # the throwaway roots, users and hook files of test_hooks_prolog
fake_flush = _hooks_tests.fake_flush  # autouse there: epilogs here must never upload either

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")


def _weights_site(site: Site, node_cache: str | None = None) -> Path:
    """Point the site's cluster and node caches into the throwaway base; returns the node cache of n1."""
    node_cache = node_cache or f"{site.base}/node/%n/weights"
    text = site.site.read_text().replace(
        "[storage]\n", f'[storage]\ncluster_cache = "{site.base}/shared/weights"\nnode_cache = "{node_cache}"\n')
    site.site.write_text(text)
    return Path(node_cache.replace("%n", "n1"))


def _cluster_entry(site: Site, team: str, name: str) -> tuple[Manifest, dict[str, bytes]]:
    files = {"config.json": b'{"h": 1}', "model.safetensors": random_bytes(2 << 20, 7), "tok/v.txt": b"v"}
    origin = site.base / f"origin-{name}"
    write_origin(origin, files)
    m = make_manifest(files, source=f"hf://org/{name}")
    (site.base / "shared" / "weights" / "teams").mkdir(parents=True, exist_ok=True)
    tier = ClusterCache.for_team(site.base / "shared" / "weights", team)
    tier.ensure(m, DirFetcher(origin), authorize=allow)
    os.chown(tier.root, 0, grp.getgrnam(team).gr_gid)  # as an admin provisions it: the prolog checks the group
    os.chmod(tier.root, 0o3770)
    return m, files


def _weights_job(site: Site, user: str, m: Manifest | None, name: str, job_dir_name: str) -> Path:
    """A job declaring one source; its pinned manifest in the job dir (as the staging job leaves it)."""
    work = write_job(site, user, job_dir_name=job_dir_name)
    pw = pwd.getpwnam(user)
    data = json.loads((work / "job.json").read_text())
    data["weights"] = [{"source": f"hf://org/{name}", "mount_location": "/app/m"}]
    (work / "job.json").write_text(json.dumps(data))
    if m is not None:
        (work / "weights").mkdir(mode=0o700)
        (work / "weights" / "0.json").write_bytes(m.canonical_json())
        for p in (work / "weights", work / "weights" / "0.json"):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    return work


def test_prolog_stages_node_cache_then_hits_and_epilog_releases(site: Site) -> None:
    node_root = _weights_site(site)
    m, files = _cluster_entry(site, "btteam1", "m1")
    work = _weights_job(site, "btu1", m, "m1", "w1")
    assert run(site, "prolog", job_env(site, "btu1", "31", work)) == 0
    state = read_hook_state("n1", "31", site.state)
    assert state.error is None and state.record is not None
    assert state.record["weights"] == [{"source": f"hf://org/m1@{'a' * 12}", "tier": "cluster-hit"}]
    link = node_root / "jobs" / "31" / "w0"
    assert Path(os.path.realpath(link)) == node_root / "snapshots" / m.manifest_id
    for p, b in files.items():
        assert (link / p).read_bytes() == b
    rec = node_root / "jobs" / "31" / "weights.json"
    st = rec.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
    jst = (node_root / "jobs" / "31").lstat()  # the record names the job's sources: the job's user only
    assert (jst.st_uid, jst.st_gid, stat.S_IMODE(jst.st_mode)) == (0, pwd.getpwnam("btu1").pw_gid, 0o750)
    assert as_user("btu2", lambda: read_node_record(str(node_root), "31")) is None
    # step 1 runs as the user: it must be able to read the root-owned record and the snapshot
    seen = as_user("btu1", lambda: (read_node_record(str(node_root), "31"),
                                    (link / "tok" / "v.txt").read_bytes().decode()))
    assert isinstance(seen, list) and seen[0][0]["tier"] == "cluster-hit" and seen[1] == "v"

    work2 = _weights_job(site, "btu1", m, "m1", "w2")
    assert run(site, "prolog", job_env(site, "btu1", "32", work2)) == 0
    rec2 = read_hook_state("n1", "32", site.state).record
    assert rec2 is not None and rec2["weights"][0]["tier"] == "node-hit"
    assert sorted(os.listdir(node_root / "leases" / m.manifest_id)) == ["31", "32"]

    # another team (btu2 is in btteam2 only) cannot get btteam1's entry: the job fails, the node stays up
    work3 = _weights_job(site, "btu2", m, "m1", "w3")
    assert run(site, "prolog", job_env(site, "btu2", "33", work3)) == 0
    err = read_hook_state("n1", "33", site.state).error
    assert err is not None and "not complete in the cluster cache of team 'btteam2'" in err
    assert not (node_root / "jobs" / "33").exists()

    # the epilog (with this non-default --site) drops leases and links
    for job in ("31", "32", "33"):
        assert run(site, "epilog", job_env(site, "btu1", job, work, SLURM_SCRIPT_CONTEXT="epilog_slurmd")) == 0
    assert os.listdir(node_root / "leases" / m.manifest_id) == []
    assert os.listdir(node_root / "jobs") == []
    assert (node_root / "snapshots" / m.manifest_id).is_dir()  # the entry stays cached (LRU decides)


def test_missing_manifests_fail_the_job(site: Site) -> None:
    _weights_site(site)
    work = _weights_job(site, "btu1", None, "m2", "w4")
    assert run(site, "prolog", job_env(site, "btu1", "34", work)) == 0
    err = read_hook_state("n1", "34", site.state).error
    assert err is not None and "were not staged (did the staging job finish?)" in err


def slow_stage(*args: object, **kwargs: object) -> object:
    """Stand-in for a node copy far bigger than the prolog's time limit."""
    time.sleep(60)
    return []


def test_copy_slower_than_the_deadline_fails_the_job_not_the_node(site: Site, monkeypatch: pytest.MonkeyPatch,
                                                                  capfd: pytest.CaptureFixture[str]) -> None:
    from slurm_bt.weights import node_stage

    _weights_site(site)
    m, _ = _cluster_entry(site, "btteam1", "m3")
    work = _weights_job(site, "btu1", m, "m3", "w5")
    site.hooks.write_text(site.hooks.read_text().replace("deadline_s = 30", "deadline_s = 8"))
    monkeypatch.setattr(node_stage, "stage_for_job", slow_stage)  # inherited by the forked child
    start = time.monotonic()
    assert run(site, "prolog", job_env(site, "btu1", "35", work)) == 0
    assert time.monotonic() - start < 8
    err = read_hook_state("n1", "35", site.state).error
    assert err is not None and re.search(r"did not finish within [1-3] s", err) and "deadline_s=8" in err, err
    assert "DRAIN" not in capfd.readouterr().err
    assert not Path(f"{site.state}/n1/last-fault").exists()


def test_unsafe_node_cache_parent_is_a_node_fault(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    (site.base / "nc" / "n1").mkdir(parents=True)
    os.chmod(site.base / "nc", 0o755)
    os.chmod(site.base / "nc" / "n1", 0o777)
    _weights_site(site, f"{site.base}/nc/%n/weights")
    m, _ = _cluster_entry(site, "btteam1", "m4")
    work = _weights_job(site, "btu1", m, "m4", "w6")
    assert run(site, "prolog", job_env(site, "btu1", "36", work)) == 1
    assert "DRAIN: parent of the node weights cache is unsafe" in capfd.readouterr().err


def test_jobs_without_weights_never_reach_the_weights_code(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object) -> dict[str, object]:
        raise AssertionError("weights step called for a job without weights")

    monkeypatch.setattr(prolog, "stage_weights", boom)
    work = write_job(site, "btu1", job_dir_name="w7")
    assert run(site, "prolog", job_env(site, "btu1", "37", work)) == 0
    rec = read_hook_state("n1", "37", site.state).record
    assert rec is not None and "weights" not in rec
    code = ("import sys, slurm_bt.hooks.prolog; "
            "sys.exit(any(m.startswith(('slurm_bt.weights.node', 'slurm_bt.weights.plan')) for m in sys.modules))")
    assert subprocess.run([sys.executable, "-I", "-c", code], check=False).returncode == 0
