"""The image's part of a submission: cached already, or mirrored by the staging job (docs/containers.md).

At submit (:func:`plan_image_delivery`): when a trusted pin record says the pinned digest is complete
in a cluster tier, ``<job_dir>/image/manifest.json`` is written at once and no staging is needed for
the image; otherwise ``<job_dir>/image/plan.json`` records the team tier to mirror into, and the staging
job (the same one as the weights', slurm_bt/steps/stage_weights.py) runs :func:`stage_image`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from slurm_bt.atomic import write_file_atomic
from slurm_bt.images.entry import ImagePlan, job_image_manifest_path, write_job_image_manifest
from slurm_bt.images.pin import cached_image
from slurm_bt.posix.user_files import read_user_file

if TYPE_CHECKING:
    from slurm_bt.images.mirror import ImageOutcome
    from slurm_bt.job_spec import JobSpec
    from slurm_bt.site.settings import ContainerSettings, SiteSettings

__all__ = ["ImagePlan", "image_plan_path", "plan_image_delivery", "read_image_plan", "stage_image",
           "staging_containers"]

_PLAN_MAX_BYTES = 1 << 20  # a team, a path and [containers]: a few KiB
# The [containers] limits that bound what one staging job writes to the team tier (and every job to node
# scratch): each is the smaller of the plan's and the admin's (:func:`staging_containers`).
_STORAGE_LIMITS = ("max_image_bytes", "max_unpacked_bytes", "max_unpacked_ratio")


def read_image_plan(job_dir: str | Path) -> ImagePlan:
    """Read ``<job_dir>/image/plan.json`` (as the user) as a file the job controls: no FIFO, device or
    user symlink, at most 1 MiB (:mod:`slurm_bt.posix.user_files`).

    Raises:
        OSError: it cannot be read or is refused (:class:`~slurm_bt.posix.user_files.UnsafeFile`).
        ValueError: it is not a valid image plan.
    """
    return ImagePlan.model_validate_json(read_user_file(image_plan_path(job_dir), _PLAN_MAX_BYTES))


def staging_containers(plan: ImagePlan, admin: SiteSettings) -> ContainerSettings:
    """The ``[containers]`` settings the staging job mirrors with: the plan's, each limit that protects
    shared storage no higher than the admin's site file says (docs/site-config.md §Who sets the limits).

    Why: the plan is the user's file, written from whatever site file ``$SLURM_BT_SITE_CONFIG`` named at
    submit (and editable until the staging job runs), while the image lands in the team's cluster tier
    on shared storage. A user may ask for a lower cap, never a higher one.
    """
    capped = {name: min(getattr(plan.containers, name), getattr(admin.containers, name))
              for name in _STORAGE_LIMITS}
    return plan.containers.model_copy(update=capped)


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


def stage_image(job_dir: Path, *, out: IO[str] = sys.stdout, spec: JobSpec | None = None,
                admin_site: SiteSettings | None = None) -> ImageOutcome | None:
    """The staging job's image step: mirror the pinned image unless its manifest is already there.

    ``spec``: the job's ``job.json`` when the caller has read it already (else read here, bounded);
    ``admin_site``: the admin's site settings (else :func:`~slurm_bt.site.hook_settings.load_trusted_site`:
    the root-owned ``/etc/slurm-bt/site.toml``, never ``$SLURM_BT_SITE_CONFIG``).
    """
    from slurm_bt.images.mirror import mirror_image
    from slurm_bt.job_spec import read_job_spec
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.hook_settings import load_trusted_site
    from slurm_bt.site.settings import user_path

    # lexists, not is_file: a plan.json swapped for a FIFO or a link to a device is refused by the
    # reader with its reason, instead of silently skipping the image (the job would then fail later).
    if not os.path.lexists(image_plan_path(job_dir)) or job_image_manifest_path(job_dir).is_file():
        return None
    plan = read_image_plan(job_dir)
    spec = spec or read_job_spec(job_dir / "job.json")
    if spec.image_pin is None:
        return None
    admin = admin_site if admin_site is not None else load_trusted_site()
    plan = plan.model_copy(update={"containers": staging_containers(plan, admin)})
    store = SecretStore(Path(user_path(spec.storage["secrets"])))
    outcome = mirror_image(job_dir, spec, plan, store, out=out)
    print(outcome.line(), file=out, flush=True)
    return outcome
