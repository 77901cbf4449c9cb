"""The completion rule: marker, quiet period, final; names and symlinks that are never uploaded."""

from __future__ import annotations

import os
from pathlib import Path

from slurm_bt.checkpoints.locations import parse_store_uri, valid_checkpoint_name
from slurm_bt.checkpoints.scan import CompletionTracker, scan_dir


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _ckpt(root: Path, name: str, files: dict[str, bytes]) -> Path:
    d = root / name
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


def test_marker_makes_a_checkpoint_complete_at_once(tmp_path: Path) -> None:
    d = _ckpt(tmp_path, "checkpoint-1", {"a.bin": b"x"})
    tracker = CompletionTracker(quiet_s=3600)
    [state], _ = scan_dir(tmp_path)
    assert tracker.completion(state) is None
    for marker in (".complete", "COMPLETE"):
        (d / marker).touch()
        [state], _ = scan_dir(tmp_path)
        assert tracker.completion(state) == "marker"
        assert [f.relpath for f in state.files] == ["a.bin"], "markers are never uploaded"
        (d / marker).unlink()


def test_quiet_rule_needs_stable_scans_and_old_mtimes(tmp_path: Path) -> None:
    d = _ckpt(tmp_path, "checkpoint-2", {"a.bin": b"x"})
    mono, wall = Clock(), Clock()
    wall.t = os.stat(d / "a.bin").st_mtime
    tracker = CompletionTracker(quiet_s=60, clock=mono, wall=wall)
    [state], _ = scan_dir(tmp_path)
    assert tracker.completion(state) is None
    mono.t += 61
    wall.t += 61
    [state], _ = scan_dir(tmp_path)
    assert tracker.completion(state) == "quiet"
    (d / "b.bin").write_bytes(b"still writing")  # a change restarts the quiet period
    [state], _ = scan_dir(tmp_path)
    assert tracker.completion(state) is None
    assert tracker.completion(state, final=True) == "final"


def test_in_progress_names_loose_files_and_foreign_symlinks(tmp_path: Path) -> None:
    _ckpt(tmp_path, ".tmp-checkpoint-3", {"a": b"1"})
    _ckpt(tmp_path, "tmp-checkpoint-4", {"a": b"1"})
    _ckpt(tmp_path, "checkpoint-5.partial", {"a": b"1"})
    d = _ckpt(tmp_path, "checkpoint-6", {"w.bin": b"w"})
    (tmp_path / "trainer_state.json").write_text("{}")
    secret = tmp_path.parent / "outside-secret"
    secret.write_text("do not upload")
    os.symlink(secret, d / "leak")
    os.symlink(d / "w.bin", d / "alias.bin")
    states, loose = scan_dir(tmp_path)
    assert [s.name for s in states] == ["checkpoint-6"]
    assert loose == ["trainer_state.json"]
    assert [f.relpath for f in states[0].files] == ["alias.bin", "w.bin"]
    assert states[0].skipped == ("leak",)
    for bad in ("", ".x", "a/b", "..", "tmp_x", "x.tmp", "x.inprogress"):
        assert not valid_checkpoint_name(bad)
    assert valid_checkpoint_name("checkpoint-100") and valid_checkpoint_name("step_5.epoch-1")


def test_store_uri_parsing() -> None:
    u = parse_store_uri("s3://bkt/some/prefix?endpoint_url=http://127.0.0.1:1&secret=s")
    assert (u.scheme, u.bucket, u.prefix, u.options["secret"]) == ("s3", "bkt", "some/prefix", "s")
    assert u.key("p", "1", "index.json") == "some/prefix/p/1/index.json"
    assert u.display() == "s3://bkt/some/prefix"
    r2 = parse_store_uri("r2://acct.bkt/x")
    assert (r2.account, r2.bucket) == ("acct", "bkt")
    f = parse_store_uri("file:///shared/ckpts")
    assert f.key("p", "1") == "/shared/ckpts/p/1"
    import pytest

    from slurm_bt.errors import StorageError

    for bad in ("file://relative/x", "s3://b/../x", "ftp://x/y", "r2://nodot/x", "s3://b/x?bogus=1"):
        with pytest.raises(StorageError):
            parse_store_uri(bad)


def test_shared_filesystem_detection(tmp_path: Path) -> None:
    from slurm_bt.checkpoints.locations import is_shared_fs

    info = tmp_path / "mountinfo"
    info.write_text("22 1 0:5 / / rw - ext4 /dev/vda rw\n"
                    "30 22 0:40 / /shared rw,relatime - nfs4 srv:/x rw\n"
                    "31 22 0:41 / /shared/local rw - xfs /dev/x rw\n"
                    "32 22 0:42 / /lus rw - lustre 10.0.0.1@tcp:/fs rw\n"
                    "33 22 0:43 / /my\\040fuse rw - fuse.sshfs host: rw\n")
    assert is_shared_fs("/shared/job/ckpt", str(info)) and is_shared_fs("/lus/x", str(info))
    assert is_shared_fs("/my fuse/x", str(info))
    assert not is_shared_fs("/shared/local/x", str(info)) and not is_shared_fs("/var/scratch", str(info))
