"""Pass-through sbatch options: a word sbatch would take as the batch script is refused.

``bt-sbatch config.py -- ARGS``: sbatch reads the first word that is neither an option nor an
option's value as the script to run (then the generated script on stdin is ignored). Before, such
a word passed. The option table is sbatch's: ``--partition gpu`` consumes ``gpu``, ``--hold x.sh``
does not consume ``x.sh``.
"""

from __future__ import annotations

import subprocess

import pytest

from slurm_bt.errors import UserError
from slurm_bt.render.sbatch_args import check_sbatch_args


@pytest.mark.parametrize("args", [
    ["other.sh"], ["--hold", "other.sh"], ["--partition", "gpu", "other.sh"], ["-p", "gpu", "x"],
    ["--requeue", "x"], ["--", "x"], ["-H", "x"], ["-vv", "x"], ["--exclusive", "x"], ["--export=NONE", "x"],
    ["-"], ["--time=5", "arg1", "arg2"], ["--nice", "5"],
])
def test_words_sbatch_would_run_are_refused(args: list[str]) -> None:
    with pytest.raises(UserError) as err:
        check_sbatch_args(args)
    assert "batch script" in str(err.value) or "not allowed" in str(err.value)


@pytest.mark.parametrize("args", [
    [], ["--partition", "gpu"], ["-p", "gpu"], ["-pgpu"], ["--part", "gpu"], ["--time", "5"], ["-t", "5"],
    ["-N2"], ["-N", "2"], ["-Hp", "gpu"], ["--comment", "-not-an-option"], ["--hold"], ["--requeue"],
    ["--mem", "4G", "--gres", "gpu:h100:1", "--account", "team1", "-q", "high", "--nice=5"],
    ["--signal", "B:USR2@60"], ["--dependency", "afterok:12"], ["--"], ["-w", "n1", "-x", "n2"],
    ["--exclusive", "--wait"], ["--container", "/img.sqsh"],
])
def test_options_and_their_values_pass(args: list[str]) -> None:
    check_sbatch_args(args)


def test_the_table_agrees_with_sbatch_about_a_stray_word() -> None:
    """sbatch itself (when installed) takes ``--hold x.sh``'s x.sh as the script: what is refused here."""
    try:
        proc = subprocess.run(["sbatch", "--test-only", "--hold", "/nonexistent/x.sh"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        pytest.skip("no sbatch here")
    assert "x.sh" in proc.stderr  # "Unable to open file /nonexistent/x.sh"
    with pytest.raises(UserError):
        check_sbatch_args(["--hold", "/nonexistent/x.sh"])
