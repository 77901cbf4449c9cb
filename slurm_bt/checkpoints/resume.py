"""Automatic resume: a restarted job gets its own newest complete checkpoint in ``BT_LOAD_CHECKPOINT_DIR``.

Slurm requeues a job (same job id) after a time limit, a preemption or a node failure; the batch
script runs again with ``SLURM_RESTART_COUNT`` > 0 (exported as ``BT_RETRY_COUNT``). The checkpoints
the earlier runs uploaded are in the store under the same ``_teams/<team>/<project>/<job id>``, so
before the start commands run, the prepare step (:mod:`slurm_bt.steps.prepare`, every node, as the user) resolves the
job's newest *complete* checkpoint (:mod:`.index`) **at that moment** and downloads it, sha256-verified,
into ``BT_LOAD_CHECKPOINT_DIR`` in upstream's layout ``rank-<n>/<checkpoint>/<files>``. Training code
resumes by reading that directory: the same code that works for ``LoadCheckpointConfig`` on Baseten.

When (``spec.load_checkpoint.resume``, decided at submit in :func:`slurm_bt.job_spec.build_job_spec`):
checkpointing is on and the config has no ``LoadCheckpointConfig``, or only upstream's default
"latest" reference. Explicit references (``from_named_checkpoint``, ``from_latest_checkpoint(job_id=...)``
or ``(project_name=...)``) or ``enabled=False`` ask for something else: those runs load what the
config pinned, every run. A first run, or a restart before any checkpoint was complete, starts
without one (the directory is empty; with the default reference, the checkpoint pinned at submit).

Retention (:mod:`.retention`) never deletes the newest complete checkpoint, and runs only in the
job's own uploaders (which are not running while a restart is queued), so what is resolved here
is still there when it is downloaded.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from slurm_bt.checkpoints.download import download_manifests
from slurm_bt.checkpoints.resolve import locate_index, open_user_store, pin
from slurm_bt.checkpoints.store import team_group
from slurm_bt.job_spec import JobSpec

__all__ = ["place_resume_checkpoint", "restart_count", "resume_or_load"]


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times Slurm restarted this job (``SLURM_RESTART_COUNT``; 0 on a first run or when unset)."""
    raw = environ.get("SLURM_RESTART_COUNT", "").strip()
    return int(raw) if raw.isdigit() else 0


def place_resume_checkpoint(spec: JobSpec, job_id: str, dest_root: Path, *, account: str | None) -> str | None:
    """Download the job's own newest complete checkpoint into ``dest_root``; its name, or None when there is none.

    ``account``: the team group the prolog resolved, else the Slurm account, as the job's uploader
    uses it (:func:`~slurm_bt.checkpoints.store.team_group`): the earlier runs uploaded into that
    team's namespace; runs from before team namespaces, at the legacy location, are found too.

    Raises:
        UntrustedLocation: the job's store directory is not the user's (a squat).
        StorageError: the store cannot be read, or a download fails verification.
    """
    team, _gid = team_group(account)
    store = open_user_store(spec.storage)
    try:
        found = locate_index(store, spec.project_id, job_id, teams=(team,))
    finally:
        store.close()
    view = found.index.latest() if found is not None else None
    if found is None or view is None:
        return None
    download_manifests(spec.storage, [pin(found.index, view, team=found.team)], dest_root)
    return view.name


def _say(node: str, message: str) -> None:
    print(f"slurm-bt prepare on {node}: {message}", file=sys.stderr, flush=True)


def resume_or_load(spec: JobSpec, environ: Mapping[str, str], dest_root: Path, *, account: str | None = None) -> None:
    """The prepare step's loading: the own newest checkpoint on a restart (when it applies), else the pinned ones.

    ``account``: the job's team group from the prolog; without it, ``SLURM_JOB_ACCOUNT``.
    """
    from slurm_bt.checkpoints.download import download_pinned

    job_id = environ["SLURM_JOB_ID"]
    node = environ.get("SLURMD_NODENAME", "?")
    runs = restart_count(environ)
    if spec.load_checkpoint.resume and runs > 0:
        name = place_resume_checkpoint(spec, job_id, dest_root, account=account or environ.get("SLURM_JOB_ACCOUNT"))
        if name is not None:
            _say(node, f"restart {runs}: resuming from checkpoint {name!r} of this job "
                       f"(in $BT_LOAD_CHECKPOINT_DIR/rank-<n>/{name})")
            return
        _say(node, f"restart {runs}: no complete checkpoint of this job yet; "
                   + ("loading the checkpoint pinned at submit" if spec.load_checkpoint.checkpoints
                      else "starting without one"))
    if spec.load_checkpoint.enabled:
        download_pinned(spec, dest_root)
