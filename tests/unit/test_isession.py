"""Interactive sessions without a cluster: the spec, the rendered scripts, the srun argv, ``--node``.

The real-cluster behaviour (a pty session in a 2-node job, the on_failure hold, --host) is in
tests/integration/hostile/test_isession.py.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from slurm_bt.errors import ConfigError, UserError
from slurm_bt.render.batch_script import render_batch_script, render_node_entry, session_env_path
from slurm_bt.render.session import SESSION_SCRIPT, session_command
from slurm_bt.site.settings import SiteSettings
from slurm_bt.slurm.srun import attach_env, build_attach_argv
from tests.spec_helpers import spec_for

PYXIS = SiteSettings(container_runtime="pyxis", storage={"scratch": "/local/scratch", "node_cache": "/local/weights"})
PYXIS_JOB_SCOPE = PYXIS.model_copy(update={"pyxis_container_scope_job": True})
APPTAINER = SiteSettings(container_runtime="apptainer",
                         storage={"scratch": "/local/scratch", "node_cache": "/local/weights"})


def _config(tmp_path: Path, session: str | None, *, nodes: int = 2) -> Path:
    body = f"""
        from truss_train import definitions as d
        job = d.TrainingJob(
            image=d.Image(base_image="nvcr.io/nvidia/pytorch:24.01"),
            compute=d.Compute(node_count={nodes}),
            runtime=d.Runtime(start_commands=["python train.py"],
                              environment_variables={{"TOKEN": d.SecretReference(name="tok"), "PLAIN": "v"}}),
            {"interactive_session=" + session + "," if session else ""}
        )
        project = d.TrainingProject(name="sess", job=job)
        """
    path = tmp_path / "config.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_interactive_session_is_honoured_not_warned(tmp_path: Path) -> None:
    spec = spec_for(_config(tmp_path, "d.InteractiveSession(trigger=d.InteractiveSessionTrigger.ON_FAILURE, "
                                      "timeout_minutes=7)"))
    assert spec.interactive is not None
    assert (spec.interactive.trigger, spec.interactive.timeout_minutes) == ("on_failure", 7)
    assert not any("not supported" in w for w in spec.warnings)
    # upstream's default provider is a VS Code tunnel: said once, with what you get instead
    [note] = [w for w in spec.warnings if "interactive_session" in w]
    assert "session_provider=vs_code" in note and "slurm-bt ssh" in note
    ssh = spec_for(_config(tmp_path, "d.InteractiveSession(session_provider=d.InteractiveSessionProvider.SSH)"))
    assert ssh.interactive is not None and ssh.interactive.trigger == "on_demand"
    assert not any("interactive_session" in w for w in ssh.warnings)
    assert spec_for(_config(tmp_path, None)).interactive is None


def test_timeout_below_one_minute_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        spec_for(_config(tmp_path, "d.InteractiveSession(timeout_minutes=0)"))
    assert "job.interactive_session.timeout_minutes" in "\n".join(info.value.lines())


def test_on_startup_prints_the_attach_command_before_step_two(tmp_path: Path) -> None:
    script = render_batch_script(spec_for(_config(tmp_path, "d.InteractiveSession("
                                                  "trigger=d.InteractiveSessionTrigger.ON_STARTUP)")))
    notice = script.index("interactive session (on_startup)")
    assert notice < script.index("--job-name=bt-train")
    assert "slurm-bt ssh ${SLURM_JOB_ID} --node RANK" in script
    assert "on_failure" not in script and "sleep " not in script  # no hold for on_startup


def test_on_failure_holds_then_ends_through_the_restart_helper(tmp_path: Path) -> None:
    held = "d.InteractiveSession(trigger=d.InteractiveSessionTrigger.ON_FAILURE, timeout_minutes=3)"
    script = render_batch_script(spec_for(_config(tmp_path, held)))
    step2 = script.index("--job-name=bt-train")
    hold = script.index('if [ "$bt_train_rc" -ne 0 ]', step2)  # after step 2 has ended, with its status
    tail = script[hold:]
    assert "interactive session (on_failure): the allocation is kept for 3 min" in tail
    # the hold, then the run's usual end: the restart helper decides (and clears Requeue on 25.11+)
    assert tail.index("sleep 180 & wait $!") < tail.index('bt_restart after "$bt_train_rc"')
    assert 'exit "$bt_train_rc"' not in tail
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0


def test_pyxis_step_two_is_named_only_with_a_session_and_job_scope(tmp_path: Path) -> None:
    with_session = render_batch_script(spec_for(_config(tmp_path, "d.InteractiveSession()"), PYXIS_JOB_SCOPE))
    assert '--container-name=bt-session-"${SLURM_JOB_ID}"' in with_session
    global_scope = render_batch_script(spec_for(_config(tmp_path, "d.InteractiveSession()"), PYXIS))
    assert "--container-name" not in global_scope
    plain = render_batch_script(spec_for(_config(tmp_path, None), PYXIS))
    assert "--container-name" not in plain and "interactive session" not in plain


def test_node_entry_saves_the_environment_without_secrets(tmp_path: Path) -> None:
    """Run the rendered entry script's session lines in bash: secrets and SLURM_* stay out."""
    spec = spec_for(_config(tmp_path, "d.InteractiveSession()"))
    entry = render_node_entry(spec)
    assert "node-\"${SLURM_NODEID}.session\"" in entry
    start = entry.index("# Interactive session: this node's environment")
    end = entry.index("unset bt_session", start)
    runtime = tmp_path / "rt"
    runtime.mkdir()
    snippet = entry[start:end].replace(session_env_path(spec, "X", "")[: -len(".session")].rsplit("/", 2)[0],
                                       str(runtime))
    snippet = snippet.replace('"${SLURM_JOB_ID}"', "")
    env = {"PATH": os.environ["PATH"], "SLURM_NODEID": "1", "SLURM_STEP_ID": "1", "TOKEN": "s3cret",
           "PLAIN": "v", "BT_NODE_RANK": "1", "WEIRD": "a\nb=c"}
    proc = subprocess.run(["bash", "-c", snippet], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    [saved] = list(runtime.rglob("node-1.session"))
    assert saved.stat().st_mode & 0o777 == 0o600
    records = saved.read_bytes().split(b"\0")
    assert b"BT_NODE_RANK=1" in records and b"PLAIN=v" in records and b"WEIRD=a\nb=c" in records
    assert not [r for r in records if r.startswith((b"TOKEN=", b"SLURM_"))]
    assert b"s3cret" not in saved.read_bytes()
    # ... and the session script loads it back (skipping SLURM_* and odd names) before running bash.
    saved.write_bytes(saved.read_bytes() + b"SLURM_JOB_ID=999\0BAD-NAME=x\0")
    loaded = subprocess.run(["bash", "-c", SESSION_SCRIPT, "bt-session", str(saved), str(tmp_path), "0",
                             'echo "$BT_NODE_RANK|$PLAIN|${SLURM_JOB_ID:-unset}|$PWD"'],
                            env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=False)
    assert loaded.stdout.strip() == f"1|v|unset|{tmp_path}", loaded


def test_session_waits_for_the_environment_only_when_the_job_saves_one(tmp_path: Path) -> None:
    late = tmp_path / "node-0.session"
    writer = subprocess.Popen(["bash", "-c", f"sleep 1; printf 'BT_NODE_RANK=0\\0' > {late}"])
    waited = subprocess.run(["bash", "-c", SESSION_SCRIPT, "bt-session", str(late), str(tmp_path), "10",
                             'echo "rank=$BT_NODE_RANK"'], capture_output=True, text=True, check=False)
    writer.wait()
    assert waited.stdout.strip() == "rank=0" and "waiting for the job's start commands" in waited.stderr
    without = session_command(spec_for(_config(tmp_path, None)), "42", "n1", 0)
    assert without.command[-1] == "0" and without.time_limit_min is None


def test_session_command_per_runtime(tmp_path: Path) -> None:
    config = _config(tmp_path, "d.InteractiveSession(trigger=d.InteractiveSessionTrigger.ON_DEMAND, "
                               "timeout_minutes=30)")
    host = session_command(spec_for(config), "42", "n2", 1)
    assert host.command[:2] == ("/bin/bash", "-c") and host.container_args == ()
    assert host.command[-3:] == ("/dev/shm/slurm-bt-1001/42/node-1.session", spec_for(config).src_dir, "120")
    assert host.time_limit_min == 30
    pyxis = session_command(spec_for(config, PYXIS), "42", "n2", 1, "hostname")
    # pyxis's default container_scope=global would keep a named container after the job: a new one
    assert pyxis.container_args[0] == "--container-image=nvcr.io#nvidia/pytorch:24.01"
    mounts = pyxis.container_args[1]
    assert mounts.startswith("--container-mounts=") and "/dev/shm/slurm-bt-1001" in mounts
    assert pyxis.container_args[2] == "--container-workdir=/b10/workspace" and pyxis.srun_env == ()
    assert pyxis.command[-1] == "hostname"
    scoped = session_command(spec_for(config, PYXIS_JOB_SCOPE), "42", "n2", 1)
    assert scoped.container_args == ("--container-name=bt-session-42:exec", "--container-workdir=/b10/workspace")
    app = session_command(spec_for(config, APPTAINER), "42", "n2", 1)
    assert app.command[:3] == ("apptainer", "exec", "--nv") and "docker://nvcr.io/nvidia/pytorch:24.01" in app.command
    held = session_command(spec_for(_config(tmp_path, "d.InteractiveSession(trigger="
                                                      "d.InteractiveSessionTrigger.ON_FAILURE)")), "42", "n1", 0)
    assert held.time_limit_min is None  # the hold bounds it


def test_attach_argv_and_its_validation() -> None:
    argv = build_attach_argv("42", "n2", ["/bin/bash", "-i"], time_limit_min=5,
                             container_args=["--container-name=x:exec"])
    assert argv[:7] == ["srun", "--jobid=42", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2",
                        "--job-name=bt-session"]
    assert "--pty" in argv and "--time=5" in argv and argv[-2:] == ["/bin/bash", "-i"]
    assert "--pty" not in build_attach_argv("42", "n2", ["/bin/true"], pty=False)
    bads: tuple[dict[str, object], ...] = (
        dict(job_id="42.batch"), dict(job_id="42_1"), dict(job_id="-a"), dict(node="--uid=0"),
        dict(node="n1,n2"), dict(command=["--export=ALL"]), dict(command=[]),
        dict(time_limit_min=0), dict(container_args=["--uid=0"]))
    for bad in bads:
        args = {"job_id": "42", "node": "n1", "command": ["/bin/true"], **bad}
        with pytest.raises(ValueError):
            build_attach_argv(args.pop("job_id"), args.pop("node"), args.pop("command"), **args)  # type: ignore[arg-type]


def test_attach_env_is_scrubbed_and_has_a_sane_term() -> None:
    env = attach_env({"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "x", "TERM": "xterm-256color"})
    assert env["TERM"] == "xterm-256color" and "AWS_SECRET_ACCESS_KEY" not in env
    assert attach_env({"PATH": "/bin", "TERM": "x\x1b]0;evil"})["TERM"] == "xterm"


def test_pick_node_by_rank_or_name() -> None:
    from slurm_bt.cli.isession_cmd import _pick_node

    nodes = ["n1", "n2"]
    assert _pick_node(nodes, None) == ("n1", 0)
    assert _pick_node(nodes, "1") == ("n2", 1)
    assert _pick_node(nodes, "n2") == ("n2", 1)
    for bad in ("2", "n3"):
        with pytest.raises(UserError):
            _pick_node(nodes, bad)


def test_cli_refuses_other_peoples_jobs_and_session_updates(isolated_home: Path) -> None:
    from click.testing import CliRunner

    from slurm_bt.cli.main import cli

    runner = CliRunner()
    missing = runner.invoke(cli, ["ssh", "4242", "--command", "true"])
    assert missing.exit_code == 2 and "no submission record for job 4242" in missing.output
    bad_id = runner.invoke(cli, ["ssh", "42.batch"])
    assert bad_id.exit_code == 2
    update = runner.invoke(cli, ["train", "isession", "--job-id", "4242", "--update-timeout", "5"])
    assert update.exit_code == 2 and "fixed in its batch script" in update.output


def test_host_weights_view_is_kept_for_sessions_and_used(tmp_path: Path) -> None:
    config = tmp_path / "w.py"
    config.write_text(textwrap.dedent("""
        from truss_train import WeightsSource, definitions as d
        project = d.TrainingProject(name="w", job=d.TrainingJob(
            image=d.Image(base_image="python:3.11"),
            runtime=d.Runtime(start_commands=["true"]),
            weights=[WeightsSource(source="hf://Org/M", mount_location="/app/w")],
            interactive_session=d.InteractiveSession(),
        ))
        """))
    entry = render_node_entry(spec_for(config))
    save = entry.index(".session-bwrap")
    assert entry.index("mapfile -d '' -t bt_argv") < save < entry.index('exec "${bt_argv[@]}"')
    # the session runs its shell through the saved prefix (here: env, standing in for bwrap ... --)
    saved = tmp_path / "node-0.session"
    saved.write_bytes(b"BT_NODE_RANK=0\0")
    (tmp_path / "node-0.session-bwrap").write_bytes(b"/usr/bin/env\0IN_VIEW=yes\0")
    ran = subprocess.run(["bash", "-c", SESSION_SCRIPT, "bt-session", str(saved), str(tmp_path), "0",
                          'echo "view=$IN_VIEW rank=$BT_NODE_RANK"'], capture_output=True, text=True, check=False)
    assert ran.stdout.strip() == "view=yes rank=0", ran
    without = render_node_entry(spec_for(config.parent / "w.py").model_copy(update={"interactive": None}))
    assert ".session-bwrap" not in without
