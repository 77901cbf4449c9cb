"""Mirror the pinned image into the team's cluster tier (the CPU staging job, as the user).

Before any GPU is held (docs/containers.md): ``skopeo copy docker://<resolved> oci:<tmp>`` fetches
the pinned manifest and every blob and verifies each against its digest; ``umoci unpack --rootless``
applies the layers in order (OCI whiteouts included) into a root filesystem; the mount points ch-run
binds over are added when the image lacks them; ``mksquashfs`` packs it as one file, owned by root
inside, which every runtime mounts (squashfuse for ch-run, enroot and Apptainer read squashfs too).
The squashfs is published like a weights blob (sha256-named, sealed 0444, renamed into ``blobs/``),
then the one-file Manifest (COMPLETE marker) and the pin record ``pins/oci-<hex>.json``.

Single flight: the team tier's weak lock ``image-<hex>``; a second submitter of the same digest
waits for it and finds the pin record. Everything temporary lives in the tier's ``.tmp`` writer dir
(named after this process; a ``kill -9`` leaves nothing visible and the next stager's ``gc_temp``
removes the debris). Credentials live in a 0700 temp dir of this process only (slurm_bt/images/skopeo.py).
Bounds: the image's compressed size and the squashfs are capped by ``[containers] max_image_bytes``,
every file a tool writes by ``RLIMIT_FSIZE``, each tool by a wall clock.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from slurm_bt.errors import RegistryToolError, SourceError, StorageError
from slurm_bt.images.entry import IMAGE_FILE, digest_hex, image_manifest, image_pin_key, write_job_image_manifest
from slurm_bt.images.pin import cached_image
from slurm_bt.images.skopeo import registry_access, run_skopeo
from slurm_bt.weights.locks import LockOptions

if TYPE_CHECKING:
    from collections.abc import Callable

    from slurm_bt.images.entry import ImagePlan
    from slurm_bt.job_spec import DockerAuthSpec, ImagePin, JobSpec
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import ContainerSettings
    from slurm_bt.weights.cluster_cache import ClusterCache
    from slurm_bt.weights.manifest import Manifest

__all__ = ["CH_RUN_DIRS", "CH_RUN_FILES", "ImageOutcome", "mirror_image", "mirror_into"]

# Mount points ch-run binds over; a read-only squashfs cannot grow them at run time.
CH_RUN_DIRS = ("dev", "proc", "sys", "tmp", "home", "mnt", "run", "var/tmp", "root")
CH_RUN_FILES = ("etc/passwd", "etc/group", "etc/hosts", "etc/resolv.conf")
_TOOL_TIMEOUT_S = 6 * 3600.0
_LOCK_TIMEOUT_S = 6 * 3600.0


@dataclass(frozen=True)
class ImageOutcome:
    """What the staging job did for the image (one line in its log, and the status report)."""

    reference: str
    tier: str  # "cluster-hit" (team/shared already had it) or "miss" (mirrored now)
    total_bytes: int
    seconds: float
    manifest: Manifest

    def line(self) -> str:
        what = "already in the cluster cache" if self.tier == "cluster-hit" else "mirrored into the cluster cache"
        return (f"slurm-bt staging: image {self.reference}: {what} ({self.total_bytes} bytes squashfs, "
                f"{self.seconds:.1f}s)")


def _limits(max_file_bytes: int) -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (max_file_bytes, max_file_bytes))


def _tool(argv: list[str], *, max_file_bytes: int, timeout_s: float = _TOOL_TIMEOUT_S) -> None:
    """Run a local tool (umoci, mksquashfs) bounded in file size and time; its stderr on failure."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent"}
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, env=env,
                              preexec_fn=lambda: _limits(max_file_bytes), close_fds=True)
    except subprocess.TimeoutExpired:
        raise StorageError(argv[0], f"{' '.join(argv[:2])} did not finish within {timeout_s:.0f}s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-800:]
        raise StorageError(argv[0], f"{' '.join(argv[:2])} failed (exit {proc.returncode}): {err}")


def _add_mount_points(rootfs: Path) -> None:
    """Create ch-run's bind targets the image lacks (never through a symlink the image planted)."""
    for d in CH_RUN_DIRS:
        p = rootfs / d
        if not os.path.lexists(p):
            with contextlib.suppress(OSError):  # a parent is a symlink or a file: ch-run will say so
                if not any(q.is_symlink() for q in p.parents if rootfs in q.parents):
                    p.mkdir(parents=True, mode=0o755)
    for f in CH_RUN_FILES:
        p = rootfs / f
        if not os.path.lexists(p) and p.parent.is_dir() and not p.parent.is_symlink():
            with contextlib.suppress(OSError):
                p.touch(mode=0o644)
    with contextlib.suppress(OSError):
        if (rootfs / "tmp").is_dir() and not (rootfs / "tmp").is_symlink():
            os.chmod(rootfs / "tmp", 0o1777)  # noqa: S103 - an image's /tmp, as on any system (the squashfs is read-only)


def _compressed_size(manifest_raw: bytes) -> int:
    doc = json.loads(manifest_raw)
    layers = doc.get("layers") if isinstance(doc, dict) else None
    total = int(doc.get("config", {}).get("size", 0)) if isinstance(doc, dict) else 0
    for layer in layers if isinstance(layers, list) else []:
        total += int(layer.get("size", 0))
    return total


@contextlib.contextmanager
def _layer_stream(path: Path, media_type: str) -> Iterator[IO[bytes]]:
    """The layer's tar stream, decompressed (gzip in-process, zstd through the zstd tool)."""
    import gzip

    with open(path, "rb") as raw:
        if media_type.endswith("+zstd"):
            proc = subprocess.Popen(["zstd", "-dc"], stdin=raw, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            assert proc.stdout is not None
            try:
                yield proc.stdout
            finally:
                proc.stdout.close()
                proc.kill()
                proc.wait()
        elif "gzip" in media_type:
            with gzip.GzipFile(fileobj=raw) as gz:
                yield gz  # type: ignore[misc]
        else:
            yield raw


def _check_unpacked_size(layout: Path, cap: int, what: str) -> None:
    """Refuse an image whose layers unpack to more than ``cap`` bytes, before unpacking anything.

    One streaming pass over each (already digest-verified) layer, summing its tar members' sizes: a
    small layer that decompresses to terabytes (a decompression bomb) is refused here instead of
    filling the tier's filesystem.
    """
    import tarfile

    index = json.loads((layout / "index.json").read_bytes())
    digest = index["manifests"][0]["digest"].split(":", 1)[1]
    manifest = json.loads((layout / "blobs" / "sha256" / digest).read_bytes())
    total = 0
    for layer in manifest.get("layers", []):
        path = layout / "blobs" / "sha256" / str(layer["digest"]).split(":", 1)[1]
        with _layer_stream(path, str(layer.get("mediaType", ""))) as stream, \
                tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                total += max(member.size, 0)
                if total > cap:
                    raise StorageError(what, f"image unpacks to more than {cap} bytes ([containers] "
                                             "max_image_bytes); refused before unpacking")


def mirror_image(
    job_dir: Path, spec: JobSpec, plan: ImagePlan, store: SecretStore, *,
    out: IO[str] = sys.stdout, lock_timeout_s: float = _LOCK_TIMEOUT_S,
) -> ImageOutcome:
    """Make the pinned image complete in a cluster tier and write ``<job_dir>/image/manifest.json``.

    Raises:
        SourceError: the registry refused, lost or corrupted the image (nothing published).
        StorageError: a tool or the cluster cache failed (nothing published).
        CacheLockTimeout: another stager held the image's lock past the timeout.
    """
    from slurm_bt.weights.plan import cluster_tiers
    from slurm_bt.weights.stage_job import ensure_team_root

    pin = spec.image_pin
    assert pin is not None
    t0 = time.monotonic()
    base, team = plan.cluster_cache, plan.team
    team_tier, _shared = cluster_tiers(base, team)
    if team_tier.refused is not None:
        raise StorageError(str(team_tier.root), team_tier.refused)
    hit = cached_image(pin, base, team)
    if hit is not None:
        write_job_image_manifest(job_dir, hit[0])
        return ImageOutcome(pin.reference, "cluster-hit", hit[0].total_bytes, time.monotonic() - t0, hit[0])
    ensure_team_root(Path(base), team_tier)
    team_tier.layout.ensure(dir_mode=team_tier.dir_mode)
    # Debris of stagers that provably died (kill -9 mid-mirror): housekeeping, never fatal. A job with
    # weights already did this in stage_plan; an image-only job has no other chance.
    with contextlib.suppress(OSError):
        for p in team_tier.gc_temp():
            print(f"slurm-bt staging: removed {p} (its writer is dead)", file=out, flush=True)
    outcome = mirror_into(team_tier, pin, spec.docker_auth, plan.containers, store,
                          lookup=lambda: cached_image(pin, base, team), out=out, lock_timeout_s=lock_timeout_s)
    write_job_image_manifest(job_dir, outcome.manifest)
    return outcome


def mirror_into(
    target: ClusterCache, pin: ImagePin, auth: DockerAuthSpec | None, containers: ContainerSettings,
    store: SecretStore, *, lookup: Callable[[], tuple[Manifest, str] | None], out: IO[str] = sys.stdout,
    lock_timeout_s: float = _LOCK_TIMEOUT_S,
) -> ImageOutcome:
    """Pull, convert and publish ``pin`` into ``target`` under its ``image-<hex>`` lock (the staging
    job's team tier; ``slurm-bt cache warm --shared``'s shared tier). ``lookup`` finds a trusted
    complete entry (a hit after waiting for another stager's lock)."""
    from slurm_bt.images.credentials import registry_login
    from slurm_bt.storage.checksums import sha256_fd
    from slurm_bt.weights.cache_layout import open_regular, publish_blob_file
    from slurm_bt.weights.manifest import ManifestFile

    t0 = time.monotonic()
    team_tier = target
    cap = containers.max_image_bytes
    hexd = digest_hex(pin.digest)
    with team_tier.lock(f"image-{hexd}", LockOptions(timeout_s=lock_timeout_s, log_every_s=30.0)):
        hit = lookup()  # the holder we waited for published it
        if hit is not None:
            return ImageOutcome(pin.reference, "cluster-hit", hit[0].total_bytes, time.monotonic() - t0, hit[0])
        login = registry_login(auth, store) if auth is not None else None
        registry = pin.resolved.split("/", 1)[0]
        with team_tier.writer_dir() as wdir:
            layout, bundle, sqfs = wdir / "oci", wdir / "bundle", wdir / IMAGE_FILE
            try:
                with registry_access(registry, login, containers.ca_bundle) as access:
                    raw = run_skopeo(["inspect", "--raw", "--retry-times", "2", *access.args(),
                                      f"docker://{pin.resolved}"], access, timeout_s=300, max_stdout=4 << 20)
                    size = _compressed_size(raw)
                    if size > cap:
                        raise StorageError(pin.resolved, f"image is {size} bytes compressed, over the site's "
                                                         f"[containers] max_image_bytes ({cap})")
                    free = shutil.disk_usage(wdir).free
                    if free < 3 * size:
                        raise StorageError(str(team_tier.root), f"{free} bytes free, the image needs about "
                                                                f"{3 * size} while it is converted")
                    print(f"slurm-bt staging: image {pin.reference}: pulling {pin.resolved} ({size} bytes)",
                          file=out, flush=True)
                    # skopeo verifies the manifest against the pinned digest and each blob against its own
                    run_skopeo(["copy", "--quiet", "--retry-times", "2", *access.args(src=True),
                                f"docker://{pin.resolved}", f"oci:{layout}:img"], access,
                               timeout_s=_TOOL_TIMEOUT_S)
            except RegistryToolError as exc:
                if exc.kind == "integrity":
                    raise SourceError(pin.resolved, f"refused: a blob did not match its digest ({exc}); "
                                                    "nothing was published") from None
                raise SourceError(pin.resolved, f"pull failed ({exc.kind}): {exc}",
                                  transient=exc.kind in ("unreachable", "timeout")) from None
            _check_unpacked_size(layout, cap, pin.resolved)
            _tool(["umoci", "unpack", "--rootless", "--image", f"{layout}:img", str(bundle)], max_file_bytes=cap)
            from slurm_bt.posix.safefs import remove_owned_tree

            remove_owned_tree(layout)  # the layers are applied: free their space before packing
            _add_mount_points(bundle / "rootfs")
            # zstd level 3: ~40x faster than mksquashfs's default gzip here at about the same size (and
            # faster to read); squashfuse, the kernel, enroot and Apptainer all read zstd squashfs
            _tool(["mksquashfs", str(bundle / "rootfs"), str(sqfs), "-noappend", "-all-root", "-no-progress",
                   "-quiet", "-no-xattrs", "-comp", "zstd", "-Xcompression-level", "3"], max_file_bytes=cap)
            remove_owned_tree(bundle)
            fd = open_regular(sqfs)
            try:
                sha, n = sha256_fd(fd)
                if n > cap:
                    raise StorageError(pin.resolved, f"squashfs is {n} bytes, over [containers] max_image_bytes")
                publish_blob_file(sqfs, fd, team_tier.layout.blob(sha), ManifestFile(path=IMAGE_FILE, size=n,
                                  sha256=sha), sha, n)
            finally:
                os.close(fd)
        m = image_manifest(pin, sha, n)
        with team_tier.lock(f"manifest-{m.manifest_id}"):
            team_tier.add_manifest(m)
        with contextlib.suppress(OSError):  # a teammate's record may sit there (sticky dir): theirs stays
            team_tier.write_pin(image_pin_key(pin.digest), m)
    return ImageOutcome(pin.reference, "miss", m.total_bytes, time.monotonic() - t0, m)
