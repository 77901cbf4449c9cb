"""The staging job's step and the files of the job directory it reads (issue 31, items 2a and 2c).

The job directory is the user's: between submit and the staging job its ``job.json`` or plans can be
swapped for a link to ``/dev/zero``, a FIFO or a huge file. Each must be refused at once with one line
naming the file (run in a child with a wall clock and an address-space limit, so a regression fails
the test instead of hanging it or the host). And the ``[containers]`` limits that protect shared
storage come from the admin's site file, never from one the user's ``$SLURM_BT_SITE_CONFIG`` named.
"""

from __future__ import annotations

import io
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.images.entry import ImagePlan
from slurm_bt.images.stage import image_plan_path, stage_image
from slurm_bt.job_spec import JOB_SPEC_MAX_BYTES, ImagePin, JobSpec
from slurm_bt.site.settings import ContainerSettings, SiteSettings
from tests.unit.test_render_injection import Cfg, spec_from_config

REPO = Path(__file__).resolve().parents[2]
_DIGEST = "sha256:" + "ab" * 32
_AS_LIMIT = 2 << 30  # far below what reading /dev/zero to the end would take


def _job(tmp_path: Path, *, image: bool = True) -> tuple[Path, JobSpec]:
    """A job directory as bt-sbatch leaves it: ``job.json`` and (``image``) an image plan to mirror."""
    spec = spec_from_config(tmp_path, Cfg())
    spec = spec.model_copy(update={"image_pin": ImagePin(reference="python:3.11", resolved=f"r.example/p@{_DIGEST}",
                                                         digest=_DIGEST)})
    job_dir = Path(spec.context.job_dir)
    job_dir.mkdir(parents=True)
    (job_dir / "job.json").write_text(spec.model_dump_json())
    if image:
        _write_image_plan(job_dir, ImagePlan(team="t", cluster_cache=str(tmp_path / "cc"),
                                             containers=ContainerSettings()))
    return job_dir, spec


def _write_image_plan(job_dir: Path, plan: ImagePlan) -> None:
    path = image_plan_path(job_dir)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(plan.model_dump_json())


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_AS_LIMIT, _AS_LIMIT))


