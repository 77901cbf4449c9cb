"""Epilog hook points implemented by other subsystems; each is a no-op until its module exists.

Why hook points and not imports: the checkpoint uploader and the node weights cache ship on their
own schedule, and an epilog must never fail (or drain a node) because a module it would like to
call is absent, broken or slow. Each call below therefore

1. imports the module and looks the function up in a forked child (as root) with a hard time
   budget, so a hang, crash or heavy import costs at most the budget and never the epilog's own
   deadline;
2. silently does nothing if the module or function is missing;
3. logs the outcome; only an explicit, well-formed success counts as one.

Contracts for implementers. Each function receives ``environ``, a ``dict`` of the *validated*
hook variables (``SLURM_JOB_ID/UID/GID/USER``, ``SLURMD_NODENAME``, ``SLURM_SCRIPT_CONTEXT``,
``SLURM_CLUSTER_NAME``) plus ``SLURM_JOB_WORK_DIR`` and ``SLURM_JOB_ACCOUNT`` as untrusted hints,
and ``deadline_s``, the seconds it may use. When the hook wrapper passed ``--site``, the child's
environment has ``SLURM_BT_HOOK_SITE`` (:data:`~slurm_bt.hooks.config.HOOK_SITE_ENV`) naming that file,
so the hook point can read the same storage roots as the hook. It runs as root and must drop to the job
user itself for anything that touches user-named paths (:func:`~slurm_bt.hooks.privdrop.run_as_job_user`):

* ``slurm_bt.checkpoints.flush.flush_job_checkpoints(environ, deadline_s)``: upload what the job
  left in its checkpoint directory. It returns an object whose ``status`` is ``"done"`` only if every
  checkpoint is confirmed in the store; any other status, a bool other than ``True``, an exception
  or a timeout means "not confirmed", and whatever is still in ``<scratch>/<job>/mnt/checkpoints``
  (if the flush did not hand it off itself) is kept there.
* ``slurm_bt.weights.node_cache.epilog_release_leases(environ, deadline_s) -> None``: drop the
  job's leases on node-cache entries (``NodeCache.release(job_id)``).
* ``slurm_bt.weights.node_cache.epilog_enforce_lru(environ, deadline_s) -> None``: evict
  lease-free entries over the node cache's limit.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from slurm_bt.hooks.config import HOOK_SITE_ENV
from slurm_bt.hooks.env import SlurmHookEnv
from slurm_bt.hooks.privdrop import ChildError, run_in_child
from slurm_bt.hooks.runner import HookLog

__all__ = [
    "CHECKPOINT_FLUSH",
    "NODE_CACHE_LRU",
    "NODE_CACHE_RELEASE",
    "call_hook_point",
    "enforce_node_cache_lru",
    "flush_checkpoints",
    "release_node_cache_leases",
]

CHECKPOINT_FLUSH = ("slurm_bt.checkpoints.flush", "flush_job_checkpoints")
NODE_CACHE_RELEASE = ("slurm_bt.weights.node_cache", "epilog_release_leases")
NODE_CACHE_LRU = ("slurm_bt.weights.node_cache", "epilog_enforce_lru")


def _lookup(module: str, name: str) -> Callable[..., Any] | None:
    """The hook point function, or None if its module or attribute does not exist (yet).

    Raises whatever importing the module raises otherwise (a broken module is an error, logged).
    """
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            return None
        raise
    fn = getattr(mod, name, None)
    return fn if callable(fn) else None


def call_hook_point(target: tuple[str, str], env: SlurmHookEnv, budget_s: float, log: HookLog,
                    site_path: str | None = None) -> tuple[bool, Any]:
    """Call ``module.function(environ, deadline_s)`` in a bounded child.

    ``site_path`` (the hook's ``--site``) reaches the child as ``SLURM_BT_HOOK_SITE``.

    The module is imported in the child too, so a slow, crashing or heavy import (boto3...) costs
    at most the budget and never pollutes the epilog process.

    Returns:
        ``(called, result)``: ``called`` is False when the hook point is absent or got no time;
        ``result`` is ``{"status": ..., "message": ...}`` for results with a ``status`` attribute,
        else the plain JSON value (None on failure, which is logged).
    """
    module, name = target
    if budget_s <= 1:
        log.warning(f"hook point {module}.{name}: skipped, no time left")
        return False, None

    def call() -> Any:
        fn = _lookup(module, name)
        if fn is None:
            return {"absent": True}
        result = fn(env.to_environ(), budget_s - 1)
        if result is None or isinstance(result, (bool, int, float, str)):
            return {"value": result}
        return {"status": str(getattr(result, "status", "")), "message": str(getattr(result, "message", ""))[:500]}

    try:
        result = run_in_child(call, timeout_s=budget_s,
                              extra_env={HOOK_SITE_ENV: site_path} if site_path else None)
    except ChildError as exc:
        log.error(f"hook point {module}.{name}: {exc.kind}: {exc.exc_type or ''} {exc}".rstrip())
        return True, None
    if not isinstance(result, dict) or result.get("absent"):
        return False, None
    if result.get("status"):
        log.info(f"hook point {module}.{name}: {result['status']}: {result.get('message', '')}".rstrip(": "))
        return True, result
    return True, result.get("value")


def flush_checkpoints(env: SlurmHookEnv, budget_s: float, log: HookLog) -> str:
    """The flush's status: ``"done"`` only if it confirmed every checkpoint of the job uploaded.

    ``"handed-off"`` means the rest was moved to the hand-off area (to be finished by a sweep);
    anything else (``"nothing"``, ``"error"``, ``"absent"``...) is "not confirmed".
    """
    called, result = call_hook_point(CHECKPOINT_FLUSH, env, budget_s, log)
    if isinstance(result, dict):
        # "nothing" is not a confirmation: a flush that could not find the job's rank reports it
        # too. Without "done", whatever is still in the checkpoint directory is kept.
        status = result.get("status")
        return status if isinstance(status, str) else "error"
    if not called:
        return "absent"
    return "done" if result is True else "error"


def release_node_cache_leases(env: SlurmHookEnv, budget_s: float, log: HookLog,
                              site_path: str | None = None) -> None:
    """Release the job's node-cache leases (no-op until ``slurm_bt.weights.node_cache`` provides it)."""
    call_hook_point(NODE_CACHE_RELEASE, env, budget_s, log, site_path)


def enforce_node_cache_lru(env: SlurmHookEnv, budget_s: float, log: HookLog, site_path: str | None = None) -> None:
    """Run node-cache LRU eviction (no-op until ``slurm_bt.weights.node_cache`` provides it)."""
    call_hook_point(NODE_CACHE_LRU, env, budget_s, log, site_path)
