"""``admin doctor``'s container runtime lines (slurm_bt/cli/admin_cmd.py ``container_runtime_checks``)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from slurm_bt.cli.admin_cmd import container_runtime_checks


def _only(name: str, checks: list) -> object:  # type: ignore[type-arg]
    found = [c for c in checks if c.name == name]
    assert len(found) == 1, checks
    return found[0]


def test_charliecloud_missing_ch_run_says_what_to_install() -> None:
    checks = container_runtime_checks("charliecloud", which=lambda _n: None)
    assert len(checks) == 1 and not checks[0].ok and "charliecloud-runtime" in checks[0].fix


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod and the probe as another user need root")
def test_dev_fuse_mode_and_a_real_open() -> None:
    """Mode bits first (Debian 12 leaves /dev/fuse 0600 on some hosts), then a real open as a user."""
    tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path has 0700 parents: nobody cannot reach it
    try:
        _fuse_checks(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _fuse_checks(tmp_path: Path) -> None:
    which = {"ch-run": "/bin/false", "unsquashfs": "/bin/true"}.get
    dev = tmp_path / "fuse"
    os.mknod(dev, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers: openable, harmless
    bad = _only("/dev/fuse", container_runtime_checks("charliecloud", which=which, fuse=str(dev)))
    assert not bad.ok and "0600" in bad.problem and "chmod 0666" in bad.fix  # type: ignore[attr-defined]
    os.chmod(dev, 0o666)
    os.chmod(tmp_path, 0o700)  # mode 0666 but nobody cannot reach it: only the real open sees that
    probe = _only("/dev/fuse", container_runtime_checks("charliecloud", which=which, fuse=str(dev)))
    assert not probe.ok and "nobody cannot open" in probe.problem  # type: ignore[attr-defined]
    os.chmod(tmp_path, 0o755)
    ok = _only("/dev/fuse", container_runtime_checks("charliecloud", which=which, fuse=str(dev)))
    assert ok.ok  # type: ignore[attr-defined]
    # ch-run without --write-fake (/bin/false answers no to --feature) needs unsquashfs
    no_unsq = container_runtime_checks("charliecloud", which={"ch-run": "/bin/false"}.get, fuse=str(dev))
    assert not _only("charliecloud (ch-run)", no_unsq).ok  # type: ignore[attr-defined]


def test_pyxis_needs_enroot_and_the_plugin_line(tmp_path: Path) -> None:
    conf = tmp_path / "plugstack.conf"
    conf.write_text("# nothing\n")
    checks = container_runtime_checks("pyxis", which=lambda _n: None, plugstack=(str(conf),))
    assert [c.ok for c in checks] == [False, False]
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "pyxis.conf").write_text("required /usr/lib/slurm/spank_pyxis.so\n")
    checks = container_runtime_checks("pyxis", which=lambda n: f"/usr/bin/{n}", plugstack=(str(conf),))
    assert [c.ok for c in checks] == [True, True]


def test_apptainer_and_none() -> None:
    assert not container_runtime_checks("apptainer", which=lambda _n: None)[0].ok
    assert container_runtime_checks("apptainer", which=lambda n: f"/usr/bin/{n}")[0].ok
    none = container_runtime_checks("none")
    assert none[0].ok and none[0].info
