"""Step-usage parsing (recorded 22.05 sacct/sstat output, fuzzed input) and the metrics summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_bt.cli import options
from slurm_bt.cli.main import cli
from slurm_bt.jobs.metrics import Metrics, bar, collect_metrics, render_metrics, sparkline
from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.runner import CommandResult
from slurm_bt.slurm.sacct import SACCT_USAGE_FIELDS, build_sacct_usage_argv, parse_sacct, parse_usage
from slurm_bt.slurm.sstat import SSTAT_FIELDS, build_sstat_argv
from slurm_bt.slurm.values import parse_tres_usage
from slurm_bt.units import format_bytes
from tests.fakes.fake_slurm import FakeSlurm, RecordedCall

DATA = Path(__file__).resolve().parents[1] / "data" / "sacct"


def test_sacct_usage_recording() -> None:
    rows = parse_usage((DATA / "2205_usage_sacct.txt").read_text(), SACCT_USAGE_FIELDS)
    assert rows.skipped == 0
    by = {str(r.job_id): r for r in rows}
    assert set(by) == {"67.batch", "67.extern", "67.0"}  # the allocation row carries no usage
    step = by["67.0"]
    assert step.state == "COMPLETED" and step.nnodes == 2 and step.ntasks == 2 and step.node_list == "n[1-2]"
    assert step.total_cpu_s == pytest.approx(16.358)
    assert step.max_rss_bytes == 119009280 and step.max_rss_node == "n1"
    assert step.usage_max["mem"] == 119009280 and step.usage_tot["cpu"] == 11
    assert step.usage_max_node == {"cpu": "n2", "energy": "n2", "fs/disk": "n2", "mem": "n1", "pages": "n2",
                                   "vmem": "n2"}
    assert step.alloc_tres["gres/gpu"] == 2


def test_sstat_recordings_with_and_without_noconvert() -> None:
    raw = parse_usage((DATA / "2205_usage_sstat.txt").read_text(), SSTAT_FIELDS, source="sstat")
    conv = parse_usage((DATA / "2205_usage_sstat_converted.txt").read_text(), SSTAT_FIELDS, source="sstat")
    assert [str(r.job_id) for r in raw] == ["67.extern", "67.batch", "67.0"] and raw.skipped == 0
    step_raw, step_conv = raw[2], conv[2]
    assert step_raw.usage_tot["cpu"] == 9 and step_raw.usage_max["mem"] == 119009280
    assert step_conv.usage_max["mem"] == 116220 * 1024  # "116220K"
    assert step_raw.source == "sstat" and step_raw.max_rss_node == "n1"


def test_usage_does_not_disturb_status_recordings() -> None:
    # The status parser still reads the status recordings; usage rows are a separate query.
    assert parse_sacct((DATA / "2205_basic.txt").read_text()).skipped == 0


def test_tres_usage_values() -> None:
    assert parse_tres_usage("cpu=1-00:00:01,mem=1.5G,gres/gpuutil=87,gres/gpumem=2000M,bad,x=,y=z") == {
        "cpu": 86401.0, "mem": 1.5 * 1024**3, "gres/gpuutil": 87.0, "gres/gpumem": 2000 * 1024**2}


def test_argv_builders() -> None:
    argv = build_sacct_usage_argv(["12"])
    assert argv[:4] == ["sacct", "--parsable2", "--noheader", "--noconvert"] and argv[-1] == "--jobs=12"
    assert "--allocations" not in argv  # steps are the point
    assert build_sstat_argv(["12"], delimiter="\x1f")[:2] == ["sstat", "--allsteps"]
    with pytest.raises(ValueError):
        build_sstat_argv(["-a"])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("0123456789.|:=,-_KMGnbatchextern \n\x1f")), max_size=400))
def test_usage_parser_never_raises(blob: str) -> None:
    for fields in (SACCT_USAGE_FIELDS, SSTAT_FIELDS):
        rows = parse_usage(blob, fields)
        assert rows.skipped >= 0
    parse_tres_usage(blob)


def test_sparkline_and_bar() -> None:
    assert sparkline([]) == "" and sparkline([1, 1]) == "▁▁"
    assert sparkline([0, 50, 100], lo=0, hi=100) == "▁▅█"
    assert bar(0.5, 10) == "█████░░░░░" and bar(7, 4) == "████" and bar(-1, 2) == "░░"
    assert format_bytes(None) == "-" and format_bytes(1536) == "1.5 KiB" and format_bytes(3) == "3 B"


def test_collect_metrics_running_job_uses_sstat() -> None:
    slurm = FakeSlurm(first_job_id=67)
    client = SlurmClient(slurm, sleep=lambda s: None)
    client.submit("#!/bin/sh\n#SBATCH --nodes=2\n")
    slurm.set_state("67", "RUNNING")
    # The client asks for the unit-separator delimiter; the recordings use "|".
    sacct_usage = (DATA / "2205_usage_sacct.txt").read_text().replace("|", "\x1f")
    sstat = (DATA / "2205_usage_sstat.txt").read_text().replace("|", "\x1f")
    real_sacct = slurm._sacct

    def sacct(call: RecordedCall) -> CommandResult:
        if "TotalCPU" in " ".join(call.argv):
            return CommandResult(call.argv, 0, sacct_usage, "")
        return real_sacct(call)

    slurm.handle("sacct", sacct)
    slurm.handle("sstat", lambda call: CommandResult(call.argv, 0, sstat, ""))
    row = next(r for r in client.query(["67"]) if not r.is_step)
    m = collect_metrics(client, "67", row)
    assert m.live and m.alloc_cpus == 2 and m.nnodes == 2
    assert m.cpu_used_s == pytest.approx(9.0)  # sstat's fresher numbers win for running steps
    assert m.peak_rss_bytes == 119009280 and m.peak_rss_node == "n1"
    text = "\n".join(render_metrics(m))
    assert "CPU" in text and "Memory  peak 113.5 MiB on n1" in text and "67.0" in text
    history = [Metrics("67", "RUNNING", 10, 2, 2, cpu_used_s=0.0, peak_rss_bytes=1),
               Metrics("67", "RUNNING", 20, 2, 2, cpu_used_s=10.0, peak_rss_bytes=5),
               Metrics("67", "RUNNING", 30, 2, 2, cpu_used_s=30.0, peak_rss_bytes=9)]
    spark = "\n".join(render_metrics(history[-1], history))
    assert "CPU %   ▅█  now 100%" in spark and "Memory  ▂▅█" in spark


def test_metrics_gpu_accounting_absent_is_said(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slurm = FakeSlurm()
    client = SlurmClient(slurm, sleep=lambda s: None)
    job = client.submit("#!/bin/sh\n#SBATCH --gres=gpu:h100:4\n")
    slurm.finish(job)
    monkeypatch.setattr(options, "make_client", lambda: client)
    res = CliRunner().invoke(cli, ["metrics", job])
    assert res.exit_code == 0, res.output
    assert "GPUs    4 allocated" in res.output and "not accounted" in res.output
    res = CliRunner().invoke(cli, ["metrics", job, "--json"])
    assert json.loads(res.output)["gpus"] == 4
    assert CliRunner().invoke(cli, ["metrics", "555"]).exit_code == 1  # unknown to Slurm: runtime failure
