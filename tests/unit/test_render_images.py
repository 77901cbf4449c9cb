"""Rendering for pinned images: the runtimes start the node's copy, and ``slurm-bt ssh`` into a
charliecloud job enters the image (slurm_bt/render/session.py), run for real with ch-run as btu1."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from slurm_bt.job_spec import ImagePin, JobSpec
from slurm_bt.render.batch_script import render_batch_script, render_node_entry
from slurm_bt.render.session import session_command
from slurm_bt.site.settings import SiteSettings
from tests.servers.oci_images import squash, user_rootfs
from tests.spec_helpers import spec_for

DIGEST = "sha256:" + "cd" * 32


def _config(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.py").write_text(textwrap.dedent("""
        from truss_train import definitions as d
        project = d.TrainingProject(name="img", job=d.TrainingJob(
            image=d.Image(base_image="python:3.11-slim"),
            compute=d.Compute(cpu_count=1),
            runtime=d.Runtime(start_commands=["true"]),
        ))
        """))
    return folder / "config.py"


def _pinned(config: Path, site: SiteSettings) -> JobSpec:
    spec = spec_for(config, site)
    pin = ImagePin(reference="python:3.11-slim", resolved=f"127.0.0.1:5443/library/python@{DIGEST}", digest=DIGEST)
    return spec.model_copy(update={"image_pin": pin})


@pytest.mark.parametrize("runtime", ["charliecloud", "apptainer", "pyxis"])
def test_pinned_jobs_never_name_the_registry_on_the_nodes(tmp_path: Path, runtime: str) -> None:
    """Nodes run the prolog's copy; no registry reference or credential variable reaches step 2."""
    site = SiteSettings(container_runtime=runtime, storage={"scratch": "/l/scratch", "node_cache": "/l/weights"})
    spec = _pinned(_config(tmp_path), site)
    text = render_batch_script(spec) + render_node_entry(spec)
    assert "docker://" not in text and "ENROOT_CONFIG_PATH" not in text
    assert '/l/weights/jobs/"${SLURM_JOB_ID}"/img/image.sqfs' in text
    cmd = session_command(spec, "77", "n1", 0)
    joined = " ".join(cmd.container_args + cmd.command)
    assert "/l/weights/jobs/77/img/image.sqfs" in joined and "docker://" not in joined


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ch-run") is None or shutil.which("mksquashfs") is None,
                    reason="needs root (to act as btu1), ch-run and mksquashfs")
def test_charliecloud_session_enters_the_image() -> None:
    with user_rootfs("bt-ch-session-") as (base, pw, rootfs):
        site = SiteSettings(container_runtime="charliecloud", storage={
            "scratch": f"{base}/%n/scratch", "node_cache": f"{base}/%n/weights", "runtime": f"{base}/shm"})
        spec = _pinned(_config(base / "cfg"), site)
        ctx = spec.context.model_copy(update={"user": "btu1", "uid": pw.pw_uid, "home": pw.pw_dir,
                                              "job_dir": str(base / "job")})
        spec = spec.model_copy(update={"context": ctx, "src_dir": str(base / "job" / "src")})
        squash(rootfs, base / "n1" / "weights" / "jobs" / "77" / "img")
        for d in (base / "job" / "src", base / "n1" / "scratch" / "77", base / "shm" / f"slurm-bt-{pw.pw_uid}"):
            d.mkdir(parents=True)
        (base / "job" / "src" / "train.py").write_text("x")
        for d in (base / "job", base / "n1" / "scratch", base / "shm"):
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(d)], check=True)
        cmd = session_command(spec, "77", "n1", 0, command='echo "in=${CH_RUNNING:+yes} cwd=$(pwd) id=$(id -u)"; ls')
        assert not cmd.container_args
        proc = subprocess.run(["runuser", "-u", "btu1", "--", "env", "USER=btu1", *cmd.command],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert f"in=yes cwd=/b10/workspace id={pw.pw_uid}" in proc.stdout or \
            f"in=yes cwd={base}/job/src id={pw.pw_uid}" in proc.stdout, proc.stdout + proc.stderr
        assert "train.py" in proc.stdout
