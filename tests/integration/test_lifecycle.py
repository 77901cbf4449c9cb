"""Lifecycle, logs and degraded status on the real dev cluster, through the real console scripts.

Time budget: the TIMEOUT job (``--time=1``) needs 60-100 s whatever we do, so every other lifecycle
case runs *while* it runs, in one test. The other tests take ~20-40 s each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(2)]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))


def _config(folder: Path, name: str, commands: list[str], nodes: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import definitions
        project = definitions.TrainingProject(name={name!r}, job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(node_count={nodes}, cpu_count=1, memory="256Mi"),
            runtime=definitions.Runtime(start_commands={commands!r}),
        ))
        """))
    return folder / "config.py"


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _submit(config: Path, *sbatch: str) -> str:
    args = [str(BIN / "bt-sbatch"), "--parsable", str(config)]
    if sbatch:
        args += ["--", *sbatch]
    sub = _run(args)
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip()


def _status(*job_ids: str, extra: tuple[str, ...] = ()) -> list[dict[str, object]]:
    st = _run([str(BIN / "slurm-bt"), "status", *job_ids, "--json", *extra], timeout=300)
    assert st.returncode == 0, st.stderr
    rows = json.loads(st.stdout)
    assert isinstance(rows, list)
    return rows


def _wait_for(job_id: str, pred: object, timeout_s: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    last: dict[str, object] = {}
    while time.monotonic() < deadline:
        last = _status(job_id)[0]
        if pred(last):  # type: ignore[operator]
            return last
        time.sleep(1)
    raise AssertionError(f"job {job_id} never reached the expected state; last: {last}")


def test_lifecycle_states(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    """Complete, exit 3, cancelled, timeout and requeued jobs, each with the right state and detail."""
    sleeper = _config(tmp_path / "sleep", "lc-sleep", ["sleep 300"])
    timeout_job = _submit(sleeper, "--time=1")
    ok = _submit(_config(tmp_path / "ok", "lc-ok", ["echo done"]))
    # Right after sbatch slurmdbd may not know the job yet: squeue answers, never "UNKNOWN".
    first = _status(ok)[0]
    assert str(first["current_status"]).startswith("TRAINING_JOB_"), first
    failing = _submit(_config(tmp_path / "fail", "lc-fail", ["echo before", "exit 3"]))
    cancelled = _submit(sleeper)
    requeued = _submit(sleeper, "--requeue")

    running = lambda d: d["current_status"] == "TRAINING_JOB_RUNNING"  # noqa: E731
    _wait_for(cancelled, running)
    stop = _run([str(BIN / "slurm-bt"), "stop", cancelled, "--json"])
    assert stop.returncode == 0, stop.stderr
    [stopped] = json.loads(stop.stdout)
    assert stopped["current_status"] == "TRAINING_JOB_STOPPED" and stopped["stopped"] is True
    assert str(stopped["detail"]).startswith("CANCELLED")

    _wait_for(requeued, running)
    rq = _run(["scontrol", "requeue", requeued])
    assert rq.returncode == 0, rq.stderr
    after = _wait_for(requeued, lambda d: "requeued 1 time" in str(d["detail"]))
    assert after["current_status"] == "TRAINING_JOB_PENDING", after
    assert str(after["detail"]).startswith("PENDING (BeginTime)"), after
    assert after["restarts"] == 1
    _run([str(BIN / "slurm-bt"), "stop", requeued])

    done = {d["id"]: d for d in _status(ok, failing, cancelled, extra=("--wait", "--timeout", "60"))}
    assert done[ok]["current_status"] == "TRAINING_JOB_COMPLETED" and done[ok]["detail"] == "COMPLETED"
    assert done[failing]["current_status"] == "TRAINING_JOB_FAILED"
    assert done[failing]["detail"] == "FAILED; exit code 3:0" and done[failing]["exit_code"] == [3, 0]
    assert done[cancelled]["current_status"] == "TRAINING_JOB_STOPPED"

    [to] = _status(timeout_job, extra=("--wait", "--timeout", "180"))
    assert to["current_status"] == "TRAINING_JOB_FAILED", to
    assert str(to["detail"]).startswith("TIMEOUT"), to

    # The human table shows the same, with Slurm's words.
    table = _run([str(BIN / "slurm-bt"), "view", failing, timeout_job]).stdout
    assert "TRAINING_JOB_FAILED" in table and "exit code 3:0" in table and "TIMEOUT" in table


def _reader(proc: subprocess.Popen[str], lines: list[tuple[float, str]]) -> threading.Thread:
    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def test_logs_follow_shows_both_nodes_as_they_print(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    script = "for i in 1 2 3 4 5 6; do echo \"slow $i rank $BT_NODE_RANK\"; sleep 2; done"
    job = _submit(_config(tmp_path / "follow", "lc-follow", [script], nodes=2))
    proc = subprocess.Popen([str(BIN / "slurm-bt"), "logs", job, "--follow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    t = _reader(proc, lines)
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    t.join(5)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    text = [line for _, line in lines]
    for rank in (0, 1):
        got = [line for line in text if line.startswith(f"[node {rank}] slow ")]
        assert got == [f"[node {rank}] slow {i} rank {rank}" for i in range(1, 7)], text
    # Lines arrived as they were printed (spread over ~10 s), not all at once at the end.
    times = [ts for ts, line in lines if " slow " in line]
    assert times[-1] - times[0] >= 6, lines


@pytest.fixture()
def slurmdbd_restored(dev_cluster: dict[str, object]) -> Iterator[int]:
    """The running slurmdbd's pid; whatever happens, the cluster is brought back up afterwards."""
    pid_file = STATE / "run" / "slurm" / "slurmdbd.pid"
    if os.geteuid() != 0 or not pid_file.exists():
        pytest.skip("needs root and the dev cluster's slurmdbd pid file")
    pid = int(pid_file.read_text().split()[0])
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"slurmdbd")
    try:
        yield pid
    finally:
        up = subprocess.run(["/usr/bin/python3", str(REPO / "devcluster" / "devcluster.py"), "up"],
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stdout + up.stderr


@pytest.mark.whole_cluster  # stops slurmdbd
def test_status_with_slurmdbd_stopped_names_it_and_shows_live_jobs(
    dev_cluster: dict[str, object], tmp_path: Path, slurmdbd_restored: int
) -> None:
    job = _submit(_config(tmp_path / "dbd", "lc-dbd", ["sleep 120"]))
    try:
        _wait_for(job, lambda d: d["current_status"] == "TRAINING_JOB_RUNNING")
        os.kill(slurmdbd_restored, 15)
        for _ in range(50):
            try:  # it may exit between any two reads (a race seen on 24.11): gone or a zombie means stopped
                stat = Path(f"/proc/{slurmdbd_restored}/stat").read_bytes()
            except FileNotFoundError:
                break
            if b"Z" in stat.split(b")")[-1][:3]:
                break
            time.sleep(0.1)
        st = _run([str(BIN / "slurm-bt"), "status", job])
        assert st.returncode == 1, (st.stdout, st.stderr)
        assert "slurmdbd" in st.stderr and "error" in st.stderr
        assert job in st.stdout and "TRAINING_JOB_RUNNING" in st.stdout
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def test_project_status_runs_without_heavy_imports(dev_cluster: dict[str, object], tmp_path: Path) -> None:
    """``status --project`` answers from records + one sacct call without importing pydantic or storage clients.

    Why it matters: the status benchmark compares it with the raw sacct call, and pydantic's import
    alone used to cost more than that call.
    """
    from slurm_bt.records import SubmissionRecord, write_record

    job = subprocess.run(["sbatch", "--parsable", "--hold", "-J", "light", "-o", "/dev/null", "--wrap", "true"],
                         capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    try:
        site = tmp_path / "site.toml"
        site.write_text(f'[storage]\nworkspace = "{tmp_path}/ws"\n')
        write_record(tmp_path / "ws", SubmissionRecord(
            job_id=job, project_name="light", project_id="light", job_name="light", submit_id="s",
            job_dir=str(tmp_path / "job"), config_path="/c/config.py", submitted_at="2026-01-01", user="root"))
        code = textwrap.dedent("""
            import sys
            from slurm_bt.cli.main import cli
            try:
                cli(["status", "--project", "light", "--json"], prog_name="slurm-bt")
            except SystemExit as exc:
                assert not exc.code, exc.code
            heavy = {"pydantic", "boto3", "botocore", "paramiko", "huggingface_hub", "fsspec", "ctypes"}
            print("HEAVY", sorted(m for m in sys.modules if m.split(".")[0] in heavy), file=sys.stderr)
            """)
        env = {**os.environ, "SLURM_BT_SITE_CONFIG": str(site)}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)
        assert [(r["id"], r["current_status"], r["training_project"]["name"]) for r in rows] == [
            (job, "TRAINING_JOB_PENDING", "light")
        ]
        assert "HEAVY []" in proc.stderr, proc.stderr
    finally:
        subprocess.run(["scancel", job], capture_output=True)
