"""Weights delivery on the real dev cluster: staging job before the GPU job, read-only views, faults.

* done-when: a host-runtime job declaring an ``hf://`` model (fake Hub) and an ``s3://`` dataset
  (SeaweedFS) starts with both read-only at their mount locations (bubblewrap), the root prolog having
  copied them into the node cache (``cluster-hit``); a second job on the same node starts from the
  NODE cache (``node-hit``) with no staging job; ``slurm-bt status`` (JSON and table) shows the tiers;
  the epilog dropped the first job's leases and links;
* one bad source among 20 jobs (its repo disappears after submit): only that job ends
  DEPLOY_FAILED, with the reason in its staging log, and no node is drained.

The loopback servers run inside pytest; the jobs reach them because the dev cluster's nodes are
this machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from slurm_bt.secrets_store import SecretStore
from slurm_bt.weights.delivery_report import read_weights_status
from tests.servers.hf_hub import FakeHub
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
MiB = 1 << 20

PROBE = r'''
import hashlib, json, os, sys, time
t_start = float(sys.argv[1])
out = {"t_first_command": t_start, "cwd": os.getcwd()}
for i, loc in enumerate(["/app/models/m", "/app/data/d"]):
    files = {}
    for root, _, names in os.walk(loc):
        for n in names:
            p = os.path.join(root, n)
            files[os.path.relpath(p, loc)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    try:
        open(os.path.join(loc, "written-by-job"), "w").write("x")
        writable = True
    except OSError as exc:
        writable = exc.strerror
    out[loc] = {"files": files, "writable": writable, "env": os.environ.get(f"BT_WEIGHTS_{i}")}
print("PROBE " + json.dumps(out), flush=True)
'''


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, fake_hub: FakeHub, seaweed: SeaweedS3) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("wsite")
    secrets = tmp / "secrets"
    path = tmp / "site.toml"
    path.write_text(textwrap.dedent(f"""
        [storage]
        secrets = "{secrets}"
        [weights.endpoints]
        hf_endpoint = "{fake_hub.endpoint}"
        s3_endpoint_url = "{seaweed.endpoint}"
        s3_addressing_style = "path"
        """))
    SecretStore(secrets).set("seaweed_creds", json.dumps({"aws_access_key_id": ACCESS_KEY,
                                                           "aws_secret_access_key": SECRET_KEY}))
    return {**os.environ, "SLURM_BT_SITE_CONFIG": str(path)}


def _config(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    (folder / "config.py").write_text("from truss_train import WeightsSource, definitions\n" + textwrap.dedent(body))
    return folder / "config.py"


def _submit(config: Path, env: dict[str, str], *sbatch: str) -> dict[str, object]:
    r = _run([str(BIN / "bt-sbatch"), "--json", str(config), *(["--", *sbatch] if sbatch else [])], env=env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert isinstance(result, dict)
    return result


def _wait(job_ids: list[str], env: dict[str, str], timeout_s: int = 240) -> dict[str, dict[str, object]]:
    r = _run([str(BIN / "slurm-bt"), "status", *job_ids, "--wait", "--timeout", str(timeout_s), "--json"], env=env,
             timeout=timeout_s + 60)
    assert r.stdout, r.stderr
    return {str(s["id"]): s for s in json.loads(r.stdout)}


def _node_root(node: str) -> Path:
    from slurm_bt.site.settings import SiteSettings, expand_path

    return Path(expand_path(SiteSettings().storage.node_cache, user="root", uid=0, home="/root", node=node))


def _wait_for(pred: object, timeout_s: float = 30.0) -> bool:
    assert callable(pred)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.5)
    return bool(pred())


def _node_states() -> dict[str, str]:
    out = _run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_hf_model_and_s3_dataset_read_only_at_mount_locations(dev_cluster: dict[str, object], site: dict[str, str],
                                                             fake_hub: FakeHub, seaweed: SeaweedS3,
                                                             tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    rnd = random.Random(tag)
    model = {"config.json": b'{"hidden": 16}', "model.safetensors": rnd.randbytes(3 * MiB + 7),
             "tokenizer/vocab.txt": b"a b c\n"}
    fake_hub.add_repo(f"Org/E2E-{tag}", model)
    data = {"train.jsonl": b'{"x": 1}\n' * 1000, "shards/part-0.bin": rnd.randbytes(2 * MiB + 3)}
    client = seaweed.client()
    for key, body in data.items():
        client.put_object(Bucket="weights", Key=f"e2e-{tag}/{key}", Body=body)
    config = _config(tmp_path / "proj", f"""
        project = definitions.TrainingProject(name="weights-e2e", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="512Mi"),
            runtime=definitions.Runtime(start_commands=['python3 probe.py "$(date +%s.%N)"']),
            weights=[
                WeightsSource(source="hf://org/e2e-{tag}@main", mount_location="/app/models/m"),
                WeightsSource(source="s3://weights/e2e-{tag}", mount_location="/app/data/d",
                              auth_secret_name="seaweed_creds"),
            ],
        ))
        """)
    node = sorted(dev_cluster["nodes"])[0]  # type: ignore[call-overload]
    first = _submit(config, site, f"--nodelist={node}")
    assert first["staging_job_id"], first  # nothing cached yet: a staging job runs first
    job_id = str(first["job_id"])
    status = _wait([job_id], site)[job_id]
    logs = _run([str(BIN / "slurm-bt"), "logs", job_id], env=site).stdout
    assert status["current_status"] == "TRAINING_JOB_COMPLETED", (status, logs)
    [probe] = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs)]
    want_model = {p: hashlib.sha256(b).hexdigest() for p, b in model.items()}
    want_data = {p: hashlib.sha256(b).hexdigest() for p, b in data.items()}
    assert probe["/app/models/m"]["files"] == want_model
    assert probe["/app/data/d"]["files"] == want_data
    for loc in ("/app/models/m", "/app/data/d"):
        assert probe[loc]["writable"] in ("Read-only file system", "Permission denied"), probe[loc]
        assert probe[loc]["env"] == loc
    assert not Path("/app/models/m").exists(), "the view must be private to the job (bubblewrap)"
    assert "slurm-bt weights: hf://Org/E2E-" in logs
    job_dir = Path(str(first["job_dir"]))
    w = read_weights_status(job_dir)
    assert [s["tier"] for s in w["staging"]] == ["miss", "miss"]
    assert list(w["nodes"]) == [node], w
    tiers_first = [e["tier"] for e in w["nodes"][node]]
    # the root prolog copied both from the cluster cache into the node cache
    assert tiers_first == ["cluster-hit", "cluster-hit"], w
    # the public hf:// source is shared on the node; the credentialed s3:// one is in the team's private subtree
    hf_entry, s3_entry = w["nodes"][node]
    assert hf_entry["path"].startswith(f"{_node_root(node)}/snapshots/"), w
    assert s3_entry["path"].startswith(f"{_node_root(node)}/private/"), w
    assert status["weights"] == w, status  # status --json carries the same view
    # the epilog released the first job's leases and removed its links (the epilog's node-cache calls really ran)
    root = _node_root(node)
    assert _wait_for(lambda: not (root / "jobs" / job_id).exists()
                     and not list((root / "leases").glob(f"*/{job_id}"))), list((root / "leases").glob("*/*"))

    # The same sources again, on the same node: no staging job, served from the NODE cache.
    second = _submit(config, site, f"--nodelist={node}")
    assert second["staging_job_id"] is None, second
    sid = str(second["job_id"])
    st2 = _wait([sid], site)[sid]
    logs2 = _run([str(BIN / "slurm-bt"), "logs", sid], env=site).stdout
    assert st2["current_status"] == "TRAINING_JOB_COMPLETED", (st2, logs2)
    [probe2] = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs2)]
    assert probe2["/app/models/m"]["files"] == want_model and probe2["/app/data/d"]["files"] == want_data
    assert probe2["/app/models/m"]["writable"] in ("Read-only file system", "Permission denied"), probe2
    w2 = st2["weights"]
    assert isinstance(w2, dict) and w2 == read_weights_status(Path(str(second["job_dir"]))), st2
    assert w2["staging"] == [], w2  # no staging job ran
    tiers_second = [e["tier"] for e in w2["nodes"][node]]
    assert tiers_second == ["node-hit", "node-hit"], w2
    table = _run([str(BIN / "slurm-bt"), "status", sid], env=site).stdout
    lines = [ln.strip() for ln in table.splitlines() if ln.strip().startswith("weights: ")]
    assert len(lines) == 2 and all(f"node-hit ({node})" in ln for ln in lines), table
    assert lines[0].startswith("weights: hf://Org/E2E-") and lines[1].startswith(f"weights: s3://weights/e2e-{tag}")
    print(f"\nweights tiers: first job {tiers_first}, second job on {node}: {tiers_second}\n{table}")


def test_bad_source_in_one_of_20_jobs_drains_no_node(dev_cluster: dict[str, object], site: dict[str, str],
                                                     fake_hub: FakeHub, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    fake_hub.add_repo(f"Org/Good-{tag}", {"model.safetensors": random.Random(1).randbytes(MiB), "config.json": b"{}"})
    fake_hub.add_repo(f"Org/Bad-{tag}", {"model.safetensors": random.Random(2).randbytes(MiB)})
    body = """
        project = definitions.TrainingProject(name="weights-20-{i}", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=["test -f /app/m/model.safetensors"]),
            weights=[WeightsSource(source="hf://Org/{repo}-{tag}", mount_location="/app/m")],
        ))
        """
    before = _node_states()
    jobs: list[str] = []
    bad_job = bad_staging = ""
    for i in range(20):
        repo = "Bad" if i == 7 else "Good"
        res = _submit(_config(tmp_path / f"j{i}", body.format(i=i, repo=repo, tag=tag)), site)
        jobs.append(str(res["job_id"]))
        if repo == "Bad":
            fake_hub.delete_repo(f"Org/Bad-{tag}")  # 404 from now on: after submit, before staging
            bad_job, bad_staging = str(res["job_id"]), str(res["staging_job_id"])
    statuses = _wait(jobs, site, timeout_s=200)
    failed = {j: s["current_status"] for j, s in statuses.items() if s["current_status"] != "TRAINING_JOB_COMPLETED"}
    assert failed == {bad_job: "TRAINING_JOB_DEPLOY_FAILED"}, (failed, statuses[bad_job])
    log = Path(str(next(s for j, s in statuses.items() if j == bad_job).get("job_dir") or ""))
    staging_logs = list(log.glob(f"logs/staging-{bad_staging}.out")) if str(log) else []
    if staging_logs:
        text = staging_logs[0].read_text()
        assert "job.weights[0].source" in text and "404" in text, text
    time.sleep(1)
    after = _node_states()
    assert all(state in {"idle", "mix", "alloc"} for state in after.values()), (before, after)
