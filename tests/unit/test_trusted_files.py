"""read_trusted_file: only regular, trusted-owner, not group/other-writable, bounded files are read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_bt.trusted_files import read_trusted_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create files owned by others")


def _file(path: Path, data: bytes = b"ok", mode: int = 0o644, uid: int = 0) -> Path:
    path.write_bytes(data)
    os.chmod(path, mode)
    os.chown(path, uid, 0)
    return path


def test_root_owned_file_is_read(tmp_path: Path) -> None:
    assert read_trusted_file(_file(tmp_path / "f"), max_bytes=10) == b"ok"


@pytest.mark.parametrize("mode", [0o664, 0o646, 0o666])
def test_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    assert read_trusted_file(_file(tmp_path / "f", mode=mode), max_bytes=10) is None


def test_other_owner_is_refused_unless_allowed(tmp_path: Path) -> None:
    f = _file(tmp_path / "f", uid=65534)
    assert read_trusted_file(f, max_bytes=10) is None
    assert read_trusted_file(f, max_bytes=10, owner_ok=lambda st: st.st_uid == 65534) == b"ok"


def test_symlink_fifo_missing_and_oversize_are_refused(tmp_path: Path) -> None:
    target = _file(tmp_path / "target")
    (tmp_path / "link").symlink_to(target)
    os.mkfifo(tmp_path / "fifo")  # must not block the reader
    assert read_trusted_file(tmp_path / "link", max_bytes=10) is None
    assert read_trusted_file(tmp_path / "fifo", max_bytes=10) is None
    assert read_trusted_file(tmp_path / "missing", max_bytes=10) is None
    assert read_trusted_file(_file(tmp_path / "big", b"x" * 11), max_bytes=10) is None
