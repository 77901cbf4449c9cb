"""The root-run Slurm hooks (Prolog/Epilog): entry points only, on compute nodes as root.

* :mod:`~slurm_bt.hooks.prolog` and :mod:`~slurm_bt.hooks.epilog` are the two entry points
  (``python -I -m slurm_bt.hooks.prolog``), wrapped by ``prolog/slurm-bt-prolog`` and
  ``epilog/slurm-bt-epilog``. Their contract is in ``prolog/README.md`` and ``epilog/README.md``.
* :mod:`~slurm_bt.hooks.runner` is their exit-code policy: it loads the hook policy and the site
  once per run, maps a user's mistake onto "fail that job" (exit 0, reason in the job's notes) and
  a node fault onto a drain with a reason saying what to fix.

What they call lives below them and never imports them (docs/architecture.md, "Layers"): the
features (:mod:`slurm_bt.jobhost` for runtime dirs, leftovers and stale scratch;
:mod:`slurm_bt.checkpoints.flush`; :mod:`slurm_bt.weights.node_stage` and
:mod:`slurm_bt.weights.tier_dirs`) and the POSIX primitives in :mod:`slurm_bt.posix` (trusted hook
environment, privilege drop, fd-relative safe filesystem, mountinfo, the per-job notes).

Importing this package imports nothing heavy: hooks must start fast.
"""

from __future__ import annotations

__all__: list[str] = []
