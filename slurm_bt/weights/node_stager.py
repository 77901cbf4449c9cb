"""The node stager: a root-owned, bounded process that copies one cluster entry into the node cache.

Why not in the prolog: the prolog runs under Slurm's ``PrologEpilogTimeout`` and our own
``deadline_s``; a node miss of hundreds of GB cannot fit without raising both (which also delays
every node-failure detection). So the prolog (:func:`slurm_bt.weights.node_stage.stage_for_job`)
only authorizes, leases the entry to the job (:meth:`NodeCache.join`) and starts this process
(:func:`spawn`); the job's first step waits for the snapshot in DEPLOYING, printing this
process's progress (:func:`read_progress`). docs/weights-cache.md §Node misses of any size.

Properties (each is enforced here, not by convention):

* **one per entry, single-flight across jobs**: the stager holds the node cache's
  ``entry-<manifest_id>`` lock for the whole copy; a second stager for the same entry finds it busy
  and exits at once, and the second job simply leases the entry and waits for the same snapshot;
* **resumable after a crash**: blobs are published one by one (verified, fsynced, renamed), and a
  blob of 128 MiB or more is written under a fixed partial name with a mark of its durable prefix
  (``NodeCache._copy_from``); a ``kill -9`` leaves those, so the next job's stager copies only what
  is missing, re-hashing a partial blob's prefix from the node's disk (``resumed_bytes`` in its
  progress);
* **its share ends with the job**: the waiting jobs hold leases (``leases/<id>/<job>``) that the
  epilog drops; when no lease is left the copy stops, this process's temp files are removed and
  nothing is published as an entry (the COMPLETE marker comes only after the whole snapshot);
* **bounded**: ``nice`` 10, an address-space limit, a CPU-time limit and a wall clock that grow
  with the entry's size (``min_rate`` bytes/s), a stall limit (no byte moved for ``stall_s``), and
  an optional rate cap so a warming copy leaves disk bandwidth to the running jobs.

Input: a root-owned request file (``<node_root>/stagers/<key>.json``, written by the prolog);
output: ``<key>.progress`` beside it (root-owned, ``0644``, or ``0640`` with the team's group for a
team's private entry; the directory is ``0711`` so only a job that was told the key can open it) and
lines in the hook log.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import stat
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.atomic import write_file_atomic
from slurm_bt.posix.privdrop import spawn_detached
from slurm_bt.trusted_files import read_trusted_file
from slurm_bt.weights.locks import process_start_time
from slurm_bt.weights.manifest import Manifest

if TYPE_CHECKING:
    from slurm_bt.site.hook_settings import HookSettings
    from slurm_bt.weights.cluster_cache import ClusterCache
    from slurm_bt.weights.node_cache import NodeCache

__all__ = ["STAGERS_DIR", "StagerPolicy", "live_stager", "main", "node_bounds", "policy_from_settings",
           "process_running", "progress_path", "read_progress", "run", "spawn", "stager_key"]

STAGERS_DIR = "stagers"
_MAX_REQUEST = 80 << 20  # a manifest is at most 64 MiB (node_stage._MAX_MANIFEST) plus a few fields
_MAX_PROGRESS = 64 << 10
#: A stager rewrites its progress every second; a record older than this names a dead stager.
STALE_AFTER_S = 60.0
#: A stager whose copy does not notice a stop (cancelled, a bound hit) within this long exits anyway.
HARD_EXIT_AFTER_S = 30.0


@dataclass(frozen=True)
class StagerPolicy:
    """The bounds of node stagers (hook policy, slurm_bt/site/hook_settings.py ``weights_stage_*``).

    Attributes:
        prolog_wait_s: how long the prolog waits for a miss before leaving it to the stager (the
            job then waits in its first step); small entries finish inside it as before.
        rate_bytes_s: copy rate cap (0: none).
        memory_bytes: address-space limit of the stager.
        min_rate_bytes_s: the slowest copy tolerated: wall clock and CPU time allowed are
            ``600 s + missing bytes / min_rate``.
        stall_s: the copy stops when no byte moved for this long.
        log_file: the hook log (the stager appends its lines there).
    """

    prolog_wait_s: float = 5.0
    rate_bytes_s: int = 0
    memory_bytes: int = 4 << 30
    min_rate_bytes_s: int = 10 << 20
    stall_s: float = 300.0
    log_file: str = "/var/log/slurm-bt/hooks.log"

    def time_limit_s(self, missing_bytes: int) -> float:
        """Wall clock (and CPU seconds) allowed for copying ``missing_bytes``."""
        return 600.0 + missing_bytes / max(1, self.min_rate_bytes_s)


def policy_from_settings(st: HookSettings) -> StagerPolicy:
    """The node stagers' bounds from the hook policy (``weights_stage_*``, ``weights_prolog_wait_s``)."""
    return StagerPolicy(prolog_wait_s=st.weights_prolog_wait_s,
                        rate_bytes_s=int(st.weights_stage_rate_mib_s * (1 << 20)),
                        memory_bytes=st.weights_stage_memory_mib << 20,
                        min_rate_bytes_s=max(1, int(st.weights_stage_min_rate_mib_s * (1 << 20))),
                        stall_s=st.weights_stage_stall_s, log_file=st.log_file)


