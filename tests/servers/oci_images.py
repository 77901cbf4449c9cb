"""Test images without Docker: the host-files base layout plus one layer per test (devcluster/oci_image.py).

The base layout (python3 + stdlib, bash, coreutils, their ld.so closure, what ch-run binds over) is
built once per host and cached under /var/tmp/slurm-bt-oci; each test image copies it and adds a layer
(files, whiteouts, an optional big random file), so a test image costs well under a second.
"""

from __future__ import annotations

import sys
from pathlib import Path

_DEVCLUSTER = Path(__file__).resolve().parents[2] / "devcluster"
if str(_DEVCLUSTER) not in sys.path:  # devcluster/ is scripts, not a package: import the builder by path
    sys.path.insert(0, str(_DEVCLUSTER))

import oci_image  # noqa: E402

__all__ = ["base_layout", "derive", "oci_image"]

base_layout = oci_image.base_layout
derive = oci_image.derive
