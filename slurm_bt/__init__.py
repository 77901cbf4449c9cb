"""slurm-bt: Baseten-Training-style ``config.py`` jobs on Slurm.

Importing this package is cheap: no storage client, SSH library or model is imported until used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["push"]


def push(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Submit a training project; see :func:`slurm_bt.api.push`."""
    from slurm_bt.api import push as _push

    return _push(*args, **kwargs)
