"""Every kind of bad input: exit 2, one line per problem naming file and field, nothing submitted,
nothing left behind. Runs the real ``bt-sbatch`` console script with a recording ``sbatch`` on PATH."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent

HEAD = "from truss_train import definitions\nfrom truss.base import truss_config\n"
OK_JOB = ('definitions.TrainingJob(image=definitions.Image(base_image="x"), '
          'runtime=definitions.Runtime(start_commands=["true"]))')


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    marker = tmp_path / "sbatch-called"
    sbatch = fake_bin / "sbatch"
    sbatch.write_text(f"#!/bin/sh\ntouch {marker}\necho 4242\n")
    sbatch.chmod(0o755)
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\nworkspace = "{tmp_path}/ws"\nsecrets = "{tmp_path}/secrets"\n')
    return {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_BT_SITE_CONFIG": str(site), "HOME": str(tmp_path),
            "LANG": "C.UTF-8"}


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "bt-sbatch"), *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def write(tmp_path: Path, body: str) -> Path:
    (tmp_path / "config.py").write_text(HEAD + textwrap.dedent(body))
    return tmp_path / "config.py"


CASES: dict[str, tuple[str, list[str]]] = {
    "typo": (f"""
        p = definitions.TrainingProject(name="x", job={OK_JOB})
        p.job.runtime.cache_config = definitions.CacheConfig(enable_legacy_hf_cache=True)
        """, ["config.py:", "enable_legacy_hf_cache", "enable_legacy_hf_mount"]),
    "wrong_type": ("""
        p = definitions.TrainingProject(name="x", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x"), compute=definitions.Compute(cpu_count="4")))
        """, ["config.py: Compute.cpu_count: line 5:"]),
    "unknown_accelerator": ("""
        p = definitions.TrainingProject(name="x", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x"),
            compute=definitions.Compute(accelerator=truss_config.AcceleratorSpec(accelerator="H1000"))))
        """, ["config.py: AcceleratorSpec.accelerator: line 6:", "H1000", "H100"]),
    "relative_mount": (f"""
        p = definitions.TrainingProject(name="x", job={OK_JOB})
        p.job.weights = [truss_config.WeightsSource(source="hf://a/b", mount_location="models/x")]
        """, ["config.py:", "mount_location", "absolute"]),
    "dotdot_mount": ("""
        p = definitions.TrainingProject(name="x", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x"),
            weights=[truss_config.WeightsSource(source="hf://a/b", mount_location="/app/../etc")]))
        """, ["config.py: job.weights[0].mount_location:", ".."]),
    "two_projects": (f"""
        a = definitions.TrainingProject(name="a", job={OK_JOB})
        b = definitions.TrainingProject(name="b", job={OK_JOB})
        """, ["config.py:", "Multiple"]),
    "zero_projects": ("x = 1\n", ["config.py:", "No"]),
    "raises_on_import": ("raise RuntimeError('boom from config')\n", ["config.py: line", "boom from config"]),
    "many_problems": ("""
        p = definitions.TrainingProject(name="x", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x"),
            compute=definitions.Compute(node_count=0, cpu_count=0, memory="bogus")))
        """, ["job.compute.node_count", "job.compute.cpu_count", "job.compute.memory"]),
    "validation_error_escapes": ("""
        p = definitions.TrainingProject(name="x", job=definitions.TrainingJob(
            image=definitions.Image(base_image="x"),
            compute={"node_count": "2", "cpu_count": "4", "memory": 2}))
        """, ["config.py: TrainingJob.compute.node_count: line 4:", "TrainingJob.compute.cpu_count: line 4:",
              "TrainingJob.compute.memory: line 4:"]),
    "missing_secret": (f"""
        p = definitions.TrainingProject(name="x", job={OK_JOB})
        p.job.runtime.environment_variables = {{"HF_TOKEN": definitions.SecretReference(name="hf_tok")}}
        """, ["config.py:", "'hf_tok'", "slurm-bt secrets set hf_tok"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_config_exits_2_with_one_line_per_problem(case: str, tmp_path: Path, env: dict[str, str]) -> None:
    body, expected = CASES[case]
    config = write(tmp_path, body)
    proc = run([config.name], env, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    for line in lines:
        assert line.startswith("config.py:"), line
    for fragment in expected:
        assert fragment in proc.stderr, (fragment, proc.stderr)
    assert not (tmp_path / "sbatch-called").exists()
    assert not (tmp_path / "ws").exists() or not any((tmp_path / "ws").rglob("*")), "files left behind"


def test_every_problem_reported_once_each(tmp_path: Path, env: dict[str, str]) -> None:
    config = write(tmp_path, CASES["many_problems"][0])
    proc = run([config.name], env, tmp_path)
    assert len(proc.stderr.strip().splitlines()) == 3, proc.stderr


@pytest.mark.parametrize("content", ["[storage\n", 'bogus_key = 1\n', 'container_runtime = "docker"\n'])
def test_bad_site_file(content: str, tmp_path: Path, env: dict[str, str]) -> None:
    Path(env["SLURM_BT_SITE_CONFIG"]).write_text(content)
    config = write(tmp_path, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name], env, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(env["SLURM_BT_SITE_CONFIG"] + ":"), proc.stderr
    assert not (tmp_path / "sbatch-called").exists()


def test_unreadable_site_file(tmp_path: Path, env: dict[str, str]) -> None:
    env["SLURM_BT_SITE_CONFIG"] = str(tmp_path / "missing.toml")
    config = write(tmp_path, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name], env, tmp_path)
    assert proc.returncode == 2
    assert "missing.toml: site configuration file not found" in proc.stderr


def test_config_is_a_directory(tmp_path: Path, env: dict[str, str]) -> None:
    proc = run([str(tmp_path)], env, tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "not a file" in proc.stderr


def test_good_config_is_submitted_and_prints_job_id(tmp_path: Path, env: dict[str, str]) -> None:
    config = write(tmp_path, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Submitted batch job 4242\n"
    assert (tmp_path / "sbatch-called").exists()
    proc = run(["--parsable", config.name], env, tmp_path)
    assert proc.stdout == "4242\n"


def test_sbatch_failure_exits_1_with_what_failed(tmp_path: Path, env: dict[str, str]) -> None:
    sbatch = Path(env["PATH"].split(":")[0]) / "sbatch"
    sbatch.write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid qos' >&2\nexit 1\n")
    config = write(tmp_path, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name], env, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.startswith("bt-sbatch: error: sbatch failed:") and "Invalid qos" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_umbrella_submit_is_the_same_command(tmp_path: Path, env: dict[str, str]) -> None:
    config = write(tmp_path, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    a = run(["--dry-run", config.name], env, tmp_path)
    b = subprocess.run([str(BIN / "slurm-bt"), "submit", "--dry-run", config.name], env=env, cwd=tmp_path,
                       capture_output=True, text=True)
    assert a.returncode == b.returncode == 0
    def stable(text: str) -> list[str]:  # drop the lines that carry the per-submission id
        return [ln for ln in text.splitlines() if not any(k in ln for k in ("submission", "jobs/", "slurm-bt:"))]

    assert stable(a.stdout) == stable(b.stdout)


def test_json_output(tmp_path: Path, env: dict[str, str]) -> None:
    import json

    config = write(tmp_path, f"p = definitions.TrainingProject(name='x y', job={OK_JOB})\n")
    proc = run(["--json", config.name, "--", "--time=5"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # "x y" is not a safe id: its id is its safe form plus a hash of the exact name (docs/compatibility.md)
    assert out["job_id"] == "4242" and out["project_name"] == "x y" and out["project_id"] == "x-y..887fcea6"
    assert Path(out["job_dir"], "src", "config.py").exists()
    assert Path(out["record"]).exists()


# -- bounds (issue 31, items 2d and 5): a config and its folder are bounded on the shared login node ----


def _site(env: dict[str, str], extra: str) -> None:
    site = Path(env["SLURM_BT_SITE_CONFIG"])
    site.write_text(extra + "\n" + site.read_text())


def _nothing_submitted_or_written(tmp_path: Path) -> None:
    """No sbatch, no job directory (the workspace's own empty folders may exist, as after any submit)."""
    assert not (tmp_path / "sbatch-called").exists()
    left = [p for p in (tmp_path / "ws").rglob("*") if p.is_file() or p.parent.name == "jobs"]
    assert left == [], "files left behind"



def _refused(proc: subprocess.CompletedProcess[str], stderr: str, tmp_path: Path) -> None:
    """Exit 2 with exactly ``stderr``, and nothing submitted or written."""
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == stderr
    _nothing_submitted_or_written(tmp_path)

def test_config_that_never_returns_is_stopped_at_the_site_time_bound(tmp_path: Path, env: dict[str, str]) -> None:
    import time

    _site(env, "[submit]\nconfig_load_timeout_s = 2")
    config = write(tmp_path, f"import time\ntime.sleep(600)\np = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    started = time.monotonic()
    proc = run([config.name], env, tmp_path)
    assert time.monotonic() - started < 30
    _refused(proc, "config.py: took longer than 2 s to load (site [submit] config_load_timeout_s)\n", tmp_path)


def test_config_allocating_too_much_is_stopped_at_the_site_memory_bound(tmp_path: Path, env: dict[str, str]) -> None:
    _site(env, "[submit]\nconfig_load_memory_bytes = 536870912")
    config = write(tmp_path, f"big = bytearray(1024**3)\np = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name], env, tmp_path)
    _refused(proc, ("config.py: used more than 512.0 MiB of memory while loading "
                           "(site [submit] config_load_memory_bytes)\n"), tmp_path)


def test_bounded_config_still_prints_and_reports_its_own_errors(tmp_path: Path, env: dict[str, str]) -> None:
    config = write(tmp_path, f"print('from the config')\np = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name], env, tmp_path)
    assert proc.returncode == 0 and proc.stdout == "from the config\nSubmitted batch job 4242\n", proc.stderr
    config = write(tmp_path, "class Mine:\n    pass\n"
                   "p = definitions.TrainingProject(name='x', job=definitions.TrainingJob(image=definitions.Image("
                   "base_image='x', docker_auth=None), weights=[truss_config.WeightsSource(source='hf://a/b', "
                   "mount_location='/m', odd=Mine())]))\n")
    proc = run(["--dry-run", config.name], env, tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("config.py: the project holds a value"), proc.stderr


def test_snapshot_file_count_is_capped_by_the_site(tmp_path: Path, env: dict[str, str]) -> None:
    _site(env, "max_snapshot_files = 50")
    folder = tmp_path / "proj"
    folder.mkdir()
    for i in range(60):
        (folder / f"f{i}.txt").write_text("x")
    config = write(folder, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([str(config)], env, tmp_path)
    _refused(proc, (f"{config}: the config folder {folder} holds 61 files and directories, over this "
                           "site's limit of 50 (max_snapshot_files); use exclude_dirs or a .truss_ignore file to "
                           "leave some out\n"), tmp_path)


def test_retries_above_the_site_ceiling_are_refused(tmp_path: Path, env: dict[str, str]) -> None:
    config = write(tmp_path, f"""
        p = definitions.TrainingProject(name="x", job={OK_JOB})
        p.job.runtime.environment_variables = {{"BT_RETRY_ON_FAILURE": "50"}}
        """)
    proc = run([config.name], env, tmp_path)
    _refused(proc, ("config.py: job.runtime.environment_variables.BT_RETRY_ON_FAILURE: 50 is above this "
                           "site's ceiling of 10 ([restarts] ceiling in the site file)\n"), tmp_path)


def test_pass_through_signal_follows_the_stop_signal_rule(tmp_path: Path, env: dict[str, str]) -> None:
    config = write(tmp_path, f"p = definitions.TrainingProject(name='x', job={OK_JOB})\n")
    proc = run([config.name, "--", "--signal=USR1@10"], env, tmp_path)
    _refused(proc, ("bt-sbatch: --signal: 'USR1@10' is not allowed: the signal must be one of TERM, INT, "
                           "HUP, USR2, QUIT, as for the stop signal (never USR1: NCCL and several launchers use "
                           "it)\n"), tmp_path)
    proc = run([config.name, "--", "--signal=B:USR2@30"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
