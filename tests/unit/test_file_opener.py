"""FileOpener: root gets descriptors on exactly what the job user may open, nothing else.

Why it exists: on a root-squashed shared filesystem root cannot open a team's 2770 tier, and root
must not open paths tenants control anyway (docs/admin.md "Root-squashed shared filesystems").
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.privdrop import FileOpener, NotRegularFile
from tests.unit.test_hooks_env import ensure_test_users, hook_environ


@pytest.fixture(scope="module")
def env() -> SlurmHookEnv:
    ensure_test_users()
    return SlurmHookEnv.from_environ(hook_environ("btu1"))


@pytest.fixture()
def tree(env: SlurmHookEnv) -> Iterator[Path]:
    # not under pytest's 0700 tmp_path: the user must be able to reach the files
    tmp_path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="bt-opener-"))
    os.chmod(tmp_path, 0o755)
    team = tmp_path / "team"
    team.mkdir()
    os.chown(team, 0, env.gid)
    os.chmod(team, 0o2770)  # a team tier: root:<team> 2770, the user is a member
    (team / "blob").write_bytes(b"team bytes")
    os.chown(team / "blob", 0, env.gid)
    os.chmod(team / "blob", 0o440)
    secret = tmp_path / "root-only"
    secret.write_bytes(b"root's")
    os.chmod(secret, 0o600)
    os.symlink(secret, team / "link")
    os.mkfifo(team / "fifo")
    os.chown(team / "fifo", env.uid, env.gid)
    yield tmp_path
    shutil.rmtree(tmp_path)


def test_opens_as_the_user_and_refuses_what_the_user_cannot_read(env: SlurmHookEnv, tree: Path) -> None:
    with FileOpener(env) as opener:
        fd = opener.open_regular(tree / "team" / "blob")
        try:
            assert os.read(fd, 100) == b"team bytes"
            assert os.get_blocking(fd) and not os.get_inheritable(fd)
        finally:
            os.close(fd)
        with pytest.raises(PermissionError):  # root could; the user cannot
            opener.open_regular(tree / "root-only")
        with pytest.raises(FileNotFoundError):
            opener.open_regular(tree / "team" / "missing")
        with pytest.raises(OSError) as link:  # O_NOFOLLOW: a planted symlink is never followed
            opener.open_regular(tree / "team" / "link")
        assert link.value.errno == 40  # ELOOP
        with pytest.raises(NotRegularFile):  # a FIFO is refused, not waited on
            opener.open_regular(tree / "team" / "fifo")
        with pytest.raises(NotRegularFile):
            opener.open_regular(tree / "team")
        # still serving after errors, from one child
        pid = opener._pid
        os.close(opener.open_regular(tree / "team" / "blob"))
        assert opener._pid == pid


def test_the_child_is_the_user_and_ends_with_close(env: SlurmHookEnv, tree: Path) -> None:
    opener = FileOpener(env)
    os.close(opener.open_regular(tree / "team" / "blob"))
    pid = opener._pid
    status = Path(f"/proc/{pid}/status").read_text()
    uid = pwd.getpwnam("btu1").pw_uid
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in status
    assert "NoNewPrivs:\t1" in status
    opener.close()
    assert not Path(f"/proc/{pid}").exists()


def test_threads_share_one_opener(env: SlurmHookEnv, tree: Path) -> None:
    seen: list[bytes] = []
    with FileOpener(env) as opener:
        def read() -> None:
            for _ in range(50):
                fd = opener.open_regular(tree / "team" / "blob")
                try:
                    seen.append(os.pread(fd, 100, 0))
                finally:
                    os.close(fd)
        threads = [threading.Thread(target=read) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert seen == [b"team bytes"] * 200
