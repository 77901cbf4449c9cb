"""push() applies every check bt-sbatch applies; `slurm-bt run SCRIPT` runs an upstream-style script.

The scripts run in a real `slurm-bt` process with a fake `sbatch` on PATH (it prints a job id and
leaves a marker), so the import shim and the push registration are exercised as a user gets them.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_bt.compat import definitions as d
from slurm_bt.compat import truss_config as tc
from slurm_bt.errors import ConfigError

BIN = Path(sys.executable).parent


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    sbatch = fake_bin / "sbatch"
    sbatch.write_text(f"#!/bin/sh\ncat > {tmp_path}/sbatch-stdin\necho 4242\n")
    sbatch.chmod(0o755)
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\nworkspace = "{tmp_path}/ws"\nsecrets = "{tmp_path}/secrets"\n')
    return {"PATH": f"{fake_bin}:/usr/bin:/bin", "SLURM_BT_SITE_CONFIG": str(site), "HOME": str(tmp_path),
            "LANG": "C.UTF-8"}


def _job(**kwargs: object) -> d.TrainingJob:
    return d.TrainingJob(image=d.Image(base_image="x"), runtime=d.Runtime(start_commands=["true"]), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("job", "loc", "fragment"), [
    (lambda: _job(compute=d.Compute(node_count=0)), "job.compute.node_count", "must be at least 1"),
    (lambda: _job(weights=[tc.WeightsSource(source="hf://a/b", mount_location="/etc/cron.d")]),
     "job.weights[0].mount_location", "under the system directory /etc"),
    (lambda: _job(compute=d.Compute(memory="lots")), "job.compute.memory", "is not a number"),
])
def test_push_of_a_project_object_applies_the_cli_checks(job, loc: str, fragment: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_bt.api import push

    monkeypatch.setenv("SLURM_BT_SITE_CONFIG", env["SLURM_BT_SITE_CONFIG"])
    monkeypatch.setenv("PATH", env["PATH"])
    with pytest.raises(ConfigError) as exc:
        push(d.TrainingProject(name="p", job=job()), source_dir=tmp_path)
    [problem] = exc.value.problems
    assert problem.loc == loc and fragment in problem.message and "stricter" in problem.message
    assert not (tmp_path / "sbatch-stdin").exists() and not (tmp_path / "ws").exists()


def _run(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "slurm-bt"), "run", str(script), *args], env=env, cwd=script.parent,
                          capture_output=True, text=True, timeout=120)


SCRIPT = '''
import sys
from pathlib import Path
from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject, push
from truss.base.truss_config import AcceleratorSpec

def main(name: str) -> None:
    job = TrainingJob(image=Image(base_image="python:3.11"), compute=Compute(node_count=NODES),
                      runtime=Runtime(start_commands=["python train.py"]))
    result = push(TrainingProject(name=name, job=job), source_dir=Path(__file__).parent)
    print("job", result["id"], result["training_project"]["name"], "job_object" in result)

if __name__ == "__main__":
    main(sys.argv[1])
'''


def test_run_submits_an_upstream_style_script(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT.replace("NODES", "1"))
    proc = _run(script, env, "from-argv")
    assert proc.returncode == 0, proc.stderr
    # upstream's push(project) answer has no job_object (only push(Path) adds it)
    assert proc.stdout.strip().splitlines()[-1] == "job 4242 from-argv False"
    assert (tmp_path / "sbatch-stdin").read_text().startswith("#!/bin/bash")
    [job_json] = list((tmp_path / "ws").rglob("job.json"))
    assert "python train.py" in job_json.read_text()
    [snapshot] = list((tmp_path / "ws").rglob("src/train.py"))
    assert snapshot.read_text() == "print('training')\n"


def test_run_reports_a_rejected_project_like_bt_sbatch(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "launch.py"
    script.write_text(SCRIPT.replace("NODES", "0"))
    proc = _run(script, env, "x")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("push: job.compute.node_count: must be at least 1, got 0 "
                                   "(slurm-bt is stricter than truss here)")
    assert "Traceback" not in proc.stderr and not (tmp_path / "sbatch-stdin").exists()


def test_run_shows_the_scripts_own_error_as_python_would(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "boom.py"
    script.write_text(textwrap.dedent("""
        from truss_train import Compute
        from pydantic import ValidationError
        try:
            Compute(node_count="two")
        except ValidationError:
            print("fallback ran")
        raise RuntimeError("the script's own bug")
        """))
    proc = _run(script, env)
    assert proc.returncode == 1
    assert proc.stdout == "fallback ran\n"
    assert "Traceback" in proc.stderr and 'boom.py", line 8' in proc.stderr
    assert proc.stderr.strip().endswith("RuntimeError: the script's own bug")
    assert "runpy" not in proc.stderr and "run_cmd" not in proc.stderr


def test_run_passes_exit_status_and_argv(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "argv.py"
    script.write_text("import sys\nprint(sys.argv, __name__, sys.modules['__main__'].__file__ == __file__)\n"
                      "sys.exit(3)\n")
    proc = subprocess.run([str(BIN / "slurm-bt"), "run", "argv.py", "--flag", "v", "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    # as python: argv[0] as typed, the script's options untouched (even --help), a real __main__ module
    assert proc.returncode == 3 and proc.stdout == "['argv.py', '--flag', 'v', '--help'] __main__ True\n"


def test_run_sets_file_and_path_as_python_does(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "helper_mod.py").write_text("VALUE = 'sibling import works'\n")
    script = tmp_path / "paths.py"
    script.write_text("import helper_mod, os\nprint(helper_mod.VALUE, os.path.isabs(__file__))\n")
    proc = subprocess.run([str(BIN / "slurm-bt"), "run", "paths.py"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "sibling import works True\n"
