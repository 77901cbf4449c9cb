"""A GlusterFS volume with root squash, mounted through FUSE: the shared filesystem as sites export it.

Debian's glusterfs-server and glusterfs-client (scripts/install.sh installs them). One glusterd serves a
host; when one already answers (the dev cluster's, with `devcluster.py up --shared gluster`) the volume is
created there, else a glusterd is started for the test and stopped after it. The brick lives in the
test's temporary directory; the volume is removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from slurm_bt.cli.admin_cmd import squashed_as


def _gluster(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["gluster", "--mode=script", *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise RuntimeError(f"gluster {' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


def _wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.3)


def root_can_create(folder: Path) -> bool:
    """True when root may create an entry in the root-owned ``folder`` as root (root is not squashed):
    the probe ``slurm-bt admin doctor`` uses."""
    return squashed_as(str(folder)) is None


class SquashedVolume:
    """A mounted volume; :meth:`layout` makes root-owned directories the way an admin does (squash off for
    a moment), :meth:`squash` turns root squash on and waits until the mount shows it."""

    def __init__(self, name: str, mount: Path) -> None:
        self.name = name
        self.mount = mount

    def set_squash(self, on: bool) -> None:
        _gluster("volume", "set", self.name, "server.root-squash", "on" if on else "off")

    @property
    def _probe_dir(self) -> Path:  # root-owned 0755: whether root may create in it tells the squash apart
        return self.mount / ".squash-probe"

    def layout(self, dirs: dict[str, int], owner: int = 0) -> None:
        """Create ``dirs`` (relative path → mode) owned by ``owner`` (root), with root squash off meanwhile."""
        self.set_squash(False)
        # Probe a root-owned 0755 directory: in a 1777 one (the mount once laid out) squashed root may
        # create too, as nobody, and the wait would end before the squash is off.
        probe = self._probe_dir if self._probe_dir.is_dir() else self.mount
        _wait(lambda: root_can_create(probe), 90, f"root squash off on {self.name}")
        for rel, mode in {".squash-probe": 0o755, **dirs}.items():
            p = self.mount / rel
            p.mkdir(parents=True, exist_ok=True)
            os.chown(p, 0 if rel == ".squash-probe" else owner, 0)
            os.chmod(p, mode)
        self.squash()

    def squash(self) -> None:
        # Asked again every 30 s: once in a fresh-clone run the squash was not in force after 90 s
        # (glusterd busy with the dev cluster's own volume); a repeated `volume set` is harmless.
        for attempt in range(3):
            self.set_squash(True)
            try:
                _wait(lambda: not root_can_create(self._probe_dir), 30, f"root squash on {self.name}")
                return
            except RuntimeError:
                if attempt == 2:
                    raise


@contextlib.contextmanager
def squashed_volume(tmp: Path) -> Iterator[SquashedVolume]:
    """A fresh volume mounted at ``tmp/mnt`` with root squash on (its root directory is 1777)."""
    if shutil.which("glusterd") is None or shutil.which("mount.glusterfs") is None:
        raise RuntimeError("glusterfs-server/glusterfs-client are not installed (scripts/install.sh installs them)")
    tmp.mkdir(parents=True, exist_ok=True)
    pidfile = tmp / "glusterd.pid"
    started = False
    if _gluster("volume", "list", check=False).returncode != 0:
        subprocess.run(["glusterd", "-p", str(pidfile), f"--log-file={tmp / 'glusterd.log'}"], check=True,
                       timeout=60, start_new_session=True, stdin=subprocess.DEVNULL)
        started = True
        _wait(lambda: _gluster("volume", "list", check=False).returncode == 0, 30, "glusterd answering")
    name = f"bttest{uuid.uuid4().hex[:8]}"
    brick, mount = tmp / "brick", tmp / "mnt"
    brick.mkdir()
    mount.mkdir()
    created = mounted = False
    try:
        # `force`: the brick is on the root filesystem, which gluster refuses by default
        _gluster("volume", "create", name, f"{socket.gethostname().split('.')[0]}:{brick}", "force")
        created = True
        _gluster("volume", "start", name)
        subprocess.run(["mount", "-t", "glusterfs", f"127.0.0.1:/{name}", str(mount)], check=True, timeout=60,
                       capture_output=True)
        mounted = True
        vol = SquashedVolume(name, mount)
        vol.layout({".": 0o1777})
        yield vol
    finally:
        if mounted:
            subprocess.run(["umount", str(mount)], timeout=60, capture_output=True)
        if created:
            _gluster("volume", "stop", name, check=False)
            _gluster("volume", "delete", name, check=False)
        if started:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
