"""Finish handed-off checkpoints: ``slurm-bt checkpoints resume-handoffs`` (root, or a sweeper).

Each entry of the hand-off area (``<node storage>/checkpoint-handoff/<job>.<node>/``, root-owned
``0711``) holds ``handoff.json`` (root-written: job, node, uid, gid, team, account) and ``data/`` (the job's
checkpoint directory, still owned by the user). The upload runs in a child dropped to that uid,
with the user's own store credentials and the team the prolog resolved, exactly like the epilog's
flush; afterwards the entry is deleted (:func:`~slurm_bt.posix.safefs.remove_tree_at`: never
follows a symlink planted in ``data/``). Running twice is harmless.

Bounded, because the job still controls ``data/`` and the files its state names (docs/checkpoints.md
§Hand-off):

* every file the child reads is opened as :mod:`slurm_bt.posix.user_files` says (no FIFO, device, user symlink or
  oversized file), and the child runs under ``[handoff]`` limits of hooks.toml: address space,
  CPU time and a wall clock in minutes (``child_timeout_s``; its process group is killed);
* an entry that failed the same way ``max_failures`` times in a row is **quarantined**
  (``status.json`` in the entry, root-written): kept, listed by ``slurm-bt admin doctor``, never
  retried automatically; ``--retry-quarantined`` retries it once its cause is fixed;
* after each pass, entries older than ``max_age_s`` and, per user, the oldest entries beyond
  ``max_bytes_per_user`` of disk are removed, quarantined ones included, each with a log line:
  a hand-off that cannot complete never keeps a user's data on the node for ever.

When it runs: the epilog that hands something off starts one detached sweep of its node's area
right away (:func:`start_background_sweep`: its own session, ``nice`` 10, output to the hook log),
so the node is released at once and the upload finishes shortly after without an admin step; a
periodic run (``slurm-bt checkpoints resume-handoffs`` from a timer, see docs/admin.md) catches what
a reboot or a store outage left behind. Each entry is taken under a non-blocking ``flock`` on its
directory (the area is node-local), so overlapping sweeps never upload the same entry twice.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.checkpoints.flush import build_uploader, handoff_policy, read_spec, read_state
from slurm_bt.checkpoints.locations import handoff_root
from slurm_bt.errors import StorageError
from slurm_bt.posix.privdrop import spawn_detached
from slurm_bt.site.settings import load_site_settings

if TYPE_CHECKING:
    from slurm_bt.site.hook_settings import HandoffPolicy

__all__ = ["STATUS_NAME", "HandoffOutcome", "QuarantinedEntry", "main", "quarantined_handoffs", "resume_handoffs",
           "start_background_sweep"]

STATUS_NAME = "status.json"
"""Root-written beside ``handoff.json``: consecutive failures, their signature, quarantine."""

_RECORD_MAX_BYTES = 65536
_EMPTY_ENTRY_AGE_S = 3600.0
_REMOVE_BUDGET_S = 120.0
_MEASURE_BUDGET_S = 30.0
_MEASURE_MAX_NAMES = 100_000  # per directory; beyond it the size is a lower bound (and still charged)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class HandoffOutcome:
    """The result for one hand-off entry."""

    entry: str
    status: str
    """``uploaded``; ``failed`` (retried next sweep); ``quarantined`` (failed ``max_failures`` times the
    same way, or skipped because it is); ``skipped``; ``busy`` (another sweep holds it); ``removed``
    (nothing left to upload); ``expired`` / ``over-budget`` (removed by the age / per-user size bound)."""
    message: str


@dataclass(frozen=True)
class QuarantinedEntry:
    """A quarantined hand-off entry, as ``slurm-bt admin doctor`` lists it."""

    entry: str
    user: str
    failures: int
    error: str
    since: float

    def line(self) -> str:
        """One line for the doctor's report."""
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(self.since))
        return f"{self.entry} (user {self.user}, {self.failures} failures, since {when} UTC): {self.error[:200]}"


