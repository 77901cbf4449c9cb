"""Nothing slurm-bt runs inside the user's image needs more than bash (issue 31).

The node entry's in-image part (after the re-exec under ch-run/apptainer, all of it under pyxis) and
the session script run in an image that may have no coreutils (python:3.11-slim has no ``mv``, a
distroless image has nothing): the rendered scripts are run here with an empty ``PATH`` and a
``command_not_found_handle`` that records every external command, and for real with ch-run in an
image without ``mv`` and in one with nothing but bash (devcluster/oci_image.py's root filesystem).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from slurm_bt.job_spec import ImagePin, JobSpec
from slurm_bt.render.batch_script import (
    SESSION_READY_SUFFIX,
    render_batch_script,
    render_node_entry,
    session_env_path,
    session_publisher,
)
from slurm_bt.render.quoting import shq
from slurm_bt.render.session import SESSION_SCRIPT, session_command
from slurm_bt.site.settings import SiteSettings
from tests.servers.oci_images import oci_image, squash, user_rootfs
from tests.spec_helpers import spec_for

DIGEST = "sha256:" + "ef" * 32
# bash runs this before the script under test: any command not found on the (empty) PATH is logged.
_RECORD_EXTERNAL = ('command_not_found_handle() { printf "%s\\n" "$1" >> "$BT_EXTERNAL_LOG"; return 127; }; '
                    '. "$0" "$@"')


def _config(folder: Path, start: str = "true") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.py").write_text(textwrap.dedent(f"""
        from truss_train import definitions as d
        project = d.TrainingProject(name="img", job=d.TrainingJob(
            image=d.Image(base_image="python:3.11-slim"),
            compute=d.Compute(cpu_count=1),
            runtime=d.Runtime(start_commands=[{start!r}], environment_variables={{"PLAIN": "v"}}),
            interactive_session=d.InteractiveSession(),
        ))
        """))
    return folder / "config.py"


def _spec(config: Path, runtime: str, storage: dict[str, str]) -> JobSpec:
    spec = spec_for(config, SiteSettings(container_runtime=runtime, storage=storage))
    pin = ImagePin(reference="python:3.11-slim", resolved=f"127.0.0.1:5443/library/python@{DIGEST}", digest=DIGEST)
    return spec.model_copy(update={"image_pin": pin})


@pytest.mark.parametrize("runtime", ["charliecloud", "apptainer", "pyxis"])
def test_in_image_part_of_the_entry_runs_bash_builtins_only(tmp_path: Path, runtime: str) -> None:
    """Run what the entry runs in the image with no PATH: no external command, and the session's
    environment is left complete for the host to publish (``.tmp`` + ready marker, never ``mv``)."""
    rt = tmp_path / "shm"
    spec = _spec(_config(tmp_path / "cfg"), runtime, {"scratch": f"{tmp_path}/scratch",
                                                      "node_cache": f"{tmp_path}/weights", "runtime": str(rt)})
    work = tmp_path / "work"
    work.mkdir()
    entry = tmp_path / "node_entry.sh"
    entry.write_text(render_node_entry(spec).replace("/b10/workspace", str(work)))
    session = Path(session_env_path(spec, "77", 0))
    session.parent.mkdir(parents=True)
    env_file = session.parent / "node-0.env"
    env_file.write_bytes(b"BT_NODE_RANK=0\0PLAIN=v\0")
    log = tmp_path / "external.log"
    # pyxis starts the whole script in the image; charliecloud/apptainer re-run it with --in-container.
    args = [] if runtime == "pyxis" else ["--in-container"]
    env = {"PATH": str(tmp_path / "empty"), "SLURM_JOB_ID": "77", "SLURM_NODEID": "0", "SLURMD_NODENAME": "n1",
           "BT_EXTERNAL_LOG": str(log)}
    if runtime != "pyxis":  # their host part loaded it before entering the image, and ch-run passes it on
        env_file.unlink()
        env |= {"BT_NODE_RANK": "0", "PLAIN": "v"}
    proc = subprocess.run(["/bin/bash", "-c", _RECORD_EXTERNAL, str(entry), *args], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert not log.exists(), f"external commands run in the image: {log.read_text()}"
    assert not session.exists(), "published in the image (it has no mv): the host publishes it"
    records = Path(f"{session}.tmp").read_bytes().split(b"\0")
    assert b"BT_NODE_RANK=0" in records and b"PLAIN=v" in records
    assert Path(f"{session}{SESSION_READY_SUFFIX}").exists()
    if runtime == "pyxis":  # emptied, not unlinked (no rm in the image): its secrets are gone all the same
        assert env_file.read_bytes() == b""
        assert subprocess.run(["/bin/bash", str(entry)], env=env, capture_output=True, check=False).returncode == 1
    # The host side (the subshell forked before the exec, or pyxis's host step) renames it into place.
    pub = subprocess.run(["/bin/bash", "-c", session_publisher(shq(str(session)), None)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert pub.returncode == 0, pub.stderr
    assert b"PLAIN=v" in session.read_bytes() and not Path(f"{session}.tmp").exists()
    assert not Path(f"{session}{SESSION_READY_SUFFIX}").exists()


def test_host_runtime_still_publishes_in_the_entry(tmp_path: Path) -> None:
    """runtime none runs on the host (coreutils there): the entry renames the file itself, no helper."""
    spec = spec_for(_config(tmp_path / "cfg"))
    entry = render_node_entry(spec)
    assert 'mv -f -- "$bt_session.tmp" "$bt_session"' in entry and SESSION_READY_SUFFIX not in entry


def test_pyxis_publishes_from_a_host_step(tmp_path: Path) -> None:
    """pyxis has no host side in step 2: an overlapping step outside the container publishes, and it is
    stopped when step 2 ends; without a session there is no such step."""
    storage = {"scratch": "/l/scratch", "node_cache": "/l/weights"}
    script = render_batch_script(_spec(_config(tmp_path / "a"), "pyxis", storage))
    [line] = [ln for ln in script.splitlines() if "--job-name=bt-session-env" in ln]
    assert "--overlap" in line and "--container" not in line and "--kill-on-bad-exit" not in line
    assert line.endswith(" &") and 'kill "$bt_publisher"' in script
    assert script.index("bt-session-env") < script.index("--job-name=bt-train")
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    plain = spec_for(_config(tmp_path / "b"), SiteSettings(container_runtime="pyxis", storage=storage))
    plain = plain.model_copy(update={"interactive": None})
    assert "bt-session-env" not in render_batch_script(plain)


def test_session_script_waits_with_bash_alone(tmp_path: Path) -> None:
    """The session script's wait for the environment uses no ``sleep`` (the image may have none)."""
    late = tmp_path / "node-0.session"
    log = tmp_path / "external.log"
    script = tmp_path / "session.sh"
    script.write_text(SESSION_SCRIPT)
    writer = subprocess.Popen(["bash", "-c", f"sleep 1.2; printf 'BT_NODE_RANK=0\\0' > {shq(str(late))}"])
    started = time.monotonic()
    ran = subprocess.run(["/bin/bash", "-c", _RECORD_EXTERNAL, str(script), str(late), str(tmp_path), "10",
                          'echo "rank=$BT_NODE_RANK"'],
                         env={"PATH": str(tmp_path / "empty"), "BT_EXTERNAL_LOG": str(log)},
                         capture_output=True, text=True, timeout=30, check=False)
    writer.wait()
    assert ran.stdout.strip() == "rank=0", ran.stderr
    assert time.monotonic() - started >= 1.0  # it did wait, half a second at a time
    assert not log.exists(), f"external commands run in the image: {log.read_text()}"


