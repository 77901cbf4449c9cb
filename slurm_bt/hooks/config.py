"""Temporary alias of :mod:`slurm_bt.site.hook_settings` for two call sites being migrated concurrently.

Deleted once ``weights/plan.py`` and ``weights/node_stage.py`` import the new path (issue #9 layering).
"""

from __future__ import annotations

from slurm_bt.site.hook_settings import HOOK_SITE_ENV, load_hook_settings, load_trusted_site

__all__ = ["HOOK_SITE_ENV", "load_hook_settings", "load_trusted_site"]
