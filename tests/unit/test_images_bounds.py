"""The unpacked size of an image the staging job mirrors (issue 31, item 2b; docs/containers.md §4).

A 10 MB gzip layer can hold a 10 GiB file: the staging job must refuse it from the verified layers
before unpacking anything (bounded by ``[containers] max_unpacked_ratio`` times the compressed size and
``max_unpacked_bytes``), check free space against what unpacking really writes, and take those limits
from the admin's site file, never a higher value from the user's plan. Against the real registries and
the real skopeo/umoci/mksquashfs (tests/servers/oci_registry.py), as tests/unit/test_images_pin.py.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import slurm_bt.images.mirror as mirror
from slurm_bt.errors import SourceError, StorageError
from slurm_bt.images.entry import ImagePlan
from slurm_bt.images.mirror import mirror_image
from slurm_bt.images.pin import pin_image
from slurm_bt.images.stage import staging_containers
from slurm_bt.job_spec import JobSpec
from slurm_bt.site.settings import ContainerSettings, SiteSettings
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.plan import cluster_tiers
from tests.servers.oci_images import base_layout, oci_image
from tests.servers.oci_registry import OciRegistries
from tests.unit.test_images_pin import _plan, _site, _spec, _store, _team

_MIB = 1 << 20
_BOMB_BYTES = 10 << 30  # the bomb: a 10 GiB file in a ~10 MB gzip layer


def _with(site: SiteSettings, **containers: Any) -> SiteSettings:
    """``site`` with ``[containers]`` settings changed, validated as a site file's would be."""
    c = ContainerSettings.model_validate({**site.containers.model_dump(), **containers})
    return site.model_copy(update={"containers": c})


def _pinned(regs: OciRegistries, tmp: Path, image: str, site: SiteSettings) -> JobSpec:
    spec = _spec(tmp, image, site)
    return spec.model_copy(update={"image_pin": pin_image(spec, site, _store(tmp))})


def _tier(site: SiteSettings) -> ClusterCache:
    return cluster_tiers(site.storage.cluster_cache, _team())[0]


def _nothing_published(site: SiteSettings) -> None:
    tier = _tier(site)
    assert tier.entries() == []
    assert not (tier.root / "pins").exists() or not any((tier.root / "pins").iterdir())
    assert not any(tier.layout.blobs.iterdir()) and not any(tier.layout.tmp.iterdir())


