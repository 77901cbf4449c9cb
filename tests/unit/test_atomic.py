"""Atomic publishing: temp files never linger, modes ignore umask, nothing is written through links."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt import atomic
from slurm_bt.atomic import fsync_dir, make_private_dir, publish_dir_atomic, write_file_atomic
from slurm_bt.errors import StorageError

IS_ROOT = os.getuid() == 0


@pytest.fixture
def umask0() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- write_file_atomic --------------------------------------------------------------------------


def test_write_creates_file_with_mode_regardless_of_umask(tmp_path: Path, umask0: None) -> None:
    target = tmp_path / "f"
    write_file_atomic(target, b"hello")
    assert target.read_bytes() == b"hello"
    assert mode_of(target) == 0o600
    write_file_atomic(target, b"run me", mode=0o755)
    assert target.read_bytes() == b"run me"
    assert mode_of(target) == 0o755
    assert os.listdir(tmp_path) == ["f"]


def test_write_replaces_symlink_instead_of_writing_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "link"
    link.symlink_to(victim)
    write_file_atomic(link, b"new")
    assert victim.read_bytes() == b"precious"
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"


def test_write_breaks_hard_link(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.write_bytes(b"old")
    target = tmp_path / "target"
    os.link(other, target)
    write_file_atomic(target, b"new")
    assert other.read_bytes() == b"old"
    assert target.read_bytes() == b"new"


def test_write_failure_keeps_old_content_and_removes_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(StorageError) as info:
        write_file_atomic(target, b"SECRET-DATA")
    assert "SECRET-DATA" not in str(info.value)
    assert info.value.uri == str(target)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f"]


def test_write_into_missing_dir_is_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot create temp file"):
        write_file_atomic(tmp_path / "nope" / "f", b"x")
    with pytest.raises(OSError):  # StorageError is an OSError for callers that catch that
        write_file_atomic(tmp_path / "nope" / "f", b"x")


def test_write_onto_directory_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(StorageError):
        write_file_atomic(tmp_path / "d", b"x")
    assert os.listdir(tmp_path) == ["d"]


def test_temp_name_is_hidden_unique_and_beside(tmp_path: Path) -> None:
    names = {atomic.temp_name(tmp_path / "x") for _ in range(50)}
    assert len(names) == 50
    for n in names:
        assert n.parent == tmp_path
        assert n.name.startswith(".x.tmp-")


# --- publish_dir_atomic -------------------------------------------------------------------------


def built_dir(parent: Path) -> Path:
    tmp = parent / ".build"
    tmp.mkdir()
    (tmp / "a").write_text("a")
    return tmp


def test_publish_moves_dir(tmp_path: Path) -> None:
    tmp = built_dir(tmp_path)
    publish_dir_atomic(tmp, tmp_path / "final")
    assert (tmp_path / "final" / "a").read_text() == "a"
    assert not tmp.exists()


@pytest.mark.parametrize("noreplace_supported", [True, False])
@pytest.mark.parametrize("existing", ["empty_dir", "full_dir", "file", "symlink"])
def test_publish_refuses_existing_final(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: str, noreplace_supported: bool
) -> None:
    if not noreplace_supported:  # the NFS path: renameat2 flag rejected
        monkeypatch.setattr(atomic, "_rename_noreplace", lambda src, dst: False)
    final = tmp_path / "final"
    if existing == "empty_dir":
        final.mkdir()
    elif existing == "full_dir":
        final.mkdir()
        (final / "keep").write_text("keep")
    elif existing == "file":
        final.write_text("keep")
    else:
        final.symlink_to(tmp_path / "nowhere")
    tmp = built_dir(tmp_path)
    with pytest.raises(StorageError, match="already exists"):
        publish_dir_atomic(tmp, final)
    assert tmp.exists()  # the caller owns it and cleans it up
    if existing == "full_dir":
        assert (final / "keep").read_text() == "keep"
    if existing == "empty_dir":
        assert os.listdir(final) == []


def test_publish_missing_tmp_is_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError):
        publish_dir_atomic(tmp_path / "nope", tmp_path / "final")


def test_fsync_dir(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    with pytest.raises(StorageError):
        fsync_dir(tmp_path / "missing")


# --- make_private_dir ---------------------------------------------------------------------------


def test_make_private_dir_creates_0700(tmp_path: Path, umask0: None) -> None:
    d = tmp_path / "p"
    make_private_dir(d)
    assert mode_of(d) == 0o700
    make_private_dir(d)  # idempotent
    assert mode_of(d) == 0o700


def test_make_private_dir_tightens_existing(tmp_path: Path) -> None:
    d = tmp_path / "p"
    d.mkdir()
    d.chmod(0o777)
    make_private_dir(d)
    assert mode_of(d) == 0o700


def test_make_private_dir_parents(tmp_path: Path, umask0: None) -> None:
    d = tmp_path / "a" / "b" / "c"
    make_private_dir(d, parents=True)
    for p in (tmp_path / "a", tmp_path / "a" / "b", d):
        assert mode_of(p) == 0o700
    with pytest.raises(StorageError):
        make_private_dir(tmp_path / "x" / "y")


def test_make_private_dir_refuses_symlink(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    target.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(StorageError, match="symlink"):
        make_private_dir(link)
    assert mode_of(target) == 0o755  # never chmod through the link


def test_make_private_dir_refuses_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(StorageError, match="not a directory"):
        make_private_dir(f)


@pytest.mark.skipif(not IS_ROOT, reason="needs root to chown")
def test_make_private_dir_refuses_foreign_owner(tmp_path: Path) -> None:
    d = tmp_path / "mallory"
    d.mkdir(mode=0o777)
    os.chown(d, 12345, 12345)
    d.chmod(0o777)
    with pytest.raises(StorageError, match="owned by uid 12345"):
        make_private_dir(d)
    assert mode_of(d) == 0o777  # never adopted or chmodded


def test_syncfs_flushes_the_filesystem_and_reports_a_bad_descriptor(tmp_path: Path) -> None:
    from slurm_bt.atomic import syncfs

    (tmp_path / "f").write_bytes(b"x")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)  # a real directory descriptor: no error
    finally:
        os.close(fd)
    with pytest.raises(StorageError, match="syncfs failed"):
        syncfs(fd)  # closed: EBADF, reported, never silently ignored
