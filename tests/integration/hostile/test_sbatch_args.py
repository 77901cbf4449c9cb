"""Hostile pass-through sbatch options: the refused ones in the spellings sbatch itself accepts.

``bt-sbatch CONFIG -- ARGS`` hands ARGS to sbatch, except ``--wrap``/``--export``/``--export-file``/
``--get-user-env`` (slurm_bt/render/sbatch_args.py: the job's script and environment come from the
config). sbatch parses with getopt_long, so ``--wra=CMD`` *is* ``--wrap=CMD``: before, that spelling
passed the check and Slurm ran the user's command instead of the generated script (no prolog
preparation, no slurm-bt comment); a word that is no option (``-- other.sh``) is the script to
sbatch as well. Each must be refused before anything reaches Slurm.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.hostile.harness import BIN, as_user, attack, write_job

pytestmark = pytest.mark.slurm

USER = "btu1"
JOB = """
    from truss_train import definitions
    project = definitions.TrainingProject(name="hostile-sbatch-args", job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        compute=definitions.Compute(cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(start_commands=["echo generated-script"]),
    ))
"""

SPELLINGS = {
    "--wra= (is --wrap)": ["--wra=echo wrapped-instead"],
    "--wr (is --wrap)": ["--wr", "echo wrapped-instead"],
    "--export-f= (is --export-file)": ["--export-f=/etc/environment"],
    "--get-u (is --get-user-env)": ["--get-u"],
    # not an option at all: sbatch runs the first such word as the batch script
    "a script word after --time": ["--time", "1", "other.sh"],
}


def _user_jobs() -> list[str]:
    # sbatch names a --wrap job "wrap"; the generated script names it after the project.
    out = subprocess.run(["squeue", "-h", "-u", USER, "-n", "hostile-sbatch-args,wrap", "-o", "%i"],
                         capture_output=True, text=True, check=False).stdout
    return out.split()


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_refused_options_in_getopt_spellings(tenants: dict[str, object], name: str) -> None:
    config = write_job(USER, JOB, files={"other.sh": "#!/bin/bash\n#SBATCH --job-name=wrap\necho not-generated\n"})
    with attack(f"sbatch pass-through {name}"):
        before = _user_jobs()
        proc = as_user(USER, [str(BIN / "bt-sbatch"), "--parsable", str(config), "--", *SPELLINGS[name]],
                       cwd=config.parent)
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
        assert "not allowed" in proc.stderr or "batch script" in proc.stderr, proc.stderr
        assert not proc.stdout.strip(), f"a job id was printed: {proc.stdout!r}"
        assert _user_jobs() == before, "a job reached Slurm"
