"""Shared storage on a real distributed filesystem with root squashed, as sites export it (issue 30).

A GlusterFS volume (tests/servers/gluster.py) holds the cache root, the cluster cache and a file://
checkpoint store laid out by an admin (root-owned, made with the squash off for a moment); then root on
this node acts as nobody there. ``slurm-bt admin doctor`` must say, feature by feature, what will not
work and what to change; on the same layout on a local disk it must say nothing about squashing.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.gluster import SquashedVolume, squashed_volume
from tests.unit.test_layout_owner import SVC, ensure_service_account

# whole_cluster: runs alone, after the parallel tests (scripts/test.sh; README, Development).
pytestmark = [pytest.mark.slurm, pytest.mark.whole_cluster]

BIN = Path(sys.executable).parent
LAYOUT = {"cache": 0o755, "weights": 0o755, "checkpoints": 0o1777}


@pytest.fixture()
def volume(dev_cluster: dict[str, object], tmp_path: Path) -> Iterator[SquashedVolume]:
    if os.geteuid() != 0:
        pytest.skip("mounting a volume and probing root squash need root")
    with squashed_volume(tmp_path / "gluster") as vol:
        vol.layout(LAYOUT)
        yield vol


def _site(folder: Path, root: Path) -> Path:
    site = folder / "site.toml"
    site.write_text('container_runtime = "none"\n[storage]\n'
                    f'cache = "{root}/cache"\ncluster_cache = "{root}/weights"\n'
                    f'checkpoint_store = "file://{root}/checkpoints"\n')
    site.chmod(0o644)
    return site


def _doctor(site: Path, identity: str | None = None) -> subprocess.CompletedProcess[str]:
    """The doctor with this site and a hooks.toml of its own (naming ``identity`` as shared_fs_identity)."""
    hooks = site.parent / "hooks.toml"
    hooks.write_text(f'shared_fs_identity = "{identity}"\n' if identity else "")
    hooks.chmod(0o644)
    return subprocess.run([str(BIN / "slurm-bt"), "admin", "doctor", "--site", str(site), "--config", str(hooks)],
                          capture_output=True, text=True, timeout=300)


def test_doctor_names_each_feature_that_root_squash_breaks(volume: SquashedVolume, tmp_path: Path) -> None:
    proc = _doctor(_site(tmp_path, volume.mount))
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    lines = out.splitlines()
    cache = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL  root squash: project and team caches:"))
    assert f"root acts as an unprivileged user on {volume.mount}/cache" in lines[cache], out
    assert "every job with CacheConfig enabled is refused" in lines[cache], out
    assert lines[cache + 1].startswith("      fix: name a service account in hooks.toml (shared_fs_identity"), out
    assert "without root squash" in lines[cache + 1] and "docs/admin.md" in lines[cache + 1], out
    weights = next(ln for ln in lines if ln.startswith("FAIL  root squash: weights and images:"))
    assert f"on {volume.mount}/weights" in weights and "teams/<team>" in weights, out
    assert "read team tiers as the job user" in weights, out
    store = next(ln for ln in lines if ln.startswith("WARN  root squash: checkpoint store:"))
    assert "_teams/<team>" in store and "uploads, the flush and hand-off resumes run as the job user" in store, out
    # the 1777 store lets squashed root create, as nobody: the probe file says which uid
    assert f"root acts as uid 65534 on {volume.mount}/checkpoints" \
        in store, out


def test_doctor_says_nothing_of_squashing_on_a_local_disk(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("probing root squash needs root")
    root = tmp_path / "local"
    for rel, mode in LAYOUT.items():
        (root / rel).mkdir(parents=True)
        (root / rel).chmod(mode)
    root.chmod(0o755)
    tmp_path.chmod(0o755)
    out = _doctor(_site(tmp_path, root)).stdout
    assert "root squash" not in out, out
    assert "shared cache root" in out, out  # the doctor did reach the shared-storage checks


def test_doctor_with_the_identity_says_what_is_missing_then_ok(volume: SquashedVolume, tmp_path: Path) -> None:
    """docs/admin.md's setup: the identity named, then `admin install`'s teams/ dirs owned by it."""
    ensure_service_account()
    site = _site(tmp_path, volume.mount)
    out = _doctor(site, SVC).stdout
    assert f"ok    shared_fs_identity {SVC}" in out, out
    cache = next(ln for ln in out.splitlines() if ln.startswith("FAIL  root squash: project and team caches:"))
    assert f"creates team caches as {SVC}, but {volume.mount}/cache/teams does not exist" in cache, out
    svc = pwd.getpwnam(SVC).pw_uid
    volume.layout({"cache/teams": 0o755, "weights/teams": 0o755, "checkpoints/_teams": 0o755}, owner=svc)
    out = _doctor(site, SVC).stdout
    for feature in ("project and team caches", "weights and images", "checkpoint store"):
        line = next(ln for ln in out.splitlines() if f"root squash: {feature}" in ln)
        assert line.startswith("ok    ") and f"{SVC} creates the team" in line, out
