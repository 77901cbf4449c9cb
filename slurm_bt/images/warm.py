"""``slurm-bt cache warm docker://<image>``: pin and mirror an image into a cluster tier now.

For admins (``--shared``, as root: the shared tier every team's public-image jobs find first, so their
jobs need no staging at all) and for users ahead of a batch of jobs (their team tier). Public images
only: a private image is mirrored by the staging job of a job that names its DockerAuth.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from slurm_bt.errors import Problem, StorageError, UserError
from slurm_bt.images.entry import image_pin_key
from slurm_bt.images.mirror import mirror_into
from slurm_bt.images.pin import cached_image, is_entry_of, pin_reference

if TYPE_CHECKING:
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import SiteSettings
    from slurm_bt.weights.manifest import Manifest

__all__ = ["warm_image"]


def warm_image(image: str, *, team: str, shared: bool, site: SiteSettings, store: SecretStore,
               out: IO[str] = sys.stdout) -> str:
    """Mirror ``image`` (pinned for the nodes' platform now) into the team or shared tier; the log line."""
    from slurm_bt.site.settings import user_path
    from slurm_bt.weights.plan import cluster_tiers, lookup_pin
    from slurm_bt.weights.stage_job import ensure_team_root

    where = "slurm-bt cache warm"
    pin = pin_reference(image, None, site, store, source=where)
    base = user_path(site.storage.cluster_cache)
    team_tier, shared_tier = cluster_tiers(base, team)
    if shared:
        if os.geteuid() != 0:
            raise UserError(where, [Problem("--shared", "only root fills the shared tier (it is trusted by every "
                                                        "team's jobs)")])
        if shared_tier.refused is not None:
            raise StorageError(str(shared_tier.root), shared_tier.refused)
        target = shared_tier
        target.dir_mode = 0o755
        Path(base).mkdir(parents=True, exist_ok=True)

        def lookup() -> tuple[Manifest, str] | None:
            m = lookup_pin(shared_tier, image_pin_key(pin.digest))
            return (m, "shared") if m is not None and is_entry_of(m, pin) else None
    else:
        if team_tier.refused is not None:
            raise StorageError(str(team_tier.root), team_tier.refused)
        ensure_team_root(Path(base), team_tier)
        target = team_tier

        def lookup() -> tuple[Manifest, str] | None:
            return cached_image(pin, base, team)
    target.layout.ensure(dir_mode=target.dir_mode)
    with contextlib.suppress(OSError):
        target.gc_temp()
    outcome = mirror_into(target, pin, None, site.containers, store, lookup=lookup, out=out)
    return (f"{outcome.line()} as {pin.resolved} -> "
            f"{target.layout.blob(outcome.manifest.files[0].sha256)}")
