"""Shared storage on a real distributed filesystem with root squashed, as sites export it (issue 30).

A GlusterFS volume (tests/servers/gluster.py) holds the cache root, the cluster cache and a file://
checkpoint store laid out by an admin (root-owned, made with the squash off for a moment); then root on
this node acts as nobody there. ``slurm-bt admin doctor`` must say, feature by feature, what will not
work and what to change; on the same layout on a local disk it must say nothing about squashing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.gluster import SquashedVolume, squashed_volume

pytestmark = pytest.mark.slurm

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


def _doctor(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "slurm-bt"), "admin", "doctor", "--site", str(site)], capture_output=True,
                          text=True, timeout=300)


def test_doctor_names_each_feature_that_root_squash_breaks(volume: SquashedVolume, tmp_path: Path) -> None:
    proc = _doctor(_site(tmp_path, volume.mount))
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    lines = out.splitlines()
    cache = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL  root squash: project and team caches:"))
    assert f"root acts as an unprivileged user on {volume.mount}/cache" in lines[cache], out
    assert "every job with CacheConfig enabled is refused" in lines[cache], out
    assert lines[cache + 1].startswith("      fix: export it to the compute nodes without root squash"), out
    assert "docs/admin.md" in lines[cache + 1], out
    weights = next(ln for ln in lines if ln.startswith("FAIL  root squash: weights and images:"))
    assert f"on {volume.mount}/weights" in weights and "team tiers" in weights, out
    store = next(ln for ln in lines if ln.startswith("info  root squash: checkpoint store:"))
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
