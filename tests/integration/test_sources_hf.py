"""HF source against the loopback fake Hub: pinning, auth, and injected faults."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_bt.errors import (
    IntegrityError,
    SourceAccessError,
    SourceNotFoundError,
    SourceSpecError,
    SourceUnavailableError,
)
from slurm_bt.storage.base import TransportOptions
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.weights.download import DownloadOptions, download_file, download_manifest, remove_stale_temps
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.resolve import resolve
from tests.servers.fixtures import fake_hub  # noqa: F401 - registered here until conftest imports it
from tests.servers.hf_hub import FakeHub, Faults, _proc_free_port

MiB = 1024 * 1024
FAST = DownloadOptions(part_size=1 * MiB, parallel_threshold=2 * MiB, max_workers=4, backoff_base_s=0.01,
                       backoff_cap_s=0.05, max_retries=3,
                       transport=TransportOptions(read_timeout_s=2.0, connect_timeout_s=1.0, list_retries=2))
_counter = iter(range(10_000))


def _rand(n: int, seed: int) -> bytes:
    import random

    return random.Random(seed).randbytes(n)


@pytest.fixture
def repo(fake_hub: FakeHub) -> tuple[str, dict[str, bytes]]:  # noqa: F811
    files = {"config.json": b'{"hidden_size": 8}', "model.safetensors": _rand(5 * MiB + 123, 1),
             "sub/tokenizer.txt": b"tok " * 100, "README.md": b"# hi"}
    name = f"Org/Model{next(_counter)}"
    fake_hub.add_repo(name, files)
    return name, files


def ep(hub: FakeHub) -> StorageEndpoints:
    return StorageEndpoints(hf_endpoint=hub.endpoint)


def _blob_names(d: Path) -> list[str]:
    return sorted(os.listdir(d))


def test_resolve_pins_commit_and_hashes(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]]) -> None:  # noqa: F811
    name, files = repo
    m = resolve(f"hf://{name.lower()}@main", endpoints=ep(fake_hub), options=FAST)
    assert m.source == f"hf://{name}"  # the Hub's canonical case, so both spellings share a key
    assert len(m.revision) == 40
    assert {f.path: f.sha256 for f in m.files} == {p: hashlib.sha256(d).hexdigest() for p, d in files.items()}
    assert resolve(f"hf://{name}", endpoints=ep(fake_hub), options=FAST).manifest_id == m.manifest_id


def test_patterns_and_empty_result(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]]) -> None:  # noqa: F811
    name, _ = repo
    m = resolve(f"hf://{name}", allow=["*.safetensors", "*.json"], ignore=["sub/*"], endpoints=ep(fake_hub))
    assert [f.path for f in m.files] == ["config.json", "model.safetensors"]
    with pytest.raises(SourceSpecError, match="No files matched"):
        resolve(f"hf://{name}", allow=["*.gguf"], endpoints=ep(fake_hub))


def test_download_parallel_verified(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:  # noqa: F811
    name, files = repo
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub), options=FAST)
    out = download_manifest(m, tmp_path, endpoints=ep(fake_hub), options=FAST)
    for path, blob in out.items():
        assert blob.read_bytes() == files[path]
        assert blob.name == hashlib.sha256(files[path]).hexdigest()
        assert oct(blob.stat().st_mode & 0o777) == "0o444"
    assert all(not n.startswith(".") for n in _blob_names(tmp_path))
    ranged = [r for r in fake_hub.requests if r[2]]
    assert ranged, "big file must be fetched with ranged GETs"


def test_branch_moves_between_resolve_and_download(
    fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path  # noqa: F811
) -> None:
    name, files = repo
    m = resolve(f"hf://{name}@main", endpoints=ep(fake_hub), options=FAST)
    new = fake_hub.commit(name, {**files, "model.safetensors": _rand(5 * MiB, 2)})
    assert new != m.revision
    out = download_manifest(m, tmp_path, endpoints=ep(fake_hub), options=FAST)
    assert out["model.safetensors"].read_bytes() == files["model.safetensors"]
    assert resolve(f"hf://{name}@main", endpoints=ep(fake_hub)).revision == new


def test_connection_reset_mid_body_resumes(
    fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path  # noqa: F811
) -> None:
    name, files = repo
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub))
    f = next(x for x in m.files if x.path == "model.safetensors")
    single = DownloadOptions(**{**FAST.__dict__, "parallel_threshold": 64 * MiB})  # one stream: easy to follow
    with fake_hub.faults(Faults(paths={f.path}, reset_after=3 * MiB + 7, times=2)):
        path = download_file(m, f, tmp_path, endpoints=ep(fake_hub), options=single)
        ranges = [r[2] for r in fake_hub.requests if r[0] == "GET" and "resolve" in r[1]]
    assert path.read_bytes() == files[f.path]
    # Resumed where the client's bytes stopped (an RST may drop what was in flight), not from 0.
    # (the second answer is shorter than reset_after, so it completes.)
    assert ranges[0] is None and len(ranges) == 2, ranges
    first = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert 0 < first <= 3 * MiB + 7, ranges


def test_server_ignores_range_restarts_from_zero(
    fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path  # noqa: F811
) -> None:
    name, files = repo
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub))
    f = next(x for x in m.files if x.path == "model.safetensors")
    with fake_hub.faults(Faults(paths={f.path}, ignore_range=True, times=-1)):
        path = download_file(m, f, tmp_path, endpoints=ep(fake_hub), options=FAST)
    assert path.read_bytes() == files[f.path]
    with fake_hub.faults(Faults(paths={f.path}, ignore_range=True, reset_after=2 * MiB, times=-1)) as flt:
        flt.times = 3  # resets on the first three (whole-body) answers, then a clean 200 from 0
        p2 = download_file(m, f, tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path,
                           endpoints=ep(fake_hub), options=FAST)
    assert p2.read_bytes() == files[f.path]


def test_same_length_corruption_detected_not_published(
    fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path  # noqa: F811
) -> None:
    name, _ = repo
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub))
    f = next(x for x in m.files if x.path == "model.safetensors")
    with fake_hub.faults(Faults(paths={f.path}, corrupt_offset=4 * MiB + 5, times=-1)):
        with pytest.raises(IntegrityError) as info:
            download_file(m, f, tmp_path, endpoints=ep(fake_hub), options=FAST)
    err = info.value
    assert err.expected == f.sha256 and err.actual != f.sha256
    assert f.sha256 in str(err) and err.actual in str(err) and "model.safetensors" in str(err)
    assert _blob_names(tmp_path) == []  # neither the blob nor a temp file


def test_stalled_origin_bounded_error(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:  # noqa: F811
    name, _ = repo
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub))
    f = next(x for x in m.files if x.path == "model.safetensors")
    opts = DownloadOptions(**{**FAST.__dict__, "max_retries": 1, "parallel_threshold": 64 * MiB,
                              "transport": TransportOptions(read_timeout_s=0.5, connect_timeout_s=0.5)})
    t0 = time.monotonic()
    with fake_hub.faults(Faults(paths={f.path}, stall_after=MiB, stall_s=3.0, times=-1)):
        with pytest.raises(SourceUnavailableError) as info:
            download_file(m, f, tmp_path, endpoints=ep(fake_hub), options=opts)
    assert time.monotonic() - t0 < 6
    msg = str(info.value)
    assert f"hf://{name}" in msg and "model.safetensors" in msg and "at byte" in msg, msg
    assert info.value.transient and _blob_names(tmp_path) == []


def test_transient_503_retried(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:  # noqa: F811
    name, files = repo
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub))
    f = next(x for x in m.files if x.path == "config.json")
    with fake_hub.faults(Faults(paths={f.path}, status=503, times=2)):
        assert download_file(m, f, tmp_path, endpoints=ep(fake_hub), options=FAST).read_bytes() == files[f.path]


def test_origin_unreachable(tmp_path: Path) -> None:
    port = _proc_free_port()
    endpoints = StorageEndpoints(hf_endpoint=f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailableError) as info:
        resolve("hf://org/model", endpoints=endpoints, options=FAST)
    assert "hf://org/model" in str(info.value) and "unreachable" in str(info.value)
    assert time.monotonic() - t0 < 10


def test_private_and_gated_auth(fake_hub: FakeHub) -> None:  # noqa: F811
    files = {"model.safetensors": b"w" * 2000}
    fake_hub.add_repo("acme/private", files, private=True, readers={"good"})
    fake_hub.add_repo("acme/gated", files, gated=True, readers={"good"})
    for repo in ("acme/private", "acme/gated"):
        for creds in (None, Credentials(token="bad")):
            with pytest.raises(SourceAccessError, match=f"not authorized for hf://{repo}"):
                resolve(f"hf://{repo}", credentials=creds, endpoints=ep(fake_hub))
        m = resolve(f"hf://{repo}", credentials=Credentials(token="good"), endpoints=ep(fake_hub))
        assert m.files[0].sha256 == hashlib.sha256(files["model.safetensors"]).hexdigest()


def test_download_needs_authorization_too(fake_hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    """A pinned manifest is not a capability: the origin re-checks the requester."""
    fake_hub.add_repo("acme/private2", {"a.bin": b"z" * 3000}, private=True, readers={"good"})
    m = resolve("hf://acme/private2", credentials=Credentials(token="good"), endpoints=ep(fake_hub))
    with pytest.raises(SourceAccessError, match="not authorized for hf://acme/private2"):
        download_manifest(m, tmp_path, credentials=Credentials(token="bad"), endpoints=ep(fake_hub))
    assert _blob_names(tmp_path) == []


def test_not_found(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:  # noqa: F811
    name, _ = repo
    with pytest.raises(SourceNotFoundError, match="hf://nobody/nothing"):
        resolve("hf://nobody/nothing", endpoints=ep(fake_hub))
    with pytest.raises(SourceNotFoundError, match="revision 'nope'"):
        resolve(f"hf://{name}@nope", endpoints=ep(fake_hub))
    m = resolve(f"hf://{name}", endpoints=ep(fake_hub))
    ghost = m.files[0].model_copy(update={"path": "ghost.bin"})
    m2 = Manifest(kind="hf", source=m.source, revision=m.revision, files=(ghost,))
    with pytest.raises(SourceNotFoundError, match=r"ghost\.bin"):
        download_manifest(m2, tmp_path, endpoints=ep(fake_hub), options=FAST)


KILL_SCRIPT = """
import sys
from pathlib import Path
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.download import download_manifest, DownloadOptions
from slurm_bt.storage.endpoints import StorageEndpoints
m = Manifest.model_validate_json(Path(sys.argv[1]).read_text())
download_manifest(m, Path(sys.argv[2]), endpoints=StorageEndpoints(hf_endpoint=sys.argv[3]),
                  options=DownloadOptions(part_size=1 << 20, parallel_threshold=2 << 20))