@pytest.fixture
def tools_run(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The local tools (umoci, mksquashfs) the mirror runs; umoci is refused, so an image that gets as
    far as unpacking fails the test instead of writing gigabytes."""
    seen: list[str] = []
    real = mirror._tool

    def spy(argv: list[str], **kw: Any) -> None:
        seen.append(argv[0])
        if argv[0] == "umoci":
            raise AssertionError(f"the image reached unpacking: {argv}")
        real(argv, **kw)

    monkeypatch.setattr(mirror, "_tool", spy)
    return seen


def _bomb_layout(dest: Path) -> Path:
    """The base layout plus a gzip layer holding one ``_BOMB_BYTES`` file of zeros, tagged ``bomb``.

    The layer is built in well under a second as concatenated gzip members (gzip readers, Python's and
    Go's, read them as one stream): one holding the tar header, one compressed MiB of zeros repeated,
    one holding the padding and the end of the archive. Its diff_id (the sha256 of the 10 GiB tar) is a
    placeholder: computing it would take the time the test must not, and nothing before umoci reads it.
    """
    shutil.copytree(base_layout(), dest, symlinks=True)
    blobs = dest / "blobs" / "sha256"
    info = tarfile.TarInfo("opt/zeros.bin")
    info.size, info.mode, info.mtime = _BOMB_BYTES, 0o644, 0
    zeros = gzip.compress(bytes(_MIB), compresslevel=9, mtime=0)
    layer = (gzip.compress(info.tobuf(format=tarfile.PAX_FORMAT), mtime=0) + zeros * (_BOMB_BYTES // _MIB)
             + gzip.compress(bytes(2 * tarfile.BLOCKSIZE), mtime=0))

    def put(data: bytes) -> tuple[str, int]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return f"sha256:{digest}", len(data)

    index = json.loads((dest / "index.json").read_text())
    manifest = json.loads((blobs / index["manifests"][0]["digest"].split(":")[1]).read_bytes())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
    config["rootfs"]["diff_ids"].append("sha256:" + "0" * 64)
    layer_digest, layer_size = put(layer)
    manifest["layers"].append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                               "digest": layer_digest, "size": layer_size})
    manifest["config"]["digest"], manifest["config"]["size"] = put(json.dumps(config).encode())
    m_digest, m_size = put(json.dumps(manifest).encode())
    index["manifests"] = [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_digest,
                           "size": m_size, "annotations": {"org.opencontainers.image.ref.name": "bomb"}}]
    (dest / "index.json").write_text(json.dumps(index))
    return dest


def test_bomb_is_refused_by_the_ratio_before_unpacking(oci_registries: OciRegistries, tmp_path: Path,
                                                       tools_run: list[str]) -> None:
    """The issue's bomb (10 GiB in ~10 MB, under max_image_bytes) is refused by the default ratio from
    the bomb's tar header: its 10 GiB are never decompressed, nothing is unpacked or published."""
    tag = uuid.uuid4().hex[:8]
    layout = _bomb_layout(tmp_path / "bomb-layout")
    oci_image.push(layout, "bomb", oci_registries.public, "library/pytest-bomb10g", tag)
    site = _site(oci_registries, tmp_path)
    assert site.containers.max_image_bytes > _BOMB_BYTES  # today's only bound would let it through
    spec = _pinned(oci_registries, tmp_path, f"pytest-bomb10g:{tag}", site)
    t0 = time.monotonic()
    with pytest.raises(StorageError) as err:
        mirror_image(tmp_path, spec, _plan(site), _store(tmp_path))
    took = time.monotonic() - t0
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"{spec.image_pin.resolved}: image unpacks to more than ")  # type: ignore[union-attr]
    assert "[containers] max_unpacked_ratio = 20 times its " in line and "refused before unpacking" in line
    counted = int(line.split("): ")[1].split(" bytes counted")[0])
    assert _BOMB_BYTES < counted < _BOMB_BYTES + (64 * _MIB)  # the header's claim, not its data
    assert tools_run == []
    _nothing_published(site)
    # decompressing the 10 GiB alone takes longer than this here (~1.7 s per GiB)
    assert took < 10, took


def _one_layer_layout(dest: Path, layer: bytes) -> Path:
    """An OCI layout as skopeo leaves it (what the count reads of it): one gzip layer."""
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer_hex = hashlib.sha256(layer).hexdigest()
    (blobs / layer_hex).write_bytes(layer)
    manifest = json.dumps({"layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                                       "digest": f"sha256:{layer_hex}", "size": len(layer)}]}).encode()
    (blobs / hashlib.sha256(manifest).hexdigest()).write_bytes(manifest)
    (dest / "index.json").write_text(json.dumps({"manifests": [
        {"digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}"}]}))
    return dest


def test_many_small_members_stop_the_count_at_the_bound(tmp_path: Path) -> None:
    """No member is big, the layer is: the count stops as its decompressed bytes pass the bound, not at
    the layer's end (here after ~2 of its 256 MiB)."""
    zeros = gzip.compress(bytes(_MIB), compresslevel=9, mtime=0)
    parts = []
    for i in range(256):
        info = tarfile.TarInfo(f"z/{i}")
        info.size = _MIB
        parts += [gzip.compress(info.tobuf(), mtime=0), zeros]
    layer = b"".join(parts) + gzip.compress(bytes(2 * tarfile.BLOCKSIZE), mtime=0)
    layout = _one_layer_layout(tmp_path / "oci", layer)
    bound = int(4 * len(layer))
    assert bound < 2 * _MIB
    with pytest.raises(StorageError, match=r"max_unpacked_ratio = 4 times") as err:
        mirror._check_unpacked_size(layout, ContainerSettings(max_unpacked_ratio=4), "r.example/x@sha256:00")
    counted = int(str(err.value).split("): ")[1].split(" bytes counted")[0])
    assert bound < counted <= bound + 2 * _MIB + 32 * tarfile.BLOCKSIZE  # one member past it, and read-ahead


def test_unreadable_layer_is_one_line(tmp_path: Path) -> None:
    """A layer that is not a tar stream (it matched its digest: the image is broken) fails the staging
    job with one line naming the image, not a traceback."""
    layout = _one_layer_layout(tmp_path / "oci", gzip.compress(os.urandom(4096), mtime=0))
    with pytest.raises(SourceError, match=r"^r\.example/x@sha256:00: layer [0-9a-f]{64} is not a readable tar"):
        mirror._check_unpacked_size(layout, ContainerSettings(), "r.example/x@sha256:00")


def test_normal_image_passes_and_the_absolute_bound_refuses(oci_registries: OciRegistries, tmp_path: Path) -> None:
    """An ordinary image (~2.5x) mirrors under the defaults; ``max_unpacked_bytes`` below its unpacked
    size refuses it by name, though its compressed size is within every other bound."""
    tag = uuid.uuid4().hex[:8]
    oci_registries.push("library/pytest-normal", tag, {"opt/app/hello.txt": b"hello\n"})
    site = _site(oci_registries, tmp_path / "a")
    spec = _pinned(oci_registries, tmp_path, f"pytest-normal:{tag}", site)
    small = _with(site, max_unpacked_bytes=30 * _MIB)  # the base layout unpacks to ~40 MB, ~16 MB compressed
    small = small.model_copy(update={"storage": small.storage.model_copy(
        update={"cluster_cache": str(tmp_path / "b" / "cc")})})
    with pytest.raises(StorageError) as err:
        mirror_image(tmp_path, spec, _plan(small), _store(tmp_path))
    assert f"more than {30 * _MIB} bytes ([containers] max_unpacked_bytes)" in str(err.value)
    _nothing_published(small)
    out = mirror_image(tmp_path, spec, _plan(_with(site, max_unpacked_bytes=64 * _MIB)), _store(tmp_path))
    assert out.tier == "miss" and _tier(site).has(out.manifest)
    assert not any(_tier(site).layout.tmp.iterdir())


class _Usage:
    """``shutil`` as mirror.py sees it, with a filesystem that has ``free`` bytes free."""

    def __init__(self, free: int) -> None:
        self.free = free

    def disk_usage(self, path: str | Path) -> Any:
        real = shutil.disk_usage(path)
        return type(real)(real.total, real.total - self.free, self.free)

    def __getattr__(self, name: str) -> Any:
        return getattr(shutil, name)


def test_free_space_is_checked_against_the_unpacked_size(oci_registries: OciRegistries, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         tools_run: list[str]) -> None:
    """More than 3x the compressed size free, less than the unpacked image and its squashfs: refused
    once the unpacked size is known, before umoci writes anything."""
    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-free", tag, {"opt/app/hello.txt": b"hello\n"})
    doc = json.loads(oci_registries.public.blob_path(digest.split(":")[1]).read_bytes())
    compressed = doc["config"]["size"] + sum(layer["size"] for layer in doc["layers"])
    site = _site(oci_registries, tmp_path)
    spec = _pinned(oci_registries, tmp_path, f"pytest-free:{tag}", site)
    free = 3 * compressed + _MIB
    monkeypatch.setattr(mirror, "shutil", _Usage(free))
    with pytest.raises(StorageError) as err:
        mirror_image(tmp_path, spec, _plan(site), _store(tmp_path))
    line = str(err.value)
    assert f"{free} bytes free" in line and "unpacks to" in line and "\n" not in line
    need = int(line.split(" bytes free, ")[1].split(" needed")[0])
    unpacked = int(line.split("unpacks to ")[1].split(" bytes")[0])
    assert need == 2 * unpacked > free
    assert tools_run == []
    _nothing_published(site)


def test_users_plan_cannot_raise_the_unpacked_limits() -> None:
    """The plan is the user's file: the admin's max_unpacked_ratio/max_unpacked_bytes cap it; a lower
    value the user asked for stays."""
    admin = SiteSettings(containers=ContainerSettings(max_unpacked_ratio=10, max_unpacked_bytes=1 << 30))
    high = ImagePlan(team="t", cluster_cache="/cc", containers=ContainerSettings(
        max_unpacked_ratio=1e6, max_unpacked_bytes=1 << 50))
    got = staging_containers(high, admin)
    assert (got.max_unpacked_ratio, got.max_unpacked_bytes) == (10, 1 << 30)
    low = ImagePlan(team="t", cluster_cache="/cc", containers=ContainerSettings(
        max_unpacked_ratio=3, max_unpacked_bytes=1 << 20))
    got = staging_containers(low, admin)
    assert (got.max_unpacked_ratio, got.max_unpacked_bytes) == (3, 1 << 20)
    # no admin file: the built-in defaults are the cap
    got = staging_containers(high, SiteSettings())
    assert (got.max_unpacked_ratio, got.max_unpacked_bytes) == (20, 100 << 30)
