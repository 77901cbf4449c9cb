"""Byte sizes as people read them: the one formatter every log line, table and message uses.

Binary units (KiB, MiB, GiB, TiB), one decimal, whole bytes below 1 KiB: ``3 B``, ``1.5 KiB``,
``11.7 MiB``. Base layer: imports nothing of slurm_bt, so the light status path can use it.
"""

from __future__ import annotations

__all__ = ["format_bytes"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None) -> str:
    """``1.5 GiB``-style size; ``"-"`` for ``None`` (a size Slurm or a status file did not give)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS[:-1]:
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} {_UNITS[-1]}"
