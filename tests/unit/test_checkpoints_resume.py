"""Issue 11 items 1, 4, 5 and issue 10's default "latest" reference, without Slurm.

* completeness that matches how trainers write: a checkpoint written by rank 0 alone is complete once
  the other ranks reported an empty ``BT_CHECKPOINT_DIR``; a sharded one only with every part;
* automatic resume: on a restart the job's own newest complete checkpoint is downloaded;
* retention: keep-last-N and a size budget, never the newest complete checkpoint;
* ``LoadCheckpointConfig(enabled=True)`` (upstream's default reference) means the own project's latest.

The real-cluster side is tests/integration/test_checkpoints_resume.py.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import shutil
import textwrap
from pathlib import Path

import pytest

from slurm_bt.checkpoints.index import EMPTY_GRACE_S, RankCheckpoint, RankIndex, merge_parts
from slurm_bt.checkpoints.resolve import resolve_load_checkpoints
from slurm_bt.checkpoints.resume import restart_count, resume_or_load
from slurm_bt.checkpoints.retention import RetentionPolicy, select_expired
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import CheckpointStore, open_store, team_group
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader
from slurm_bt.checkpoints.upload import read_job_index as _read_job_index
from slurm_bt.errors import ConfigError, StorageError
from slurm_bt.site.settings import SiteSettings
from tests.spec_helpers import spec_for

USER = pwd.getpwuid(os.getuid()).pw_name
TEAM = team_group(None)[0]
"""The namespace this process's uploads go to (its primary group's slug)."""


def read_job_index(store: CheckpointStore, project_id: str, job_id: str):  # type: ignore[no-untyped-def]
    """The job's index in this process's team namespace, where :func:`_up` uploads."""
    return _read_job_index(store, project_id, job_id, team=TEAM)


def _ckpt(root: Path, name: str, data: bytes = b"x" * 100, marker: bool = True) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "model.bin").write_bytes(data)
    if marker:
        (root / name / ".complete").touch()


def _up(store: CheckpointStore, ckpt: Path, rank: int, group: int, project: str = "Demo",
        job: str = "77") -> RankUploader:
    ckpt.mkdir(parents=True, exist_ok=True)
    ident = JobIdentity(project, project.replace(" ", "-"), job, USER, rank, group, TEAM)
    return RankUploader(store=store, ident=ident, checkpoint_dir=ckpt, tracker=CompletionTracker(quiet_s=3600),
                        log=lambda r, m: None)


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).replace(microsecond=0).isoformat()


def _part(rank: int, names: list[str], *, uploaded: float = 1000.0, empty_at: float | None = None,
          final: bool = False, group: int = 2) -> RankIndex:
    ckpts = tuple(RankCheckpoint(name=n, created=_iso(uploaded), uploaded=_iso(uploaded), completion="marker",
                                 files=()) for n in names)
    return RankIndex(project_name="p", project_id="p", job_id="1", user="u", rank=rank, group_size=group,
                     updated="t", checkpoints=ckpts, empty_at=None if empty_at is None else _iso(empty_at),
                     final=final)


# -- completeness ---------------------------------------------------------------------------------


def test_rank0_only_checkpoint_is_complete_once_the_other_rank_reports(tmp_path: Path) -> None:
    """The quick start's case: only rank 0 writes; before, it stayed "1/2 ranks" forever."""
    store = open_store(f"file://{tmp_path}/store")
    r0, r1 = _up(store, tmp_path / "n0", 0, 2), _up(store, tmp_path / "n1", 1, 2)
    _ckpt(tmp_path / "n0", "checkpoint-1")
    assert r0.run_once() == ["checkpoint-1"]
    view = read_job_index(store, "Demo", "77").get("checkpoint-1")  # type: ignore[union-attr]
    assert view is not None and not view.complete and view.waiting == (1,), "rank 1 has not reported yet"
    assert r1.run_once(final=True) == []
    r1.report(final=True)  # its last pass: an empty BT_CHECKPOINT_DIR, nothing listed
    index = read_job_index(store, "Demo", "77")
    assert index is not None
    view = index.get("checkpoint-1")
    assert view is not None and view.complete and sorted(view.ranks) == [0]
    assert index.latest() is not None and index.latest().name == "checkpoint-1"  # type: ignore[union-attr]