def _read_root_json(dir_fd: int, name: str) -> dict[str, Any] | None:
    """A small JSON object root wrote into a root-owned entry (None if absent, foreign or not JSON)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _RECORD_MAX_BYTES or (os.geteuid() == 0 and st.st_uid != 0):
            return None
        data = json.loads(os.read(fd, _RECORD_MAX_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def _write_status(dir_fd: int, status: dict[str, Any]) -> None:
    from slurm_bt.posix.safefs import write_file_at

    try:
        write_file_at(dir_fd, STATUS_NAME, json.dumps(status).encode(), uid=os.geteuid(), gid=os.getegid(),
                      mode=0o600)
    except OSError:
        pass  # counting is best effort; the age and size bounds still apply


def _resume_one(data_dir: Path, record: dict[str, Any]) -> dict[str, Any]:
    """As the owner: upload every checkpoint in ``data_dir`` (all are complete: the job has ended)."""
    if not data_dir.is_dir():
        # Not moved: the checkpoints were outside scratch (checkpoint_path); find them from the spec.
        from slurm_bt.checkpoints.locations import host_checkpoint_dir

        try:
            spec = read_spec(Path(str(record.get("work_dir")), "job.json"))
        except FileNotFoundError:
            return {"uploaded": [], "gone": True}  # neither the checkpoints nor the job's spec exist any more
        host = host_checkpoint_dir(spec, str(record["job_id"]), record.get("node"))
        if not host or not Path(host).is_dir():
            return {"uploaded": [], "gone": True}
        data_dir = Path(host)
    state = read_state(data_dir)
    if state is None and record.get("work_dir"):
        # Hand-offs made before the flush recorded the state itself: a single-node job is rank 0.
        spec_path = f"{record['work_dir']}/job.json"
        if read_spec(spec_path).nodes == 1:
            state = {"job_id": record.get("job_id"), "rank": 0, "spec_path": spec_path}
    if state is None:
        raise StorageError(str(data_dir), "no readable uploader state file: cannot tell which job and rank this is")
    if str(state.get("job_id")) != str(record.get("job_id")):
        raise StorageError(str(data_dir), "state file names another job")
    spec = read_spec(str(state["spec_path"]))
    # The team the prolog resolved, else the job's Slurm account (both root-recorded), as the job's own
    # uploader chose them: the hand-off completes the same namespace _teams/<team>/.
    team = next((v for v in (record.get("team"), record.get("account")) if isinstance(v, str) and v), None)
    uploader = build_uploader(spec, job_id=str(record["job_id"]), rank=int(state["rank"]), checkpoint_dir=data_dir,
                              account=team)
    try:
        done = uploader.run_once(final=True)
    finally:
        uploader.store.close()
    return {"uploaded": done}


def resume_handoffs(*, root: Path | None = None, node: str | None = None, timeout_s: float | None = None,
                    keep: bool = False, retry_quarantined: bool = False, policy: HandoffPolicy | None = None,
                    on_outcome: Callable[[HandoffOutcome], None] | None = None) -> list[HandoffOutcome]:
    """Upload and remove every hand-off entry under ``root`` (default: this node's hand-off area),
    then apply the age and per-user size bounds.

    Args:
        root: the hand-off area; defaults to the site's, for ``node`` (``%n`` in storage roots).
        node: the Slurm node name, when the site's roots use ``%n``.
        timeout_s: per-entry wall-clock limit of the upload child (default: ``child_timeout_s``).
        keep: leave entries in place after a successful upload (debugging).
        retry_quarantined: also retry quarantined entries (an admin, after fixing their cause).
        policy: the ``[handoff]`` bounds (default: hooks.toml's).
        on_outcome: called with each outcome as soon as it is known (the sweep logs it then, so a
            long upload of one entry does not hide what happened to the others).
    """
    policy = policy or handoff_policy()
    if root is None:
        root = Path(handoff_root(load_site_settings().storage.model_dump(), node))
    outcomes = _Outcomes(on_outcome)
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError:
        return outcomes
    try:
        if os.geteuid() == 0 and os.fstat(root_fd).st_uid != 0:
            outcomes.append(HandoffOutcome(".", "skipped", f"{root} is not root-owned: not touched"))
            return outcomes
        for name in sorted(os.listdir(root_fd)):
            with _locked(root_fd, name) as lock_fd:
                if lock_fd is None:
                    continue
                if lock_fd < 0:
                    outcomes.append(HandoffOutcome(name, "busy", "another sweep is uploading it"))
                    continue
                outcomes.append(_resume_entry(root, root_fd, name, lock_fd, timeout_s or policy.child_timeout_s,
                                              keep, retry_quarantined, policy))
        _enforce_bounds(root_fd, policy, keep, outcomes)
    finally:
        os.close(root_fd)
    return outcomes


class _Outcomes(list[HandoffOutcome]):
    """The outcomes so far; each is also passed to ``on_outcome`` as it is added."""

    def __init__(self, on_outcome: Callable[[HandoffOutcome], None] | None) -> None:
        super().__init__()
        self._on_outcome = on_outcome

    def append(self, outcome: HandoffOutcome) -> None:
        super().append(outcome)
        if self._on_outcome is not None:
            self._on_outcome(outcome)


class _locked:
    """``with _locked(root_fd, name) as fd``: the entry's directory fd under an exclusive ``flock``.

    ``fd`` is None when the entry is gone or not a real directory, -1 when another sweep holds it.
    """

    def __init__(self, root_fd: int, name: str) -> None:
        self.root_fd, self.name, self.fd = root_fd, name, -2

    def __enter__(self) -> int | None:
        try:
            self.fd = os.open(self.name, _DIR_FLAGS, dir_fd=self.root_fd)
        except OSError:
            return None  # removed by a concurrent sweep, or a symlink / file: never ours
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return -1
        try:
            if not os.path.samestat(os.fstat(self.fd), os.stat(self.name, dir_fd=self.root_fd, follow_symlinks=False)):
                return None
        except OSError:
            return None  # finished and removed by the sweep that held the lock before us
        return self.fd

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _remove_entry(root_fd: int, name: str) -> str:
    """Remove one entry (fd-relative, never following a symlink); '' or what was left."""
    from slurm_bt.posix.safefs import remove_tree_at

    report = remove_tree_at(root_fd, name, deadline=time.monotonic() + _REMOVE_BUDGET_S)
    return "" if report.complete else f"; {len(report.leftovers)} item(s) left for the next sweep"


def _resume_entry(root: Path, root_fd: int, name: str, lock_fd: int, timeout_s: float, keep: bool,
                  retry_quarantined: bool, policy: HandoffPolicy) -> HandoffOutcome:
    """Upload one locked entry as its owner, then remove it; count and quarantine failures."""
    from slurm_bt.checkpoints.flush import child_limits
    from slurm_bt.posix.privdrop import ChildError, ChildTimeout, run_as_uid

    est = os.fstat(lock_fd)
    if os.geteuid() == 0 and est.st_uid == 0 and stat.S_IMODE(est.st_mode) != 0o711:
        # Entries made before the flush set 0711 explicitly are 0700 (the epilog's umask): the child,
        # running as the user, could not reach data/ ("Permission denied" on every entry).
        os.fchmod(lock_fd, 0o711)
    record = _read_root_json(lock_fd, "handoff.json")
    if record is None:
        # An empty entry an hour old is what a hand-off that failed before moving anything leaves
        # (an epilog mid-hand-off has it for milliseconds); rmdir removes only an empty directory.
        if time.time() - est.st_mtime > _EMPTY_ENTRY_AGE_S:
            try:
                os.rmdir(name, dir_fd=root_fd)
                return HandoffOutcome(name, "removed", "empty entry left by a failed hand-off")
            except OSError:
                pass
        return HandoffOutcome(name, "skipped", "no readable root-owned handoff.json")
    status = _read_root_json(lock_fd, STATUS_NAME) or {}
    if status.get("quarantined") and not retry_quarantined:
        return HandoffOutcome(name, "quarantined", f"not retried (failed {status.get('failures')} times: "
                                                   f"{status.get('error', '')}); see `slurm-bt admin doctor`")
    data = root / name / "data" if record.get("moved") else Path(str(record.get("source")))
    try:
        uid, gid = int(record["uid"]), int(record["gid"])
    except (KeyError, TypeError, ValueError):
        return HandoffOutcome(name, "skipped", "handoff.json has no valid uid/gid")
    if uid == 0 and (owner := _data_owner(data)) not in (None, 0):
        # An epilog that was told uid 0 for a user's job (Slurm 26.05 after its node was set DOWN,
        # before the hooks took the prolog's record: docs/slurm-releases.md) recorded the user's
        # checkpoints as root's. Never upload a user's files as root: quarantined for an admin.
        why = (f"recorded for uid 0 but its data belongs to uid {owner}: not uploaded as root; an admin sets "
               f"uid/gid in the entry's handoff.json to that user's and runs `slurm-bt checkpoints "
               f"resume-handoffs --retry-quarantined`, or removes the entry")
        _write_status(lock_fd, {"failures": policy.max_failures, "signature": "root-record-user-data",
                                "error": why, "quarantined": True, "user": record.get("user"),
                                "updated": time.time(), "since": status.get("since", time.time())})
        return HandoffOutcome(name, "quarantined", why)
    env = {"PATH": "/usr/bin:/bin"}
    if os.environ.get("SLURM_BT_SITE_CONFIG"):
        env["SLURM_BT_SITE_CONFIG"] = os.environ["SLURM_BT_SITE_CONFIG"]
    started = time.monotonic()
    try:
        res = run_as_uid(lambda data=data, record=record: _resume_one(data, record),  # type: ignore[misc]
                         uid=uid, gid=gid, timeout_s=timeout_s, extra_env=env, limits=child_limits())
    except ChildError as exc:
        how = "timeout" if isinstance(exc, ChildTimeout) else f"{exc.kind}:{exc.exc_type}:{exc.errno}"
        failures = int(status.get("failures", 0)) + 1 if status.get("signature") == how else 1
        quarantined = failures >= policy.max_failures
        _write_status(lock_fd, {"failures": failures, "signature": how, "error": str(exc)[:1000],
                                "quarantined": quarantined, "user": record.get("user"), "updated": time.time(),
                                "since": status.get("since", time.time()) if quarantined else None})
        if quarantined:
            return HandoffOutcome(name, "quarantined", f"failed {failures} times the same way, quarantined "
                                                       f"(kept, not retried automatically): {exc}")
        return HandoffOutcome(name, "failed", f"attempt {failures} of {policy.max_failures}: {exc}")
    took = time.monotonic() - started
    left = "" if keep else _remove_entry(root_fd, name)
    if res.get("gone"):
        return HandoffOutcome(name, "removed", f"nothing left to upload: {data} no longer exists{left}")
    return HandoffOutcome(name, "uploaded", f"{len(res.get('uploaded', []))} checkpoint(s) in {took:.1f} s{left}")


def _data_owner(data: Path) -> int | None:
    """The uid owning ``data`` (not following a symlink), or None when it is gone."""
    try:
        return os.lstat(data).st_uid
    except OSError:
        return None


def _disk_usage(root_fd: int, name: str, deadline: float) -> int:
    """Bytes under one entry (per file the larger of allocated and apparent size, hard links once);
    stops at ``deadline`` (then it is a lower bound)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    try:
        top = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return 0
    stack = [top]
    try:
        while stack and time.monotonic() < deadline:
            dfd = stack.pop()
            try:
                with os.scandir(dfd) as it:  # an iterator: a directory of millions of names is never one list
                    children = [e.name for e, _ in zip(it, range(_MEASURE_MAX_NAMES), strict=False)]
                for child in children:
                    if time.monotonic() >= deadline:
                        break
                    try:
                        st = os.stat(child, dir_fd=dfd, follow_symlinks=False)
                    except OSError:
                        continue
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                    # Apparent size too: a sparse 1 TB file costs little disk but a whole day of upload.
                    total += max(st.st_blocks * 512, st.st_size if stat.S_ISREG(st.st_mode) else 0)
                    if stat.S_ISDIR(st.st_mode) and len(stack) < 1000:
                        try:
                            stack.append(os.open(child, _DIR_FLAGS, dir_fd=dfd))
                        except OSError:
                            pass
            except OSError:
                pass
            finally:
                os.close(dfd)
    finally:
        for dfd in stack:
            os.close(dfd)
    return total


def _enforce_bounds(root_fd: int, policy: HandoffPolicy, keep: bool, outcomes: list[HandoffOutcome]) -> None:
    """Remove entries older than ``max_age_s`` and, per user, the oldest beyond ``max_bytes_per_user``."""
    if keep:
        return
    now = time.time()
    per_user: dict[int, list[tuple[float, str, int]]] = {}
    for name in sorted(os.listdir(root_fd)):
        with _locked(root_fd, name) as lock_fd:
            if lock_fd is None or lock_fd < 0:
                continue
            record = _read_root_json(lock_fd, "handoff.json")
            if record is None:
                continue  # no owner to charge; an empty one is removed by the pass above
            try:
                created = float(record.get("created") or os.fstat(lock_fd).st_mtime)
                uid = int(record["uid"])
            except (KeyError, TypeError, ValueError):
                continue
            who = f"{record.get('user') or uid}"
            if now - created > policy.max_age_s:
                left = _remove_entry(root_fd, name)
                outcomes.append(HandoffOutcome(name, "expired", f"removed: user {who}'s hand-off is "
                                               f"{(now - created) / 3600:.1f} h old, more than the "
                                               f"{policy.max_age_s / 3600:g} h allowed (max_age_s){left}"))
                continue
            size = _disk_usage(root_fd, name, time.monotonic() + _MEASURE_BUDGET_S)
            per_user.setdefault(uid, []).append((created, name, size))
    for uid, entries in sorted(per_user.items()):
        used = 0
        for _created, name, size in sorted(entries, reverse=True):  # newest first: the oldest go
            used += size
            if used <= policy.max_bytes_per_user:
                continue
            with _locked(root_fd, name) as lock_fd:
                if lock_fd is None or lock_fd < 0:
                    continue
                left = _remove_entry(root_fd, name)
            outcomes.append(HandoffOutcome(name, "over-budget", f"removed: uid {uid}'s hand-offs on this node hold "
                                           f"{used} bytes with this one, more than the {policy.max_bytes_per_user} "
                                           f"allowed (max_bytes_per_user){left}"))
            used -= size


def quarantined_handoffs(storage: dict[str, str], node: str | None) -> list[QuarantinedEntry]:
    """The quarantined entries of ``node``'s hand-off area (for ``slurm-bt admin doctor``)."""
    found: list[QuarantinedEntry] = []
    try:
        root_fd = os.open(handoff_root(storage, node), _DIR_FLAGS)
    except OSError:
        return found
    try:
        for name in sorted(os.listdir(root_fd)):
            try:
                efd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            except OSError:
                continue
            try:
                status = _read_root_json(efd, STATUS_NAME) or {}
            finally:
                os.close(efd)
            if status.get("quarantined"):
                found.append(QuarantinedEntry(name, str(status.get("user") or "?"), int(status.get("failures") or 0),
                                              str(status.get("error") or ""),
                                              float(status.get("since") or status.get("updated") or 0)))
    finally:
        os.close(root_fd)
    return found


def start_background_sweep(
    node: str | None, *, site_path: str | None = None, log_path: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a detached sweep of ``node``'s hand-off area and return at once (root, epilog).

    Detached so that Slurm releases the node now: a new session (the epilog's process group may be
    killed when the epilog ends), no inherited descriptors (slurmd reads the epilog's output until
    EOF), ``nice`` 10 (it shares the node with the next job). Output is appended to ``log_path``
    (the root-owned hook log), else discarded.

    Raises:
        OSError: the interpreter could not be started.
    """
    argv = [sys.executable, "-I", "-m", "slurm_bt.checkpoints.handoff", "--nice", "10"]
    if node:
        argv += ["--node", node]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if site_path:
        env["SLURM_BT_SITE_CONFIG"] = site_path
    return spawn_detached(argv, env, log_path)


def main(argv: list[str] | None = None) -> int:
    """``python -I -m slurm_bt.checkpoints.handoff [--node N] [--root DIR] [--nice K] [--config hooks.toml]
    [--retry-quarantined]``: one sweep.

    Prints one line per entry (for the hook log); exit 1 if any entry failed.
    """
    import argparse
    from datetime import datetime, timezone

    parser = argparse.ArgumentParser(prog="slurm-bt-resume-handoffs")
    parser.add_argument("--node", default=None)
    parser.add_argument("--root", type=Path, default=None)
    parser.add_argument("--nice", type=int, default=0)
    parser.add_argument("--config", type=Path, default=None, help="hooks.toml (its [handoff] bounds)")
    parser.add_argument("--retry-quarantined", action="store_true")
    args = parser.parse_args(argv)
    if args.nice:
        os.nice(args.nice)
    policy = None
    if args.config is not None:
        from slurm_bt.site.hook_settings import load_hook_settings

        policy = load_hook_settings(args.config).handoff

    def log(o: HandoffOutcome) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{stamp} slurm-bt resume-handoffs node={args.node or '-'} entry={o.entry} {o.status}: {o.message}",
              flush=True)

    outcomes = resume_handoffs(root=args.root, node=args.node, policy=policy, retry_quarantined=args.retry_quarantined,
                               on_outcome=log)
    return 1 if any(o.status in ("failed", "quarantined") for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
