"""Root-run Slurm hooks (Prolog/Epilog) for slurm-bt: code that runs on compute nodes as root.

Everything in this package assumes a hostile local user (threats-and-faults.md R1-R3):

* :mod:`~slurm_bt.posix.hook_env` trusts only the Slurm variables that slurmd itself sets
  (``SLURM_JOB_ID/UID/GID/USER``, ``SLURMD_NODENAME``, ``SLURM_SCRIPT_CONTEXT``,
  ``SLURM_CLUSTER_NAME``); the comment, the work dir and ``job.json`` are untrusted;
* :mod:`~slurm_bt.posix.privdrop` runs work on user-named paths in a forked child that has become
  the job user (groups, gid, uid; verified; ``no_new_privs``; clean env; no inherited fds);
* :mod:`~slurm_bt.posix.safefs` does fd-relative, symlink-refusing creation and deletion in
  root-owned trees;
* :mod:`~slurm_bt.hooks.runner` maps every outcome onto Slurm's exit-code semantics: a user's
  mistake fails that job (exit 0, reason in a job-keyed status file), a node fault exits non-zero
  with a reason saying what to fix;
* :mod:`~slurm_bt.hooks.prolog` and :mod:`~slurm_bt.hooks.epilog` are the two entry points
  (``python -I -m slurm_bt.hooks.prolog``), wrapped by ``prolog/slurm-bt-prolog`` and
  ``epilog/slurm-bt-epilog``. Their contract is in ``prolog/README.md`` and ``epilog/README.md``.

Importing this package imports nothing heavy: hooks must start fast.
"""

from __future__ import annotations

__all__: list[str] = []
