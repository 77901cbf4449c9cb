"""The background checkpoint uploader: one per node, as the job user, alongside the start commands.

The batch script starts it as an overlapping ``srun`` step on every node after step 1 (prepare) and
before step 2 (the start commands); when step 2 has ended on every node (or failed) the script
creates ``<job_dir>/checkpoints.finish.<job_id>`` on the shared workspace and waits for it. Each node
then makes its final pass (every checkpoint is complete now: the same pass the epilog's
:func:`~slurm_bt.checkpoints.flush.flush_job_checkpoints` makes) and exits.

Why a separate step and not a background process of the entry script: with pyxis the entry script
runs inside the container, which has neither slurm-bt nor the host paths; an ``srun --overlap``
step runs on the host for every container runtime.

Usage: ``python -I -m slurm_bt.steps.checkpoint_agent JOB_JSON``. Tunables (environment, e.g. via the
config's ``environment_variables``): ``BT_CHECKPOINT_POLL_S`` (default 5), ``BT_CHECKPOINT_QUIET_S``
(default 120, see :mod:`slurm_bt.checkpoints.scan`), ``BT_CHECKPOINT_FINAL_FLUSH_S`` (default 86400).
Retention (``spec.checkpointing.keep_last``/``max_bytes``, :mod:`slurm_bt.checkpoints.retention`) runs
here after each upload and after the final pass, never in the epilog: the checkpoint a queued
restart will load is never deleted. Each pass also reports this rank's state (``empty_at``,
``final``) so rank-0-only checkpoints of a multi-node job are complete (:mod:`slurm_bt.checkpoints.index`).
Exit status: 0 when everything was uploaded, 1 otherwise (the job itself is not failed by it).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from slurm_bt.checkpoints.flush import build_uploader, prolog_team, write_state
from slurm_bt.checkpoints.locations import host_checkpoint_dir, is_shared_fs
from slurm_bt.checkpoints.retention import RetentionPolicy
from slurm_bt.errors import BtError, DeadlineExceeded
from slurm_bt.job_spec import JobSpec, read_job_spec

__all__ = ["finish_path", "main"]


def finish_path(spec: JobSpec, job_id: str) -> Path:
    """The file whose appearance tells every node's uploader that the start commands have ended."""
    return Path(spec.context.job_dir) / f"checkpoints.finish.{job_id}"


def _log(message: str) -> None:
    print(f"slurm-bt checkpoints [{os.environ.get('SLURMD_NODENAME', '?')}]: {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the uploader until the finish file appears, then flush."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m slurm_bt.steps.checkpoint_agent JOB_JSON", file=sys.stderr)
        return 2
    stop = {"term": False}

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop["term"] = True  # job cancelled or out of time: the epilog's flush takes over

    signal.signal(signal.SIGTERM, on_term)
    env = os.environ
    try:
        spec = read_job_spec(Path(args[0]))
        job_id, node = env["SLURM_JOB_ID"], env.get("SLURMD_NODENAME")
        rank = int(env.get("SLURM_NODEID", "0"))
        host = host_checkpoint_dir(spec, job_id, node)
        if host is None:
            return 0
        ckpt_dir = Path(host)
        ckpt_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if rank != 0 and spec.nodes > 1 and is_shared_fs(ckpt_dir):
            _log(f"{ckpt_dir} is on a shared filesystem: rank 0 uploads it for every node")
            return 0
        write_state(ckpt_dir, spec_path=args[0], job_id=job_id, rank=rank, node=node)
        uploader = build_uploader(spec, job_id=job_id, rank=rank, checkpoint_dir=ckpt_dir,
                                  account=prolog_team(node, job_id) or env.get("SLURM_JOB_ACCOUNT"))
    except (BtError, OSError, ValueError, KeyError) as exc:
        _log(f"cannot start: {exc}")
        return 1
    policy = RetentionPolicy(keep_last=spec.checkpointing.keep_last, max_bytes=spec.checkpointing.max_bytes)
    try:
        # A (re)started run: this rank reports again (clears the earlier run's "final"), so a
        # checkpoint only rank 0 writes can become complete while the job runs (slurm_bt/checkpoints/index.py).
        uploader.report(start=True)
    except (BtError, OSError) as exc:
        _log(f"cannot report to the store yet (will retry): {exc}")
    poll_s = float(env.get("BT_CHECKPOINT_POLL_S", "5"))
    finish = finish_path(spec, job_id)
    _log(f"watching {ckpt_dir} -> {uploader.store.uri.display()} (rank {rank})")
    failures = 0
    try:
        while not stop["term"] and not finish.exists():
            try:
                if uploader.run_once(final=False):
                    uploader.apply_retention(policy)
                uploader.report()
                failures = 0
            except (BtError, OSError) as exc:
                failures += 1
                _log(f"upload failed (attempt {failures}; will retry): {exc}")
            end = time.monotonic() + min(poll_s * (2 ** min(failures, 5)), 300)
            while time.monotonic() < end and not stop["term"] and not finish.exists():
                time.sleep(min(0.5, poll_s))
    except BaseException:
        uploader.store.close()
        raise
    if stop["term"]:
        uploader.store.close()
        _log("stopped (SIGTERM); the epilog flushes what is left")
        return 1
    # The final flush: the same pass the epilog's flush_job_checkpoints makes, with every checkpoint
    # now complete ("final": the start commands have ended on every node).
    budget = float(env.get("BT_CHECKPOINT_FINAL_FLUSH_S", "86400"))
    try:
        done = uploader.run_once(final=True, deadline=time.monotonic() + budget)
    except (BtError, OSError, DeadlineExceeded) as exc:
        uploader.store.close()
        _log(f"final flush incomplete ({type(exc).__name__}: {exc}); the epilog retries")
        return 1
    try:
        uploader.report(final=True)  # the epilog's flush records it too, if this fails
        uploader.apply_retention(policy)
    except (BtError, OSError) as exc:
        _log(f"after the final flush: {exc}")
    finally:
        uploader.store.close()
    _log(f"final flush: done ({len(done)} more checkpoint(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
