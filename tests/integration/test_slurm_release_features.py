"""What slurm-bt uses of newer Slurm releases, on the dev cluster of each release (issue 12 item 4).

* ``admin doctor`` names the release the cluster runs (cluster.json's ``slurm_release``) and one
  line per feature, and its hook-timeout check reads the keys that release has (PrologTimeout and
  EpilogTimeout from 25.05);
* ``admin install --dry-run`` writes the slurm.conf lines of that release;
* ``--prefer``: a job whose weights a node's cache already holds is placed on that node, where
  Slurm alone would take the first free node (n1).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.slurm.release import parse_release
from tests.servers.hf_hub import FakeHub

# whole_cluster: runs alone, after the parallel tests (scripts/test.sh; README, Development).
pytestmark = [pytest.mark.slurm, pytest.mark.whole_cluster]

BIN = Path(sys.executable).parent


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def test_doctor_names_the_release_and_its_features(dev_cluster: dict[str, object]) -> None:
    proc = _run([str(BIN / "slurm-bt"), "admin", "doctor"])
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    release = parse_release(str(dev_cluster["slurm_release"]))
    assert release is not None
    assert f"info  Slurm release: Slurm {release}" in out, out
    for name in ("prefer (>= 22.05)", "prolog_force_requeue_on_fail (>= 23.02)", "split_hook_timeouts (>= 25.05)",
                 "requeue_expedite (>= 25.11)"):
        assert f"info  feature {name}: " in out, out
    # The timeout check reads what this release's slurm.conf has (the dev cluster writes the split
    # keys from 25.05, devcluster/devcluster.py).
    if release.at_least(25, 5):
        assert "ok    PrologTimeout" in out and "ok    EpilogTimeout" in out, out
    else:
        assert "ok    PrologEpilogTimeout" in out, out
    # The dev cluster does not set it (admin install advises it): available from 23.02, not in use.
    force = "info  feature prolog_force_requeue_on_fail (>= 23.02): " + (
        "available, off: add ForceRequeueOnFail to PrologFlags" if release.at_least(23, 2) else "not on 22.05")
    assert force in out, out


def test_install_writes_the_lines_of_this_release(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\nscratch = "{tmp_path}/node/%n/scratch"\nnode_cache = "{tmp_path}/node/%n/w"\n'
                    f'cache = "{tmp_path}/shared/cache"\n')
    proc = _run([str(BIN / "slurm-bt"), "admin", "install", "--dry-run", "--site", str(site), "--node", "n1"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    release = parse_release(str(dev_cluster["slurm_release"]))
    assert release is not None
    lines = proc.stdout.splitlines()
    assert f"(written for Slurm {release})" in proc.stdout
    assert ("PrologFlags=Alloc,Contain,DeferBatch,ForceRequeueOnFail" in lines) == release.at_least(23, 2)
    assert ("PrologTimeout=120" in lines and "EpilogTimeout=120" in lines) == release.at_least(25, 5)
    assert ("PrologEpilogTimeout=120" in lines) != release.at_least(25, 5)


# -- --prefer ----------------------------------------------------------------------------------------------


@pytest.fixture()
def node_features(dev_cluster: dict[str, object]) -> Iterator[list[str]]:
    """Each node carries a feature named after itself (what admin install advises; a site's job).

    Set at run time with ``scontrol update`` when the cluster's slurm.conf gives none, and put back
    afterwards: node features change no placement of jobs that ask for none.
    """
    nodes = sorted(dev_cluster["nodes"])  # type: ignore[call-overload]
    before: dict[str, tuple[str, str]] = {}
    for node in nodes:
        text = _run(["scontrol", "--oneliner", "show", "node", node]).stdout
        avail = re.search(r"AvailableFeatures=(\S*)", text)
        active = re.search(r"ActiveFeatures=(\S*)", text)
        before[node] = (avail.group(1) if avail else "", active.group(1) if active else "")
        if node not in before[node][1].split(","):
            r = _run(["scontrol", "update", f"NodeName={node}", f"AvailableFeatures={node}",
                      f"ActiveFeatures={node}"])
            assert r.returncode == 0, r.stderr
    try:
        yield nodes
    finally:
        for node, (avail, active) in before.items():
            if node not in active.split(","):
                clean = [("" if v == "(null)" else v) for v in (avail, active)]
                _run(["scontrol", "update", f"NodeName={node}", f"AvailableFeatures={clean[0]}",
                      f"ActiveFeatures={clean[1]}"])


def _submit(config: Path, env: dict[str, str], *sbatch: str) -> dict[str, object]:
    r = _run([str(BIN / "bt-sbatch"), "--json", str(config), *(["--", *sbatch] if sbatch else [])], env=env,
             timeout=300)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert isinstance(result, dict)
    return result


def _wait_done(job_id: str, env: dict[str, str], timeout_s: int = 240) -> dict[str, object]:
    r = _run([str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", str(timeout_s), "--json"], env=env,
             timeout=timeout_s + 60)
    assert r.stdout, r.stderr
    [status] = json.loads(r.stdout)
    assert isinstance(status, dict)
    return status


def _node_of(job_id: str) -> str:
    for _ in range(30):
        out = _run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "NodeList"]).stdout.strip()
        if out and out != "None assigned":
            return out.splitlines()[0]
        time.sleep(1)
    raise AssertionError(f"job {job_id} never got a node")


def test_a_job_prefers_the_node_whose_cache_holds_its_weights(dev_cluster: dict[str, object], fake_hub: FakeHub,
                                                               node_features: list[str], tmp_path: Path) -> None:
    first_node, cached_node = node_features[0], node_features[-1]
    assert first_node != cached_node
    tag = uuid.uuid4().hex[:8]
    fake_hub.add_repo(f"Org/Prefer-{tag}", {"config.json": b'{"a": 1}', "w.bin": os.urandom(256 * 1024)})
    site = tmp_path / "site.toml"
    site.write_text(f'[weights.endpoints]\nhf_endpoint = "{fake_hub.endpoint}"\n')
    env = {**os.environ, "SLURM_BT_SITE_CONFIG": str(site)}
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import WeightsSource, definitions
        project = definitions.TrainingProject(name="prefer-{tag}", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=["true"]),
            weights=[WeightsSource(source="hf://org/prefer-{tag}@main", mount_location="/app/m")],
        ))
        """))
    config = folder / "config.py"
    # The first job stages the weights into the cluster tier and, by its prolog, into the node cache
    # of the node it is pinned to: the LAST node, which Slurm would not pick by itself.
    first = _submit(config, env, f"--nodelist={cached_node}")
    assert _wait_done(str(first["job_id"]), env)["current_status"] == "TRAINING_JOB_COMPLETED"
    # The second job names no node: bt-sbatch finds the entry in that node's cache and prefers it.
    second = _submit(config, env)
    assert second["staging_job_id"] is None, second  # cluster tier hit: the manifest is known at submit
    job_id = str(second["job_id"])
    status = _wait_done(job_id, env)
    assert status["current_status"] == "TRAINING_JOB_COMPLETED", status
    assert _node_of(job_id) == cached_node
    shown = _run(["scontrol", "--oneliner", "show", "job", job_id]).stdout  # kept MinJobAge=300 s after the end
    # 22.05 shows Prefer=<features>; 24.11 shows the preference it placed the job by as Features=<...>.
    assert re.search(rf"\b(Prefer|Features)={cached_node}\b", shown), shown
    weights = status.get("weights")
    assert isinstance(weights, dict) and [e["tier"] for e in weights["nodes"][cached_node]] == ["node-hit"], weights