def _stage(job_dir: Path) -> subprocess.CompletedProcess[str]:
    """The staging step in a child, bounded: a hang or an unbounded read fails the test, not the host."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "slurm_bt.steps.stage_weights", str(job_dir)], capture_output=True,
                          text=True, env=env, timeout=60, preexec_fn=_limit_memory)


def _one_refusal(proc: subprocess.CompletedProcess[str], path: Path, reason: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"slurm-bt staging failed: {path}: "), lines[0]
    assert reason in lines[0], lines[0]


def test_job_json_linked_to_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    job_dir, _ = _job(tmp_path)
    (job_dir / "job.json").unlink()
    (job_dir / "job.json").symlink_to("/dev/zero")
    _one_refusal(_stage(job_dir), job_dir / "job.json", "is a symlink (not followed)")


def test_job_json_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    job_dir, _ = _job(tmp_path)
    (job_dir / "job.json").unlink()
    os.mkfifo(job_dir / "job.json")
    _one_refusal(_stage(job_dir), job_dir / "job.json", "is not a regular file")


def test_oversized_job_json_is_refused_from_its_size(tmp_path: Path) -> None:
    job_dir, _ = _job(tmp_path)
    with open(job_dir / "job.json", "r+b") as f:  # sparse: nothing is written but the size
        f.truncate(JOB_SPEC_MAX_BYTES + 1)
    _one_refusal(_stage(job_dir), job_dir / "job.json", f"more than the {JOB_SPEC_MAX_BYTES} allowed")


def test_invalid_job_json_is_one_line(tmp_path: Path) -> None:
    job_dir, _ = _job(tmp_path)
    (job_dir / "job.json").write_text('{"spec_version": 1}')
    _one_refusal(_stage(job_dir), job_dir / "job.json", "is not a valid slurm-bt job spec")


@pytest.mark.parametrize("swap", ["dev-zero", "fifo"])
def test_swapped_weights_plan_is_refused_not_skipped(tmp_path: Path, swap: str) -> None:
    # Before: is_file() said False for both, so the staging job skipped the weights and succeeded.
    job_dir, _ = _job(tmp_path, image=False)
    plan = job_dir / "weights" / "plan.json"
    plan.parent.mkdir()
    if swap == "fifo":
        os.mkfifo(plan)
    else:
        plan.symlink_to("/dev/zero")
    reason = "is not a regular file" if swap == "fifo" else "is a symlink (not followed)"
    _one_refusal(_stage(job_dir), plan, reason)


def test_image_plan_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    job_dir, _ = _job(tmp_path)
    image_plan_path(job_dir).unlink()
    os.mkfifo(image_plan_path(job_dir))
    proc = _stage(job_dir)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"slurm-bt staging failed: job.image.base_image: {image_plan_path(job_dir)}: "
                                  "is not a regular file"), proc.stderr


# -- 2c: limits that protect shared storage come from the admin's site file ----------------------------------


class _Outcome:
    def line(self) -> str:
        return "slurm-bt staging: image mirrored (fake)"


@pytest.fixture
def mirrored(monkeypatch: pytest.MonkeyPatch) -> list[ImagePlan]:
    """What the real mirror would have been given (skopeo is not run)."""
    import slurm_bt.images.mirror as mirror

    seen: list[ImagePlan] = []

    def fake(job_dir: Path, spec: JobSpec, plan: ImagePlan, store: Any, *, out: Any = None) -> _Outcome:
        seen.append(plan)
        return _Outcome()

    monkeypatch.setattr(mirror, "mirror_image", fake)
    return seen


def _containers(max_image_bytes: int) -> ContainerSettings:
    return ContainerSettings(max_image_bytes=max_image_bytes)


def test_plan_cannot_raise_the_admins_image_cap(tmp_path: Path, mirrored: list[ImagePlan]) -> None:
    job_dir, _ = _job(tmp_path, image=False)
    _write_image_plan(job_dir, ImagePlan(team="t", cluster_cache=str(tmp_path / "cc"), containers=_containers(1 << 50)))
    admin = SiteSettings(containers=_containers(1 << 30))
    stage_image(job_dir, out=io.StringIO(), admin_site=admin)
    assert [p.containers.max_image_bytes for p in mirrored] == [1 << 30]


def test_plan_may_lower_the_image_cap(tmp_path: Path, mirrored: list[ImagePlan]) -> None:
    job_dir, _ = _job(tmp_path, image=False)
    _write_image_plan(job_dir, ImagePlan(team="t", cluster_cache=str(tmp_path / "cc"), containers=_containers(5 << 20)))
    stage_image(job_dir, out=io.StringIO(), admin_site=SiteSettings(containers=_containers(1 << 30)))
    assert [p.containers.max_image_bytes for p in mirrored] == [5 << 20]


def test_users_site_config_does_not_raise_the_staging_jobs_cap(tmp_path: Path, mirrored: list[ImagePlan],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's $SLURM_BT_SITE_CONFIG raising max_image_bytes (and the plan written from it) is capped
    by the admin's file; here the admin wrote none, so the built-in default is the bound."""
    import slurm_bt.site.hook_settings as hook_settings

    user_site = tmp_path / "my-site.toml"
    user_site.write_text("[containers]\nmax_image_bytes = 1125899906842624\n")
    monkeypatch.setenv("SLURM_BT_SITE_CONFIG", str(user_site))
    monkeypatch.setattr(hook_settings, "DEFAULT_SITE_PATH", tmp_path / "no-admin-file.toml")
    from slurm_bt.site.settings import load_site_settings

    users = load_site_settings().containers  # what bt-sbatch (login side) still honours
    assert users.max_image_bytes == 1 << 50
    job_dir, _ = _job(tmp_path, image=False)
    _write_image_plan(job_dir, ImagePlan(team="t", cluster_cache=str(tmp_path / "cc"), containers=users))
    stage_image(job_dir, out=io.StringIO())
    assert [p.containers.max_image_bytes for p in mirrored] == [ContainerSettings().max_image_bytes]


@pytest.mark.skipif(os.geteuid() != 0, reason="the admin's site file must be root-owned")
def test_admins_site_file_sets_the_staging_jobs_cap(tmp_path: Path, mirrored: list[ImagePlan],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import slurm_bt.site.hook_settings as hook_settings

    admin_site = tmp_path / "site.toml"
    admin_site.write_text("[containers]\nmax_image_bytes = 1073741824\n")
    admin_site.chmod(0o644)
    user_site = tmp_path / "my-site.toml"
    user_site.write_text("[containers]\nmax_image_bytes = 1125899906842624\n")
    monkeypatch.setenv("SLURM_BT_SITE_CONFIG", str(user_site))
    monkeypatch.setattr(hook_settings, "DEFAULT_SITE_PATH", admin_site)
    job_dir, _ = _job(tmp_path, image=False)
    _write_image_plan(job_dir, ImagePlan(team="t", cluster_cache=str(tmp_path / "cc"), containers=_containers(1 << 50)))
    stage_image(job_dir, out=io.StringIO())
    assert [p.containers.max_image_bytes for p in mirrored] == [1 << 30]
