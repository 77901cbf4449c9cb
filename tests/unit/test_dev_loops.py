"""The developer loops of README "Development": the pre-commit configuration runs the project's checks.

The hooks are local (nothing fetched) and run the venv through the `.bt-venv` link scripts/install.sh
makes, so a hook that names a tool the venv lacks, or a config pre-commit cannot read, fails here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / ".pre-commit-config.yaml"
PRE_COMMIT = Path(sys.prefix) / "bin" / "pre-commit"


def _pre_commit(cwd: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PRE_COMMIT_HOME": str(home / "pc")}
    return subprocess.run([str(PRE_COMMIT), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_config_is_valid_and_every_hook_runs_a_venv_tool(tmp_path: Path) -> None:
    proc = _pre_commit(REPO, tmp_path, "validate-config", str(CONFIG))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    entries = [line.split("entry:", 1)[1].split() for line in CONFIG.read_text().splitlines() if "entry:" in line]
    assert len(entries) == 4
    for entry in entries:
        tool = entry[0] if entry[0] != "bash" else entry[1]
        if tool.startswith(".bt-venv/"):
            assert (Path(sys.prefix) / tool.removeprefix(".bt-venv/")).is_file(), tool
        else:
            assert (REPO / tool).is_file(), tool


def test_ruff_hook_refuses_a_lint_error_and_passes_clean_code(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "slurm_bt").mkdir(parents=True)
    shutil.copy(CONFIG, repo / CONFIG.name)
    (repo / ".bt-venv").symlink_to(sys.prefix)
    (repo / "slurm_bt" / "bad.py").write_text("import os\n")  # F401: imported but unused
    (repo / "slurm_bt" / "good.py").write_text("import os\n\nprint(os.sep)\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    bad = _pre_commit(repo, tmp_path, "run", "ruff", "--files", "slurm_bt/bad.py")
    assert bad.returncode == 1 and "F401" in bad.stdout, bad.stdout + bad.stderr
    good = _pre_commit(repo, tmp_path, "run", "ruff", "--files", "slurm_bt/good.py")
    assert good.returncode == 0, good.stdout + good.stderr


def _integration(tests: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "SLURM_BT_VENV": sys.prefix, "HOME": str(tests)}
    return subprocess.run(["bash", str(REPO / "scripts" / "integration.sh"), str(tests)], env=env,
                          capture_output=True, text=True, timeout=180)


def test_integration_passes_run_the_unmarked_in_parallel_then_whole_cluster_alone(tmp_path: Path) -> None:
    """scripts/integration.sh: two passes that split the tests by the whole_cluster marker; both run
    whatever the first returned, and the status is a failing pass's; a pass with nothing to run is fine."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_side_by_side.py").write_text(
        "import os\n\ndef test_a():\n    assert os.environ.get('PYTEST_XDIST_WORKER', '').startswith('gw')\n\n"
        "def test_b():\n    assert os.environ.get('PYTEST_XDIST_WORKER', '').startswith('gw')\n")
    (tests / "test_alone.py").write_text(
        "import os\nimport pytest\n\n@pytest.mark.whole_cluster\n"
        "def test_alone():\n    assert 'PYTEST_XDIST_WORKER' not in os.environ\n    assert False, 'ALONE-FAILED'\n")
    proc = _integration(tests)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "2 passed" in out and "1 failed, 2 deselected" in out and "ALONE-FAILED" in out, out
    assert "whole_cluster pass" in out.splitlines()[-1], out

    (tests / "test_alone.py").unlink()
    proc = _integration(tests)
    assert proc.returncode == 0, proc.stdout + proc.stderr
