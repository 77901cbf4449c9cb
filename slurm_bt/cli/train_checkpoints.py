"""``slurm-bt train checkpoints list`` and ``slurm-bt train get_checkpoint_urls``, shaped like truss train's.

Both read the job's checkpoint index (``index.json`` in the store, slurm_bt/checkpoints/index.py)
as the caller, with the caller's store credentials (docs/checkpoints.md, trust model): what the
store lets the caller read is what is shown. ``list`` prints truss train's columns (``-o
cli-table|csv|json``, ``--sort``, ``--order``) plus ``complete`` (every node rank uploaded it: only a
complete checkpoint is ever loaded). ``get_checkpoint_urls`` writes truss train's
``<project>_<job>_checkpoints.json``: each file with a presigned GET URL for object stores (signed
locally with the caller's credentials, no request made) or its path for ``file://`` stores.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.train_jobs import artifact_stem, check_remote, forward_remote, pick_job, project_option, render
from slurm_bt.display import visible
from slurm_bt.units import format_bytes

if TYPE_CHECKING:
    from slurm_bt.checkpoints.index import CheckpointView, JobIndex
    from slurm_bt.checkpoints.resolve import FoundJob
    from slurm_bt.checkpoints.store import CheckpointStore

__all__ = ["checkpoint_rows", "checkpoints_group", "get_checkpoint_urls_command", "sort_rows"]

# truss/cli/train/checkpoint_viewer.py's choices.
SORT_KEYS = ("checkpoint-id", "size", "created", "type")
FORMATS = ("cli-table", "csv", "json")
#: How long a presigned URL stays valid by default (SigV4 allows at most 7 days).
DEFAULT_EXPIRES_S = 24 * 3600
MAX_EXPIRES_S = 7 * 24 * 3600


@contextmanager
def _open_index(job_id: str) -> Iterator[tuple[CheckpointStore, FoundJob]]:
    """The caller's store and where ``job_id`` is (exit 2 naming the store when it has none for the caller).

    Found like ``slurm-bt checkpoints list`` finds it: the caller's teams' namespaces, then the
    legacy layout of a store from before team namespaces.
    """
    from slurm_bt.checkpoints.resolve import find_job, open_user_store
    from slurm_bt.errors import Problem, UserError
    from slurm_bt.site.settings import load_site_settings, user_path

    site = load_site_settings()
    store = open_user_store(site.storage.model_dump())
    try:
        found = find_job(store, job_id, workspace=user_path(site.storage.workspace))
        if found is None:
            raise UserError("slurm-bt", [Problem("--job-id", f"job {job_id} has no checkpoints in "
                                                 f"{store.uri.display()} (or they are not readable by you)")])
        yield store, found
    finally:
        store.close()


def _kind(view: CheckpointView) -> str:
    """truss's ``checkpoint_type``: ``lora`` when it holds a PEFT adapter config, else ``full``."""
    return "lora" if any(f.path.rsplit("/", 1)[-1] == "adapter_config.json"
                         for files in view.ranks.values() for f in files) else "full"


def checkpoint_rows(index: JobIndex) -> list[dict[str, Any]]:
    """One truss-shaped dict per checkpoint (``id`` and ``checkpoint_id`` are both its name here)."""
    return [{
        "id": c.name, "checkpoint_id": c.name, "checkpoint_type": _kind(c), "base_model": "",
        "size_bytes": c.size, "created_at": c.created, "complete": c.complete,
        "ranks": sorted(c.ranks), "group_size": index.group_size, "file_count": c.file_count,
        "waiting": list(c.waiting), "missing": list(c.missing),
    } for c in index.checkpoints]


def sort_rows(rows: list[dict[str, Any]], sort: str, order: str) -> list[dict[str, Any]]:
    """truss's sort keys: checkpoint-id (natural order here, so checkpoint-10 follows checkpoint-9)."""
    from slurm_bt.checkpoints.index import natural_key

    keys: dict[str, Any] = {
        "checkpoint-id": lambda r: natural_key(r["checkpoint_id"]),
        "size": lambda r: r["size_bytes"],
        "created": lambda r: r["created_at"],
        "type": lambda r: r["checkpoint_type"],
    }
    return sorted(rows, key=keys[sort], reverse=order == "desc")