def test_empty_report_counts_only_after_the_grace_period() -> None:
    """While running: rank 1's "empty" must be seen EMPTY_GRACE_S after the upload (a sharded rank may be late)."""
    up = 10_000.0
    early = merge_parts([_part(0, ["c1"], uploaded=up), _part(1, [], empty_at=up + 5)])
    assert early is not None and not early.checkpoints[0].complete and early.checkpoints[0].waiting == (1,)
    late = merge_parts([_part(0, ["c1"], uploaded=up), _part(1, [], empty_at=up + EMPTY_GRACE_S + 1)])
    assert late is not None and late.checkpoints[0].complete


def test_sharded_checkpoint_missing_a_part_is_never_complete(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    r0, r1 = _up(store, tmp_path / "n0", 0, 2), _up(store, tmp_path / "n1", 1, 2)
    for n in ("n0", "n1"):
        _ckpt(tmp_path / n, "step-1")
    _ckpt(tmp_path / "n0", "step-2")  # rank 1 never wrote its shard of step-2
    r0.run_once(final=True)
    r1.run_once(final=True)
    r0.report(final=True)
    r1.report(final=True)
    index = read_job_index(store, "Demo", "77")
    assert index is not None
    s2 = index.get("step-2")
    assert s2 is not None and not s2.complete and s2.missing == (1,)
    assert index.latest() is not None and index.latest().name == "step-1"  # type: ignore[union-attr]


def test_rank_with_a_directory_in_progress_is_not_empty(tmp_path: Path) -> None:
    """A dot directory (a shard being written) is evidence the rank writes checkpoints."""
    store = open_store(f"file://{tmp_path}/store")
    r0, r1 = _up(store, tmp_path / "n0", 0, 2), _up(store, tmp_path / "n1", 1, 2)
    _ckpt(tmp_path / "n0", "c1")
    (tmp_path / "n1" / ".tmp-c1").mkdir(parents=True)
    r0.run_once()
    r1.report(final=True)
    assert r1.part().empty_at is None
    view = read_job_index(store, "Demo", "77").get("c1")  # type: ignore[union-attr]
    assert view is not None and not view.complete


def test_restarted_run_clears_final(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    r1 = _up(store, tmp_path / "n1", 1, 2)
    r1.report(final=True)
    assert r1.part().final
    again = _up(store, tmp_path / "n1-run2", 1, 2)
    again.report(start=True)
    assert not again.part().final and again.part().empty_at is not None


def test_old_indexes_keep_the_every_rank_rule() -> None:
    """Parts written before empty_at/final existed: a rank that never reported still blocks completeness."""
    merged = merge_parts([_part(0, ["c1"])])
    assert merged is not None and not merged.checkpoints[0].complete


# -- retention ------------------------------------------------------------------------------------


def _index(names: list[str], *, incomplete: tuple[str, ...] = (), size: int = 100):  # type: ignore[no-untyped-def]
    from slurm_bt.checkpoints.index import CheckpointView, FileEntry, JobIndex

    views = tuple(CheckpointView(name=n, created=_iso(1000 + i), complete=n not in incomplete,
                                 waiting=(1,) if n in incomplete else (),
                                 ranks={0: (FileEntry(path="m", size=size, sha256="0" * 64),)})
                  for i, n in enumerate(names))
    return JobIndex(project_name="p", project_id="p", job_id="1", user="u", group_size=1, updated="t",
                    checkpoints=views)


def test_keep_last_expires_older_complete_checkpoints() -> None:
    idx = _index(["c1", "c2", "c3", "c4", "c5"])
    assert select_expired(idx, RetentionPolicy(keep_last=2)) == ["c1", "c2", "c3"]
    assert select_expired(idx, RetentionPolicy()) == []


def test_newest_complete_is_never_expired_and_newer_ones_wait() -> None:
    """c5 is still waiting for a rank: c4 is what a restart would load, so even a tiny budget keeps both."""
    idx = _index(["c1", "c2", "c3", "c4", "c5"], incomplete=("c5",))
    assert select_expired(idx, RetentionPolicy(keep_last=1)) == ["c1", "c2", "c3"]
    assert select_expired(idx, RetentionPolicy(max_bytes=1)) == ["c1", "c2", "c3"]
    assert select_expired(idx, RetentionPolicy(max_bytes=350)) == ["c1", "c2"]


def test_retention_deletes_from_the_store_and_never_reuploads(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/store")
    up = _up(store, tmp_path / "n0", 0, 1)
    policy = RetentionPolicy(keep_last=2)
    for i in range(1, 5):
        _ckpt(tmp_path / "n0", f"checkpoint-{i}", data=bytes([i]) * 1000)
        up.run_once()
        up.apply_retention(policy)
    index = read_job_index(store, "Demo", "77")
    assert index is not None
    assert [c.name for c in index.checkpoints] == ["checkpoint-3", "checkpoint-4"]
    assert set(index.expired) == {"checkpoint-1", "checkpoint-2"}
    on_disk = tmp_path / f"store/_teams/{TEAM}/Demo/77/rank-0"
    assert sorted(p.name for p in on_disk.iterdir()) == ["checkpoint-3", "checkpoint-4"]
    assert up.run_once(final=True) == [], "an expired checkpoint still on the node is not uploaded again"
    fresh = _up(store, tmp_path / "n0", 0, 1)  # a new process (e.g. the epilog's flush) agrees
    assert fresh.run_once(final=True) == []


# -- resume and the default reference -------------------------------------------------------------


def _site(tmp_path: Path) -> SiteSettings:
    return SiteSettings(storage={"checkpoint_store": f"file://{tmp_path}/store", "workspace": f"{tmp_path}/ws",
                                 "secrets": f"{tmp_path}/s", "runtime": f"{tmp_path}/run"})


def _config(tmp: Path, load: str) -> Path:
    cfg = tmp / "cfg" / "config.py"
    cfg.parent.mkdir(exist_ok=True)
    cfg.write_text(textwrap.dedent(f"""
        from truss_train import definitions
        project = definitions.TrainingProject(name="Demo", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            runtime=definitions.Runtime(start_commands=["true"],
                checkpointing_config=definitions.CheckpointingConfig(enabled=True),
                {load}),
        ))
        """))
    return cfg


@pytest.mark.parametrize(("load", "resume", "enabled"), [
    ("", True, False),
    ("load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True)", True, True),
    ("load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=False)", False, False),
    ("load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, checkpoints=["
     "definitions.BasetenCheckpoint.from_latest_checkpoint(project_name='Other')])", False, True),
])
def test_which_configs_resume(tmp_path: Path, load: str, resume: bool, enabled: bool) -> None:
    spec = spec_for(_config(tmp_path, load), _site(tmp_path))
    assert (spec.load_checkpoint.resume, spec.load_checkpoint.enabled) == (resume, enabled)


def test_default_latest_reference_is_the_own_project(tmp_path: Path) -> None:
    """Issue 10: LoadCheckpointConfig(enabled=True) was refused ("needs project_name or job_id")."""
    site = _site(tmp_path)
    spec = spec_for(_config(tmp_path, "load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True)"), site)
    first = resolve_load_checkpoints(spec)  # no checkpoint yet: a warning, the job starts without one
    assert first.load_checkpoint.checkpoints == ()
    assert any("no complete checkpoint of project 'Demo' yet" in w for w in first.warnings)
    store = open_store(site.storage.checkpoint_store)
    up = _up(store, tmp_path / "n0", 0, 1, job="12")
    _ckpt(tmp_path / "n0", "checkpoint-9")
    up.run_once()
    pinned = resolve_load_checkpoints(spec)
    [ref] = pinned.load_checkpoint.checkpoints
    assert (ref["resolved"]["job_id"], ref["resolved"]["checkpoint_name"]) == ("12", "checkpoint-9")


def test_explicit_reference_without_a_checkpoint_still_fails(tmp_path: Path) -> None:
    load = ("load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True, checkpoints=["
            "definitions.BasetenCheckpoint.from_latest_checkpoint(project_name='Demo')])")
    with pytest.raises(ConfigError):
        resolve_load_checkpoints(spec_for(_config(tmp_path, load), _site(tmp_path)))


def test_restart_loads_the_own_newest_complete_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = _site(tmp_path)
    spec = spec_for(_config(tmp_path, ""), site)
    store = open_store(site.storage.checkpoint_store)
    up = _up(store, tmp_path / "run1", 0, 1, job="55")
    _ckpt(tmp_path / "run1", "checkpoint-10", data=b"ten" * 10)
    _ckpt(tmp_path / "run1", "checkpoint-20", data=b"twenty" * 10)
    _ckpt(tmp_path / "run1", "checkpoint-30", data=b"partial", marker=False)  # never complete
    up.run_once()
    env = {"SLURM_JOB_ID": "55", "SLURMD_NODENAME": "n1"}
    first = tmp_path / "load-first"
    resume_or_load(spec, {**env, "SLURM_RESTART_COUNT": "0"}, first)
    assert not first.exists(), "a first run starts without a checkpoint"
    dest = tmp_path / "load"
    resume_or_load(spec, {**env, "SLURM_RESTART_COUNT": "2"}, dest)
    assert (dest / "rank-0" / "checkpoint-20" / "model.bin").read_bytes() == b"twenty" * 10
    assert sorted(p.name for p in (dest / "rank-0").iterdir()) == ["checkpoint-20"]
    assert "resuming from checkpoint 'checkpoint-20'" in capsys.readouterr().err
    other = tmp_path / "load-other"
    resume_or_load(spec, {**env, "SLURM_JOB_ID": "56", "SLURM_RESTART_COUNT": "1"}, other)
    assert not other.exists(), "a restart with no checkpoint of its own starts normally"


def test_restart_count() -> None:
    assert restart_count({}) == 0
    assert restart_count({"SLURM_RESTART_COUNT": "3"}) == 3
    assert restart_count({"SLURM_RESTART_COUNT": "x"}) == 0


MOTO_DELETE = """
import boto3, moto
from slurm_bt.checkpoints.store import open_store
from slurm_bt.storage.credentials import Credentials
with moto.mock_aws():
    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket="ckpts")
    store = open_store("s3://ckpts/pre", credentials=Credentials(aws_access_key_id="k", aws_secret_access_key="s"))
    for key in ("p/1/rank-0/c1/a", "p/1/rank-0/c1/sub/b", "p/1/rank-0/c10/a", "p/1/ranks/rank-0.json"):
        store.write_bytes(key, b"x")
    store.delete_tree("p/1/rank-0/c1")
    left = sorted(o["Key"] for o in client.list_objects_v2(Bucket="ckpts")["Contents"])
    assert left == ["pre/p/1/rank-0/c10/a", "pre/p/1/ranks/rank-0.json"], left
    store.close()
print("MOTO-OK")
"""


def test_s3_retention_deletes_exactly_one_checkpoint_prefix(tmp_path: Path) -> None:
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("moto") is None:
        pytest.skip("moto not installed")
    out = subprocess.run([sys.executable, "-c", MOTO_DELETE], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert "MOTO-OK" in out.stdout, out.stdout + out.stderr


def test_heartbeat_writes_only_on_change_or_every_refresh_period(tmp_path: Path) -> None:
    """An empty rank republishes empty_at at most every EMPTY_REFRESH_S, not on every 5 s pass."""
    store = open_store(f"file://{tmp_path}/store")
    writes: list[str] = []
    real = store.write_bytes

    def counting(key: str, data: bytes) -> None:
        writes.append(key)
        real(key, data)

    store.write_bytes = counting  # type: ignore[method-assign]
    r1 = _up(store, tmp_path / "n1", 1, 2)
    r1.report(start=True)
    first = len(writes)
    assert first >= 1 and r1.part().empty_at is not None
    r1.report()
    r1.report()
    assert len(writes) == first, "no write while nothing changed"
    (tmp_path / "n1" / "shard").mkdir()
    r1.report()
    assert r1.part().empty_at is None and len(writes) > first, "a directory appearing is published at once"


def test_two_writers_of_one_rank_part_keep_each_others_checkpoints(tmp_path: Path) -> None:
    """A requeued run's uploader and a hand-off sweep of the previous run write the same rank part."""
    store = open_store(f"file://{tmp_path}/store")
    sweep, run2 = _up(store, tmp_path / "handoff", 0, 1), _up(store, tmp_path / "run2", 0, 1)
    run2.report(start=True)  # run 2 read the part before the sweep published
    _ckpt(tmp_path / "handoff", "checkpoint-5")
    sweep.run_once(final=True)
    _ckpt(tmp_path / "run2", "checkpoint-8")
    run2.run_once()
    run2.report()
    index = read_job_index(store, "Demo", "77")
    assert index is not None and [c.name for c in index.checkpoints] == ["checkpoint-5", "checkpoint-8"]


def test_retention_never_deletes_in_another_users_job_directory(tmp_path: Path) -> None:
    """delete_tree walks for writing: a job directory (or a checkpoint in it) of another uid is refused, kept."""
    from slurm_bt.errors import UntrustedLocation

    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user")
    store = open_store(f"file://{tmp_path}/store")
    up = _up(store, tmp_path / "n0", 0, 1)
    _ckpt(tmp_path / "n0", "checkpoint-1")
    up.run_once()
    job_dir = tmp_path / f"store/_teams/{TEAM}/Demo/77"
    for path in (job_dir, *job_dir.rglob("*")):
        os.lchown(path, 4242, -1)  # now someone else's job directory
    with pytest.raises(UntrustedLocation):
        store.delete_tree(f"_teams/{TEAM}/Demo/77/rank-0/checkpoint-1")
    assert (job_dir / "rank-0/checkpoint-1/model.bin").is_file()
    for above in (f"_teams/{TEAM}/Demo/77", f"_teams/{TEAM}/Demo", f"_teams/{TEAM}", "_teams", "Demo/77"):
        with pytest.raises(StorageError, match="refusing to delete above"):
            store.delete_tree(above)  # never a whole job, project or namespace


def test_restart_finds_an_earlier_run_at_the_legacy_location(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A job queued across the upgrade: its first run uploaded to ``<store>/<project>/<job>``."""
    site = _site(tmp_path)
    spec = spec_for(_config(tmp_path, ""), site)
    up = _up(open_store(site.storage.checkpoint_store), tmp_path / "run1", 0, 1, job="58")
    _ckpt(tmp_path / "run1", "checkpoint-3", data=b"three" * 10)
    up.run_once()
    store_root = tmp_path / "store"
    (store_root / "Demo").mkdir()
    os.rename(store_root / "_teams" / TEAM / "Demo" / "58", store_root / "Demo" / "58")
    shutil.copystat(store_root / "_teams" / TEAM / "Demo", store_root / "Demo")
    os.chown(store_root / "Demo", -1, os.stat(store_root / "_teams" / TEAM / "Demo").st_gid)
    dest = tmp_path / "load"
    resume_or_load(spec, {"SLURM_JOB_ID": "58", "SLURMD_NODENAME": "n1", "SLURM_RESTART_COUNT": "1"}, dest)
    assert (dest / "rank-0" / "checkpoint-3" / "model.bin").read_bytes() == b"three" * 10
    assert "resuming from checkpoint 'checkpoint-3'" in capsys.readouterr().err
