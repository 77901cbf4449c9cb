"""Console entry points: ``slurm-bt`` (umbrella, truss-train-like verbs) and ``bt-sbatch``."""

from __future__ import annotations

import click

from slurm_bt.cli.logs_cmd import logs_command
from slurm_bt.cli.secrets_cmd import STORE_META_KEY, secrets_group
from slurm_bt.cli.status_cmd import status_command
from slurm_bt.cli.submit_cmd import bt_sbatch_command, submit_command

__all__ = ["bt_sbatch", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-bt")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """slurm-bt: Baseten-style training jobs (truss_train configs) on Slurm."""
    if ctx.invoked_subcommand == "secrets":
        from pathlib import Path

        from slurm_bt.cli.errors import handle_errors
        from slurm_bt.secrets_store import SecretStore
        from slurm_bt.site_settings import load_site_settings, user_path

        with handle_errors("slurm-bt"):
            ctx.meta[STORE_META_KEY] = SecretStore(Path(user_path(load_site_settings().storage.secrets)))


cli.add_command(submit_command)
cli.add_command(secrets_group)
cli.add_command(status_command)
cli.add_command(logs_command)


def bt_sbatch() -> None:
    """``bt-sbatch X`` behaves exactly as ``slurm-bt submit X``."""
    bt_sbatch_command(prog_name="bt-sbatch")
