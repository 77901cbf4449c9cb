"""Test images without Docker: the host-files base layout plus one layer per test (devcluster/oci_image.py).

The base layout (python3 + stdlib, bash, coreutils, their ld.so closure, what ch-run binds over) is
built once per host and cached under /var/tmp/slurm-bt-oci; each test image copies it and adds a layer
(files, whiteouts, an optional big random file), so a test image costs well under a second.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_DEVCLUSTER = Path(__file__).resolve().parents[2] / "devcluster"
if str(_DEVCLUSTER) not in sys.path:  # devcluster/ is scripts, not a package: import the builder by path
    sys.path.insert(0, str(_DEVCLUSTER))

import oci_image  # noqa: E402

__all__ = ["base_layout", "derive", "oci_image", "squash", "user_rootfs"]

base_layout = oci_image.base_layout
derive = oci_image.derive


@contextlib.contextmanager
def user_rootfs(prefix: str) -> Iterator[tuple[Path, pwd.struct_passwd, Path]]:
    """(base, btu1's passwd entry, base/rootfs): a world-readable temp tree for a test that runs ch-run as
    btu1, holding the host-files root filesystem without python (bash and a few coreutils); removed after."""
    from tests.unit.test_hooks_env import ensure_test_users

    ensure_test_users()
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        rootfs = base / "rootfs"
        oci_image.build_rootfs(rootfs, with_python=False)
        yield base, pwd.getpwnam("btu1"), rootfs
    finally:
        shutil.rmtree(base, ignore_errors=True)


def squash(rootfs: Path, img_dir: Path) -> Path:
    """``img_dir/image.sqfs`` made from ``rootfs`` (root-owned inside, as the staging job makes them)."""
    img_dir.mkdir(parents=True)
    subprocess.run(["mksquashfs", str(rootfs), str(img_dir / "image.sqfs"), "-noappend", "-all-root", "-no-progress"],
                   check=True, capture_output=True)
    return img_dir / "image.sqfs"
