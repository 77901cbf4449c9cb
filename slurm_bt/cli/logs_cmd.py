"""``slurm-bt logs JOB``: the batch output and every node's output, each line tagged by its source."""

from __future__ import annotations

import re
from pathlib import Path

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.errors import Problem, UserError

__all__ = ["logs_command"]


def _log_files(job_dir: Path, job_id: str) -> list[tuple[str, Path]]:
    logs = job_dir / "logs"
    out: list[tuple[str, Path]] = []
    batch = logs / f"slurm-{job_id}.out"
    if batch.exists():
        out.append(("batch", batch))
    node_re = re.compile(rf"^slurm-{re.escape(job_id)}\.node(\d+)\.out$")
    nodes = []
    for path in logs.glob(f"slurm-{job_id}.node*.out") if logs.is_dir() else []:
        m = node_re.match(path.name)
        if m:
            nodes.append((int(m.group(1)), path))
    out += [(f"node {rank}", path) for rank, path in sorted(nodes)]
    return out


@click.command(name="logs")
@click.argument("job_id")
@click.option("--node", "node_rank", type=int, default=None, help="Only this node rank's output.")
@click.option("--debug", is_flag=True, help="Show tracebacks for internal errors.")
def logs_command(job_id: str, node_rank: int | None, debug: bool) -> None:
    """Print JOB_ID's output: the batch step, then each node, every line tagged."""
    from slurm_bt.records import read_record
    from slurm_bt.site_settings import load_site_settings, user_path

    with handle_errors("slurm-bt", debug=debug):
        workspace = Path(user_path(load_site_settings().storage.workspace))
        record = read_record(workspace, job_id)
        if record is None:
            raise UserError("slurm-bt", [Problem("JOB_ID", f"job {job_id} was not submitted with slurm-bt "
                                                 f"from this account (no record in {workspace}/records)")])
        files = _log_files(Path(record.job_dir), job_id)
        if node_rank is not None:
            files = [(tag, p) for tag, p in files if tag == f"node {node_rank}"]
        for tag, path in files:
            with path.open("r", errors="replace") as f:
                for line in f:
                    click.echo(f"[{tag}] {line.rstrip(chr(10))}")
