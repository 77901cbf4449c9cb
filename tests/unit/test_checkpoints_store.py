"""Stores and the rank uploader: file:// end to end, idempotence, resume, index merge; S3 API semantics on moto.

moto is used only for API semantics (it does not compute multipart checksums like S3, so integrity
of multipart uploads is tested against SeaweedFS in tests/integration/test_checkpoints_s3.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurm_bt.checkpoints.index import FileEntry, RankCheckpoint, RankIndex, merge_parts
from slurm_bt.checkpoints.locations import (
    TEAMS_DIR,
    checkpoint_key,
    file_key,
    index_key,
    job_prefix,
    project_prefix,
    rank_index_key,
)
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import CheckpointStore, FileStore, UploadResult, open_store, team_group
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader, read_job_index
from slurm_bt.errors import IntegrityError, StorageError

TEAM = team_group(None)[0]
"""The namespace this process's uploads go to (its primary group's slug: ``root`` in CI)."""


def _write_ckpt(root: Path, name: str, files: dict[str, bytes], marker: bool = True) -> None:
    for rel, data in files.items():
        p = root / name / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    if marker:
        (root / name / ".complete").touch()


def _uploader(store: CheckpointStore, ckpt: Path, rank: int = 0, group: int = 1) -> RankUploader:
    ident = JobIdentity("Demo Project", "demo-project", "4242", "alice", rank, group, TEAM)
    return RankUploader(store=store, ident=ident,
                        checkpoint_dir=ckpt, tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None)


def test_file_store_upload_index_and_download(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _write_ckpt(ckpt, "checkpoint-1", {"model.safetensors": os.urandom(3 << 20), "cfg/config.json": b"{}"})
    store = open_store(f"file://{tmp_path}/store")
    up = _uploader(store, ckpt)
    assert up.run_once() == ["checkpoint-1"]
    assert up.run_once() == [], "idempotent: nothing new"
    index = read_job_index(store, "demo-project", "4242", team=TEAM)
    assert index is not None and index.latest() is not None
    view = index.get("checkpoint-1")
    assert view is not None and view.complete and view.file_count == 2
    on_disk = tmp_path / f"store/_teams/{TEAM}/demo-project/4242"
    assert (on_disk / "index.json").is_file() and (on_disk / "ranks/rank-0.json").is_file()
    assert stat.S_IMODE(os.stat(tmp_path / f"store/_teams/{TEAM}/demo-project").st_mode) == 0o2770
    assert stat.S_IMODE(os.stat(tmp_path / f"store/_teams/{TEAM}").st_mode) == 0o2770
    assert not (tmp_path / "store/demo-project").exists(), "uploads never go to the legacy layout"
    assert stat.S_IMODE(os.stat(on_disk / "rank-0/checkpoint-1/model.safetensors").st_mode) == 0o640
    assert not (on_disk / "rank-0/checkpoint-1/.complete").exists()
    # download verifies sha256; a tampered copy in the store is refused and nothing is left behind
    f = next(x for x in view.ranks[0] if x.path == "model.safetensors")
    dest = tmp_path / "dl/model.safetensors"
    key = file_key("demo-project", "4242", 0, "checkpoint-1", "model.safetensors", team=TEAM)
    store.download_file(key, dest, size=f.size, sha256=f.sha256)
    assert dest.read_bytes() == (ckpt / "checkpoint-1/model.safetensors").read_bytes()
    stored = on_disk / "rank-0/checkpoint-1/model.safetensors"
    blob = bytearray(stored.read_bytes())
    blob[100] ^= 1
    stored.write_bytes(bytes(blob))
    with pytest.raises(IntegrityError):
        store.download_file(key, tmp_path / "dl2/m", size=f.size, sha256=f.sha256)
    assert not list((tmp_path / "dl2").iterdir())


def test_restart_skips_unchanged_and_reuploads_changed(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _write_ckpt(ckpt, "checkpoint-1", {"a.bin": b"a" * 1000})
    store = open_store(f"file://{tmp_path}/store")
    assert _uploader(store, ckpt).run_once() == ["checkpoint-1"]
    fresh = _uploader(store, ckpt)  # a restarted uploader (or the epilog's flush)
    assert fresh.run_once(final=True) == [], "already uploaded, unchanged: skipped without re-hashing"
    (ckpt / "checkpoint-1/b.bin").write_bytes(b"new")
    assert fresh.run_once(final=True) == ["checkpoint-1"]
    index = read_job_index(store, "demo-project", "4242", team=TEAM)
    assert index is not None
    view = index.get("checkpoint-1")
    assert view is not None and sorted(f.path for f in view.ranks[0]) == ["a.bin", "b.bin"]


class _FlakyStore:
    """Wraps a store; fails the N-th file upload once (a crash mid-checkpoint)."""

    def __init__(self, inner: CheckpointStore, fail_at: int) -> None:
        self.inner, self.fail_at, self.calls, self.sent = inner, fail_at, 0, 0
        self.uri = inner.uri

    def upload_file(self, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        self.calls += 1
        if self.calls == self.fail_at:
            raise StorageError(key, "injected failure")
        res = self.inner.upload_file(fd, size, key, expect_sha256=expect_sha256)
        if not res.skipped:
            self.sent += 1
        return res

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_resume_after_failure_mid_checkpoint_skips_verified_files(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    files = {f"shard-{i}.bin": os.urandom(2000) for i in range(6)}
    _write_ckpt(ckpt, "checkpoint-7", files)
    base = open_store(f"file://{tmp_path}/store")
    flaky = _FlakyStore(base, fail_at=5)
    up = _uploader(flaky, ckpt)  # type: ignore[arg-type]
    up.file_workers = 1
    with pytest.raises(StorageError):
        up.run_once()
    stored = tmp_path / f"store/_teams/{TEAM}/demo-project/4242/ranks/rank-0.json"
    part = RankIndex.model_validate_json(stored.read_bytes())
    verified = len(part.uploading[0].files)
    assert part.checkpoints == () and 4 <= verified <= 5, "progress recorded, not listed"
    again = _FlakyStore(base, fail_at=0)
    up2 = _uploader(again, ckpt)  # type: ignore[arg-type]
    assert up2.run_once() == ["checkpoint-7"]
    assert again.sent == 6 - verified, "the verified files were not sent again"
    index = read_job_index(base, "demo-project", "4242", team=TEAM)
    assert index is not None and index.get("checkpoint-7") is not None


def test_multi_rank_merge_and_completeness(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    for rank in (0, 1):
        ckpt = tmp_path / f"ckpt{rank}"
        _write_ckpt(ckpt, "checkpoint-1", {f"shard{rank}.pt": b"x" * (rank + 1)})
        if rank == 0:
            _write_ckpt(ckpt, "checkpoint-2", {"shard0.pt": b"y"})
        assert _uploader(store, ckpt, rank=rank, group=2).run_once()
    index = read_job_index(store, "demo-project", "4242", team=TEAM)
    assert index is not None and index.group_size == 2
    c1, c2 = index.get("checkpoint-1"), index.get("checkpoint-2")
    assert c1 is not None and c1.complete and sorted(c1.ranks) == [0, 1]
    assert c2 is not None and not c2.complete, "rank 1 never uploaded checkpoint-2"
    assert index.latest() == c1
    assert (tmp_path / f"store/_teams/{TEAM}/demo-project/4242/rank-1/checkpoint-1/shard1.pt").read_bytes() == b"xx"


def test_keys_of_the_team_namespace_and_of_the_legacy_layout() -> None:
    assert project_prefix("llm-ft", team="btteam1") == "_teams/btteam1/llm-ft"
    assert job_prefix("llm-ft", "42", team="btteam1") == "_teams/btteam1/llm-ft/42"
    assert index_key("llm-ft", "42", team="btteam1") == "_teams/btteam1/llm-ft/42/index.json"
    assert rank_index_key("llm-ft", "42", 1, team="btteam1") == "_teams/btteam1/llm-ft/42/ranks/rank-1.json"
    assert checkpoint_key("llm-ft", "42", 1, "c-9", team="btteam1") == "_teams/btteam1/llm-ft/42/rank-1/c-9"
    assert file_key("llm-ft", "42", 0, "c-9", "a/b.bin", team="btteam1") == \
        "_teams/btteam1/llm-ft/42/rank-0/c-9/a/b.bin"
    # Legacy (stores from before team namespaces; read, never written).
    assert file_key("llm-ft", "42", 0, "c-9", "a/b.bin", team=None) == "llm-ft/42/rank-0/c-9/a/b.bin"
    assert rank_index_key("llm-ft", "42", 0, team=None) == "llm-ft/42/ranks/rank-0.json"
    assert TEAMS_DIR == "_teams"
    for bad in ("..", ".", "", "a/b", "Team", "-x", ".hidden"):
        with pytest.raises(ValueError, match="invalid team"):
            project_prefix("p", team=bad)


def test_the_team_slug_lives_below_both_features() -> None:
    from slurm_bt.posix import teams
    from slurm_bt.weights import plan

    assert plan.team_slug is teams.team_slug, "weights.plan keeps re-exporting the one spelling"
    assert teams.team_slug("BT Team.1-") == "bt-team.1" and teams.is_team_slug(teams.team_slug("..")) is True
    assert all(teams.is_team_slug(teams.team_slug(g)) for g in ("Domain Users", "x" * 200, "_svc", "..", "ü"))


def test_merge_parts_orders_naturally() -> None:
    entry = FileEntry(path="a", size=1, sha256="0" * 64)

    def ck(name: str, created: str) -> RankCheckpoint:
        return RankCheckpoint(name=name, created=created, uploaded=created, completion="marker", files=(entry,))

    part = RankIndex(project_name="p", project_id="p", job_id="1", user="u", rank=0, group_size=1, updated="t",
                     checkpoints=(ck("checkpoint-10", "2026-01-01T00:00:02"),
                                  ck("checkpoint-9", "2026-01-01T00:00:01")))
    merged = merge_parts([part])
    assert merged is not None
    assert [c.name for c in merged.checkpoints] == ["checkpoint-9", "checkpoint-10"]
    assert merged.latest() is not None and merged.latest().name == "checkpoint-10"  # type: ignore[union-attr]


def test_file_store_refuses_other_teams_project(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a directory owned by someone else")
    store = FileStore(open_store(f"file://{tmp_path}/store").uri)
    store.write_bytes("theirs/1/index.json", b"{}")  # a project of a store from before team namespaces
    os.chown(tmp_path / "store/theirs", 65534, 65534)
    os.chmod(tmp_path / "store/theirs", 0o2770)
    import subprocess
    import sys

    code = ("from slurm_bt.checkpoints.store import open_store\n"
            f"s = open_store('file://{tmp_path}/store')\n"
            "print(s.list_dirs('theirs'))\n"
            "try:\n    s.read_bytes('theirs/1/index.json')\nexcept Exception as e:\n    print('ERR', e)\n")
    os.chmod(tmp_path, 0o755)
    out = subprocess.run(["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups", sys.executable, "-c", code],
                         capture_output=True, text=True, cwd="/", env={"PYTHONPATH": str(Path.cwd())})
    assert "[]" in out.stdout and "permission denied" in out.stdout, out.stdout + out.stderr


# -- S3 API semantics (moto) -------------------------------------------------------------------
# Run in a subprocess: importing boto3 here would leak into sys.modules and break the suite's
# "importing slurm_bt pulls no heavy dependency" checks that run later in the same session.

MOTO_SCRIPT = r"""
import os, sys
from pathlib import Path
import boto3, moto
from slurm_bt.checkpoints.store import open_store
from slurm_bt.storage.credentials import Credentials
from slurm_bt.errors import IntegrityError
tmp = Path(sys.argv[1])
with moto.mock_aws():
    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket="ckpts")
    store = open_store("s3://ckpts/pre?part_size_mib=5",
                       credentials=Credentials(aws_access_key_id="k", aws_secret_access_key="s"))
    assert store.read_bytes("missing.json") is None
    store.write_bytes("p/1/index.json", b'{"x": 1}')  # keys are relative to the URI's prefix ("pre")
    store.write_bytes("p/2/index.json", b"{}")
    assert store.read_bytes("p/1/index.json") == b'{"x": 1}'
    assert store.list_dirs("p") == ["1", "2"] and store.list_dirs("") == ["p"]
    src = tmp / "small.bin"
    src.write_bytes(os.urandom(4096))
    fd = os.open(src, os.O_RDONLY)
    res = store.upload_file(fd, 4096, "p/1/rank-0/c/small.bin")
    assert res.verified == "sha256" and not res.skipped
    again = store.upload_file(fd, 4096, "p/1/rank-0/c/small.bin", expect_sha256=res.sha256)
    assert again.skipped, "same key, same sha256: not sent again"
    os.close(fd)
    assert client.head_object(Bucket="ckpts", Key="pre/p/1/rank-0/c/small.bin")["ContentLength"] == 4096
    client.create_multipart_upload(Bucket="ckpts", Key="pre/p/1/rank-0/c/big.bin")
    assert len(client.list_multipart_uploads(Bucket="ckpts").get("Uploads", [])) == 1
    assert store.abort_incomplete("pre/p/1/rank-0/c/big.bin") == 1
    assert client.list_multipart_uploads(Bucket="ckpts").get("Uploads", []) == []
    try:
        store.download_file("p/1/rank-0/c/small.bin", tmp / "dl/small.bin", size=4096, sha256="0" * 64)
        raise AssertionError("a wrong sha256 was accepted")
    except IntegrityError:
        pass
    assert not (tmp / "dl/small.bin").exists()
    store.close()
print("MOTO-OK")
"""


def test_s3_small_objects_list_and_abort(tmp_path: Path) -> None:
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("moto") is None:  # not importorskip: that would import boto3 here
        pytest.skip("moto not installed")

    out = subprocess.run([sys.executable, "-c", MOTO_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert "MOTO-OK" in out.stdout, out.stdout + out.stderr
