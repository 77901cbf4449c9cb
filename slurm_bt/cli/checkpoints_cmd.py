"""``slurm-bt checkpoints``: list and download a job's checkpoints; finish hand-offs (root).

Everything runs as the caller with the caller's store credentials, so it shows exactly what the
store lets the caller read (docs/checkpoints.md, trust model).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_bt.checkpoints.index import CheckpointView
from slurm_bt.cli.errors import handle_errors
from slurm_bt.display import visible
from slurm_bt.errors import Problem, UserError
from slurm_bt.units import format_bytes

__all__ = ["checkpoints_group"]


def _job_index(job_id: str):  # type: ignore[no-untyped-def]
    """The caller's store and where ``job_id`` is in it: your teams' namespaces first, then the legacy layout."""
    from slurm_bt.checkpoints.resolve import find_job, open_user_store
    from slurm_bt.site.settings import load_site_settings, user_path

    site = load_site_settings()
    store = open_user_store(site.storage.model_dump())
    try:
        found = find_job(store, job_id, workspace=user_path(site.storage.workspace))
    except BaseException:
        store.close()
        raise
    if found is None:
        store.close()
        raise UserError("slurm-bt", [Problem("JOB_ID", f"job {job_id} has no checkpoints in {store.uri.display()} "
                                             "(or they are not readable by you)")])
    return store, found


def _completeness(view: CheckpointView, expired: tuple[str, ...]) -> str:
    """The COMPLETE column: why a checkpoint is not loadable (docs/checkpoints.md, "When is a checkpoint complete?")."""
    if view.complete:
        return "yes"
    if view.name in expired:
        return "no (deleted by retention on some ranks)"
    if view.missing:
        return f"no (rank {','.join(map(str, view.missing))} never uploaded its part)"
    return f"no (waiting for rank {','.join(map(str, view.waiting))})"


@click.group(name="checkpoints")
def checkpoints_group() -> None:
    """Checkpoints uploaded from $BT_CHECKPOINT_DIR (list, download, resume-handoffs)."""


@checkpoints_group.command(name="list")
@click.argument("job_id")
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
def list_command(job_id: str, fmt: str, debug: bool) -> None:
    """List JOB_ID's checkpoints (newest last)."""
    from slurm_bt.jobs.lifecycle import check_job_ids

    with handle_errors("slurm-bt", debug=debug):
        [job_id] = check_job_ids([job_id])
        store, found = _job_index(job_id)
        store.close()
        index = found.index
        if fmt == "json":
            click.echo(index.model_dump_json(indent=2))
            return
        rows = [("NAME", "CREATED", "RANKS", "FILES", "SIZE", "COMPLETE")]
        for c in index.checkpoints:
            rows.append((c.name, c.created, ",".join(str(r) for r in sorted(c.ranks)), str(c.file_count),
                         format_bytes(c.size), _completeness(c, index.expired)))
        shown = [[visible(v) for v in r] for r in rows]  # names come from the job's own index
        widths = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
        click.echo(visible(f"project {index.project_name} ({index.project_id}), job {index.job_id}, "
                           f"{index.group_size} node(s), store {store.uri.display()}, {found.describe()}"))
        for r in shown:
            click.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


@checkpoints_group.command(name="download")
@click.argument("job_id")
@click.argument("name", required=False)
@click.option("--target-directory", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to put rank-<n>/<name>/ (default: ./<job_id>).")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
def download_command(job_id: str, name: str | None, target_directory: Path | None, debug: bool) -> None:
    """Download checkpoint NAME of JOB_ID (default: its latest complete one), sha256-verified."""
    import os

    from slurm_bt.checkpoints.index import decode_relpath
    from slurm_bt.checkpoints.locations import valid_checkpoint_name
    from slurm_bt.checkpoints.resolve import safe_relpath
    from slurm_bt.jobs.lifecycle import check_job_ids

    with handle_errors("slurm-bt", debug=debug):
        [job_id] = check_job_ids([job_id])
        store, found = _job_index(job_id)
        index = found.index
        try:
            view = index.get(name) if name else index.latest()
            if view is None:
                what = f"no checkpoint named {name!r}" if name else "no complete checkpoint"
                raise UserError("slurm-bt", [Problem("NAME", f"job {job_id} has {what}")])
            if not valid_checkpoint_name(view.name):
                raise UserError("slurm-bt", [Problem("NAME", f"unsafe checkpoint name {view.name!r} in the index")])
            target = target_directory or Path(job_id)
            count = size = 0
            for rank, files in sorted(view.ranks.items()):
                for f in files:
                    try:  # stored names are percent-encoded where needed (odd bytes, newlines): decode them
                        local = os.fsdecode(decode_relpath(f.path)) if safe_relpath(f.path) else None
                    except ValueError:
                        local = None
                    if local is None:
                        raise UserError("slurm-bt", [Problem("NAME", f"unsafe path {f.path!r} in the index")])
                    key = found.file_key(rank, view.name, f.path)
                    store.download_file(key, target / f"rank-{rank}" / view.name / local, size=f.size, sha256=f.sha256)
                    count += 1
                    size += f.size
        finally:
            store.close()
        click.echo(visible(f"downloaded {view.name} of job {job_id}: {count} files, {format_bytes(size)}, "
                           f"sha256 verified, to {target}"))


@checkpoints_group.command(name="resume-handoffs")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Hand-off area (default: the site's, next to the scratch root).")
@click.option("--node", default=None, help="Node name, when storage roots use %n.")
@click.option("--keep", is_flag=True, help="Keep entries after a successful upload.")
@click.option("--retry-quarantined", is_flag=True,
              help="Also retry quarantined entries (after fixing what made them fail, e.g. the store location).")
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
def resume_handoffs_command(root: Path | None, node: str | None, keep: bool, retry_quarantined: bool, fmt: str,
                            debug: bool) -> None:
    """Upload checkpoints the epilog handed off (run as root, e.g. from a timer); exit 1 if any failed.

    Entries that failed the same way ``[handoff] max_failures`` times are quarantined and skipped
    unless --retry-quarantined; entries beyond the age or per-user size bound are removed.
    """
    from slurm_bt.checkpoints.handoff import resume_handoffs
    from slurm_bt.site.settings import load_site_settings

    with handle_errors("slurm-bt", debug=debug):
        if root is None and node is None and "%n" in load_site_settings().storage.scratch:
            raise UserError("slurm-bt", [Problem("--node", "the site's scratch root uses %n: name the node "
                                                 "whose hand-offs to resume (--node NAME)")])
        outcomes = resume_handoffs(root=root, node=node, keep=keep, retry_quarantined=retry_quarantined,
                                   on_outcome=None if fmt == "json" else
                                   lambda o: click.echo(f"{o.entry}: {o.status}: {o.message}"))
        if fmt == "json":
            click.echo(json.dumps([o.__dict__ for o in outcomes], indent=2))
        elif not outcomes:
            click.echo("no hand-offs")
        if any(o.status in ("failed", "quarantined") for o in outcomes):
            raise SystemExit(1)