"""


def test_kill_9_mid_body_then_rerun(fake_hub: FakeHub, repo: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:  # noqa: F811
    name, files = repo
    m = resolve(f"hf://{name}", allow=["*.safetensors"], endpoints=ep(fake_hub))
    (tmp_path / "m.json").write_text(m.model_dump_json())
    dest = tmp_path / "blobs"
    dest.mkdir()
    repo_root = Path(__file__).resolve().parents[2]
    with fake_hub.faults(Faults(stall_after=512 * 1024, stall_s=20.0, times=-1)):
        proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(tmp_path / "m.json"), str(dest),
                                 fake_hub.endpoint], cwd=repo_root)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                temps = [n for n in os.listdir(dest) if ".tmp-" in n]
                if temps and sum(1 for r in fake_hub.requests if r[0] == "GET") >= 2:
                    break
                time.sleep(0.05)
            time.sleep(0.3)  # bytes are flowing into the temp file now
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(timeout=10)
    names = _blob_names(dest)
    assert names and all(".tmp-" in n for n in names), names  # nothing at a final name
    assert os.stat(dest / names[0]).st_size > 0
    out = download_manifest(m, dest, endpoints=ep(fake_hub), options=FAST)
    assert out["model.safetensors"].read_bytes() == files["model.safetensors"]
    removed = remove_stale_temps(dest)
    assert [p.name for p in removed] == names
    assert _blob_names(dest) == [m.files[0].sha256]


def test_lfs_files_follow_the_hubs_redirect_to_its_cdn_without_the_token(
    fake_hub: FakeHub, tmp_path: Path  # noqa: F811
) -> None:
    """The real Hub answers ``resolve`` of every LFS file with a 302 to its CDN (another origin).

    Before, the pool refused every redirect ("unexpected HTTP 302"): no LFS weight of a real Hub
    repo could be downloaded. The token must not travel to the CDN; Range must.
    """
    files = {"config.json": b'{"a": 1}', "model.safetensors": _rand(5 * MiB + 7, 9)}
    fake_hub.add_repo("acme/cdn", files, private=True, readers={"good"})
    creds = Credentials(token="good")
    fake_hub.lfs_cdn = True
    fake_hub.cdn_auth.clear()
    try:
        m = resolve("hf://acme/cdn", credentials=creds, endpoints=ep(fake_hub), options=FAST)
        out = download_manifest(m, tmp_path, credentials=creds, endpoints=ep(fake_hub), options=FAST)
    finally:
        fake_hub.lfs_cdn = False
    assert {p: b.read_bytes() for p, b in out.items()} == files
    assert fake_hub.cdn_auth, "the LFS file must have come from the CDN route"
    assert fake_hub.cdn_auth == [None] * len(fake_hub.cdn_auth)  # never the Hub token
    cdn_ranged = [r for r in fake_hub.requests if r[1].startswith("/cdn-lfs/") and r[2]]
    assert len(cdn_ranged) >= 5  # 5 MiB in 1 MiB parts, each its own redirected ranged GET


def test_staging_many_small_files_keeps_every_connection_pooled(
        fake_hub: FakeHub, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    """The staging job fetches up to 64 small files at once (stage_job.py): the backend's connection pool
    must hold that many, or each extra connection is opened, used once and dropped with urllib3's
    "Connection pool is full" warning on the job's stderr."""
    import logging

    from slurm_bt.weights.cluster_cache import ClusterCache
    from slurm_bt.weights.plan import SourcePin, list_selected, pin_key
    from slurm_bt.weights.stage_job import stage_source

    name = f"Org/ManySmall{next(_counter)}"
    files = {f"tok/{i:03d}.json": _rand(3000, i) for i in range(200)}
    fake_hub.add_repo(name, files)
    caplog.set_level(logging.WARNING, logger="urllib3")
    listing, picked, revision = list_selected(f"hf://{name}", allow=None, ignore=None, credentials=None,
                                              endpoints=ep(fake_hub))
    pin = SourcePin(index=0, declared=f"hf://{name}", kind="hf", source=listing.uri.canonical, revision=revision,
                    mount_location="/w", pin_key=pin_key("hf", listing.uri.canonical, revision, picked),
                    files=tuple(picked))
    team = ClusterCache(tmp_path / "team", dir_mode=0o755)
    with open(os.devnull, "w") as out:
        outcome = stage_source(pin, team, ClusterCache(tmp_path / "shared"), credentials=None,
                               endpoints=ep(fake_hub), out=out)
    snap = team.snapshot_path(outcome.manifest)
    assert all((snap / p).read_bytes() == b for p, b in files.items())
    full = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
    assert full == [], full[:3]
