"""Pure LRU planning: order, leases, shared blobs, orphans, protected in-progress blobs."""

from __future__ import annotations

from slurm_bt.weights.eviction import EvictionCandidate, plan_lru_eviction


def _c(mid: str, t: float, blobs: str, leased: bool = False) -> EvictionCandidate:
    return EvictionCandidate(mid, t, frozenset(blobs), leased)


def test_nothing_to_do_under_target() -> None:
    plan = plan_lru_eviction([_c("m1", 1, "ab")], {"a": 10, "b": 20}, set(), 100)
    assert plan.manifests == () and plan.blobs == () and plan.satisfied


def test_orphans_first_then_lru() -> None:
    cands = [_c("new", 3, "c"), _c("old", 1, "a"), _c("mid", 2, "b")]
    plan = plan_lru_eviction(cands, {"a": 10, "b": 20, "c": 30, "o": 5}, set(), 50)
    assert plan.blobs[0] == "o" and plan.manifests == ("old",) and plan.bytes_freed == 15 and plan.satisfied


def test_leased_entries_and_their_blobs_survive() -> None:
    cands = [_c("old", 1, "ab", leased=True), _c("new", 2, "bc")]
    plan = plan_lru_eviction(cands, {"a": 10, "b": 20, "c": 30}, set(), 0)
    assert plan.manifests == ("new",) and plan.blobs == ("c",) and not plan.satisfied


def test_shared_blob_freed_only_with_last_reference() -> None:
    cands = [_c("m1", 1, "ab"), _c("m2", 2, "bc")]
    sizes = {"a": 10, "b": 20, "c": 30}
    plan = plan_lru_eviction(cands, sizes, set(), 50)
    assert plan.manifests == ("m1",) and plan.blobs == ("a",) and plan.bytes_freed == 10
    plan = plan_lru_eviction(cands, sizes, set(), 0)
    assert plan.manifests == ("m1", "m2") and set(plan.blobs) == {"a", "b", "c"} and plan.satisfied


def test_protected_blobs_are_kept() -> None:
    cands = [_c("m1", 1, "ab")]
    plan = plan_lru_eviction(cands, {"a": 10, "b": 20, "x": 7}, {"b", "x"}, 0)
    assert plan.blobs == ("a",) and plan.bytes_freed == 10 and not plan.satisfied