class _Cancelled(Exception):
    """No job waits for the entry any more (their leases are gone), or a bound was hit."""


def stager_key(manifest_id: str, team: str | None) -> str:
    """The file name stem of an entry's request and progress (``pub-<id>`` or ``team-<team>-<id>``)."""
    return f"pub-{manifest_id}" if team is None else f"team-{team}-{manifest_id}"


def progress_path(node_root: str | Path, key: str) -> Path:
    """``<node_root>/stagers/<key>.progress``."""
    return Path(node_root) / STAGERS_DIR / f"{key}.progress"


def read_progress(node_root: str | Path, key: str) -> dict[str, Any] | None:
    """The stager's progress record if root wrote it (anyone may call this; jobs do, as the user)."""
    if "/" in key or key.startswith("."):
        return None
    raw = read_trusted_file(progress_path(node_root, key), max_bytes=_MAX_PROGRESS)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def process_running(pid: int, start_time: object) -> bool:
    """``pid`` is the process that started at ``start_time`` and has not exited (a zombie has)."""
    if process_start_time(pid) != start_time:
        return False
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    rest = data[data.rfind(b")") + 2:].split()
    return bool(rest) and rest[0] not in (b"Z", b"X")


def _alive(rec: Mapping[str, Any]) -> bool:
    """The record's writer still runs (same pid and start time) and wrote recently."""
    pid, start = rec.get("pid"), rec.get("start_time")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if not process_running(pid, start):
        return False
    updated = rec.get("updated")
    return isinstance(updated, (int, float)) and time.time() - updated < STALE_AFTER_S


def live_stager(node_root: str | Path, key: str) -> dict[str, Any] | None:
    """The progress record of a stager of ``key`` that is still running, else None."""
    rec = read_progress(node_root, key)
    if rec is not None and rec.get("state") in ("starting", "running") and _alive(rec):
        return rec
    return None


def _stagers_dir(node_root: Path) -> Path:
    d = node_root / STAGERS_DIR
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o711)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{d} is not a directory owned by uid {os.geteuid()}")
    os.chmod(d, 0o711)  # noqa: S103 - traversable, not listable: a job opens its entry's progress by key
    return d


def spawn(node_root: Path, key: str, request: Mapping[str, Any], policy: StagerPolicy) -> int | None:
    """Start a detached stager for ``key`` unless one is running; returns its pid (None: one runs).

    Detached like the hand-off sweep (slurm_bt/checkpoints/handoff.py ``start_background_sweep``):
    a new session (the prolog's process group may be killed when it ends), no inherited
    descriptors (slurmd reads the prolog's output until EOF), output appended to the hook log.
    """
    if live_stager(node_root, key) is not None:
        return None
    d = _stagers_dir(node_root)
    req = d / f"{key}.json"
    write_file_atomic(req, json.dumps(dict(request, policy=policy.__dict__)).encode(), mode=0o600)
    argv = [sys.executable, "-I", "-m", "slurm_bt.weights.node_stager", str(req)]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    proc = spawn_detached(argv, env, policy.log_file)
    # A first record at once, so the job's first step never mistakes an older stager's final
    # "failed"/"cancelled" for this one; the stager replaces it within a second.
    aud = request.get("audience")
    _write_progress(d / f"{key}.progress", {"state": "starting", "pid": proc.pid,
                                             "start_time": process_start_time(proc.pid), "updated": time.time()},
                    int(aud["gid"]) if isinstance(aud, Mapping) else None)
    return proc.pid


