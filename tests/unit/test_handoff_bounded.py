"""Issue #8 items 4 and 6: root-started checkpoint helpers are bounded; odd file names never block an upload.

* files a job controls are opened without following a user's symlink, never as a FIFO or device,
  and size-capped (:mod:`slurm_bt.posix.user_files`);
* privilege-dropped children run under memory, CPU and wall-clock limits (:mod:`slurm_bt.posix.privdrop`);
* a hand-off entry that fails the same way K times is quarantined, reported, skipped; age and per-user
  size bounds remove what cannot complete (:mod:`slurm_bt.checkpoints.handoff`);
* names that are not UTF-8 or hold a newline round-trip through keys and indexes;
* a hand-off made under the epilog's umask can be resumed by root for an ordinary user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.checkpoints.flush import STATE_NAME, flush_job_checkpoints, read_state
from slurm_bt.checkpoints.handoff import STATUS_NAME, quarantined_handoffs, resume_handoffs
from slurm_bt.checkpoints.index import decode_relpath, encode_relpath
from slurm_bt.checkpoints.scan import list_files
from slurm_bt.checkpoints.store import FileStore, UploadResult, team_group
from slurm_bt.checkpoints.upload import read_job_index
from slurm_bt.hooks import epilog
from slurm_bt.job_spec import JobSpec
from slurm_bt.posix.privdrop import ChildError, ChildLimits, ChildTimeout, run_in_child
from slurm_bt.posix.user_files import UnsafeFile, open_user_file, read_user_file
from slurm_bt.site.hook_settings import HandoffPolicy
from slurm_bt.site.settings import SiteSettings
from tests.spec_helpers import spec_for
from tests.unit import test_hooks_prolog as hp
from tests.unit.test_hooks_prolog import site  # noqa: F401  (the prolog/epilog sandbox fixture)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the epilog flush and hand-off sweep run as root")
TEAM = team_group(None)[0]
"""The team namespace of root's jobs here (root's primary group, no prolog record, no account)."""

CONFIG = """
from truss_train import definitions
project = definitions.TrainingProject(name="Bounded Demo", job=definitions.TrainingJob(
    image=definitions.Image(base_image="python:3.11"),
    runtime=definitions.Runtime(start_commands=["true"],
        checkpointing_config=definitions.CheckpointingConfig(enabled=True)),
))
"""


def _uri(base: Path):  # type: ignore[no-untyped-def]
    from slurm_bt.checkpoints.locations import parse_store_uri

    return parse_store_uri(f"file://{base}/store")


# -- opening files a job controls --------------------------------------------------------------


def test_fifo_device_and_user_symlinks_are_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text("{}")
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero-link")
    os.symlink(tmp_path / "ok.json", tmp_path / "file-link")
    started = time.monotonic()
    for name in ("fifo", "zero-link", "file-link"):
        with pytest.raises(UnsafeFile):
            read_user_file(tmp_path / name, 1 << 20)
    with pytest.raises(UnsafeFile, match="not a regular file"):
        read_user_file("/dev/zero", 1 << 20)
    assert time.monotonic() - started < 2, "a FIFO must not block the open"
    assert read_user_file(tmp_path / "ok.json", 10) == b"{}"


def test_symlinked_parent_is_followed_only_when_root_owns_it(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "job.json").write_text("{}")
    os.symlink(real, tmp_path / "admin-link")  # created by root: an admin's /home -> /data/home
    assert read_user_file(tmp_path / "admin-link" / "job.json", 10) == b"{}"
    if os.geteuid() == 0:
        os.symlink(real, tmp_path / "user-link")
        os.lchown(tmp_path / "user-link", 1001, 1001)  # a symlink a user made
        with pytest.raises(UnsafeFile, match="symlink owned by uid 1001"):
            read_user_file(tmp_path / "user-link" / "job.json", 10)


def test_size_cap(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 1000)
    with pytest.raises(UnsafeFile, match="more than the 999"):
        read_user_file(tmp_path / "big", 999)
    fd = open_user_file(tmp_path / "big")
    try:
        assert os.fstat(fd).st_size == 1000 and os.get_blocking(fd) is False
    finally:
        os.close(fd)


def test_state_file_swapped_for_dev_zero_is_not_read(tmp_path: Path) -> None:
    os.symlink("/dev/zero", tmp_path / STATE_NAME)
    assert read_state(tmp_path) is None
    (tmp_path / STATE_NAME).unlink()
    os.mkfifo(tmp_path / STATE_NAME)
    started = time.monotonic()
    assert read_state(tmp_path) is None
    assert time.monotonic() - started < 2


# -- limits of children ------------------------------------------------------------------------


def test_child_memory_limit_stops_a_runaway_read() -> None:
    def hog() -> int:
        chunks = [bytearray(64 << 20) for _ in range(64)]  # 4 GiB: far above the limit
        return len(chunks)

    with pytest.raises(ChildError) as info:
        run_in_child(hog, timeout_s=60, limits=ChildLimits(memory_bytes=512 << 20))
    assert info.value.exc_type == "MemoryError"


def test_child_cpu_limit_kills_a_busy_loop() -> None:
    def spin() -> None:
        while True:
            pass

    started = time.monotonic()
    with pytest.raises(ChildError, match=r"SIGXCPU|SIGKILL"):
        run_in_child(spin, timeout_s=60, limits=ChildLimits(cpu_s=1))
    assert time.monotonic() - started < 30


def test_wall_clock_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"

    def start_and_block() -> None:
        import subprocess

        proc = subprocess.Popen(["sleep", "300"])
        pidfile.write_text(str(proc.pid))
        time.sleep(300)

    started = time.monotonic()
    with pytest.raises(ChildTimeout):
        run_in_child(start_and_block, timeout_s=2)
    assert time.monotonic() - started < 10
    pid = int(pidfile.read_text())
    _assert_gone(pid)


def test_a_finished_child_leaves_no_process_behind(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"

    def start_and_return() -> int:
        import subprocess

        proc = subprocess.Popen(["sleep", "300"])
        pidfile.write_text(str(proc.pid))
        return 1

    assert run_in_child(start_and_return, timeout_s=20) == 1
    _assert_gone(int(pidfile.read_text()))


def _assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # a zombie whose parent (the killed child) is gone is reaped by init; check its state
            if Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"process {pid} outlived its child's process group")


# -- odd names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"w.bin", b"sub/dir/x", b"bad-\xff-name", b"nl\nname", b"50%25.bin", b"100%.txt",
                                 "modèle-模型".encode(), b"tab\tand\x7fdel", b"\xc2\x85nel", b"%%41%zz"])
def test_names_round_trip(raw: bytes) -> None:
    enc = encode_relpath(raw)
    enc.encode("utf-8")  # storable in JSON and keys
    assert not any(c in enc for c in "\n\r\t\x00")
    assert decode_relpath(enc) == raw
    if raw.isascii() and b"%" not in raw and all(32 <= b < 127 for b in raw):
        assert enc == raw.decode(), "ordinary names keep their keys"


@pytest.mark.parametrize("bad", ["a/%2E%2E/b", "%2F", "..", "a//b", "x%00y", "."])
def test_decoded_names_cannot_leave_the_folder(bad: str) -> None:
    with pytest.raises(ValueError):
        decode_relpath(bad)


def test_scan_lists_odd_names_encoded(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "w.bin").write_bytes(b"w")
    with open(os.path.join(os.fsencode(tmp_path), b"bad-\xff"), "wb") as f:
        f.write(b"x")
    (tmp_path / "sub" / "nl\nname").write_bytes(b"y")
    os.mkfifo(tmp_path / "fifo")
    files, skipped, _ = list_files(tmp_path)
    assert [f.relpath for f in files] == ["bad-%FF", "sub/nl%0Aname", "w.bin"]
    assert skipped == ["fifo"]


# -- the flush and the hand-off ----------------------------------------------------------------


def _job(base: Path, job_id: str, owner: int = 0) -> tuple[SiteSettings, JobSpec, Path, dict[str, str]]:
    settings = SiteSettings(storage={"scratch": f"{base}/node/%n/scratch", "checkpoint_store": f"file://{base}/store",
                                 "secrets": f"{base}/secrets", "workspace": f"{base}/ws"})
    cfg = base / "config.py"
    cfg.write_text(textwrap.dedent(CONFIG))
    spec = spec_for(cfg, settings)
    spec_path = base / f"job-{job_id}.json"
    spec_path.write_text(spec.model_dump_json())
    ckpt = base / "node/n1/scratch" / job_id / "mnt/checkpoints"
    for name in ("checkpoint-1", "checkpoint-2"):
        (ckpt / name).mkdir(parents=True)
        (ckpt / name / "w.bin").write_bytes(os.urandom(10_000))
    (ckpt / STATE_NAME).write_text(json.dumps({"spec_path": str(spec_path), "job_id": job_id, "rank": 0,
                                               "node": "n1"}))
    user = "root"
    if owner:
        import pwd

        user = pwd.getpwuid(owner).pw_name
        for p in [spec_path, *ckpt.parent.parent.rglob("*"), ckpt.parent.parent]:
            os.lchown(p, owner, owner)
    env = {"SLURM_JOB_ID": job_id, "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": str(owner), "SLURM_JOB_GID": str(owner),
           "SLURM_JOB_USER": user}
    return settings, spec, ckpt, env


@root_only
def test_flush_uploads_a_checkpoint_with_odd_names(tmp_path: Path) -> None:
    settings, spec, ckpt, env = _job(tmp_path, "901")
    with open(os.path.join(os.fsencode(ckpt), b"checkpoint-1", b"bad-\xff"), "wb") as f:
        f.write(b"odd")
    (ckpt / "checkpoint-2" / "nl\nname").write_bytes(b"newline")
    result = flush_job_checkpoints(env, 60, site=settings)
    assert result.status == "done", result
    index = read_job_index(FileStore(_uri(tmp_path)), spec.project_id, "901", team=TEAM)
    assert index is not None
    paths = {c.name: sorted(f.path for f in c.ranks[0]) for c in index.checkpoints}
    assert paths == {"checkpoint-1": ["bad-%FF", "w.bin"], "checkpoint-2": ["nl%0Aname", "w.bin"]}
    stored = tmp_path / "store" / "_teams" / TEAM / spec.project_id / "901" / "rank-0"
    assert (stored / "checkpoint-1" / "bad-%FF").read_bytes() == b"odd"


@root_only
def test_unreadable_job_spec_hands_off_fast_then_quarantines_after_k(tmp_path: Path) -> None:
    settings, spec, _, env = _job(tmp_path, "902")
    spec_path = tmp_path / "job-902.json"
    spec_path.unlink()
    os.mkfifo(spec_path)  # the job swapped its job.json for a FIFO before it ended
    started = time.monotonic()
    result = flush_job_checkpoints(env, 30, site=settings)
    assert result.status == "handed-off", result
    assert time.monotonic() - started < 10, "the flush did not wait on the FIFO"
    area = tmp_path / "node/n1/checkpoint-handoff"
    policy = HandoffPolicy(max_failures=3)
    for attempt in (1, 2):
        [o] = resume_handoffs(root=area, policy=policy)
        assert (o.status, o.message.startswith(f"attempt {attempt} of 3")) == ("failed", True), o
    [o] = resume_handoffs(root=area, policy=policy)
    assert o.status == "quarantined" and "not a regular file" in o.message, o
    status = json.loads((area / "902.n1" / STATUS_NAME).read_text())
    assert status["quarantined"] is True and status["failures"] == 3
    [q] = quarantined_handoffs(settings.storage.model_dump(), "n1")
    assert q.entry == "902.n1" and q.failures == 3 and "not a regular file" in q.error
    # Never retried automatically: no child runs (the message says so) and the data stays.
    [o] = resume_handoffs(root=area, policy=policy)
    assert o.status == "quarantined" and o.message.startswith("not retried"), o
    assert (area / "902.n1" / "data" / "checkpoint-1" / "w.bin").is_file()
    # The admin repairs the cause, then retries it explicitly.
    spec_path.unlink()
    spec_path.write_text(spec.model_dump_json())
    [o] = resume_handoffs(root=area, policy=policy, retry_quarantined=True)
    assert o.status == "uploaded", o
    assert not (area / "902.n1").exists() and quarantined_handoffs(settings.storage.model_dump(), "n1") == []


@root_only
def test_a_different_failure_restarts_the_count(tmp_path: Path) -> None:
    settings, _, _, env = _job(tmp_path, "903")
    spec_path = tmp_path / "job-903.json"
    spec_path.unlink()
    os.mkfifo(spec_path)
    assert flush_job_checkpoints(env, 30, site=settings).status == "handed-off"
    area = tmp_path / "node/n1/checkpoint-handoff"
    policy = HandoffPolicy(max_failures=2)
    assert [o.status for o in resume_handoffs(root=area, policy=policy)] == ["failed"]
    spec_path.unlink()
    spec_path.write_text("not json")
    [o] = resume_handoffs(root=area, policy=policy)
    assert o.status == "failed" and "attempt 1 of 2" in o.message, o


@root_only
def test_checkpoint_file_swapped_after_the_scan_fails_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, _, ckpt, env = _job(tmp_path, "904")
    import slurm_bt.checkpoints.scan as scan_mod
    import slurm_bt.checkpoints.upload as upload_mod

    real_scan = scan_mod.scan_dir
    target = ckpt / "checkpoint-1" / "w.bin"

    def scan_then_swap(path: Path):  # type: ignore[no-untyped-def]
        result = real_scan(path)
        target.unlink()
        os.mkfifo(target)  # swapped between the scan and the open
        return result

    monkeypatch.setattr(upload_mod, "scan_dir", scan_then_swap)
    started = time.monotonic()
    result = flush_job_checkpoints(env, 30, site=settings)
    assert time.monotonic() - started < 10, "opening the FIFO blocked"
    assert result.status == "handed-off" and "not a regular file" in result.message, result


@root_only
def test_a_symlinked_checkpoint_dir_is_never_moved_into_the_hand_off_area(tmp_path: Path) -> None:
    settings, _, ckpt, env = _job(tmp_path, "906")
    real = tmp_path / "elsewhere"
    ckpt.rename(real)
    os.symlink(real, ckpt)  # the job replaced its checkpoint directory with a symlink
    (tmp_path / "job-906.json").unlink()
    os.mkfifo(tmp_path / "job-906.json")
    result = flush_job_checkpoints(env, 30, site=settings)
    entry = tmp_path / "node/n1/checkpoint-handoff/906.n1"
    assert not (entry / "data").exists() and ckpt.is_symlink(), result
    assert (real / "checkpoint-1" / "w.bin").is_file()


@root_only
@pytest.mark.parametrize("old_entry", [False, True])
def test_hand_off_without_an_uploader_state_resumes_once_the_store_is_repaired(tmp_path: Path,
                                                                               old_entry: bool) -> None:
    settings, spec, ckpt, env = _job(tmp_path, "907")
    (ckpt / STATE_NAME).unlink()  # the job's uploader never ran (its store location was squatted)
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "job-907.json").rename(work / "job.json")
    (tmp_path / "store").write_text("squatted")  # the store location is unusable
    result = flush_job_checkpoints({**env, "SLURM_JOB_WORK_DIR": str(work)}, 30, site=settings)
    assert result.status == "handed-off", result
    entry = tmp_path / "node/n1/checkpoint-handoff/907.n1"
    assert read_state(entry / "data") is not None, "the flush recorded spec and rank for the hand-off"
    if old_entry:  # as hand-offs made before that were: no state file at all
        (entry / "data" / STATE_NAME).unlink()
    [o] = resume_handoffs(root=entry.parent)
    assert o.status == "failed", o
    (tmp_path / "store").unlink()  # the admin repairs the store location
    [o] = resume_handoffs(root=entry.parent)
    assert o.status == "uploaded", o
    index = read_job_index(FileStore(_uri(tmp_path)), spec.project_id, "907", team=TEAM)
    assert index is not None and [c.name for c in index.checkpoints] == ["checkpoint-1", "checkpoint-2"]


@root_only
def test_a_refused_job_with_no_checkpoint_is_not_handed_off(tmp_path: Path) -> None:
    settings, _, ckpt, env = _job(tmp_path, "908")
    for child in ckpt.iterdir():  # only the uploader's state file is left: nothing was ever written
        if child.name != STATE_NAME:
            shutil.rmtree(child)
    assert read_state(ckpt) is not None
    (tmp_path / "store").write_text("squatted")  # the store refuses the job
    result = flush_job_checkpoints(env, 30, site=settings)
    assert result.status == "done" and "no checkpoint to upload" in result.message, result
    assert not (tmp_path / "node/n1/checkpoint-handoff/908.n1").exists()


@root_only
def test_flush_leaves_a_squatted_host_checkpoint_path_alone(tmp_path: Path) -> None:
    squat = tmp_path / "squatted-ckpts"
    (squat / "planted").mkdir(parents=True)
    (squat / "planted" / "w.bin").write_bytes(b"not the job's")
    os.chown(squat, 1, 1)  # another user (daemon) made the name first; step 1 refused it
    settings = SiteSettings(storage={"scratch": f"{tmp_path}/node/%n/scratch", "checkpoint_store": f"file://{tmp_path}/store",
                                     "secrets": f"{tmp_path}/secrets", "workspace": f"{tmp_path}/ws"})
    cfg = tmp_path / "config.py"
    cfg.write_text(textwrap.dedent(CONFIG).replace("enabled=True)", f"enabled=True, checkpoint_path={str(squat)!r})"))
    spec = spec_for(cfg, settings)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "job.json").write_text(spec.model_dump_json())
    env = {"SLURM_JOB_ID": "909", "SLURMD_NODENAME": "n1", "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
           "SLURM_JOB_USER": "root", "SLURM_JOB_WORK_DIR": str(tmp_path / "work")}
    result = flush_job_checkpoints(env, 30, site=settings)
    assert result.status == "nothing", result
    assert sorted(p.name for p in squat.iterdir()) == ["planted"], "nothing written into the squatter's dir"
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("w.bin"))


def _entry(area: Path, name: str, uid: int, created: float, size: int) -> None:
    (area / name / "data").mkdir(parents=True)
    (area / name / "data" / "blob").write_bytes(os.urandom(size))
    (area / name / "handoff.json").write_text(json.dumps({"job_id": name.split(".")[0], "node": "n1", "uid": uid,
                                                          "gid": uid, "user": f"u{uid}", "moved": True,
                                                          "created": created}))


@root_only
def test_age_and_per_user_size_bounds_remove_what_cannot_complete(tmp_path: Path) -> None:
    area = tmp_path / "checkpoint-handoff"
    now = time.time()
    _entry(area, "1.n1", 1001, now - 10 * 86400, 4096)  # older than max_age_s
    _entry(area, "2.n1", 1001, now - 300, 300_000)  # older of 1001's two recent ones: over the budget
    _entry(area, "3.n1", 1001, now - 100, 300_000)
    _entry(area, "4.n1", 1002, now - 200, 300_000)  # another user's budget is separate
    for name in ("2.n1", "3.n1", "4.n1"):  # poisoned: quarantined entries are bounded too
        (area / name / STATUS_NAME).write_text(json.dumps({"quarantined": True, "failures": 3, "signature": "x"}))
    policy = HandoffPolicy(max_age_s=86400, max_bytes_per_user=500_000)
    outcomes = {o.entry: o.status for o in resume_handoffs(root=area, policy=policy)}
    assert outcomes["1.n1"] == "expired" and outcomes["2.n1"] == "over-budget", outcomes
    assert outcomes["3.n1"] == outcomes["4.n1"] == "quarantined", outcomes
    assert sorted(p.name for p in area.iterdir()) == ["3.n1", "4.n1"]


@root_only
def test_a_sparse_file_is_charged_its_apparent_size(tmp_path: Path) -> None:
    area = tmp_path / "checkpoint-handoff"
    _entry(area, "7.n1", 1001, time.time() - 60, 10)
    with open(area / "7.n1" / "data" / "sparse", "wb") as f:
        f.truncate(50 * 1024**3)  # 50 GiB to read and upload, almost no disk
    (area / "7.n1" / STATUS_NAME).write_text(json.dumps({"quarantined": True, "failures": 3, "signature": "x"}))
    outcomes = resume_handoffs(root=area, policy=HandoffPolicy(max_bytes_per_user=1024**3))
    assert [o.status for o in outcomes] == ["quarantined", "over-budget"], outcomes
    assert not (area / "7.n1").exists()


# -- resume as root for an ordinary user --------------------------------------------------------


@pytest.fixture
def world_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="bt-handoff-", dir="/tmp"))
    os.chmod(base, 0o755)
    (base / "store").mkdir()
    os.chmod(base / "store", 0o1777)
    (base / "store" / "_teams").mkdir()  # as an admin (or the prolog) makes it; users never do
    os.chmod(base / "store" / "_teams", 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@root_only
def test_root_resumes_a_hand_off_made_under_the_epilog_umask(world_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.test_hooks_env import ensure_test_users

    uid = ensure_test_users()["btu1"].pw_uid
    settings, spec, _, env = _job(world_dir, "905", owner=uid)
    release = threading.Event()
    real = FileStore.upload_file

    def stalled(self: FileStore, fd: int, size: int, key: str, *, expect_sha256: str | None = None) -> UploadResult:
        release.wait(30)  # the store is unreachable during the epilog
        return real(self, fd, size, key, expect_sha256=expect_sha256)

    monkeypatch.setattr(FileStore, "upload_file", stalled)
    old = os.umask(0o077)  # what the epilog runs under
    try:
        assert flush_job_checkpoints(env, 2, site=settings).status == "handed-off"
    finally:
        os.umask(old)
    monkeypatch.undo()
    entry = world_dir / "node/n1/checkpoint-handoff/905.n1"
    assert stat.S_IMODE(os.stat(entry).st_mode) == 0o711
    os.chmod(entry, 0o700)  # as older versions left it: the child (btu1) could not reach data/
    [o] = resume_handoffs(root=entry.parent)
    assert o.status == "uploaded", o
    import grp

    from slurm_bt.posix.teams import team_slug

    team = team_slug(grp.getgrgid(ensure_test_users()["btu1"].pw_gid).gr_name)  # btu1's primary group: btteam1
    index = read_job_index(FileStore(_uri(world_dir)), spec.project_id, "905", team=team)
    assert index is not None and [c.name for c in index.checkpoints] == ["checkpoint-1", "checkpoint-2"]
    stored = world_dir / "store" / "_teams" / team / spec.project_id / "905"
    assert os.stat(stored).st_uid == uid, "uploaded as the job's user, not as root"


# -- checkpoints the epilog kept in scratch are bounded by the same age ----------------------------


@root_only
def test_prolog_removes_scratch_kept_for_a_hand_off_past_max_age(site: hp.Site,  # noqa: F811
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(epilog, "checkpoint_flush", hp.flush_incomplete)
    site.hooks.write_text(site.hooks.read_text() + "[handoff]\nmax_age_s = 86400\n")
    work = hp.write_job(site, "btu1")
    root = site.scratch("x").parent
    records = root / ".slurm-bt-handoff"
    records.mkdir(exist_ok=True)
    for job, age in (("920", 2 * 86400), ("922", 7200)):
        (root / job / "mnt" / "checkpoints" / "c").mkdir(parents=True)
        (root / job / "mnt" / "checkpoints" / "c" / "w.bin").write_bytes(b"x" * 1000)
        (records / f"{job}.json").write_text("{}")
        hp._age(records / f"{job}.json", age)
        hp._age(root / job, age)
    assert hp.run(site, "prolog", hp.job_env(site, "btu1", "921", work)) == 0
    assert not (root / "920").exists() and not (records / "920.json").exists()
    assert (root / "922" / "mnt" / "checkpoints" / "c" / "w.bin").is_file() and (records / "922.json").exists()
    log = (site.base / "log" / "hooks.log").read_text()
    assert f"stale scratch {root}/920 (kept for a hand-off past max_age_s): removed" in log


@root_only
def test_a_root_record_of_a_users_data_is_quarantined_never_uploaded_as_root(tmp_path: Path) -> None:
    """What a 26.05 epilog told uid 0 for a user's job left behind: the user's checkpoints recorded as root's."""
    area = tmp_path / "checkpoint-handoff"
    _entry(area, "11.n1", 0, time.time() - 60, 64)
    os.chown(area / "11.n1" / "data", 1001, 1001)
    [o] = resume_handoffs(root=area, policy=HandoffPolicy())
    assert o.status == "quarantined" and "belongs to uid 1001: not uploaded as root" in o.message, o
    assert (area / "11.n1" / "data" / "blob").is_file()  # kept for the admin
    status = json.loads((area / "11.n1" / STATUS_NAME).read_text())
    assert status["quarantined"] is True and status["signature"] == "root-record-user-data"
    # A root job's own data (root-owned) is not affected by the rule.
    _entry(area, "12.n1", 0, time.time() - 60, 64)
    outcomes = {o.entry: o for o in resume_handoffs(root=area, policy=HandoffPolicy())}
    assert "not uploaded as root" not in outcomes["12.n1"].message, outcomes["12.n1"]
