"""Checkpoint retention: which of a job's checkpoints in the store its policy no longer keeps.

A job's policy (docs/checkpoints.md §Retention) is *keep the newest N complete checkpoints* and/or
*keep the job's checkpoints under a size budget*; the site file sets the default
(``[checkpoints] keep_last``, ``max_bytes``), a job overrides it with ``BT_CHECKPOINT_KEEP_LAST`` /
``BT_CHECKPOINT_MAX_BYTES`` in its ``environment_variables`` (resolved into the job spec at submit).

The one promise: the **newest complete checkpoint is never expired**, whatever the policy says. That
is the checkpoint a restart of the job (a requeue after a time limit, a preemption or a node
failure) loads in its prepare step (:mod:`.resume`), and nothing else of the job deletes while a
restart is queued: retention runs only in the job's own uploaders, never in the epilog or a
hand-off. Checkpoints newer than it (still being uploaded by a slower rank, so not complete yet)
are kept too. Every rank computes the same answer from the same merged index, so each drops its own
copies (:meth:`~slurm_bt.checkpoints.upload.RankUploader.apply_retention`) without coordinating.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_bt.checkpoints.index import CheckpointView, JobIndex, natural_key
from slurm_bt.units import format_bytes

__all__ = ["RetentionPolicy", "select_expired"]


@dataclass(frozen=True)
class RetentionPolicy:
    """``keep_last`` complete checkpoints (0: no count limit) within ``max_bytes`` (0: no budget)."""

    keep_last: int = 0
    max_bytes: int = 0

    @property
    def active(self) -> bool:
        """Whether anything can ever be expired."""
        return self.keep_last > 0 or self.max_bytes > 0

    def describe(self) -> str:
        """One line for logs: ``keep last 3, budget 10.0 GiB``."""
        bits = []
        if self.keep_last > 0:
            bits.append(f"keep last {self.keep_last}")
        if self.max_bytes > 0:
            bits.append(f"budget {format_bytes(self.max_bytes)}")
        return ", ".join(bits) or "keep all"


def _order(view: CheckpointView) -> tuple[object, ...]:
    return (view.created, natural_key(view.name))


def select_expired(index: JobIndex, policy: RetentionPolicy) -> list[str]:
    """Names of checkpoints ``policy`` expires, oldest first (never the newest complete one, nor newer ones).

    Candidates are complete checkpoints older than the newest complete one, incomplete ones that can
    never complete (a writing rank's last pass lacks them) and names some rank already expired; a
    checkpoint still ``waiting`` for a rank is never a candidate (it may be about to complete).
    ``keep_last`` keeps the newest N complete ones; the size budget then expires the oldest
    remaining candidates until the job's total fits (the protected ones alone may exceed it).
    """
    views = sorted(index.checkpoints, key=_order)
    complete = [v for v in views if v.complete and v.name not in index.expired]
    if not complete or not policy.active:
        return sorted((v.name for v in views if v.name in index.expired), key=natural_key)
    newest = complete[-1]
    cut = _order(newest)
    expire: list[str] = [v.name for v in views if v.name in index.expired]
    kept_complete = complete[-policy.keep_last:] if policy.keep_last > 0 else complete
    kept = {v.name for v in kept_complete}
    for v in views:
        if v.name in expire or _order(v) >= cut:
            continue
        if v.complete and v.name not in kept:
            expire.append(v.name)
        elif not v.complete and v.missing and not v.waiting:
            expire.append(v.name)
    if policy.max_bytes > 0:
        total = sum(v.size for v in views if v.name not in expire)
        for v in views:  # oldest first
            if total <= policy.max_bytes:
                break
            if v.name in expire or _order(v) >= cut or v.waiting:
                continue
            expire.append(v.name)
            total -= v.size
    order = {v.name: i for i, v in enumerate(views)}
    return sorted(set(expire), key=lambda n: order.get(n, -1))
