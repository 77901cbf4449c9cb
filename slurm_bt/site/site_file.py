"""Finding and reading the site file, and expanding its storage roots: the stdlib-only part of the site settings.

Why a separate module: read-only verbs such as ``slurm-bt status`` only need one storage root (the
caller's workspace, where the submission records are). Importing the full validated model
(:mod:`slurm_bt.site.settings`, pydantic) costs more than the ``sacct`` call those verbs wrap, so
they read the one key here, validated by the same rule the model applies. Commands that create
jobs or act on the cluster (submit, the hooks, the cache and checkpoint commands) always load and
validate the whole file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slurm_bt.errors import Problem, SiteConfigError

__all__ = [
    "DEFAULT_SITE_PATH",
    "SITE_ENV_VAR",
    "STORAGE_DEFAULTS",
    "check_storage_path",
    "expand_path",
    "read_site_table",
    "site_path",
    "storage_root",
    "user_path",
]

DEFAULT_SITE_PATH = Path("/etc/slurm-bt/site.toml")
SITE_ENV_VAR = "SLURM_BT_SITE_CONFIG"

_DEV_SHARED = "/var/lib/slurm-bt-dev/shared"
_DEV_NODE = "/var/lib/slurm-bt-dev/node/%n"

#: ``[storage]`` defaults; they match the embedded dev cluster (``devcluster/devcluster.py``).
STORAGE_DEFAULTS: Mapping[str, str] = {
    "cluster_cache": f"{_DEV_SHARED}/weights",
    "node_cache": f"{_DEV_NODE}/weights",
    "scratch": f"{_DEV_NODE}/scratch",
    "cache": f"{_DEV_SHARED}/cache",
    "checkpoint_store": f"file://{_DEV_SHARED}/checkpoints",
    "workspace": "{home}/.slurm-bt",
    "runtime": "/dev/shm",
    "secrets": "{home}/.config/slurm-bt/secrets",
}


def check_storage_path(value: str) -> str:
    """The rule for every path-valued storage root: absolute (or ``{home}``-relative), no ``..``.

    Raises:
        ValueError: with the message the site-config error shows.
    """
    if not (value.startswith("/") or value.startswith("{home}")):
        raise ValueError("must be an absolute path (or start with {home})")
    if "\n" in value or "\0" in value or ".." in value.split("/"):
        raise ValueError("must not contain '..', newlines or NUL")
    return value


def site_path(path: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The site file to read and whether it must exist (named explicitly or through the env var)."""
    if path is not None:
        return Path(path), True
    if environ.get(SITE_ENV_VAR):
        return Path(environ[SITE_ENV_VAR]), True
    return DEFAULT_SITE_PATH, False


def read_site_table(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[str, dict[str, Any] | None]:
    """``(source, table)``: the parsed TOML of the site file, or ``None`` when no file is configured.

    Raises:
        SiteConfigError: the file was named but is missing, is unreadable or is not TOML.
    """
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same parser, as a package
        import tomli as tomllib

    env = os.environ if environ is None else environ
    where, required = site_path(path, env)
    source = str(where)
    try:
        raw = where.read_bytes()
    except FileNotFoundError:
        if required:
            raise SiteConfigError(source, [Problem("", "site configuration file not found")]) from None
        return source, None
    except OSError as exc:
        raise SiteConfigError(source, [Problem("", f"cannot read site configuration: {exc.strerror}")]) from exc
    try:
        return source, tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SiteConfigError(source, [Problem("", f"not valid TOML: {exc}")]) from exc


def storage_root(name: str, environ: Mapping[str, str] | None = None) -> str:
    """One path-valued ``[storage]`` root (still a template), validated as the full model would.

    Raises:
        SiteConfigError: the file cannot be read, or this key is not a valid path.
    """
    source, table = read_site_table(environ=environ)
    storage = (table or {}).get("storage", {})
    if not isinstance(storage, dict):
        raise SiteConfigError(source, [Problem("storage", "must be a table")])
    value = storage.get(name, STORAGE_DEFAULTS[name])
    if not isinstance(value, str):
        raise SiteConfigError(source, [Problem(f"storage.{name}", "must be a string")])
    try:
        return check_storage_path(value)
    except ValueError as exc:
        raise SiteConfigError(source, [Problem(f"storage.{name}", str(exc))]) from None


def user_path(template: str) -> str:
    """Expand a storage template for the current user (from passwd by uid, never ``$HOME``)."""
    import pwd

    pw = pwd.getpwuid(os.getuid())
    return expand_path(template, user=pw.pw_name, uid=pw.pw_uid, home=pw.pw_dir)


def expand_path(template: str, *, user: str, uid: int, home: str, node: str | None = None) -> str:
    """Expand ``{user}``, ``{uid}``, ``{home}`` and (on a compute node) ``%n`` in a storage root.

    Why not ``str.format``: a root is admin input and may legitimately contain other braces; only
    these four tokens are substituted.
    """
    out = template.replace("{user}", user).replace("{uid}", str(uid)).replace("{home}", home)
    if node is not None:
        out = out.replace("%n", node)
    return out