def _complete(r: dict[str, Any]) -> str:
    """Why a checkpoint is not loadable, as ``slurm-bt checkpoints list`` says it (docs/checkpoints.md)."""
    if r["complete"]:
        return "yes"
    if r["missing"]:
        return f"no (rank {','.join(map(str, r['missing']))} never uploaded its part)"
    if r["waiting"]:
        return f"no (waiting for rank {','.join(map(str, r['waiting']))})"
    return f"no ({len(r['ranks'])}/{r['group_size']} ranks)"  # e.g. deleted by retention on another rank


def _print_checkpoints(job_id: str, rows: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps({"job_id": job_id, "total_checkpoints": len(rows),
                               "checkpoints": [{"job_id": job_id, **r} for r in rows]}, indent=2))
        return
    header = ["Job ID", "Checkpoint ID", "Checkpoint Name", "Type", "Base Model"]
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow([*header, "Size (bytes)", "Size (human readable)", "Created At", "Complete"])
        for r in rows:
            writer.writerow([job_id, r["id"], r["checkpoint_id"], r["checkpoint_type"], r["base_model"],
                             r["size_bytes"], format_bytes(r["size_bytes"]), r["created_at"], _complete(r)])
        return
    if not rows:
        click.echo(f"No checkpoints found for job: {job_id}.")
        return
    render([h.upper() for h in [*header, "Size", "Created At", "Complete"]],
           [(job_id, r["id"], r["checkpoint_id"], r["checkpoint_type"], r["base_model"] or "-",
             format_bytes(r["size_bytes"]), r["created_at"], _complete(r)) for r in rows],
           title=f"Checkpoints for job: {job_id}")


def _file_rows(view: CheckpointView) -> list[dict[str, Any]]:
    from slurm_bt.checkpoints.index import decode_relpath

    out = []
    for rank, files in sorted(view.ranks.items()):
        for f in files:
            try:
                shown = os.fsdecode(decode_relpath(f.path))
            except ValueError:
                shown = f.path
            out.append({"relative_file_name": f"rank-{rank}/{view.name}/{shown}", "node_rank": rank,
                        "size_bytes": f.size, "sha256": f.sha256, "_key_path": f.path})
    return out


def _print_files(job_id: str, view: CheckpointView, fmt: str) -> None:
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in _file_rows(view)]
    if fmt == "json":
        click.echo(json.dumps({"job_id": job_id, "checkpoint_name": view.name, "files": rows}, indent=2))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["File", "Node Rank", "Size (bytes)", "SHA256"])
        for r in rows:
            writer.writerow([r["relative_file_name"], r["node_rank"], r["size_bytes"], r["sha256"]])
    else:
        render(("FILE", "RANK", "SIZE"), [(r["relative_file_name"], str(r["node_rank"]), format_bytes(r["size_bytes"]))
                                          for r in rows], title=f"Files of checkpoint {view.name} (job {job_id})")


@click.group(name="checkpoints")
def checkpoints_group() -> None:
    """Checkpoint-related subcommands for slurm-bt train."""


@checkpoints_group.command(name="list")
@click.option("--remote", default=None, help="Accepted for truss compatibility (this cluster only).")
@click.option("--project-id", default=None, help="Project ID.")
@click.option("--project", default=None, help="Project name or project id.")
@click.option("--job-id", default=None, help="Job ID (default: the most recent job).")
@click.option("--checkpoint-name", default=None, help="List this checkpoint's files.")
@click.option("--sort", type=click.Choice(SORT_KEYS), default="created", show_default=True)
@click.option("--order", type=click.Choice(("asc", "desc")), default="asc", show_default=True)
@click.option("-o", "--output-format", "fmt", type=click.Choice(FORMATS), default="cli-table", show_default=True)
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
@click.pass_context
def list_command(ctx: click.Context, remote: str | None, project_id: str | None, project: str | None,
                 job_id: str | None, checkpoint_name: str | None, sort: str, order: str, fmt: str,
                 debug: bool) -> None:
    """List checkpoints for a training job."""
    forward_remote(ctx, remote, ["checkpoints", "list"], debug=debug)
    with handle_errors("slurm-bt", debug=debug):
        jid = pick_job(job_id, project_option(project, project_id))
        with _open_index(jid) as (_store, found):
            index = found.index
            if checkpoint_name is not None:
                view = index.get(checkpoint_name)
                if view is None:
                    click.echo(visible(f"No files found for checkpoint: {checkpoint_name}"), err=True)
                    raise SystemExit(1)
                _print_files(jid, view, fmt)
                return
            _print_checkpoints(jid, sort_rows(checkpoint_rows(index), sort, order), fmt)


