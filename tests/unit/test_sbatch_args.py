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


# -- --signal follows the stop-signal rule; node lists are read for --prefer (issue 31, item 2d) --------


@pytest.mark.parametrize("args", [
    ["--signal=USR1@10"], ["--signal", "B:USR1@60"], ["--signal=SIGUSR1"], ["--sig=usr1@5"], ["--si=R:10@5"],
    ["--signal=KILL@10"], ["--time=5", "--signal", "B:USR1"],
])
def test_pass_through_signal_outside_the_stop_signals_is_refused(args: list[str]) -> None:
    with pytest.raises(UserError) as err:
        check_sbatch_args(args)
    assert err.value.lines()[0].startswith("bt-sbatch: --signal: ")
    assert "must be one of TERM, INT, HUP, USR2, QUIT" in err.value.lines()[0]


@pytest.mark.parametrize("args", [
    ["--signal=B:USR2@60"], ["--signal", "TERM@30"], ["--signal=SIGINT"], ["--signal=15@60"], ["--signal=RB:HUP"],
    ["--sockets-per-node=2"],
])
def test_pass_through_stop_signals_pass(args: list[str]) -> None:
    check_sbatch_args(args)


def test_node_lists_among_pass_through_options() -> None:
    from slurm_bt.render.sbatch_args import sbatch_excluded_nodes, sbatch_names_nodes

    for named in (["-w", "n1"], ["-wn1"], ["--nodelist=n[1-2]"], ["--nodel", "n1"], ["-F", "hosts"],
                  ["--nodefile=hosts"], ["-Hw", "n1"]):
        assert sbatch_names_nodes(named), named
    for not_named in ([], ["--nodes=2"], ["-N", "2"], ["-pw"], ["--comment", "-w"]):
        assert not sbatch_names_nodes(not_named), not_named
    assert sbatch_excluded_nodes(["-x", "n1", "--exclude=n[2-3]"]) == "n[2-3]"
    assert sbatch_excluded_nodes(["-xn4"]) == "n4" and sbatch_excluded_nodes(["--exclud", "n5"]) == "n5"
    assert sbatch_excluded_nodes(["--exclusive"]) is None and sbatch_excluded_nodes(["--time=5"]) is None
