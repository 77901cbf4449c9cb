"""The staging job (a CPU job on the staging partition, as the user): mirror remote → cluster cache.

``python -I -m slurm_bt.steps.stage_weights <job_dir>`` (:mod:`slurm_bt.steps.stage_weights`), submitted by
``bt-sbatch`` before the
training job, which depends on it (``afterok``, ``--kill-on-invalid-dep=yes``). So every remote
byte is fetched while no GPU is held, and a source error fails *this* job with a clear reason
(the training job is then cancelled by Slurm and shows DEPLOY_FAILED), never a GPU node's prolog.

Per source (``<job_dir>/weights/plan.json`` says which, pinned at submit):

1. take the team tier's ``pin-<key>`` lock (single-flight: N jobs staging one source fetch it once;
   correctness never depends on the lock);
2. list the source again **with the user's credentials** (the authorization check for a cache
   hit) and compare the pin key with the submit-time one: a different key means the source changed
   since submit (objects replaced, files added) and the job fails rather than mixing versions;
   HF sources are listed at the pinned commit, so a moved branch changes nothing;
3. if the manifest is known (published sha256s, or a trusted pin record) and complete in the team
   or shared tier: a cluster hit, nothing is fetched;
4. else fetch every missing file into ``blobs/`` through the verified download engine (parallel
   ranges, pinned to ETag/generation/commit, hashed while written, published by rename), compute the
   sha256 of files that have none published from the very bytes published, build the snapshot,
   write the COMPLETE marker and the pin record;
5. write ``<job_dir>/weights/<i>.json`` (the manifest every node of the job stages).

Progress goes to the staging job's log (``logs/staging-<id>.out``) every few seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import grp
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from slurm_bt.atomic import write_file_atomic
from slurm_bt.errors import BtError, SourceError, StorageError
from slurm_bt.storage.base import Backend, Listing, RemoteFile
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.units import format_bytes
from slurm_bt.weights.cluster_cache import ClusterCache, blob_present, team_tier_problem
from slurm_bt.weights.delivery_report import write_staging_status
from slurm_bt.weights.locks import LockOptions
from slurm_bt.weights.manifest import Manifest, ManifestFile
from slurm_bt.weights.plan import (
    PinnedFile,
    SourcePin,
    cluster_tiers,
    job_manifest_path,
    lookup_pin,
    pin_key,
    select_listing,
)

if TYPE_CHECKING:
    from slurm_bt.job_spec import JobSpec

__all__ = ["StageOutcome", "ensure_team_root", "stage_plan", "stage_source", "team_gid"]

_DEF_LOCK_TIMEOUT_S = 6 * 3600.0


@dataclass(frozen=True)
class StageOutcome:
    """What staging one source did.

    Attributes:
        index: position in ``job.weights``.
        source: pinned URI (``hf://org/repo@<commit>``, ``s3://bucket/prefix``).
        tier: ``cluster-hit`` (nothing fetched) or ``miss`` (fetched from the origin).
        total_bytes: bytes of the source's selected files.
        fetched_bytes: bytes read from the origin.
        seconds: wall time, lock wait included.
        manifest: the final manifest.
    """

    index: int
    source: str
    tier: str
    total_bytes: int
    fetched_bytes: int
    seconds: float
    manifest: Manifest

    def line(self) -> str:
        """The job-log line, e.g. ``slurm-bt weights: hf://a/b@1234567 miss 1.2 GiB in 4.1 s (290.0 MiB/s)``."""
        rate = f" ({format_bytes(self.fetched_bytes / self.seconds)}/s)" if self.fetched_bytes and self.seconds else ""
        return (f"slurm-bt weights: {self.source} {self.tier} {format_bytes(self.total_bytes)} in "
                f"{self.seconds:.2f} s{rate}")


class _Progress:
    """Counts bytes read from the origin and prints a line every ``interval_s`` while active."""

    def __init__(self, label: str, total: int, out: IO[str], interval_s: float) -> None:
        self.label, self.total, self.out, self.interval_s = label, total, out, interval_s
        self.done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bt-progress")

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.print_line()

    def print_line(self) -> None:
        elapsed = max(1e-9, time.monotonic() - self._t0)
        pct = f" {100 * self.done / self.total:.0f}%" if self.total else ""
        print(f"slurm-bt staging: {self.label} {format_bytes(self.done)}/{format_bytes(self.total)}{pct} "
              f"{format_bytes(self.done / elapsed)}/s", file=self.out, flush=True)

    def __enter__(self) -> _Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class _CountingStream:
    def __init__(self, inner: Any, progress: _Progress) -> None:
        self._inner = inner
        self.partial = inner.partial
        self._progress = progress

    def read(self, n: int) -> bytes:
        data: bytes = self._inner.read(n)
        self._progress.add(len(data))
        return data

    def readinto(self, buf: memoryview) -> int:
        """The download engine reads big bodies into its own buffer when the stream can (_http.py)."""
        inner = getattr(self._inner, "readinto", None)
        if inner is None:
            data = self._inner.read(len(buf))
            buf[:len(data)] = data
            n = len(data)
        else:
            n = int(inner(buf))
        self._progress.add(n)
        return n

    def close(self) -> None:
        self._inner.close()


class _CountingSource(Backend):
    """A backend whose range streams report bytes to the progress counter."""

    def __init__(self, inner: Any, progress: _Progress) -> None:
        self._inner = inner
        self.uri = inner.uri
        self._progress = progress

    def list_files(self) -> Any:
        return self._inner.list_files()

    def open_range(self, file: Any, start: int, end: int | None) -> _CountingStream:
        return _CountingStream(self._inner.open_range(file, start, end), self._progress)

    def etag_is_md5(self, file: Any) -> bool:
        """Forwarded: download.py asks it after an ETag-MD5 mismatch (SSE-KMS objects, storage/s3.py)."""
        confirm = getattr(self._inner, "etag_is_md5", None)
        return True if confirm is None else bool(confirm(file))

    def exact_check(self, file: Any, check: Any) -> Any:
        """Forwarded: download.py asks it after a per-part mismatch over an assumed part layout."""
        exact = getattr(self._inner, "exact_check", None)
        return None if exact is None else exact(file, check)

    def close(self) -> None:
        self._inner.close()


def _make_dir(path: Path, mode: int, gid: int = -1) -> bool:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        return False
    if gid >= 0:
        os.chown(path, -1, gid)  # the creator is a member: allowed, and the team's group owns the tier
    os.chmod(path, mode)  # after chown, which clears setgid
    return True


def team_gid(team: str) -> int:
    """The gid of the caller's group whose slug is ``team`` (the group :func:`plan.team_for_user` chose).

    Raises:
        StorageError: the caller is in no such group (the team tier would not be theirs).
    """
    from slurm_bt.weights.plan import caller_team_gid

    gid = caller_team_gid(team)
    if gid is not None:
        return gid
    raise StorageError(team, f"you are not a member of a Unix group for team {team!r}; the team cache "
                       "belongs to that group")


def ensure_team_root(base: Path, team: ClusterCache, gid: int | None = None) -> None:
    """Make sure ``<base>/teams/<team>`` exists and is exactly the team's (squatting, poisoning).

    Admins should provision ``<base>`` as ``root:root 0755`` and ``<base>/teams/<team>`` as
    ``root:<team group> 3770`` (docs/weights-cache.md). Where they have not (the dev cluster), the
    first stager creates ``<base>`` and ``<base>/teams`` as sticky world-writable directories (1777,
    like ``/tmp``) and the team directory as ``2770`` with the team's group. An existing team
    directory is used only if it is what slurm-bt or an admin would have made for *this* team
    (:func:`~slurm_bt.weights.cluster_cache.team_tier_problem`): group = the team's group, owner root or
    a member, closed to others. Anything else, e.g. a directory another user created first in the
    world-writable ``teams/``, is refused with the directory and the fix: its creator could plant
    entries the team's jobs would be authorized to load.

    Raises:
        StorageError: the team directory cannot be created or is not the team's.
    """
    root = team.root
    gid = team_gid(root.name) if gid is None else gid
    try:
        if not base.is_dir():
            base.parent.mkdir(parents=True, exist_ok=True)
            _make_dir(base, 0o1777)
        _make_dir(base / "teams", 0o1777)
        _make_dir(root, 0o2770, gid)
    except OSError as exc:
        raise StorageError(str(root), f"cannot create the team cache directory: {exc.strerror} (ask an admin "
                           "to provision it as root:<team group> 3770)") from exc
    problem = team_tier_problem(root, gid)
    if problem is not None:
        raise StorageError(str(root), f"team cache directory {problem}; refusing to use it (someone else "
                           f"created it first). Fix: an admin removes it (rm -rf {root}) or provisions it as "
                           f"root:{_group_name(gid)} 3770, then resubmit")
    for d in (base, base / "teams"):
        with contextlib.suppress(OSError):
            st = os.lstat(d)
            if st.st_uid not in (0, os.getuid()):
                # Its owner can rename team directories away (denial of service, not poisoning:
                # a replacement fails the check above); say so, the job itself can go on.
                print(f"slurm-bt staging: warning: {d} is owned by uid {st.st_uid}, not root; ask an admin to "
                      f"chown root:root {d}", file=sys.stderr, flush=True)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def stage_source(
    pin: SourcePin,
    team: ClusterCache,
    shared: ClusterCache,
    *,
    credentials: Credentials | None,
    endpoints: StorageEndpoints,
    options: Any = None,
    out: IO[str] = sys.stdout,
    progress_interval_s: float = 5.0,
    lock_timeout_s: float = _DEF_LOCK_TIMEOUT_S,
) -> StageOutcome:
    """Mirror one pinned source into ``team`` (or find it complete in ``team``/``shared``).

    Raises:
        SourceError: access denied, not found, unreachable after retries, integrity failure, or
            "source changed since submit" (the pin key differs).
        StorageError, CacheLockTimeout: cluster-cache problems.
    """
    from slurm_bt.storage.registry import open_backend
    from slurm_bt.storage.url import parse_source_uri
    from slurm_bt.weights.download import (
        DownloadOptions,
        each_streamed,
        fetch_file,
        fetch_small,
        release_thread_buffers,
    )

    opts: DownloadOptions = options or DownloadOptions(max_files=16)  # many small files: overlap fsyncs
    t0 = time.monotonic()
    if team.refused is not None:
        raise StorageError(str(team.root), team.refused)
    if shared.refused is not None:
        print(f"slurm-bt staging: warning: shared tier {shared.refused}", file=out, flush=True)
    team.layout.ensure(dir_mode=team.dir_mode)
    lock_opts = LockOptions(timeout_s=lock_timeout_s, log_every_s=30.0)
    # One pooled connection for every file thread and range worker that may be busy at once: a
    # urllib3 or botocore pool smaller than that opens extra connections, then drops each one with
    # a "connection pool is full" warning on the job's stderr.
    transport = dataclasses.replace(opts.transport, max_connections=max(
        opts.transport.max_connections, max(opts.max_files, opts.max_small_files) + opts.max_workers))
    backend = open_backend(parse_source_uri(pin.pinned_uri), credentials=credentials, endpoints=endpoints,
                          options=transport)
    try:
        with team.lock(f"pin-{pin.pin_key}", lock_opts):
            def checked_listing(on_file: Callable[[RemoteFile], None]) -> tuple[Listing, list[PinnedFile], str]:
                # With the user's credentials: authorization, hit or miss.
                listing = backend.list_files_streaming(on_file)
                files, revision = select_listing(listing, pin.allow_patterns, pin.ignore_patterns)
                if pin_key(listing.uri.kind, listing.uri.canonical, revision, files) != pin.pin_key:
                    raise SourceError(pin.source, "source changed since submit (objects added, removed or "
                                      "replaced after bt-sbatch pinned it); resubmit to use the new version")
                return listing, files, revision

            # A hit is known from the pin key alone, but is returned only once the listing matched it.
            for tier in (team, shared):
                m = pin.manifest or lookup_pin(tier, pin.pin_key)
                if m is not None and tier.has(m):
                    checked_listing(lambda _f: None)
                    return StageOutcome(pin.index, pin.pinned_uri, "cluster-hit", m.total_bytes, 0,
                                        time.monotonic() - t0, m)
            # A miss: each pinned file the listing reaches (same path, size and ETag as at submit)
            # is fetched while the listing goes on, as ``s5cmd cp`` does; nothing is recorded as an
            # entry until the whole listing matched the pin (a changed source fails the job, and what
            # was fetched by then is only content-addressed, verified blobs). Files the backend did
            # not stream follow, biggest first.
            pinned = {(f.path, f.size, f.etag) for f in pin.files}
            handed: set[str] = set()
            # Temp files go to a writer dir that names this process and keeps a heartbeat, not
            # beside the blobs: a kill -9 leaves debris the next stager can prove dead and remove.
            with _Progress(pin.pinned_uri, sum(f.size for f in pin.files), out, progress_interval_s) as progress, \
                    team.writer_dir() as wdir, team.fetched_batch() as batch:
                counting = _CountingSource(backend, progress)

                def fetch_into_tier(rf: Any) -> ManifestFile:
                    if rf.size <= opts.small_file_max:  # verified in memory, published in batches (BlobBatch)
                        small = fetch_small(counting, rf, wdir, options=opts)
                        assert small.path is not None
                        mf = ManifestFile(path=rf.path, size=rf.size, sha256=small.sha256, etag=rf.etag)
                        batch.add(small.path, mf)
                        return mf
                    with big_slots:  # small files run on more threads than bigger ones may
                        try:
                            got = fetch_file(counting, rf, wdir, options=opts, pool=parts)
                        finally:
                            release_thread_buffers()
                    mf = ManifestFile(path=rf.path, size=rf.size, sha256=got.sha256, etag=rf.etag)
                    if got.path is not None and got.path.parent == wdir:
                        try:
                            team.publish_fetched(got.path, mf)
                        except FileNotFoundError:  # two files with one content: the other published it
                            if not blob_present(team.layout, mf):
                                raise
                    return mf

                def one(rf: Any) -> ManifestFile:
                    if rf.sha256 is None:  # no published hash: the bytes we publish name the blob
                        return fetch_into_tier(rf)
                    mf = ManifestFile(path=rf.path, size=rf.size, sha256=rf.sha256, etag=rf.etag)
                    if not blob_present(team.layout, mf):
                        with team.lock(f"blob-{rf.sha256}", lock_opts):
                            if not blob_present(team.layout, mf):
                                fetch_into_tier(rf)
                    return mf

                def produce(submit: Callable[[RemoteFile], None]) -> tuple[Listing, str]:
                    def early(rf: RemoteFile) -> None:
                        if (rf.path, rf.size, rf.etag) in pinned and rf.path not in handed:
                            handed.add(rf.path)
                            submit(rf)

                    listing, files, revision = checked_listing(early)
                    by_path = {f.path: f for f in listing.files}
                    for rf in sorted((by_path[f.path] for f in files if f.path not in handed), key=lambda f: -f.size):
                        submit(rf)
                    return listing, revision

                # Small files (one GET each) on up to max_small_files threads, bigger ones on at most
                # max_files of them at a time (DownloadOptions says why).
                big_slots = threading.BoundedSemaphore(opts.max_files)
                files_at_once = max(opts.max_files, min(opts.max_small_files, sum(
                    1 for f in pin.files if f.size <= opts.small_file_max)))
                with ThreadPoolExecutor(opts.max_workers, thread_name_prefix="bt-part") as parts:
                    (listing, revision), got = each_streamed(one, produce, files_at_once)
                progress.print_line()
            manifest = Manifest(kind=listing.uri.kind, source=listing.uri.canonical, revision=revision,
                                files=tuple(got))
            with team.lock(f"manifest-{manifest.manifest_id}", lock_opts):
                team.add_manifest(manifest)
            with contextlib.suppress(OSError):  # a teammate's record may sit there (sticky dir): fine
                team.write_pin(pin.pin_key, manifest)
            return StageOutcome(pin.index, pin.pinned_uri, "miss", manifest.total_bytes, progress.done,
                                time.monotonic() - t0, manifest)
    finally:
        backend.close()


def stage_plan(
    job_dir: Path,
    *,
    out: IO[str] = sys.stdout,
    credentials_for: Callable[[SourcePin], Credentials | None] | None = None,
    options: Any = None,
    progress_interval_s: float = 5.0,
    spec: JobSpec | None = None,
) -> list[StageOutcome]:
    """Stage every source of the plan in ``job_dir`` and write its final manifests.

    ``spec``: the job's ``job.json`` when the caller has read it already (else read here, bounded,
    when the credentials come from the user's store).

    Raises:
        BtError: the first source that failed, with ``job.weights[i].source`` prepended by
            :func:`slurm_bt.steps.stage_weights.main`.
    """
    from slurm_bt.job_spec import read_job_spec
    from slurm_bt.weights.plan import read_plan

    plan = read_plan(job_dir)
    if credentials_for is None:
        credentials_for = _store_credentials(spec or read_job_spec(job_dir / "job.json"))
    team, shared = cluster_tiers(plan.cluster_cache, plan.team)
    ensure_team_root(Path(plan.cluster_cache), team)
    _collect_dead_writers(team, out)
    outcomes = []
    for pin in plan.sources:
        try:
            outcome = stage_source(pin, team, shared, credentials=credentials_for(pin), endpoints=plan.endpoints,
                                   options=options, out=out, progress_interval_s=progress_interval_s)
        except BtError as exc:
            exc.weights_index = pin.index  # type: ignore[attr-defined]
            raise
        write_file_atomic(job_manifest_path(job_dir, pin.index), outcome.manifest.canonical_json(), mode=0o600)
        write_staging_status(job_dir, pin.index, {
            "index": pin.index, "source": outcome.source, "tier": outcome.tier,
            "total_bytes": outcome.total_bytes, "fetched_bytes": outcome.fetched_bytes,
            "seconds": round(outcome.seconds, 3), "manifest_id": outcome.manifest.manifest_id})
        print(outcome.line(), file=out, flush=True)
        outcomes.append(outcome)
    return outcomes


def _collect_dead_writers(team: ClusterCache, out: IO[str]) -> None:
    """Remove temp files of stagers that provably died (e.g. ``kill -9``); housekeeping, never fatal."""
    try:
        removed = team.gc_temp()
    except OSError as exc:
        print(f"slurm-bt staging: warning: could not collect dead writers' temp files in {team.root}: {exc}",
              file=out, flush=True)
        return
    for p in removed:
        print(f"slurm-bt staging: removed {p} (its writer is dead)", file=out, flush=True)


def _store_credentials(spec: JobSpec) -> Callable[[SourcePin], Credentials | None]:
    """Credentials from the user's secret store (the store named in the job's spec)."""
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import user_path
    from slurm_bt.storage.credentials import credentials_from_store

    store = SecretStore(Path(user_path(spec.storage["secrets"])))

    def get(pin: SourcePin) -> Credentials | None:
        return credentials_from_store(store, pin.auth_secret_name, pin.kind, source=pin.declared)

    return get
