"""Per-job read-only weight views: container links, and real bubblewrap namespaces as an ordinary user."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt.errors import StorageError
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.job_view import bwrap_argv, link_job_weights, unlink_job_weights
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_cache import NodeCache
from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, write_origin

USER = "btview"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[NodeCache, Manifest, Manifest]]:
    """A node cache in a world-traversable dir (pytest's tmp dirs are 0700 root) with two models."""
    base = Path(tempfile.mkdtemp(prefix="bt-jobview-"))
    os.chmod(base, 0o755)
    node = NodeCache(base / "node", 1 << 30)
    ms = []
    for name in ("alpha", "beta"):
        files = {"config.json": f'{{"model": "{name}"}}'.encode(), "sub/w.bin": name.encode() * 1000}
        write_origin(base / f"origin-{name}", files)
        c = ClusterCache(base / "cluster")
        m = make_manifest(files, source=f"hf://org/{name}")
        c.ensure(m, DirFetcher(base / f"origin-{name}"), authorize=allow)
        node.stage(m, c, f"job-{name}", authorize=allow)
        ms.append(m)
    yield node, ms[0], ms[1]
    shutil.rmtree(base, ignore_errors=True)


def test_link_job_weights_points_at_snapshot_and_is_idempotent(world: tuple[NodeCache, Manifest, Manifest]) -> None:
    node, alpha, beta = world
    link = link_job_weights(node, "42", 0, alpha)
    assert link == node.root / "jobs" / "42" / "w0" and link.is_symlink()
    assert link.resolve() == node.snapshot_path(alpha)
    assert (link / "config.json").read_bytes() == b'{"model": "alpha"}'
    link = link_job_weights(node, "42", 0, beta)  # requeue with other weights: replaced atomically
    assert (link / "config.json").read_bytes() == b'{"model": "beta"}'
    assert [p.name for p in link.parent.iterdir()] == ["w0"]
    unlink_job_weights(node, "42")
    unlink_job_weights(node, "42")
    assert not (node.root / "jobs" / "42").exists() and node.is_ready(beta)
    with pytest.raises(StorageError, match="not staged"):
        link_job_weights(node, "43", 0, make_manifest({"x": b"y"}))
    with pytest.raises(ValueError):
        link_job_weights(node, "../x", 0, alpha)


def test_bwrap_argv_shape(tmp_path: Path) -> None:
    host = tmp_path / "host"
    for d in ("usr/bin", "etc", "home/u", "opt/tool", "proc", "dev", "tmp"):
        (host / d).mkdir(parents=True)
    (host / "bin").symlink_to("usr/bin")
    argv = bwrap_argv([("/snap/a", "/app/models/x"), ("/snap/b", "/opt/models/y")], ["python", "train.py"],
                      cwd="/home/u", host_root=str(host))
    s = " ".join(argv)
    assert argv[:2] == ["bwrap", "--die-with-parent"] and argv[-3:] == ["--", "python", "train.py"]
    assert "--symlink usr/bin /bin" in s and "--proc /proc" in s and "--dev-bind /dev /dev" in s
    assert f"--ro-bind {host}/usr /usr" in s and f"--bind {host}/home /home" in s and f"--bind {host}/tmp /tmp" in s
    assert f"--ro-bind {host}/opt " not in s and "--dir /opt" in s and f"--ro-bind {host}/opt/tool /opt/tool" in s
    assert s.index("--dir /app ") < s.index("--dir /app/models ") < s.index("--ro-bind /snap/a /app/models/x")
    assert "--ro-bind /snap/b /opt/models/y" in s and "--chdir /home/u" in s
    assert "--unshare-net" not in s and "--unshare-user" not in s
    for bad in ("relative", "/", "/proc/x", "/a/../b", "/a//b"):
        with pytest.raises(ValueError):
            bwrap_argv([("/s", bad)], ["true"], host_root=str(host))
    with pytest.raises(ValueError, match="share"):
        bwrap_argv([("/s", "/m"), ("/t", "/m")], ["true"], host_root=str(host))
    with pytest.raises(ValueError, match="not a plain directory"):
        bwrap_argv([("/s", "/bin/models")], ["true"], host_root=str(host))


@pytest.fixture(scope="module")
def job_user() -> str:
    if os.getuid() != 0 or shutil.which("bwrap") is None or shutil.which("runuser") is None:
        pytest.skip("needs root, bwrap and runuser")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        if subprocess.run(["useradd", "-m", USER], capture_output=True).returncode != 0:
            pytest.skip("cannot create a test user")
    return USER


def _as_user(user: str, argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(["runuser", "-u", user, "--", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd="/tmp")


SCRIPT = """
set -u
id -u
cat {loc}/config.json; echo
touch {loc}/new 2>&1 || true
( echo x >> {loc}/config.json ) 2>&1 || true
test -d /usr/bin && test -r /etc/passwd && echo host-ok
sleep 0.5
cat {loc}/config.json; echo
"""


@pytest.mark.parametrize("loc", ["/app/models/x", "/opt/bt-test-models/x"])
def test_real_bwrap_views_are_private_and_read_only(
    world: tuple[NodeCache, Manifest, Manifest], job_user: str, loc: str
) -> None:
    node, alpha, beta = world
    assert not os.path.exists(loc.split("/x")[0])  # the mount point does not exist on the host
    uid = pwd.getpwnam(job_user).pw_uid
    procs = [
        _as_user(job_user, bwrap_argv([(str(link_job_weights(node, job, 0, m)), loc)],
                                      ["sh", "-c", SCRIPT.format(loc=loc)], cwd="/tmp"))
        for job, m in (("501", alpha), ("502", beta))
    ]
    outs = [p.communicate(timeout=30) for p in procs]
    for (out, err), p, name in zip(outs, procs, ("alpha", "beta"), strict=True):
        assert p.returncode == 0, err
        lines = out.splitlines()
        assert lines[0] == str(uid)  # the job keeps its own uid
        assert lines[1] == lines[-1] == f'{{"model": "{name}"}}'  # each job sees its own weights
        assert "new': Read-only file system" in out, out  # EROFS from the ro bind
        assert "cannot create" in out  # 0444 file: no append either (content re-checked below)
        assert "host-ok" in out
    assert not os.path.exists(loc.split("/x")[0])  # nothing leaked to the host
    for job in ("501", "502"):
        unlink_job_weights(node, job)