# -- --requeue=expedite ------------------------------------------------------------------------------------


def test_requeue_option_fits_the_release_and_the_cluster_takes_it(dev_cluster: dict[str, object]) -> None:
    """What long-run restarts get from :func:`requeue_option` here, and that sbatch takes it: a job
    submitted with it and requeued runs again (same id). With ``--requeue=expedite`` (26.05, the dev
    cluster switches it on) the second run starts at once instead of waiting out the requeue delay."""
    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.slurm.release import requeue_option, slurm_release
    from slurm_bt.slurm.runner import SubprocessRunner

    client = SlurmClient(SubprocessRunner())
    release = slurm_release(client)
    assert release is not None and str(release) == str(parse_release(str(dev_cluster["slurm_release"])))
    option = requeue_option(release, client.config())
    assert option == ("--requeue=expedite" if release.at_least(25, 11) else "--requeue")
    if option == "--requeue":
        return  # plain --requeue is exercised by the long-run tests (docs/long-runs.md)
    sub = _run(["sbatch", "--parsable", option, "--time=1", "-o", "/dev/null",
                "--wrap", "sleep $(( SLURM_RESTART_COUNT ? 1 : 60 ))"])
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    try:
        for _ in range(60):
            if _run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip() == "RUNNING":
                break
            time.sleep(0.5)
        requeued_at = time.monotonic()
        r = _run(["scontrol", "requeue", job_id])
        assert r.returncode == 0, r.stderr
        restarted = None
        while time.monotonic() - requeued_at < 60:
            shown = _run(["scontrol", "--oneliner", "show", "job", job_id]).stdout
            if re.search(r"\bRestarts=1\b", shown) and re.search(r"JobState=(RUNNING|COMPLETED)\b", shown):
                restarted = time.monotonic() - requeued_at
                break
            time.sleep(0.5)
        assert restarted is not None, shown
        print(f"\n{option}: run 2 of job {job_id} started {restarted:.1f} s after the requeue")
    finally:
        _run(["scancel", job_id])