# -- for real: ch-run, as btu1, in images without mv and without any coreutils


def _bare_rootfs(rootfs: Path) -> None:
    """Leave only bash in /usr/bin (and the libraries it links): no coreutils, no sh."""
    for p in (rootfs / "usr" / "bin").iterdir():
        if p.name != "bash":
            p.unlink()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ch-run") is None or shutil.which("mksquashfs") is None
                    or shutil.which("unsquashfs") is None,
                    reason="needs root (to act as btu1), ch-run, mksquashfs and unsquashfs")
@pytest.mark.parametrize("image", ["no-mv", "bash-only"])
def test_charliecloud_session_opens_in_an_image_without_coreutils(image: str) -> None:
    with user_rootfs("bt-ch-bare-") as (base, pw, rootfs):
        assert not {"mv", "setsid", "nohup"} & set(oci_image.BASE_TOOLS)
        if image == "bash-only":
            _bare_rootfs(rootfs)
        assert not (rootfs / "usr/bin/mv").exists()
        runtime = base / "shm"
        site_storage = {"scratch": f"{base}/%n/scratch", "node_cache": f"{base}/%n/weights", "runtime": str(runtime)}
        spec = _spec(_config(base / "cfg", 'echo "ran in=${CH_RUNNING:+yes}" > /b10/workspace/ran.txt'),
                     "charliecloud", site_storage)
        ctx = spec.context.model_copy(update={"user": "btu1", "uid": pw.pw_uid, "home": pw.pw_dir,
                                              "job_dir": str(base / "job")})
        spec = spec.model_copy(update={"context": ctx, "src_dir": str(base / "job" / "src")})
        squash(rootfs, base / "n1" / "weights" / "jobs" / "77" / "img")
        run_dir = Path(session_env_path(spec, "77", 0)).parent
        for d in (base / "job" / "src", base / "n1" / "scratch" / "77", run_dir):
            d.mkdir(parents=True)
        (base / "job" / "src" / "train.py").write_text("x")
        (base / "job" / "node_entry.sh").write_text(render_node_entry(spec))
        (run_dir / "node-0.env").write_bytes(b"BT_NODE_RANK=0\0BT_TRAINING_JOB_ID=77\0")
        for d in (base / "job", base / "n1" / "scratch", runtime):
            subprocess.run(["chown", "-R", f"{pw.pw_uid}:{pw.pw_gid}", str(d)], check=True)
        env = ["env", "-i", "PATH=/usr/local/bin:/usr/bin:/bin", "USER=btu1", f"HOME={pw.pw_dir}",
               "SLURM_JOB_ID=77", "SLURM_NODEID=0", "SLURMD_NODENAME=n1"]
        # Step 2 on the node: the entry loads the environment, enters the image, saves it, runs the command.
        step = subprocess.run(["runuser", "-u", "btu1", "--", *env, "/bin/bash", str(base / "job" / "node_entry.sh")],
                              capture_output=True, text=True, timeout=120, check=False)
        assert step.returncode == 0, step.stdout + step.stderr
        assert (base / "job" / "src" / "ran.txt").read_text() == "ran in=yes\n"
        session = Path(session_env_path(spec, "77", 0))
        deadline = time.monotonic() + 10
        while not session.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert session.exists(), f"not published: {sorted(p.name for p in run_dir.iterdir())} {step.stderr}"
        assert not Path(f"{session}.tmp").exists() and not Path(f"{session}{SESSION_READY_SUFFIX}").exists()
        assert session.stat().st_mode & 0o777 == 0o600 and b"BT_NODE_RANK=0" in session.read_bytes()
        # The owner's `slurm-bt ssh 77`: a new ch-run of the image finds the environment at once.
        cmd = session_command(spec, "77", "n1", 0, command='echo "in=${CH_RUNNING:+yes} rank=$BT_NODE_RANK cwd=$PWD"')
        proc = subprocess.run(["runuser", "-u", "btu1", "--", *env, *cmd.command],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        assert "in=yes rank=0 cwd=/b10/workspace" in proc.stdout, proc.stdout + proc.stderr
        assert "waiting for the job's start commands" not in proc.stderr
