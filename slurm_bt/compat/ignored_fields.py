"""truss fields a Slurm cluster accepts but cannot honour: one warning each.

Why: a config written for Baseten must load unchanged, so these fields stay valid; but a value the
user wrote that changes nothing must never be dropped without a word (docs/compatibility.md lists
them). Each warning names the field by its path in the config and says why it has no effect here.
Fields whose drop would change what the job does are refused instead (registry OIDC in
:mod:`slurm_bt.job_spec`; upstream itself refuses OIDC weights credentials for training jobs).

Pure: reads the project model only; the site's container runtime comes in as a string.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pydantic

if TYPE_CHECKING:
    from slurm_bt.compat.definitions import TrainingProject

__all__ = ["ignored_field_warnings"]

def _value(x: object) -> str:
    return str(getattr(x, "value", x))


def _default(model: object, name: str) -> object:
    return type(model).model_fields[name].default  # type: ignore[attr-defined]


def ignored_field_warnings(project: TrainingProject, *, container_runtime: str) -> list[str]:
    """One line per accepted-but-ignored field the config sets, ``"<field path> ...: <why>"``.

    A field at its default value is not mentioned (the user asked for nothing, or for what happens
    anyway), except ``base_image``, which every config must set and a host-runtime site never uses.
    Defaults are compared by value: the loader rebuilds the models, so ``model_fields_set`` names
    every field.
    """
    job = project.job
    runtime = job.runtime
    no_container = container_runtime == "none"
    out: list[str] = []
    if project.team_name is not None:
        out.append(f"team_name={project.team_name!r} is ignored: on this cluster a job's team (and its "
                   "team cache) is the Unix group of its Slurm account (`-- --account=<account>`) or your "
                   "primary group, never a name in the config (docs/admin.md, Teams)")
    if no_container:
        out.append(f"job.image.base_image={job.image.base_image!r} is ignored: this cluster runs jobs "
                   "directly on the nodes (site container_runtime = \"none\"), so the start commands use "
                   "the nodes' software, not the image's")
        if job.image.docker_auth is not None:
            out.append("job.image.docker_auth is ignored: no image is pulled (site container_runtime = "
                       "\"none\"), so its registry secrets are not needed either")
    ckpt = runtime.checkpointing_config
    if ckpt.volume_size_gib is not None:
        out.append(f"job.runtime.checkpointing_config.volume_size_gib={ckpt.volume_size_gib} is ignored: "
                   "checkpoints are written to the node's scratch directory ($BT_CHECKPOINT_DIR), whose "
                   "size the site sets, then copied to the checkpoint store")
    cache = runtime.cache_config
    # True (the default) is what happens anyway: every node sees the caches' shared filesystem.
    if cache is not None and cache.require_cache_affinity is not _default(cache, "require_cache_affinity"):
        out.append(f"job.runtime.cache_config.require_cache_affinity={cache.require_cache_affinity} is "
                   "ignored: the caches live on a shared filesystem every node sees, so every node has "
                   "them and the job always runs with its caches")
    if no_container and cache is not None and cache.enabled and \
            cache.mount_base_path != _default(cache, "mount_base_path"):
        out.append(f"job.runtime.cache_config.mount_base_path={cache.mount_base_path!r} is ignored without "
                   "a container (site container_runtime = \"none\"): the cache is at $BT_RW_CACHE_DIR")
    load = runtime.load_checkpoint_config
    if no_container and load is not None and load.enabled and \
            load.download_folder != _default(load, "download_folder"):
        out.append(f"job.runtime.load_checkpoint_config.download_folder={load.download_folder!r} is ignored "
                   "without a container (site container_runtime = \"none\"): the checkpoints are placed "
                   "in $BT_LOAD_CHECKPOINT_DIR")
    out += [f"{loc} is ignored: truss 0.18.25 accepts unknown keys in this object and keeps them, but no "
            "slurm-bt feature reads them (a typo of a field name?)" for loc in _extra_keys(project, "")]
    return out


def _extra_keys(value: object, loc: str) -> Iterator[str]:
    """Paths of the extra keys the lax models (WeightsSource, WeightsAuth, AcceleratorSpec, the
    checkpoint classes) kept: upstream forwards them to Baseten, here nothing reads them."""
    if isinstance(value, pydantic.BaseModel):
        for key in sorted(value.__pydantic_extra__ or {}):
            yield f"{loc}.{key}" if loc else key
        for name in type(value).model_fields:
            yield from _extra_keys(getattr(value, name, None), f"{loc}.{name}" if loc else name)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _extra_keys(item, f"{loc}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _extra_keys(item, f"{loc}.{key}")

