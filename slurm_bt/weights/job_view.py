"""Show a job its staged weights, read-only, at its ``mount_location``, and to that job only.

Two jobs on one node may declare the same ``mount_location`` with different weights, so the view
must be per job, never a host-wide mount or symlink at that path.

* **Container jobs.** The batch script already binds ``<node_cache>/jobs/<job_id>/w<i>`` read-only
  at ``mount_location`` (:mod:`slurm_bt.node.job_paths`). :func:`link_job_weights` makes that path a
  symlink to the staged snapshot; ``mount(2)`` resolves a symlinked bind source, and the snapshot's
  files are hard links, so nothing points outside the bound tree. The link lives in a root-owned
  directory, so the user cannot retarget it.
* **Host jobs.** Slurm 22.05 script hooks cannot give one job a private mount (docs/footguns.md),
  so the job's command runs under bubblewrap as the unprivileged job user (:func:`bwrap_argv`): a
  new mount namespace whose root is a tmpfs with every host top-level entry bound back, each
  snapshot ``--ro-bind``-ed at its ``mount_location``, the same uid, cwd, environment and network.
  bwrap cannot create a missing mount point inside a host directory the user cannot write, so such
  an ancestor is *exploded*: recreated on the tmpfs with each of its children bound individually.

Without bwrap there is no equivalent: ``unshare --user --map-root-user --mount`` makes the job uid 0
inside its namespace (tools that check the uid, ssh, NCCL bootstrap and file ownership shown to the
job all change), and getting the real uid back needs a second nested user namespace, i.e.
reimplementing bwrap. The documented fallback (docs/weights-cache.md) is to point the job at
``<node_cache>/jobs/<job_id>/w<i>`` via its ``BT_*`` variable: read-only by permissions (root-owned
0444/0555), but not at ``mount_location`` and not read-only by mount flag.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from slurm_bt.atomic import fsync_dir
from slurm_bt.errors import StorageError
from slurm_bt.weights.cache_layout import CacheLayout, tmp_name
from slurm_bt.weights.manifest import Manifest
from slurm_bt.weights.node_cache import NodeCache, validate_job_id

__all__ = [
    "READ_ONLY_TOP_DIRS",
    "bwrap_argv",
    "bwrap_usable",
    "job_weights_dir",
    "link_job_weights",
    "unlink_job_weights",
]

READ_ONLY_TOP_DIRS = frozenset({"usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "boot", "opt", "srv"})
"""Host top-level directories bound read-only; everything else keeps its host permissions (rw bind)."""

_FORBIDDEN_TOP = frozenset({"proc", "sys", "dev"})


def _root_of(node_cache: NodeCache | Path) -> Path:
    return node_cache.root if isinstance(node_cache, NodeCache) else Path(node_cache)


def job_weights_dir(node_cache: NodeCache | Path, job_id: str) -> Path:
    """``<node_root>/jobs/<job_id>``."""
    return CacheLayout(_root_of(node_cache)).jobs / validate_job_id(job_id)


def link_job_weights(node_cache: NodeCache | Path, job_id: str, index: int, manifest: Manifest, *,
                     pending: bool = False, name: str | None = None, snapshot: Path | None = None) -> Path:
    """Point ``<node_root>/jobs/<job_id>/w<index>`` at the staged snapshot of ``manifest``.

    Idempotent and atomic (a requeued job gets the link replaced in one ``rename``). The entry must
    be complete on this node and should be leased to the job (:meth:`NodeCache.stage`), unless
    ``pending``: a node stager is still copying it (slurm_bt/weights/node_stager.py) and the link
    points at where its snapshot will appear; the job's first step waits for it before anything
    binds the link.

    Returns:
        The link path (what the container runtime binds at ``mount_location``).

    ``name`` replaces ``w<index>`` (the job's image is linked as ``img``: slurm_bt/node/job_paths.py);
    ``snapshot`` points the link at a complete snapshot outside the node cache (an image read in place
    from the root-owned shared tier when the site asks for no node copy; docs/containers.md).

    Raises:
        StorageError: the entry is not staged, or ``jobs/<job_id>`` exists as something other than a
            real directory.
    """
    if index < 0:
        raise ValueError("weights index must be >= 0")
    # The entry may live in a team's private subtree (NodeCache.audience); jobs/ is always in the base.
    entry = node_cache.layout if isinstance(node_cache, NodeCache) else CacheLayout(Path(node_cache))
    layout = CacheLayout(_root_of(node_cache))
    snap = entry.snapshot(manifest.manifest_id) if snapshot is None else snapshot
    if snapshot is None and not pending and not (entry.is_complete(manifest) and snap.is_dir()):
        raise StorageError(str(snap), f"weights {manifest.source} are not staged on this node")
    job_dir = job_weights_dir(layout.root, job_id)
    layout.jobs.mkdir(mode=0o755, exist_ok=True)
    try:
        os.mkdir(job_dir, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(job_dir).st_mode):
            raise StorageError(str(job_dir), "exists but is not a directory; refusing to use it") from None
    leaf = name or f"w{index}"
    link = job_dir / leaf
    tmp = job_dir / f".{leaf}.{tmp_name('link')}"
    os.symlink(snap, tmp)
    try:
        os.rename(tmp, link)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise StorageError(str(link), f"cannot link weights: {exc.strerror}") from exc
    fsync_dir(job_dir)
    return link


def unlink_job_weights(node_cache: NodeCache | Path, job_id: str) -> None:
    """Remove ``jobs/<job_id>`` (links only; targets untouched). Idempotent, for the epilog."""
    job_dir = job_weights_dir(node_cache, job_id)
    with contextlib.suppress(FileNotFoundError):
        if os.path.islink(job_dir):
            os.unlink(job_dir)
        else:
            shutil.rmtree(job_dir)


def _check_location(location: str) -> PurePosixPath:
    p = PurePosixPath(location)
    parts = location.split("/")
    if (not location.startswith("/") or location == "/" or "\0" in location
            or any(x in {"", ".", ".."} for x in parts[1:]) or p.parts[1] in _FORBIDDEN_TOP):
        raise ValueError(f"unsafe mount_location {location!r}")
    return p


def _bind_flag(top: str) -> str:
    return "--ro-bind" if top in READ_ONLY_TOP_DIRS else "--bind"


def bwrap_argv(
    mounts: Sequence[tuple[str | Path, str]],
    command: Sequence[str],
    *,
    bwrap: str = "bwrap",
    cwd: str | None = None,
    host_root: str = "/",
) -> list[str]:
    """argv that runs ``command`` in a private mount namespace with each snapshot at its location.

    Runs as the calling (unprivileged) user: uid, groups, environment and network are kept, and
    the process dies with its parent. The new root is a tmpfs; every host top-level entry is bound
    back (``/proc`` fresh, ``/dev`` with devices for GPUs, system dirs read-only, the rest with
    their host permissions), symlinks such as ``/bin -> usr/bin`` are recreated, and each
    ``(host_snapshot_dir, mount_location)`` is bound read-only, with missing parents created by
    ``--dir`` (existing host ancestors are exploded, see the module docstring).

    Args:
        mounts: ``(host snapshot dir, mount_location)`` pairs; locations absolute and normalized.
        command: the job's argv.
        bwrap: bwrap executable.
        cwd: working directory inside (default: the current one).
        host_root: for tests only: the directory whose listing stands for ``/``.

    Raises:
        ValueError: a location is unsafe, duplicated, or crosses an existing symlink or file.
    """
    locations = [_check_location(loc) for _, loc in mounts]
    if len(set(locations)) != len(locations):
        raise ValueError("two weights share one mount_location")
    host = PurePosixPath(host_root)

    def on_host(p: PurePosixPath) -> Path:
        return Path(host, *p.parts[1:])

    explode: set[PurePosixPath] = {PurePosixPath("/")}
    create: list[PurePosixPath] = []
    for loc in locations:
        cur = PurePosixPath("/")
        for part in loc.parts[1:]:
            nxt = cur / part
            hp = on_host(nxt)
            if not os.path.lexists(hp):
                break
            st = os.lstat(hp)
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
                raise ValueError(f"mount_location {loc} crosses {nxt}, which is not a plain directory")
            cur = nxt
        if cur != loc:  # something below `cur` is missing: `cur` and its ancestors must be exploded
            explode.update([cur, *cur.parents])
            missing = loc
            while missing != cur:
                create.append(missing)
                missing = missing.parent

    argv = [bwrap, "--die-with-parent"]

    def emit(d: PurePosixPath) -> None:
        if d != PurePosixPath("/"):
            argv.extend(["--dir", str(d)])
        for name in sorted(os.listdir(on_host(d))):
            child = d / name
            hp = on_host(child)
            top = child.parts[1]
            if child in explode:
                emit(child)
            elif os.path.islink(hp):
                argv.extend(["--symlink", os.readlink(hp), str(child)])
            elif child == PurePosixPath("/proc"):
                argv.extend(["--proc", "/proc"])
            elif child == PurePosixPath("/dev"):
                argv.extend(["--dev-bind", "/dev", "/dev"])
            else:
                argv.extend([_bind_flag(top), str(hp), str(child)])

    emit(PurePosixPath("/"))
    for d in sorted(set(create), key=lambda p: len(p.parts)):
        argv.extend(["--dir", str(d)])
    for (src, _), loc in sorted(zip(mounts, locations, strict=True), key=lambda m: len(m[1].parts)):
        argv.extend(["--ro-bind", str(src), str(loc)])
    argv.extend(["--chdir", cwd or os.getcwd(), "--", *command])
    return argv


def bwrap_usable(bwrap: str = "bwrap") -> bool:
    """bwrap is installed and can create a namespace here (user namespaces may be disabled)."""
    exe = shutil.which(bwrap)
    if exe is None:
        return False
    try:
        r = subprocess.run([exe, "--ro-bind", "/", "/", "--", "/bin/true"], capture_output=True, timeout=10,
                           check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0
