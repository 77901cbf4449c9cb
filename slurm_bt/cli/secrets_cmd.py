"""``slurm-bt secrets``: manage the per-user secret store that ``SecretReference`` names resolve in.

Values are read from stdin (or a hidden prompt on a terminal), never from argv: argv is readable
by every local user through ``/proc/<pid>/cmdline`` (CVE-2020-27746).
Errors are raised as :mod:`slurm_bt.errors` types; the main CLI maps them to messages and exit
codes in one place.

The store used is, in order: ``--store DIR``; a :class:`~slurm_bt.secrets_store.SecretStore`
that the parent command placed in ``ctx.meta[STORE_META_KEY]`` (the main CLI does this from the
site config); :meth:`SecretStore.default`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from slurm_bt.errors import Problem, SecretError
from slurm_bt.secrets_store import MAX_SECRET_BYTES, SecretStore, check_secret_name

__all__ = ["STORE_META_KEY", "secrets_group"]

STORE_META_KEY = "slurm_bt.secret_store"
"""``click.Context.meta`` key under which a parent command may put the SecretStore to use."""


def _store(ctx: click.Context) -> SecretStore:
    store = ctx.find_object(SecretStore)
    if store is not None:
        return store
    meta_store = ctx.meta.get(STORE_META_KEY)
    if isinstance(meta_store, SecretStore):
        return meta_store
    return SecretStore.default()


def _check_name(name: str) -> None:
    """Reject a bad name before the value is read, so nobody types a secret for nothing."""
    why = check_secret_name(name)
    if why is not None:
        raise SecretError("slurm-bt secrets", [Problem("", why)])


def _read_value(name: str) -> str:
    stdin = sys.stdin  # CliRunner swaps it in tests; click.get_text_stream is deprecated in 8.5
    if stdin.isatty():
        value: str = click.prompt(f"Value for secret {name}", hide_input=True, err=True)
        return value
    value = stdin.read(MAX_SECRET_BYTES + 2)  # the store reports an oversized value
    if value.endswith("\r\n"):
        return value[:-2]
    if value.endswith("\n"):
        return value[:-1]
    return value


@click.group("secrets")
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Secret store directory (default: from the site config, else ~/.config/slurm-bt/secrets).",
)
@click.pass_context
def secrets_group(ctx: click.Context, store_dir: Path | None) -> None:
    """Manage your secrets (SecretReference names), resolved on the compute node at run time."""
    if store_dir is not None:
        ctx.obj = SecretStore(store_dir)


@secrets_group.command("set")
@click.argument("name")
@click.pass_context
def set_cmd(ctx: click.Context, name: str) -> None:
    """Store secret NAME; the value is read from stdin (a hidden prompt on a terminal).

    One trailing newline is removed, so `echo "$TOKEN" | slurm-bt secrets set NAME` works.
    """
    _check_name(name)
    store = _store(ctx)
    store.set(name, _read_value(name))
    click.echo(f"Saved secret {name} in {store.root}", err=True)


@secrets_group.command("list")
@click.pass_context
def list_cmd(ctx: click.Context) -> None:
    """Print the names of your secrets, one per line (never their values)."""
    for name in _store(ctx).names():
        click.echo(name)


@secrets_group.command("rm")
@click.argument("name")
@click.pass_context
def rm_cmd(ctx: click.Context, name: str) -> None:
    """Delete secret NAME."""
    _check_name(name)
    store = _store(ctx)
    store.remove(name)
    click.echo(f"Removed secret {name} from {store.root}", err=True)
