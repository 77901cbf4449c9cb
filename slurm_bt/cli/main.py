"""Console entry points: ``slurm-bt`` (umbrella, truss-train-like verbs) and ``bt-sbatch``.

Subcommands are imported only when invoked (:class:`LazyGroup`): ``slurm-bt status`` is often run in
loops and by scripts, and should cost little more than the ``sacct`` call it wraps, so it must not
pay for importing the weights, checkpoint or SSH code it never uses.
"""

from __future__ import annotations

import importlib

import click

__all__ = ["bt_sbatch", "cli"]

# name -> "module:attribute"; the order is the order of `slurm-bt --help`.
COMMANDS: dict[str, str] = {
    "submit": "slurm_bt.cli.submit_cmd:submit_command",
    "run": "slurm_bt.cli.run_cmd:run_command",
    "status": "slurm_bt.cli.status_cmd:status_command",
    "view": "slurm_bt.cli.status_cmd:status_command",  # truss train's name for it
    "list": "slurm_bt.cli.status_cmd:list_command",
    "logs": "slurm_bt.cli.logs_cmd:logs_command",
    "stop": "slurm_bt.cli.stop_cmd:stop_command",
    "metrics": "slurm_bt.cli.metrics_cmd:metrics_command",
    "ssh": "slurm_bt.cli.isession_cmd:ssh_command",
    "checkpoints": "slurm_bt.cli.checkpoints_cmd:checkpoints_group",
    "cache": "slurm_bt.cli.cache_cmd:cache_group",
    "secrets": "slurm_bt.cli.secrets_cmd:secrets_group",
    "admin": "slurm_bt.cli.admin_cmd:admin_group",
    "train": "slurm_bt.cli.train_cmd:train_group",  # truss train's verbs and flags (docs/cli.md)
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, _, attr = target.partition(":")
        command = getattr(importlib.import_module(module), attr)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="slurm-bt")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """slurm-bt: Baseten-style training jobs (truss_train configs) on Slurm."""
    if ctx.invoked_subcommand == "secrets":
        from pathlib import Path

        from slurm_bt.cli.errors import handle_errors
        from slurm_bt.cli.secrets_cmd import STORE_META_KEY
        from slurm_bt.secrets_store import SecretStore
        from slurm_bt.site.settings import load_site_settings, user_path

        with handle_errors("slurm-bt"):
            ctx.meta[STORE_META_KEY] = SecretStore(Path(user_path(load_site_settings().storage.secrets)))


def bt_sbatch() -> None:
    """``bt-sbatch X`` behaves exactly as ``slurm-bt submit X``."""
    from slurm_bt.cli.submit_cmd import bt_sbatch_command

    bt_sbatch_command(prog_name="bt-sbatch")
