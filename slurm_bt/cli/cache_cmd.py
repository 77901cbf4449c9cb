"""``slurm-bt cache summarize PROJECT``: what a project's persistent cache holds, like ``truss train cache summarize``.

Runs as the calling user on any node that mounts the shared cache, so it shows exactly what that
user may see: the kernel's ``2770 root:<team group>`` permissions decide, not this command. The
project is looked up in every team directory the user can enter (``--team`` narrows it).

"Last use" is the newest of the project directory's mtime (the prolog touches it when a job that
uses the cache starts) and the newest file's mtime; atime is unreliable.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.weights_cmd import register_weights_commands
from slurm_bt.display import visible
from slurm_bt.errors import Problem, UserError
from slurm_bt.job_spec import slugify
from slurm_bt.site.settings import load_site_settings, user_path
from slurm_bt.units import format_bytes

__all__ = ["CacheEntry", "CacheSummary", "cache_group", "summarize_project"]

_SORT_KEYS = ("filepath", "size", "modified", "type", "permissions")


@dataclass(frozen=True)
class CacheEntry:
    """One file or directory in a cache (path relative to the project cache)."""

    filepath: str
    size_bytes: int
    modified: float
    type: str
    permissions: str


@dataclass(frozen=True)
class CacheSummary:
    """One project's cache in one team."""

    project: str
    team: str
    path: str
    total_size_bytes: int
    file_count: int
    last_used: float
    entries: tuple[CacheEntry, ...]
    unreadable: int


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "file"
    return "other"


def _scan(root: Path) -> tuple[list[CacheEntry], int]:
    """Every entry below ``root`` without following symlinks (iterative; unreadable dirs counted)."""
    entries: list[CacheEntry] = []
    unreadable = 0
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            it = list(os.scandir(d))
        except OSError:
            unreadable += 1
            continue
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                unreadable += 1
                continue
            rel = os.path.relpath(e.path, root)
            entries.append(CacheEntry(rel, st.st_size if not stat.S_ISDIR(st.st_mode) else 0, st.st_mtime,
                                      _kind(st.st_mode), stat.filemode(st.st_mode)))
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(e.path))
    return entries, unreadable


def summarize_project(cache_root: Path, project: str, team: str | None = None) -> list[CacheSummary]:
    """Summaries of ``project`` in every team directory (or ``team``) the caller can enter.

    Raises:
        UserError: the project name is unsafe, or no accessible cache of it exists.
    """
    project_id = slugify(project, default="")
    if not project_id:
        raise UserError("slurm-bt cache", [Problem("project", f"{project!r} is not a project name")])
    teams_dir = cache_root / "teams"
    if team is not None:
        candidates = [team]
    else:
        try:
            candidates = sorted(os.listdir(teams_dir))
        except OSError:
            candidates = []
    out = []
    for t in candidates:
        if "/" in t or t in (".", ".."):
            continue
        pdir = teams_dir / t / "projects" / project_id
        try:
            pst = pdir.stat()
        except OSError:
            continue
        if not os.access(pdir, os.R_OK | os.X_OK):
            continue
        entries, unreadable = _scan(pdir)
        files = [e for e in entries if e.type != "directory"]
        last = max([pst.st_mtime, *(e.modified for e in entries)])
        out.append(CacheSummary(project=project_id, team=t, path=str(pdir),
                                total_size_bytes=sum(e.size_bytes for e in files), file_count=len(files),
                                last_used=last, entries=tuple(entries), unreadable=unreadable))
    if not out:
        where = f"team {team!r}" if team else "any team you belong to"
        raise UserError("slurm-bt cache", [Problem("", f"no cache for project {project_id!r} in {where} under "
                                                   f"{teams_dir} (caches exist after a job with "
                                                   "CacheConfig(enabled=True) ran)")])
    return out



def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _sorted(entries: tuple[CacheEntry, ...], key: str, order: str) -> list[CacheEntry]:
    field = "size_bytes" if key == "size" else key
    return sorted(entries, key=lambda e: (getattr(e, field), e.filepath), reverse=order == "desc")


def _render(summaries: list[CacheSummary], key: str, order: str, fmt: str) -> str:
    if fmt == "json":
        docs = []
        for s in summaries:
            d = asdict(s)
            d["entries"] = [asdict(e) for e in _sorted(s.entries, key, order)]
            docs.append(d)
        return json.dumps(docs, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["team", "filepath", "size_bytes", "modified", "type", "permissions"])
        for s in summaries:
            for e in _sorted(s.entries, key, order):
                w.writerow([s.team, e.filepath, e.size_bytes, _iso(e.modified), e.type, e.permissions])
        return buf.getvalue().rstrip("\n")
    lines = []
    for s in summaries:
        # File names in a cache are whatever a job wrote: every line is made visible.
        lines.append(visible(f"Cache summary for project {s.project} (team {s.team}): {s.path}"))
        lines.append(f"  total size {format_bytes(s.total_size_bytes)}, {s.file_count} files, "
                     f"last used {_iso(s.last_used)}"
                     + (f", {s.unreadable} unreadable entries" if s.unreadable else ""))
        rows = [("File path", "Size", "Modified", "Type", "Permissions")]
        rows += [(visible(e.filepath), format_bytes(e.size_bytes), _iso(e.modified), e.type, e.permissions)
                 for e in _sorted(s.entries, key, order)]
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for i, r in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(widths[j]) for j, c in enumerate(r)).rstrip())
            if i == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.group(name="cache", context_settings={"help_option_names": ["-h", "--help"]})
def cache_group() -> None:
    """Inspect the persistent project and team caches (CacheConfig)."""


@cache_group.command(name="summarize")
@click.argument("project")
@click.option("--team", default=None, help="Team (Unix group) directory to look in; default: every one you can enter.")
@click.option("--sort", "sort_key", type=click.Choice(_SORT_KEYS), default="filepath", show_default=True)
@click.option("--order", type=click.Choice(("asc", "desc")), default="asc", show_default=True)
@click.option("-o", "--output-format", "fmt", type=click.Choice(("cli-table", "csv", "json")), default="cli-table",
              show_default=True)
def summarize_command(project: str, team: str | None, sort_key: str, order: str, fmt: str) -> None:
    """Show sizes, files and last use of PROJECT's cache (BT_PROJECT_CACHE_DIR)."""
    with handle_errors("slurm-bt cache"):
        site = load_site_settings()
        cache_root = Path(user_path(site.storage.cache))
        click.echo(_render(summarize_project(cache_root, project, team), sort_key, order, fmt))


# -- weights caches (slurm_bt.cli.weights_cmd): ls, inspect, warm, evict
register_weights_commands(cache_group)
