"""A node miss bigger than the prolog's whole budget completes and the job runs (issue 14, first test).

The issue's first test: "a node miss larger than ``deadline_s`` x the copy rate completes and the job
runs". Made cheap on the dev cluster by shrinking both factors through the hook policy
(``/etc/slurm-bt/hooks.toml``, the only place root hooks read them): ``deadline_s = 10`` (the prolog's
whole budget, of which the weights step gets what is left minus 5 s) and a node-stager rate cap of
8 MiB/s, so a 120 MiB model needs at least 15 s to reach the node: 1.5x what the prolog may spend
in total. The cap makes the lower bound on the copy time deterministic (the stager sleeps to stay
under it), independent of disk speed.

What tests/integration/hostile/test_node_stager.py already covers (kill -9 resume, two jobs sharing
one copy, cancel while waiting, status progress) runs with the default 90 s ``deadline_s`` and a
10 s copy; this file adds only the case where the copy outlasts ``deadline_s`` itself.

The small ``deadline_s`` is in force only from submit until the job's prolog has handed the copy
to its stager (the stager took its bounds at spawn): other tests' prologs on the shared cluster see
it for seconds, not for the length of the copy. The file is put back as it was.

Fails on the code before node stagers: there the prolog copied the miss inside ``deadline_s``
(and the ``weights_stage_*`` keys were unknown, so the policy file itself was refused).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.site.settings import SiteSettings, expand_path
from slurm_bt.weights.node_stager import read_progress
from tests.integration.hostile.harness import BIN, aftermath, as_user, wait, write_job
from tests.integration.hostile.weights_jobs import PROBE, readable_site, weights_job
from tests.servers.hf_hub import FakeHub
from tests.unit.test_hooks_env import ensure_test_users

# whole_cluster: runs alone, after the parallel tests (scripts/test.sh; README, Development).
pytestmark = [pytest.mark.slurm, pytest.mark.whole_cluster]

MiB = 1 << 20
HOOKS = Path("/etc/slurm-bt/hooks.toml")
NODE = "n1"
USER = "btu2"
DEADLINE_S = 10
RATE_MIB_S = 8
PARTS, PART_MIB = 12, 10  # 120 MiB: >= 15 s at the cap, 1.5 x DEADLINE_S
_KEYS = ("deadline_s", "weights_prolog_wait_s", "weights_stage_rate_mib_s")


@contextmanager
def hook_policy(**keys: float) -> Iterator[None]:
    """Set top-level ``keys`` in hooks.toml (root 0644, temp + rename) for the block; restore after."""
    old = HOOKS.read_bytes() if HOOKS.exists() else None
    text = (old or b"").decode()
    taken = [k for k in keys if re.search(rf"(?m)^\s*{k}\s*=", text)]
    if taken:
        pytest.skip(f"{HOOKS} already sets {', '.join(taken)}; not overriding a real policy")
    lines = "".join(f"{k} = {v}\n" for k, v in keys.items())
    # top-level keys must come before the first [table] of the file
    first_table = re.search(r"(?m)^\s*\[", text)
    at = first_table.start() if first_table else len(text)
    body = text[:at] + ("\n" if at and not text[:at].endswith("\n") else "") + lines + text[at:]
    HOOKS.parent.mkdir(mode=0o755, exist_ok=True)
    tmp = HOOKS.with_name(".hooks.toml.big-miss")

    def publish(data: bytes | None) -> None:
        if data is None:
            HOOKS.unlink(missing_ok=True)
            return
        tmp.write_bytes(data)
        os.chmod(tmp, 0o644)
        os.rename(tmp, HOOKS)

    publish(body.encode())
    try:
        yield
    finally:
        publish(old)


@pytest.fixture(scope="module")
def users(dev_cluster: dict[str, object]) -> None:
    """btu2 exists with a Slurm association (what the hostile suite's ``tenants`` fixture does)."""
    ensure_test_users()
    subprocess.run(["sacctmgr", "-i", "add", "user", USER, "account=default"], capture_output=True, check=False)


def _status(job_id: str) -> dict[str, Any]:
    proc = as_user(USER, [str(BIN / "slurm-bt"), "status", job_id, "--json"])
    rows = json.loads(proc.stdout) if proc.returncode == 0 and proc.stdout.strip() else []
    return dict(rows[0]) if rows else {}


def _staging(row: dict[str, Any]) -> dict[str, Any] | None:
    for e in ((row.get("weights") or {}).get("nodes") or {}).get(NODE) or []:
        if e.get("tier") == "node-staging" and isinstance(e.get("progress"), dict):
            return dict(e)
    return None


def test_node_miss_longer_than_the_prolog_deadline_completes(users: None, fake_hub: FakeHub) -> None:
    tag = uuid.uuid4().hex[:8]
    rnd = random.Random(tag)
    files = {f"model-{i:02d}.safetensors": rnd.randbytes(PART_MIB * MiB + i) for i in range(PARTS)}
    total = sum(len(b) for b in files.values())
    assert total > DEADLINE_S * RATE_MIB_S * MiB  # the premise: this copy cannot fit in the prolog
    fake_hub.add_repo(f"org/big-miss-{tag}", files)
    with readable_site("bt-big-miss-site-", f"""
            [weights.endpoints]
            hf_endpoint = "{fake_hub.endpoint}"
            """):
        config = write_job(USER, weights_job("big-miss", f"hf://org/big-miss-{tag}"), {"probe.py": PROBE})
        with hook_policy(deadline_s=DEADLINE_S, weights_prolog_wait_s=1, weights_stage_rate_mib_s=RATE_MIB_S):
            proc = as_user(USER, [str(BIN / "bt-sbatch"), "--json", str(config), "--", f"--nodelist={NODE}"],
                           cwd=config.parent)
            assert proc.returncode == 0, proc.stderr
            job = str(json.loads(proc.stdout)["job_id"])
            # the prolog ran under the small deadline once the job waits in DEPLOYING on a stager
            end, row, entry = time.monotonic() + 180, {}, None
            while time.monotonic() < end:
                row = _status(job)
                entry = _staging(row)
                if entry is not None and row.get("current_status") == "TRAINING_JOB_DEPLOYING":
                    break
                if row.get("current_status") in ("TRAINING_JOB_COMPLETED", "TRAINING_JOB_FAILED"):
                    break
                time.sleep(0.5)
            assert entry is not None, f"job {job} never waited for a node copy: {row}"
        p = entry["progress"]
        assert p["total_bytes"] == total and p["done_bytes"] < total, p
        record, logs = wait(USER, job, timeout_s=240)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
    found = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs)]
    assert found and found[0] == {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}, logs
    site = SiteSettings()
    root = expand_path(site.storage.node_cache, user="root", uid=0, home="/root", node=NODE)
    rec = read_progress(root, entry["stager"]) or {}
    assert rec.get("state") == "done" and rec["done_bytes"] == total, rec
    # the copy itself outlasted the prolog's whole budget (done record: copied bytes / wall seconds)
    assert rec["rate_bytes_s"] > 0 and total / rec["rate_bytes_s"] > DEADLINE_S, rec
    aftermath(job, USER)