def _write_progress(path: Path, rec: Mapping[str, Any], gid: int | None = None) -> None:
    """Publish a progress record: ``0644`` for public entries; a team's entry ``0640`` with the team's
    group (a failure message may name the private source's files)."""
    from slurm_bt.atomic import atomic_output

    data = json.dumps(dict(rec)).encode()
    with contextlib.suppress(OSError), atomic_output(path, mode=0o644 if gid is None else 0o640) as fd:
        if gid is not None:
            os.fchown(fd, -1, gid)
            os.fchmod(fd, 0o640)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


def _log(key: str, msg: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    print(f"{stamp} node-stager[{os.getpid()}] {key}: {msg}", flush=True)


class _Tracker:
    """Counts bytes, enforces the rate cap and the bounds, and publishes the progress record."""

    def __init__(self, path: Path, total: int, present: int, policy: StagerPolicy, leased: Any,
                 gid: int | None = None) -> None:
        self.path, self.total, self.policy, self.leased, self.gid = path, total, policy, leased, gid
        self.resumed = present
        self.done = present
        self.copied = 0
        self.t0 = time.monotonic()
        self.last_move = self.t0
        self.deadline = self.t0 + policy.time_limit_s(total - present)
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._samples: list[tuple[float, int]] = [(self.t0, 0)]
        self._thread = threading.Thread(target=self._run, name="stager-progress", daemon=True)

    def add(self, n: int) -> None:
        """``progress`` callback of the copy: may sleep (rate cap) or raise :class:`_Cancelled`."""
        if self.reason is not None:
            raise _Cancelled(self.reason)
        with self._lock:
            self.done += n
            self.copied += n
            copied = self.copied
            self.last_move = time.monotonic()
        if self.policy.rate_bytes_s > 0:
            ahead = copied / self.policy.rate_bytes_s - (time.monotonic() - self.t0)
            while ahead > 0 and self.reason is None:
                time.sleep(min(ahead, 0.5))
                ahead -= 0.5
        if self.reason is not None:
            raise _Cancelled(self.reason)

    def resumed_part(self, n: int) -> None:
        """A partial blob a killed stager left: ``n`` bytes that need no copy (``NodeCache.on_resume``)."""
        with self._lock:
            self.resumed += n
            self.done += n

    def rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, self.copied))
            self._samples = [s for s in self._samples if now - s[0] <= 10.0] or self._samples[-1:]
            t, c = self._samples[0]
            return (self.copied - c) / (now - t) if now > t else 0.0

    def record(self, state: str, message: str = "") -> dict[str, Any]:
        rate = self.rate() if state == "running" else self.copied / max(1e-9, time.monotonic() - self.t0)
        left = max(0, self.total - self.done)
        pid = os.getpid()
        return {"state": state, "pid": pid, "start_time": process_start_time(pid), "updated": time.time(),
                "done_bytes": self.done, "total_bytes": self.total, "resumed_bytes": self.resumed,
                "rate_bytes_s": round(rate, 1), "eta_s": round(left / rate, 1) if rate > 0 and left else None,
                "message": message}

    def _run(self) -> None:
        empty = 0
        stopping_since: float | None = None
        while not self._stop.wait(1.0):
            now = time.monotonic()
            empty = 0 if self.leased() else empty + 1
            if self.reason is not None:
                stopping_since = stopping_since or now
                if now - stopping_since > HARD_EXIT_AFTER_S:
                    # The copy did not reach its next chunk (a read blocked on a hung filesystem):
                    # end the process anyway; the next stager proves this one dead and collects its
                    # temp files, and the waiting jobs read why.
                    _write_progress(self.path, self.record("failed", f"{self.reason} (copy blocked; ended)"),
                                    self.gid)
                    _log(self.path.name, f"ending: {self.reason}; the copy stayed blocked")
                    os._exit(1)
            elif empty >= 2:  # twice in a row: a prolog adds its lease before it starts us
                self.reason = "no job waits for this entry any more (cancelled or ended)"
            elif now > self.deadline:
                self.reason = f"exceeded its wall-clock limit of {self.deadline - self.t0:.0f} s"
            elif now - self.last_move > self.policy.stall_s:
                self.reason = f"no progress for {self.policy.stall_s:.0f} s"
            _write_progress(self.path, self.record("running"), self.gid)

    def __enter__(self) -> _Tracker:
        _write_progress(self.path, self.record("running"), self.gid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _limit(policy: StagerPolicy, missing: int) -> None:
    """Bound this process: niceness, address space, CPU seconds (as for the hand-off children)."""
    with contextlib.suppress(OSError):
        os.nice(10)
    cpu = int(policy.time_limit_s(missing))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (policy.memory_bytes, policy.memory_bytes))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 30))


