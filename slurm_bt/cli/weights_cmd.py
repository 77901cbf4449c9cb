"""``slurm-bt cache ls | inspect | warm | evict``: the weights caches (BDN tiers) for users and admins.

Registered into the ``cache`` group of :mod:`slurm_bt.cli.cache_cmd` (next to ``summarize``, which is
about the read-write project caches). What each command sees is decided by file permissions: a user
lists their team's cluster tier and the shared tier; the node tier is root-owned but world-readable.

* ``ls``: entries of the cluster tiers (``--node N``: the node cache of node ``N``, expanded from the
  site's ``node_cache`` template), least recently used first, with leases;
* ``inspect ID``: one entry (an id prefix is enough): source, revision, files, where it is;
* ``warm SOURCE``: pin and mirror a source into your team tier now (``--shared``: the admin tier),
  so later submissions need no staging job. Runs here, with your secret store's credentials;
* ``evict``: plan, print and (without ``--dry-run``) carry out LRU eviction: the node tier down to
  ``--max-bytes`` (leased entries are never touched), or cluster-tier entries by id or age. The
  cluster tier has no leases (jobs in the no-prolog fallback read it directly), so its eviction is
  explicit and age-bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.display import visible
from slurm_bt.errors import Problem, StorageError, UserError
from slurm_bt.images.entry import entry_label

__all__ = ["register_weights_commands"]


def _site() -> Any:
    from slurm_bt.site.settings import load_site_settings

    return load_site_settings()


def _tiers(team: str | None) -> list[tuple[str, Any]]:
    from slurm_bt.site.settings import user_path
    from slurm_bt.weights.plan import cluster_tiers, team_for_user

    site = _site()
    try:
        team_tier, shared = cluster_tiers(user_path(site.storage.cluster_cache), team or team_for_user())
    except ValueError as exc:  # not a team directory name (``../x``): the user's input, not a bug
        raise UserError("slurm-bt cache", [Problem("--team", str(exc))]) from None
    return [(f"team:{team_tier.root.name}", team_tier), ("shared", shared)]


def _eviction_refusal(cache: Any, manifest_ids: tuple[str, ...]) -> str | None:
    """Why the caller may not evict from ``cache`` at all, or None.

    Asked before anything is removed, so that naming another team's entry is a refusal that says
    why, not a PermissionError from listing its tier ("internal error", issue 31) or half an eviction.
    """
    if os.geteuid() == 0:
        return None
    from slurm_bt.weights.plan import caller_team_gid

    what = (f"entr{'y' if len(manifest_ids) == 1 else 'ies'} {', '.join(repr(i) for i in manifest_ids)}"
            if manifest_ids else "entries")
    team = cache.root.name
    if cache.root.parent.name == "teams" and caller_team_gid(team) is None:
        return (f"cannot evict {what} from the weights cache of team {team} ({cache.root}): you are not a "
                f"member of team {team}; only its members (or root) may evict its entries")
    if cache.root.is_dir() and not os.access(cache.layout.manifests, os.R_OK | os.W_OK | os.X_OK):
        return (f"cannot evict {what} from {cache.root}: its entries are not writable by you "
                "(only the tier's members, or root, may evict them)")
    return None


def _not_yours(cache: Any, manifest_id: str) -> str | None:
    """Why the caller cannot remove this one entry's manifest (a teammate's, in a sticky tier), or None."""
    if os.geteuid() == 0:
        return None
    import pwd
    import stat

    try:
        folder = os.stat(cache.layout.manifests)
        st = os.lstat(cache.layout.manifest_file(manifest_id))
    except OSError as exc:
        return f"cannot be checked: {exc.strerror}"
    if folder.st_mode & stat.S_ISVTX and os.geteuid() not in (st.st_uid, folder.st_uid):
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        return f"published by {owner}: only its publisher (or root) may evict it from this shared tier"
    return None


def _node(node: str) -> Any:
    from slurm_bt.weights.node_stage import _node_cache

    return _node_cache(_site(), {"SLURMD_NODENAME": node, "SLURM_JOB_UID": str(os.getuid())})


def _entry_dict(tier: str, e: Any) -> dict[str, Any]:
    return {"tier": tier, "manifest_id": e.manifest_id, "kind": e.kind, "source": e.source, "revision": e.revision,
            "files": e.files, "total_bytes": e.total_bytes, "published": e.published,
            "last_used": e.last_used, "leases": list(e.leases)}


def _fmt_time(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def _collect(team: str | None, node: str | None) -> list[dict[str, Any]]:
    caches = [(f"node:{node}", _node(node))] if node else _tiers(team)
    out: list[dict[str, Any]] = []
    for name, cache in caches:
        if cache.root.is_dir():
            out += [_entry_dict(name, e) for e in cache.entries()]
    return out


def register_weights_commands(group: click.Group) -> None:
    """Add ``ls``, ``inspect``, ``warm`` and ``evict`` to the ``cache`` group."""
    from slurm_bt.units import format_bytes

    @group.command(name="ls")
    @click.option("--team", default=None, help="Team tier to list (default: yours).")
    @click.option("--node", default=None, metavar="NODE", help="List the node cache of NODE instead.")
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
    def ls_command(team: str | None, node: str | None, as_json: bool) -> None:
        """List weights cache entries, least recently used first."""
        with handle_errors("slurm-bt cache"):
            rows = _collect(team, node)
            if as_json:
                click.echo(json.dumps(rows, indent=2))
                return
            if not rows:
                click.echo("no weights cache entries")
            for r in rows:
                leases = f" leases={','.join(r['leases'])}" if r["leases"] else ""
                label = entry_label(r["kind"], r["source"], r["revision"])
                click.echo(visible(f"{r['tier']:<14} {r['manifest_id'][:12]}  {label}  "
                                   f"{r['files']} files  {format_bytes(r['total_bytes'])}  "
                                   f"last used {_fmt_time(r['last_used'])}{leases}"))

    @group.command(name="inspect")
    @click.argument("manifest_id")
    @click.option("--team", default=None, help="Team tier (default: yours).")
    @click.option("--node", default=None, metavar="NODE", help="Look in the node cache of NODE too.")
    def inspect_command(manifest_id: str, team: str | None, node: str | None) -> None:
        """Show one entry (an id prefix is enough): where it is, its source and files."""
        with handle_errors("slurm-bt cache"):
            caches = _tiers(team) + ([(f"node:{node}", _node(node))] if node else [])
            found = False
            for name, cache in caches:
                for mid in cache.layout.manifest_ids():
                    if not mid.startswith(manifest_id):
                        continue
                    m = cache.layout.read_manifest(mid)
                    if m is None:
                        continue
                    found = True
                    what = (entry_label(m.kind, m.source, m.revision) if m.kind == "oci"
                            else f"source {m.source}@{m.revision}")
                    for line in (f"{name}: {mid}", f"  {what}",
                                 f"  {len(m.files)} files, {format_bytes(m.total_bytes)}",
                                 f"  snapshot {cache.layout.snapshot(mid)}"):
                        click.echo(visible(line))
                    for f in m.files:
                        click.echo(visible(f"    {f.sha256[:12]}  {f.size:>14}  {f.path}"))
            if not found:
                raise UserError("slurm-bt cache", [Problem("", f"no weights cache entry {manifest_id!r}")])

    @group.command(name="warm")
    @click.argument("source")
    @click.option("--allow", "allow", multiple=True, help="allow_patterns (repeatable).")
    @click.option("--ignore", "ignore", multiple=True, help="ignore_patterns (repeatable).")
    @click.option("--secret", default=None, help="Secret name in your store (auth_secret_name).")
    @click.option("--team", default=None, help="Team tier to fill (default: yours).")
    @click.option("--shared", is_flag=True, help="Fill the admin-curated shared tier (root only).")
    def warm_command(source: str, allow: tuple[str, ...], ignore: tuple[str, ...], secret: str | None,
                     team: str | None, shared: bool) -> None:
        """Pin SOURCE and mirror it into the cluster cache now, with verification.

        SOURCE is a weights source, or ``docker://IMAGE`` for a public container image (docs/containers.md).
        """
        with handle_errors("slurm-bt cache"):
            if source.startswith("docker://"):
                from slurm_bt.images.warm import warm_image
                from slurm_bt.secrets_store import SecretStore
                from slurm_bt.site.settings import user_path
                from slurm_bt.weights.plan import team_for_user

                site = _site()
                click.echo(warm_image(source.removeprefix("docker://"), team=team or team_for_user(), shared=shared,
                                      site=site, store=SecretStore(Path(user_path(site.storage.secrets)))))
                return
            click.echo(warm_source(source, allow=allow or None, ignore=ignore or None, secret=secret, team=team,
                                   shared=shared))

    @group.command(name="evict")
    @click.argument("manifest_ids", nargs=-1)
    @click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
    @click.option("--node", default=None, metavar="NODE", help="Evict from the node cache of NODE (LRU).")
    @click.option("--max-bytes", type=int, default=None, help="Node tier: blob usage to get down to "
                  "(default: the site's node_cache_max_bytes).")
    @click.option("--older-than-days", type=float, default=None,
                  help="Cluster tier: entries published more than this many days ago.")
    @click.option("--team", default=None, help="Team tier (default: yours).")
    def evict_command(manifest_ids: tuple[str, ...], dry_run: bool, node: str | None, max_bytes: int | None,
                      older_than_days: float | None, team: str | None) -> None:
        """Evict weights cache entries (node tier: LRU of lease-free entries; cluster tier: by id or age)."""
        with handle_errors("slurm-bt cache"):
            for line in evict(manifest_ids, dry_run=dry_run, node=node, max_bytes=max_bytes,
                              older_than_days=older_than_days, team=team):
                click.echo(visible(line))


def warm_source(source: str, *, allow: Any = None, ignore: Any = None, secret: str | None = None,
                team: str | None = None, shared: bool = False) -> str:
    """``cache warm``: what a staging job does for one source, here and now; returns the log line."""
    from slurm_bt.secrets_store import SecretStore
    from slurm_bt.site.settings import user_path
    from slurm_bt.storage.credentials import credentials_from_store
    from slurm_bt.storage.url import parse_source_uri
    from slurm_bt.weights.plan import SourcePin, cluster_tiers, list_selected, pin_key, team_for_user
    from slurm_bt.weights.stage_job import ensure_team_root, stage_source

    site = _site()
    kind = parse_source_uri(source).kind
    store = SecretStore(Path(user_path(site.storage.secrets)))
    creds = credentials_from_store(store, secret, kind, source=source)
    listing, files, revision = list_selected(source, allow=allow, ignore=ignore, credentials=creds,
                                             endpoints=site.weights.endpoints)
    base = user_path(site.storage.cluster_cache)
    team_tier, shared_tier = cluster_tiers(base, team or team_for_user())
    target = shared_tier if shared else team_tier
    if shared:
        target.dir_mode = 0o755
    else:
        ensure_team_root(Path(base), team_tier)
    pin = SourcePin(index=0, declared=source, kind=listing.uri.kind, source=listing.uri.canonical, revision=revision,
                    allow_patterns=allow, ignore_patterns=ignore, auth_secret_name=secret, mount_location="/warm",
                    pin_key=pin_key(listing.uri.kind, listing.uri.canonical, revision, files), files=tuple(files))
    outcome = stage_source(pin, target, shared_tier, credentials=creds, endpoints=site.weights.endpoints,
                           out=sys.stdout)
    return outcome.line() + f" -> {target.snapshot_path(outcome.manifest)}"


def evict(manifest_ids: tuple[str, ...], *, dry_run: bool, node: str | None, max_bytes: int | None,
          older_than_days: float | None, team: str | None) -> list[str]:
    """``cache evict``: the plan (and, unless ``dry_run``, the result) as printable lines."""
    from slurm_bt.weights.cache_layout import remove_tree

    if node:
        nc = _node(node)
        plan = nc.plan_eviction(max_bytes if max_bytes is not None else nc.cap_bytes())
        lines: list[str] = list(plan.describe())
        if not dry_run:
            res = nc.execute(plan)
            lines.append(f"removed {len(res.manifests)} entries, {len(res.blobs)} blobs; skipped {len(res.skipped)}")
        return lines
    if not manifest_ids and older_than_days is None:
        raise UserError("slurm-bt cache evict", [Problem("", "name entries (ids) or --older-than-days for the "
                                                         "cluster tier, or --node NODE for a node cache")])
    [(name, cache)] = _tiers(team)[:1]
    refusal = _eviction_refusal(cache, manifest_ids)
    if refusal is not None:
        raise UserError("slurm-bt cache evict", [Problem("", refusal)])
    cutoff = time.time() - (older_than_days or 0) * 86400
    try:
        entries = cache.entries()
    except OSError as exc:  # the tier changed under us, or an ACL the check above cannot see
        why = f"cannot list {cache.root}: {exc.strerror}; only the tier's members (or root) may evict its entries"
        raise UserError("slurm-bt cache evict", [Problem("", why)]) from None
    chosen = [e for e in entries
              if (manifest_ids and any(e.manifest_id.startswith(i) for i in manifest_ids))
              or (older_than_days is not None and e.published < cutoff)]
    refused = [(e, reason) for e in chosen if manifest_ids and (reason := _not_yours(cache, e.manifest_id))]
    if refused:  # named entries someone else published: refuse them all before removing anything
        raise UserError("slurm-bt cache evict", [
            Problem("", f"cannot evict {e.manifest_id[:12]} ({entry_label(e.kind, e.source, e.revision)}): {reason}")
            for e, reason in refused])
    lines = [f"{name}: evict {e.manifest_id[:12]} {entry_label(e.kind, e.source, e.revision)} "
             f"({e.total_bytes} bytes)"
             for e in chosen]
    if dry_run or not chosen:
        return lines or ["nothing to evict"]
    keep: set[str] = set()
    gone = {e.manifest_id for e in chosen}
    for mid in cache.layout.manifest_ids():
        if mid not in gone and (m := cache.layout.read_manifest(mid)) is not None:
            keep |= {f.sha256 for f in m.files}
    failed: list[str] = []
    for e in chosen:
        m = cache.layout.read_manifest(e.manifest_id)
        try:
            os.unlink(cache.layout.manifest_file(e.manifest_id))
        except FileNotFoundError:
            pass
        except OSError as exc:  # e.g. a teammate's entry in a sticky tier: left whole, as it was
            failed.append(f"{e.manifest_id[:12]}: cannot remove its manifest: {exc.strerror}")
            continue
        # The manifest is gone (no reader trusts the entry now): whatever else fails below, the
        # blobs go too, so a failed snapshot removal never strands gigabytes that nothing names.
        try:
            remove_tree(cache.layout, cache.layout.snapshot(e.manifest_id))
        except StorageError as exc:
            failed.append(f"{e.manifest_id[:12]}: {' '.join(exc.lines())}")
        for f in (m.files if m else ()):
            if f.sha256 not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(cache.layout.blob(f.sha256))
                keep.add(f.sha256)
    lines += [f"{name}: removed pin record {p}" for p in cache.remove_pins(gone)]
    if failed:
        raise StorageError(str(cache.root), "evict left parts of entries: " + "; ".join(failed))
    lines.append(f"removed {len(chosen)} entries")
    return lines
