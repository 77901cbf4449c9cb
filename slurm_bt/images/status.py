"""The job's pinned image for ``slurm-bt status`` (read as the user, cheap for jobs without an image)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurm_bt.trusted_files import read_trusted_file

if TYPE_CHECKING:
    from slurm_bt.records import SubmissionRecord

__all__ = ["image_status"]


def image_status(record: SubmissionRecord | None) -> dict[str, Any] | None:
    """``{"reference", "resolved", "digest", "private", "in_cluster_cache"}`` of the job, or None.

    None for jobs without a pinned image (``<job_dir>/image`` absent: one lstat) or whose image
    directory is not the caller's own (a record edited to point elsewhere reads nothing).
    """
    if record is None:
        return None
    folder = Path(record.job_dir) / "image"
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return None
    raw = read_trusted_file(folder / "pin.json", max_bytes=64 << 10, owner_ok=lambda st: st.st_uid == os.getuid())
    if raw is None:
        return None
    # Imported here, not at the top: they load pydantic and ctypes, and `status` of jobs without an
    # image must stay as light as the sacct call it wraps (tests/integration/test_lifecycle.py).
    from slurm_bt.images.entry import job_image_manifest_path
    from slurm_bt.job_spec import ImagePin

    try:
        pin = ImagePin.model_validate_json(raw)
    except ValueError:
        return None
    out: dict[str, Any] = pin.model_dump()
    out["in_cluster_cache"] = False
    with contextlib.suppress(OSError):
        out["in_cluster_cache"] = os.path.isfile(job_image_manifest_path(record.job_dir))
    return out
