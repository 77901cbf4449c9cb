"""``bt-sbatch`` / ``slurm-bt submit``: submit a truss_train-style config.py as a Slurm job."""

from __future__ import annotations

import json

import click

from slurm_bt.cli.errors import handle_errors

__all__ = ["submit_command"]


def _submit_remote(config: str, sbatch_args: tuple[str, ...], host: str, accept_new: bool, parsable: bool,
                   as_json: bool, debug: bool) -> None:
    """Submit on a login node over SSH; the remote ``bt-sbatch --json`` does the work."""
    import sys

    from slurm_bt.remote.commands import submit_remote

    with handle_errors("bt-sbatch", debug=debug):
        outcome = submit_remote(config, host, sbatch_args=sbatch_args, accept_new_host_key=accept_new)
    if outcome.stderr:
        sys.stderr.write(outcome.stderr)
    data = outcome.json()
    if outcome.returncode != 0 or not isinstance(data, dict):
        raise SystemExit(outcome.returncode or 1)
    if as_json:
        click.echo(json.dumps(data, indent=2))
    elif parsable:
        click.echo(data.get("job_id"))
    else:
        click.echo(f"Submitted batch job {data.get('job_id')} on {host}")


def _submit(config: str, sbatch_args: tuple[str, ...], dry_run: bool, parsable: bool, as_json: bool,
            debug: bool, host: str | None = None, accept_new: bool = False) -> None:
    from slurm_bt.api import training_job_dict
    from slurm_bt.submit import submit_config

    if host is not None and not dry_run:
        _submit_remote(config, sbatch_args, host, accept_new, parsable, as_json, debug)
        return
    with handle_errors("bt-sbatch", debug=debug):
        result = submit_config(config, sbatch_args=sbatch_args, dry_run=dry_run)
    for warning in result.warnings:
        click.echo(f"bt-sbatch: warning: {warning}", err=True)
    pin = result.spec.image_pin
    if pin is not None and not parsable and not as_json:  # the job runs this digest even if the tag moves
        click.echo(f"bt-sbatch: image {pin.reference} pinned to {pin.resolved}", err=True)
    if dry_run:
        click.echo(result.script, nl=False)
    elif as_json:
        click.echo(json.dumps({**result.as_dict(), "training_job": training_job_dict(result)}, indent=2))
    elif parsable:
        click.echo(result.job_id)
    else:
        click.echo(f"Submitted batch job {result.job_id}")


def _make(name: str) -> click.Command:
    @click.command(name=name, context_settings={"help_option_names": ["-h", "--help"]})
    @click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing (no Slurm needed).")
    @click.option("--parsable", is_flag=True, help="Print only the job id, like sbatch --parsable.")
    @click.option("--json", "as_json", is_flag=True, help="Print a JSON summary of the submission.")
    @click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
    @click.option("--host", default=None, metavar="HOST",
                  help="Submit on this login node over SSH (ssh config alias, user@host[:port]).")
    @click.option("--accept-new-host-key", is_flag=True,
                  help="With --host: add an unknown host key to ~/.ssh/known_hosts instead of refusing.")
    @click.argument("config", type=click.Path(dir_okay=True))
    @click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
    def command(config: str, sbatch_args: tuple[str, ...], dry_run: bool, parsable: bool, as_json: bool,
                debug: bool, host: str | None, accept_new_host_key: bool) -> None:
        """Submit CONFIG (a truss_train config.py); arguments after `--` go to sbatch."""
        _submit(config, sbatch_args, dry_run, parsable, as_json, debug, host, accept_new_host_key)

    return command


submit_command = _make("submit")
bt_sbatch_command = _make("bt-sbatch")
