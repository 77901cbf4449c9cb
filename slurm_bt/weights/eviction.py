"""LRU eviction as a pure plan: decide on data, then let the cache execute.

Planning touches no filesystem, so ``--dry-run`` can print exactly what would go and tests can
check the policy without disks. The rules:

* never evict an entry with a live lease, nor any blob referenced by a leased or in-progress entry
  (``protected_blobs``), nor a blob still referenced by an entry that stays;
* orphan blobs (referenced by no entry) go first: they are debris of failed stages;
* then lease-free entries, least recently used first, until usage is at or below the target;
* a blob is freed only when the last entry referencing it is evicted, so ``bytes_freed`` is what
  the disk really gets back (snapshots are hard links to the same inodes).

The executor removes each entry's COMPLETE marker and snapshot before any blob (readers never
trust an entry whose blobs are going), and re-checks leases under the entry lock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

__all__ = ["EvictionCandidate", "EvictionPlan", "EvictionResult", "plan_lru_eviction"]


@dataclass(frozen=True)
class EvictionCandidate:
    """A complete cache entry as the planner sees it.

    Attributes:
        manifest_id: the entry.
        last_used: epoch seconds of the last lease or release.
        blobs: sha256 of every blob it references.
        leased: a job holds a lease on it (never evicted).
    """

    manifest_id: str
    last_used: float
    blobs: frozenset[str]
    leased: bool


@dataclass(frozen=True)
class EvictionPlan:
    """What an eviction would remove, in order.

    Attributes:
        target_bytes: usage to get down to.
        usage_bytes: blob bytes before eviction.
        manifests: entries to remove, least recently used first.
        blobs: blobs to remove afterwards (orphans included).
        bytes_freed: bytes the removed blobs hold.
    """

    target_bytes: int
    usage_bytes: int
    manifests: tuple[str, ...]
    blobs: tuple[str, ...]
    bytes_freed: int

    @property
    def satisfied(self) -> bool:
        """Executing the plan brings usage to ``target_bytes`` or below."""
        return self.usage_bytes - self.bytes_freed <= self.target_bytes

    def describe(self) -> list[str]:
        """One line per action, for ``--dry-run``."""
        lines = [f"evict entry {m}" for m in self.manifests]
        lines += [f"remove blob {b}" for b in self.blobs]
        lines.append(f"frees {self.bytes_freed} of {self.usage_bytes} bytes "
                     f"(target {self.target_bytes}; {'enough' if self.satisfied else 'NOT enough'})")
        return lines


@dataclass(frozen=True)
class EvictionResult:
    """What an executed plan actually removed.

    Attributes:
        manifests: entries removed.
        skipped: planned entries kept because a lease appeared or their lock was busy.
        blobs: blobs removed.
        bytes_freed: their bytes.
    """

    manifests: tuple[str, ...]
    skipped: tuple[str, ...]
    blobs: tuple[str, ...]
    bytes_freed: int


def plan_lru_eviction(
    candidates: Iterable[EvictionCandidate],
    blob_sizes: Mapping[str, int],
    protected_blobs: AbstractSet[str],
    target_bytes: int,
) -> EvictionPlan:
    """Plan LRU eviction down to ``target_bytes`` of blob usage.

    Args:
        candidates: every complete entry (leased ones included: their blobs count as referenced).
        blob_sizes: every blob present, sha256 → bytes.
        protected_blobs: blobs of in-progress or leased entries that have no COMPLETE marker yet.
        target_bytes: desired usage after eviction.

    Returns:
        The plan; check :attr:`EvictionPlan.satisfied` before executing it.
    """
    entries: Sequence[EvictionCandidate] = sorted(candidates, key=lambda c: (c.last_used, c.manifest_id))
    usage = sum(blob_sizes.values())
    refs: dict[str, int] = {}
    for c in entries:
        for b in c.blobs:
            refs[b] = refs.get(b, 0) + 1
    freed_blobs: list[str] = []
    freed = 0
    if usage <= target_bytes:
        return EvictionPlan(target_bytes, usage, (), (), 0)
    for b in sorted(blob_sizes):
        if refs.get(b, 0) == 0 and b not in protected_blobs:
            freed_blobs.append(b)
            freed += blob_sizes[b]
    evicted: list[str] = []
    for c in entries:
        if usage - freed <= target_bytes:
            break
        if c.leased:
            continue
        evicted.append(c.manifest_id)
        for b in sorted(c.blobs):
            refs[b] -= 1
            if refs[b] == 0 and b not in protected_blobs and b in blob_sizes:
                freed_blobs.append(b)
                freed += blob_sizes[b]
    return EvictionPlan(target_bytes, usage, tuple(evicted), tuple(freed_blobs), freed)
