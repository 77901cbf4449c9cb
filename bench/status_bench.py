"""Status and follow overhead on the dev cluster (run as root: ``/opt/slurm-bt/venv/bin/python bench/status_bench.py``).

1. ``slurm-bt status --project bench --json`` for a project with N (default 1000) jobs, against the single
   raw ``sacct`` call it wraps (same argv, same environment): median of several runs each, ratio
   target <= 1.3x. The jobs are tiny ``--hold`` jobs (``sbatch --hold --wrap true``): they are recorded by
   slurmdbd like any job but never use a node, so the bench does not disturb other work on the cluster;
   they are cancelled at the end and the status is measured again for the (terminal) cancelled jobs.
   Submission records are written by the bench into a private workspace (``SLURM_BT_SITE_CONFIG``).
2. ``slurm-bt logs --follow`` on a 2-node job printing one line per second for ~60 s: every Slurm command
   it runs is counted through logging wrappers put first on ``PATH`` (sacct = slurmdbd query,
   squeue/scontrol = slurmctld query), and reported per minute of following. ``sdiag`` and
   ``sacctmgr show stats`` deltas are recorded too, but they count the whole cluster (other users' work
   included), so they are only an upper bound.

Writes ``bench/results/status.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_bt.records import SubmissionRecord, write_record  # noqa: E402
from slurm_bt.slurm.client import QUERY_ENV  # noqa: E402
from slurm_bt.slurm.runner import scrubbed_env  # noqa: E402
from slurm_bt.slurm.sacct import SACCT_DELIMITER, build_sacct_argv  # noqa: E402

BIN = Path(sys.executable).parent
N_JOBS = int(os.environ.get("BENCH_JOBS", "1000"))
REPEATS = int(os.environ.get("BENCH_REPEATS", "5"))


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr[-500:]}")
    return dt


def _median_pair(a: list[str], b: list[str], env_a: dict[str, str], env_b: dict[str, str]) -> tuple[float, float]:
    _time(a, env_a), _time(b, env_b)  # warm caches (slurmdbd, page cache, Python bytecode)
    ta, tb = [], []
    for _ in range(REPEATS):  # interleaved, so drift on the shared machine hits both alike
        ta.append(_time(a, env_a))
        tb.append(_time(b, env_b))
    return statistics.median(ta), statistics.median(tb)


def bench_project_status(work: Path) -> dict[str, object]:
    site = work / "site.toml"
    site.write_text(f'[storage]\nworkspace = "{work}/ws"\n')
    env = {**os.environ, "SLURM_BT_SITE_CONFIG": str(site)}
    t0 = time.perf_counter()
    ids: list[str] = []
    for i in range(N_JOBS):
        out = subprocess.run(["sbatch", "--parsable", "--hold", "-J", f"bench-{i}", "-o", "/dev/null",
                              "-c", "1", "--mem=10M", "--wrap", "true"], capture_output=True, text=True, check=True)
        ids.append(out.stdout.strip().split(";")[0])
    submit_s = time.perf_counter() - t0
    for i, jid in enumerate(ids):
        write_record(work / "ws", SubmissionRecord(
            job_id=jid, project_name="bench", project_id="bench", job_name=f"bench-{i}", submit_id=f"b{i}",
            job_dir=str(work / "jobs" / jid), config_path="/bench/config.py",
            submitted_at=f"2026-01-01T00:00:00.{i:06d}", user="root"))
    time.sleep(3)  # slurmdbd records asynchronously
    # The exact call `slurm-bt status --project bench` makes (ids newest first, as the records list them).
    ordered = sorted(ids, key=lambda j: f"{ids.index(j):06d}", reverse=True)
    raw = build_sacct_argv(ordered, duplicates=True, delimiter=SACCT_DELIMITER)
    raw_env = scrubbed_env(overrides=QUERY_ENV)
    ours = [str(BIN / "slurm-bt"), "status", "--project", "bench", "--json"]
    bare = [sys.executable, "-c", "import slurm_bt.cli.main"]
    check = subprocess.run(ours, env=env, capture_output=True, text=True)
    rows = json.loads(check.stdout)
    assert len(rows) == N_JOBS, (len(rows), check.stderr[-300:])
    pending = {r["current_status"] for r in rows}
    load = os.getloadavg()[0]
    raw_s, ours_s = _median_pair(raw, ours, raw_env, env)
    _, startup_s = _median_pair(raw, bare, raw_env, env)  # interpreter + imports alone, no query
    for start in range(0, len(ids), 500):
        subprocess.run(["scancel", *ids[start:start + 500]], check=True)
    time.sleep(3)
    raw_done_s, ours_done_s = _median_pair(raw, ours, raw_env, env)
    done = {r["current_status"] for r in json.loads(subprocess.run(ours, env=env, capture_output=True,
                                                                   text=True).stdout)}
    return {
        "jobs": N_JOBS,
        "repeats": REPEATS,
        "submit_s": round(submit_s, 2),
        "load_average_1min": round(load, 2),
        "python_startup_and_imports_s": round(startup_s, 4),
        "held": {"statuses": sorted(pending), "raw_sacct_s": round(raw_s, 4), "slurm_bt_status_s": round(ours_s, 4),
                 "ratio": round(ours_s / raw_s, 3),
                 "ratio_without_startup": round((ours_s - startup_s) / raw_s, 3)},
        "cancelled": {"statuses": sorted(done), "raw_sacct_s": round(raw_done_s, 4),
                      "slurm_bt_status_s": round(ours_done_s, 4), "ratio": round(ours_done_s / raw_done_s, 3)},
        "target_ratio": 1.3,
    }


def _wrappers(work: Path, log: Path) -> str:
    wrap = work / "wrap"
    wrap.mkdir()
    for prog in ("sacct", "squeue", "scontrol", "sstat", "scancel", "sbatch"):
        real = shutil.which(prog)
        if real is None:
            continue
        script = wrap / prog
        script.write_text(f'#!/bin/sh\necho "$(date +%s.%N) {prog}" >> {log}\nexec {real} "$@"\n')
        script.chmod(0o755)
    return str(wrap)


def _sdiag_total() -> int:
    return _rpc_total(["sdiag"])


def _dbd_total() -> int:
    return _rpc_total(["sacctmgr", "-n", "show", "stats"])


def _rpc_total(argv: list[str]) -> int:
    """Sum of the per-message-type RPC counts that sdiag and `sacctmgr show stats` both print."""
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    total, section = 0, False
    for line in out.splitlines():
        if "Remote Procedure Call statistics by message type" in line:
            section = True
            continue
        if section and "statistics by user" in line:
            break
        if section and "count:" in line:
            total += int(line.split("count:")[1].split()[0])
    return total


def bench_follow(work: Path) -> dict[str, object]:
    site = work / "site.toml"
    log = work / "calls.log"
    wrap = _wrappers(work, log)
    env = {**os.environ, "SLURM_BT_SITE_CONFIG": str(site), "PATH": f"{wrap}:{os.environ['PATH']}"}
    proj = work / "follow"
    proj.mkdir()
    (proj / "config.py").write_text(textwrap.dedent("""
        from truss_train import definitions
        project = definitions.TrainingProject(name="bench-follow", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count=2, cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands=[
                "for i in $(seq 1 60); do echo \\"line $i rank $BT_NODE_RANK\\"; sleep 1; done"]),
        ))
        """))
    job = subprocess.run([str(BIN / "bt-sbatch"), "--parsable", str(proj / "config.py")], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    log.write_text("")
    ctld0, dbd0 = _sdiag_total(), _dbd_total()
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / "slurm-bt"), "logs", job, "--follow"], env=env, capture_output=True, text=True,
                          timeout=600)
    follow_s = time.monotonic() - t0
    ctld1, dbd1 = _sdiag_total(), _dbd_total()
    calls = [ln.split()[1] for ln in log.read_text().splitlines() if ln.strip()]
    counts = {p: calls.count(p) for p in sorted(set(calls))}
    lines = [ln for ln in proc.stdout.splitlines() if " line " in ln]
    minutes = follow_s / 60
    return {
        "job": job,
        "follow_s": round(follow_s, 1),
        "lines_seen": len(lines),
        "our_calls": counts,
        "our_calls_per_min": {p: round(n / minutes, 2) for p, n in counts.items()},
        "batched_queries_per_poll": 1,
        "cluster_wide_upper_bound_per_min": {"slurmctld_rpcs": round((ctld1 - ctld0) / minutes, 1),
                                             "slurmdbd_rpcs": round((dbd1 - dbd0) / minutes, 1)},
    }


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root on the dev cluster (it submits jobs)")
    with tempfile.TemporaryDirectory(prefix="slurm-bt-bench-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        result = {"project_status": bench_project_status(work), "logs_follow": bench_follow(work)}
    out = REPO / "bench" / "results" / "status.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