def run(request_path: Path) -> int:
    """Copy the requested entry; exit 0 when it is ready, already being copied, or nobody waits."""
    from slurm_bt.weights.cluster_cache import ClusterCache
    from slurm_bt.weights.node_cache import NodeAudience, NodeCache

    raw = read_trusted_file(request_path, max_bytes=_MAX_REQUEST)
    if raw is None:
        print(f"node-stager: {request_path}: not a root-owned request file", flush=True)
        return 2
    req = json.loads(raw)
    key = request_path.name.removesuffix(".json")
    policy = StagerPolicy(**req["policy"])
    manifest = Manifest.model_validate_json(req["manifest"])
    aud = req.get("audience")
    node = NodeCache(Path(req["node_root"]), int(req["max_bytes"]), reserve_bytes=int(req["reserve_bytes"]),
                     audience=NodeAudience(str(aud["team"]), int(aud["gid"])) if aud else None)
    base = Path(req["cluster_base"])
    shared = ClusterCache.shared(base)
    shared.trusted_copy = bool(req.get("shared_trusted")) and shared.refused is None and shared.root.is_dir()
    team_tier = ClusterCache.for_team(base, str(req["team"]))
    tiers = [c for c in (shared, team_tier) if c.refused is None]
    path = request_path.with_name(f"{key}.progress")
    reader = req.get("reader")
    if isinstance(reader, dict):
        # as in the prolog: the job user opens the team tier's blobs and passes the descriptors;
        # started before the tracker's thread (a fork is safest in a single-threaded process)
        team_tier.read_as_user(int(reader["uid"]), int(reader["gid"]))
    try:
        return _copy(request_path, key, path, node, manifest, tiers, policy)
    finally:
        team_tier.close_reader()


