"""The gs:// checkpoint store against fake-gcs-server on loopback: upload (CRC32C-checked), index, download."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from slurm_bt.checkpoints.locations import file_key
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import open_store
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader, read_job_index
from slurm_bt.errors import IntegrityError
from tests.servers.fixtures import fake_gcs  # noqa: F401  (session fixture)
from tests.servers.gcs import FakeGcs


def test_gcs_store_round_trip(fake_gcs: FakeGcs, tmp_path: Path) -> None:  # noqa: F811
    fake_gcs.create_bucket("ckpt-gcs")
    store = open_store(f"gs://ckpt-gcs/pre?endpoint_url={fake_gcs.endpoint}")
    ckpt = tmp_path / "ckpt"
    (ckpt / "checkpoint-3").mkdir(parents=True)
    data = os.urandom(3 * 1024 * 1024 + 7)
    (ckpt / "checkpoint-3/model.bin").write_bytes(data)
    (ckpt / "checkpoint-3/COMPLETE").touch()
    up = RankUploader(store=store, ident=JobIdentity("G", "G", "55", "alice", 0, 1, "btteam1"), checkpoint_dir=ckpt,
                      tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None)
    assert up.run_once() == ["checkpoint-3"]
    index = read_job_index(store, "G", "55", team="btteam1")
    assert index is not None and index.latest() is not None
    [entry] = index.latest().ranks[0]  # type: ignore[union-attr]
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert store.list_dirs("_teams/btteam1/G") == ["55"] and store.list_dirs("G") == []
    dest = tmp_path / "dl/model.bin"
    key = file_key("G", "55", 0, "checkpoint-3", "model.bin", team="btteam1")
    assert key == "_teams/btteam1/G/55/rank-0/checkpoint-3/model.bin"
    store.download_file(key, dest, size=len(data), sha256=entry.sha256)
    assert dest.read_bytes() == data
    with pytest.raises(IntegrityError):
        store.download_file(key, tmp_path / "bad/m", size=len(data), sha256="0" * 64)
    store.close()
