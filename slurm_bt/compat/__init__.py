"""truss_train compatibility: the models, the import shim and the config loader.

Other slurm-bt code imports from here::

    from slurm_bt.compat import load_training_project, memory_to_mib

The ``truss_train``-named classes live in :mod:`slurm_bt.compat.definitions` and
:mod:`slurm_bt.compat.truss_config`; configs reach them as ``truss_train`` and
``truss.base.truss_config`` through :func:`truss_modules`.
"""

from __future__ import annotations

from slurm_bt.compat.loader import load_training_project
from slurm_bt.compat.shim import SHIMMED_MODULES, truss_modules
from slurm_bt.compat.stricter import memory_to_bytes, memory_to_mib, mount_location_problem

__all__ = [
    "SHIMMED_MODULES",
    "load_training_project",
    "memory_to_bytes",
    "memory_to_mib",
    "mount_location_problem",
    "truss_modules",
]