def _copy(request_path: Path, key: str, path: Path, node: NodeCache, manifest: Manifest, tiers: list[ClusterCache],
          policy: StagerPolicy) -> int:
    from slurm_bt.errors import CacheLockTimeout
    from slurm_bt.weights.locks import LockOptions

    mid = manifest.manifest_id
    try:
        # Single flight: the lock is held for the whole copy; a busy lock means a live stager.
        with node._lock(f"entry-{mid}", LockOptions(timeout_s=2.0)):
            missing = node.missing_bytes(manifest)
            _limit(policy, missing)
            node.gc_temp()  # a killed stager's temp blobs (their writer is provably dead)
            _sweep_old(request_path.parent)
            tracker = _Tracker(path, manifest.total_bytes, manifest.total_bytes - missing, policy,
                               lambda: bool(node.leases(mid)), node.audience.gid if node.audience else None)
            _log(key, f"copying {missing} of {manifest.total_bytes} bytes of {manifest.source} "
                      f"({tracker.resumed} already on the node)")
            node.on_resume = tracker.resumed_part
            try:
                with tracker:
                    if not node.leases(mid):
                        raise _Cancelled("no job waits for this entry")
                    node.fill(manifest, tiers, progress=tracker.add)
            except _Cancelled as exc:
                _drop(request_path)
                _write_progress(path, tracker.record("cancelled", str(exc)), tracker.gid)
                _log(key, f"stopped: {exc}; {tracker.done} of {tracker.total} bytes kept for the next job")
                return 0
            except Exception as exc:  # reported to the waiting jobs; the hook log has the class
                msg = " ".join(str(exc).split())[:1000]
                _drop(request_path)
                _write_progress(path, tracker.record("failed", f"{type(exc).__name__}: {msg}"), tracker.gid)
                _log(key, f"failed: {type(exc).__name__}: {msg}")
                return 1
            _drop(request_path)
            _write_progress(path, tracker.record("done"), tracker.gid)
            _log(key, f"done: {tracker.copied} bytes copied in {time.monotonic() - tracker.t0:.1f} s")
            return 0
    except CacheLockTimeout:
        _log(key, "another stager holds this entry; leaving it the copy")
        return 0


def _drop(request_path: Path) -> None:
    """Remove our request (it holds a whole manifest) *before* the final record: a prolog that reads
    that record may start a new stager with a new request, which must not be removed after."""
    with contextlib.suppress(OSError):
        os.unlink(request_path)


def _sweep_old(d: Path, older_than_s: float = 86400.0) -> None:
    """Remove records and requests of stagers that ended (or died) more than ``older_than_s`` ago."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(d) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if now - st.st_mtime < older_than_s or not e.name.endswith((".json", ".progress")):
                continue
            if e.name.endswith(".progress") and live_stager(d.parent, e.name.removesuffix(".progress")):
                continue
            with contextlib.suppress(OSError):
                os.unlink(e.path)


def node_bounds(node_root: str, max_bytes: int, reserve_bytes: int, policy: StagerPolicy) -> tuple[bool, str]:
    """``admin doctor``: the bounds that remain for a node miss (ok, one line); no admin setting grows
    with the model, so this names capacity and free space, and how long a copy may take."""
    from slurm_bt.units import format_bytes

    try:
        vfs = os.statvfs(node_root)
    except OSError as exc:
        return False, f"{node_root}: {exc.strerror}"
    free = max(0, vfs.f_bavail * vfs.f_frsize - reserve_bytes)
    from slurm_bt.weights.node_cache import NodeCache

    node = NodeCache(Path(node_root), max_bytes, reserve_bytes=reserve_bytes)
    used = 0
    with contextlib.suppress(OSError):
        used = node.usage_bytes()
    cap = node.cap_bytes()
    largest = min(cap, free + used)
    rate = f", capped at {format_bytes(policy.rate_bytes_s)}/s" if policy.rate_bytes_s else ""
    cap_text = format_bytes(max_bytes) if max_bytes else f"0 = 90% of the filesystem = {format_bytes(cap)}"
    line = (f"largest entry this node can take: {format_bytes(largest)} (node_cache_max_bytes "
            f"{cap_text}, {format_bytes(free)} free after node_cache_reserve_bytes, "
            f"{format_bytes(used)} held, evictable unless leased); bigger entries fail the job (node cache full). "
            f"Misses are copied outside the prolog by a node stager (the prolog waits {policy.prolog_wait_s:.0f} s): "
            f"a copy may take 600 s + size / {format_bytes(policy.min_rate_bytes_s)}/s (1 TB: "
            f"{policy.time_limit_s(10**12) / 3600:.1f} h){rate}, stops after {policy.stall_s:.0f} s without progress")
    return largest >= 1 << 30, line


def main(argv: list[str] | None = None) -> int:
    """``python -I -m slurm_bt.weights.node_stager REQUEST_JSON`` (root; started by the prolog)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or os.geteuid() != 0:
        print("usage (as root): python -m slurm_bt.weights.node_stager REQUEST_JSON", file=sys.stderr)
        return 2
    os.umask(0o022)
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
