"""Interactive sessions: ``slurm-bt ssh JOB [--node N]`` and ``slurm-bt train isession --job-id JOB``.

Upstream's ``InteractiveSession`` opens a VS Code/Cursor tunnel into the training container; here a
session is a shell inside the running job on one of its nodes: a new job step
(``srun --jobid --overlap --pty``, :mod:`slurm_bt.slurm.srun`), inside the job's container when it
has one, with the start commands' ``BT_*`` environment (:mod:`slurm_bt.render.session`). The
config's trigger decides *when* the job offers it (docs/cli.md §Interactive sessions):

* ``on_startup``: the batch script prints this command into the job's log as the start commands begin;
* ``on_failure``: when the start commands fail, the job keeps its allocation ``timeout_minutes``
  (printing this command) so you can attach, then ends as failed;
* ``on_demand`` (and jobs without an ``interactive_session``): attach whenever the job runs.

Only your own jobs (your submission records) can be attached to, and Slurm itself lets ``srun
--jobid`` into a job only for its owner. With ``--host`` the same command runs on the login node
through an SSH channel with a pseudo-terminal (:mod:`slurm_bt.remote.interactive`).
"""

from __future__ import annotations

import sys

import click

from slurm_bt.cli import options
from slurm_bt.cli.errors import handle_errors
from slurm_bt.cli.options import host_options, load_records
from slurm_bt.errors import Problem, RuntimeFailure, UserError

__all__ = ["isession_command", "ssh_command"]


def _pick_node(nodes: list[str], node: str | None) -> tuple[str, int]:
    """``--node``: a rank (0 = leader) or one of the job's node names; default the leader."""
    if node is None:
        return nodes[0], 0
    if node.isdigit():
        rank = int(node)
        if rank >= len(nodes):
            raise UserError("--node", [Problem("--node", f"rank {rank} is out of range: the job has "
                                                          f"{len(nodes)} node(s), ranks 0..{len(nodes) - 1}")])
        return nodes[rank], rank
    if node in nodes:
        return node, nodes.index(node)
    raise UserError("--node", [Problem("--node", f"{node!r} is not a node of this job "
                                                  f"(its nodes: {', '.join(nodes)})")])


def attach_local(job_id: str, node: str | None, command: str | None) -> int:
    """Open the session on this machine (a login node); returns the shell's exit status.

    Raises:
        UserError: not your job (no submission record), or a bad ``--node``.
        RuntimeFailure: the job is not running, or its ``job.json`` cannot be read.
        SlurmCommandError: squeue/scontrol/srun failed.
    """
    from slurm_bt.job_spec import read_job_spec
    from slurm_bt.render.session import session_command
    from slurm_bt.slurm.srun import attach_env, build_attach_argv, run_attached

    record = load_records([job_id]).get(job_id)
    if record is None:
        raise UserError(job_id, [Problem("job", f"no submission record for job {job_id} in your workspace: "
                                                "you can open a session only in your own slurm-bt jobs")])
    try:
        spec = read_job_spec(f"{record.job_dir}/job.json")
    except (OSError, ValueError) as exc:
        raise RuntimeFailure(f"job {job_id}: cannot read {record.job_dir}/job.json: {exc}") from exc
    client = options.make_client()
    rows = [r for r in client.live([job_id]) if not r.is_step and str(r.job_id) == job_id]
    if not rows:
        raise RuntimeFailure(f"job {job_id} is not running (Slurm no longer lists it): "
                             f"see `slurm-bt status {job_id}`")
    row = rows[0]
    if row.state != "RUNNING" or not row.node_list:
        why = f" ({row.reason})" if row.reason else ""
        raise RuntimeFailure(f"job {job_id} is {row.state or 'not running'}{why}: a session can be opened "
                             "only while it runs")
    name, rank = _pick_node(client.hostnames(row.node_list), node)
    session = session_command(spec, job_id, name, rank, command)
    # A pty only for a terminal: piped input (a script feeding the shell) must stay a plain stream.
    argv = build_attach_argv(job_id, name, session.command, pty=sys.stdin.isatty(),
                             time_limit_min=session.time_limit_min, container_args=session.container_args)
    if command is None:
        click.echo(f"slurm-bt: opening a shell in job {job_id} on {name} (rank {rank}); `exit` to leave",
                   err=True)
    return run_attached(argv, env={**attach_env(), **dict(session.srun_env)})


def _attach(job_id: str, node: str | None, command: str | None, host: str | None, accept_new: bool,
            debug: bool) -> None:
    from slurm_bt.jobs.lifecycle import check_job_ids

    with handle_errors("slurm-bt", debug=debug):
        [job_id] = check_job_ids([job_id])
        if host is not None:
            from slurm_bt.remote.interactive import run_interactive

            argv = ["ssh", job_id]
            if node is not None:
                argv += ["--node", node]
            if command is not None:
                argv += ["--command", command]
            code = run_interactive(host, argv, accept_new_host_key=accept_new)
        else:
            code = attach_local(job_id, node, command)
    raise SystemExit(code)


_NODE_HELP = "Node to open the shell on: its rank (0 = the leader, the default) or its name."
_COMMAND_HELP = "Run this one command (bash -c) in the job's environment instead of an interactive shell."


@click.command(name="ssh")
@click.argument("job_id")
@click.option("--node", default=None, metavar="N", help=_NODE_HELP)
@click.option("--command", default=None, metavar="CMD", help=_COMMAND_HELP)
@host_options
def ssh_command(job_id: str, node: str | None, command: str | None, host: str | None,
                accept_new_host_key: bool, debug: bool) -> None:
    """Open a shell inside running job JOB_ID on one of its nodes (in its container, with its BT_* env)."""
    _attach(job_id, node, command, host, accept_new_host_key, debug)


@click.command(name="isession")
@click.option("--job-id", "job_id", required=True, help="The running training job.")
@click.option("--node", default=None, metavar="N", help=_NODE_HELP)
@click.option("--command", default=None, metavar="CMD", help=_COMMAND_HELP)
@click.option("--remote", default=None, metavar="NAME", hidden=True,
              help="Accepted for truss compatibility: this cluster only.")
@click.option("--update-timeout", "update_timeout", type=int, default=None, hidden=True)
@click.option("--update-trigger", "update_trigger", default=None, hidden=True)
@host_options
def isession_command(job_id: str, node: str | None, command: str | None, remote: str | None,
                     update_timeout: int | None, update_trigger: str | None, host: str | None,
                     accept_new_host_key: bool, debug: bool) -> None:
    """Interactive session: a shell inside the running job (truss train isession; here srun --pty)."""
    if update_timeout is not None or update_trigger is not None:
        # Upstream patches a hosted session; here trigger and hold are part of the submitted batch script.
        with handle_errors("slurm-bt", debug=debug):
            raise UserError("isession", [Problem(
                "--update-timeout/--update-trigger",
                "a running job's session settings cannot change on Slurm: they are fixed in its batch script "
                "at submission; set InteractiveSession in the config (or `slurm-bt train push --interactive`)")])
    _attach(job_id, node, command, host, accept_new_host_key, debug)
