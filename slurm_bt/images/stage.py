"""The image's part of a submission: cached already, or mirrored by the staging job (docs/containers.md).

At submit (:func:`plan_image_delivery`): when a trusted pin record says the pinned digest is complete
in a cluster tier, ``<job_dir>/image/manifest.json`` is written at once and no staging is needed for
the image; otherwise ``<job_dir>/image/plan.json`` records the team tier to mirror into, and the staging
job (the same one as the weights', slurm_bt/steps/stage_weights.py) runs :func:`stage_image`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from slurm_bt.atomic import write_file_atomic
from slurm_bt.images.entry import ImagePlan, job_image_manifest_path, write_job_image_manifest
from slurm_bt.images.pin import cached_image

if TYPE_CHECKING:
    from slurm_bt.images.mirror import ImageOutcome
    from slurm_bt.job_spec import JobSpec
    from slurm_bt.site.settings import SiteSettings

__all__ = ["ImagePlan", "image_plan_path", "plan_image_delivery", "read_image_plan", "stage_image"]


def read_image_plan(job_dir: str | Path) -> ImagePlan:
    """Read ``<job_dir>/image/plan.json`` (as the user, capped)."""
    with open(image_plan_path(job_dir), "rb") as f:
        return ImagePlan.model_validate_json(f.read(1 << 20))


def image_plan_path(job_dir: str | Path) -> Path:
    """``<job_dir>/image/plan.json``: present while the image still has to be mirrored."""
    return Path(job_dir) / "image" / "plan.json"


def plan_image_delivery(spec: JobSpec, site: SiteSettings, team: str, job_dir: Path) -> bool:
    """Write the image's manifest (cached) or its plan (to mirror); True when staging is needed."""
    pin = spec.image_pin
    if pin is None:
        return False
    from slurm_bt.site.settings import user_path

    pin_path = job_dir / "image" / "pin.json"  # for `slurm-bt status` (slurm_bt/images/status.py)
    pin_path.parent.mkdir(mode=0o700, exist_ok=True)
    write_file_atomic(pin_path, pin.model_dump_json().encode(), mode=0o600)
    base = user_path(site.storage.cluster_cache)
    hit = cached_image(pin, base, team)
    if hit is not None:
        write_job_image_manifest(job_dir, hit[0])
        return False
    path = image_plan_path(job_dir)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    plan = ImagePlan(team=team, cluster_cache=base, containers=site.containers)
    write_file_atomic(path, plan.model_dump_json(indent=2).encode(), mode=0o600)
    return True


def stage_image(job_dir: Path, *, out: IO[str] = sys.stdout) -> ImageOutcome | None:
    """The staging job's image step: mirror the pinned image unless its manifest is already there."""
    from slurm_bt.images.mirror import mirror_image
    from slurm_bt.job_spec import JobSpec
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import user_path

    if not image_plan_path(job_dir).is_file() or job_image_manifest_path(job_dir).is_file():
        return None
    plan = read_image_plan(job_dir)
    spec = JobSpec.model_validate_json((job_dir / "job.json").read_bytes())
    if spec.image_pin is None:
        return None
    store = SecretStore(Path(user_path(spec.storage["secrets"])))
    outcome = mirror_image(job_dir, spec, plan, store, out=out)
    print(outcome.line(), file=out, flush=True)
    return outcome