def checkpoint_artifacts(store: CheckpointStore, found: FoundJob, expires_s: int) -> list[dict[str, Any]]:
    """Every file of every checkpoint with a URL: presigned (object stores) or ``file://`` + ``path``.

    Keys are built from where the job was found (:class:`~slurm_bt.checkpoints.resolve.FoundJob`).
    """
    from slurm_bt.checkpoints.locations import valid_checkpoint_name
    from slurm_bt.checkpoints.resolve import safe_relpath
    from slurm_bt.errors import Problem, UserError

    presign = getattr(store, "presigned_url", None)
    index = found.index
    out = []
    for view in index.checkpoints:
        for r in _file_rows(view):
            # The index is written by the job's user (or a teammate): a name that climbs out of the
            # checkpoint would make a path or URL of something else. Refused as `checkpoints download` does.
            if not (valid_checkpoint_name(view.name) and safe_relpath(r["_key_path"])):
                raise UserError("slurm-bt", [Problem("--job-id", f"unsafe name {view.name!r}/{r['_key_path']!r} "
                                                     f"in job {index.job_id}'s checkpoint index")])
            key = found.file_key(r["node_rank"], view.name, r.pop("_key_path"))
            entry: dict[str, Any] = {"checkpoint_name": view.name, "complete": view.complete, **r}
            if store.uri.scheme == "file":
                path = Path(store.uri.key(key))
                entry.update(url=path.as_uri(), path=str(path))
            elif presign is not None:
                entry["url"] = presign(key, expires_s)
            out.append(entry)
    return out


@click.command(name="get_checkpoint_urls")
@click.option("--job-id", default=None, help="Job ID (default: your most recent job).")
@click.option("--remote", default=None, help="Accepted for truss compatibility (this cluster only).")
@click.option("--expires-in", "expires_s", type=click.IntRange(60, MAX_EXPIRES_S), default=DEFAULT_EXPIRES_S,
              show_default=True, help="slurm-bt: seconds a presigned URL stays valid.")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
def get_checkpoint_urls_command(job_id: str | None, remote: str | None, expires_s: int, debug: bool) -> None:
    """Write <project>_<job>_checkpoints.json: a URL (presigned) or path for every checkpoint file."""
    from slurm_bt.atomic import write_file_atomic
    from slurm_bt.cli.train_jobs import job_statuses
    from slurm_bt.records import read_record

    check_remote(remote, "get_checkpoint_urls")
    with handle_errors("slurm-bt", debug=debug):
        jid = pick_job(job_id, None)
        with _open_index(jid) as (store, found):
            index = found.index
            artifacts = checkpoint_artifacts(store, found, expires_s)
        if not artifacts:
            raise click.ClickException("No checkpoints found for this training job.")
        from slurm_bt.cli.options import workspace

        record = read_record(workspace(), jid)
        job: dict[str, Any] = {"id": jid, "training_project": {"id": index.project_id, "name": index.project_name},
                               "user": {"email": index.user}}
        if record is not None:
            job = {**job_statuses([record])[0].as_dict(), **job}
        out = {"timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(), "job": job,
               "checkpoint_artifacts": artifacts}
        path = Path.cwd() / f"{artifact_stem(index.project_name, jid)}_checkpoints.json"
        write_file_atomic(path, json.dumps(out, indent=2).encode() + b"\n", mode=0o600)
    click.echo(f"✨ Training job checkpoint artifacts downloaded to {path}")
