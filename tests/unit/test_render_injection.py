"""No string from the config or the submission context can inject shell syntax or ``#SBATCH`` lines.

Every string that reaches the batch script or ``node_entry.sh`` is fed hostile payloads, through the
real path where the config layer lets it through (a temporary config.py → ``load_training_project`` →
``build_job_spec`` → render) and through ``SubmitContext`` for the context fields. A payload may be
rejected with a one-line-per-problem ``ConfigError``; otherwise:

(a) the ``#SBATCH`` directives, read the way sbatch reads them (``#SBATCH``/``#SLURM`` lines before the
    first line that is neither blank nor a comment), are exactly the expected ones, and sbatch would
    accept the script at all (``#!`` first, no NUL, no ``\\r\\n``);
(b) ``bash -n`` accepts both scripts;
(c) executing the batch script with bash (``srun`` replaced by an exported function, ``apptainer`` by a
    stub executable first on the node's PATH, the node python by a stub that prints ``127.0.0.1``)
    creates no canary file, passes the exact argv we expect to each ``srun`` step, and exports every
    config value byte for byte;
(d) the stub ``srun`` then runs ``node_entry.sh``, which loads the NUL-separated env file the prepare
    step would have written, runs the start commands, and those see every value verbatim.

Helpers here are imported by ``test_render_fuzz.py``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.compat.loader import load_training_project
from slurm_bt.errors import ConfigError, UserError
from slurm_bt.job_spec import JobSpec, SubmitContext, build_job_spec
from slurm_bt.node.job_paths import job_layout, runtime_dir
from slurm_bt.render.batch_script import (
    ENTRY_NAME,
    container_image_ref,
    render_batch_script,
    render_node_entry,
)
from slurm_bt.site.settings import SiteSettings
from slurm_bt.steps.prepare import encode_env, node_environment

JOB_ID = "4242"
NODE_NAME = "n0"
SUBMIT_ID = "20260101T000000Z-0123abcd"
CANARY = "{CANARY}"  # replaced by an absolute path under the test's tmp dir
# Every fake secret value carries this mark, so we can prove it never reaches the batch script or env.
SECRET_MARK = "S3cr3tM4rk"
SECRET_VALUE = f"u:{SECRET_MARK}\n$(touch {CANARY})'\"`x`; LD_PRELOAD=/evil\\"
UNSET: Any = object()

# NUL-free payloads (NUL, CRLF and lone surrogates have their own tests below).
PAYLOADS: dict[str, str] = {
    "newline-sbatch": f"x\n#SBATCH --wrap=touch {CANARY}\n",
    "newline-slurm": f"x\n#SLURM --wrap=touch {CANARY}\ntouch {CANARY}\n",
    "leading-sbatch": f"#SBATCH --wrap=touch {CANARY}",
    "cmd-subst": f"$(touch {CANARY})",
    "backticks": f"`touch {CANARY}`",
    "semicolon": f"; touch {CANARY}",
    "single-quote": f"'; touch {CANARY}; '",
    "double-quote": f'"; touch {CANARY}; "',
    "backslash": f"\\'; touch {CANARY}; #\\",
    "ifs": f"${{IFS}}touch${{IFS}}{CANARY}",
    "ansi-c": f"$'\\x27'; touch {CANARY}",
    "carriage-return": f"x\r#SBATCH --wrap=touch {CANARY}\r$(touch {CANARY})",
    "escape-sequences": f"\x1b[2J\x1b]0;$(touch {CANARY})\x07\x7f",
    "unicode-separators": f"x\u2028#SBATCH --wrap=touch {CANARY}\u0085$(touch {CANARY})\u2029",
    "long": "A" * 100_000 + f"$(touch {CANARY})",
    # Without whitespace, ',' or ':' (which container paths and registries refuse), so that these also
    # reach the bind-mount and registry code paths.
    "nospace-subst": f"$(touch${{IFS}}{CANARY})",
    "nospace-backticks": f"`touch${{IFS}}{CANARY}`",
    "nospace-single-quote": f"';touch${{IFS}}{CANARY};'",
    "nospace-double-quote": f'";touch${{IFS}}{CANARY};"',
    "nospace-redirect": f"x&>{CANARY}|touch${{IFS}}{CANARY}",
    "nospace-glob-percent": "*?[a]~{a,b}%j%n%x!!#",
    "nospace-escape": f"\x1b]0;$(touch${{IFS}}{CANARY})\x07",
}


# ---------------------------------------------------------------------------------------------------
# Building configs and specs through the real loader
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Secret:
    """A ``SecretReference(name=...)`` in a generated config."""

    name: Any


@dataclass
class Cfg:
    """A config.py written with ``repr()`` of every value (so any Python value can be tried).

    ``UNSET`` leaves a keyword out (the model default applies).
    """

    name: Any = "inj-project"
    job_name: Any = UNSET
    base_image: Any = "python:3.11"
    registry: Any = UNSET
    registry_secret: Any = "ghcr_creds"
    env: Any = field(default_factory=dict)
    start_commands: Any = field(default_factory=lambda: ["true"])
    weights: Any = field(default_factory=list)
    checkpoint_path: Any = UNSET
    checkpoint_enabled: Any = True
    download_folder: Any = UNSET
    mount_base_path: Any = UNSET
    node_count: Any = UNSET
    cpu_count: Any = UNSET
    memory: Any = UNSET
    accelerator: Any = UNSET
    availability_model: Any = UNSET
    priority: Any = UNSET
    team_name: Any = UNSET
    enable_baseten_workdir: Any = False

    def source(self) -> str:
        def kw(**items: Any) -> str:
            return ", ".join(f"{k}={v}" for k, v in items.items() if v is not UNSET)

        def val(v: Any) -> Any:
            return UNSET if v is UNSET else repr(v)

        def env_value(v: Any) -> str:
            return f"d.SecretReference(name={v.name!r})" if isinstance(v, Secret) else repr(v)

        env = ("{" + ", ".join(f"{k!r}: {env_value(v)}" for k, v in self.env.items()) + "}"
               if isinstance(self.env, dict) else repr(self.env))
        if isinstance(self.weights, list):
            weights = "[" + ", ".join(
                f"truss_config.WeightsSource(source={w[0]!r}, mount_location={w[1]!r})"
                if isinstance(w, tuple) else repr(w) for w in self.weights) + "]"
        else:
            weights = repr(self.weights)
        docker_auth = UNSET
        if self.registry is not UNSET:
            docker_auth = (
                "d.DockerAuth(auth_method=truss_config.DockerAuthType.REGISTRY_SECRET, "
                f"registry={self.registry!r}, registry_secret_docker_auth=d.RegistrySecretDockerAuth("
                f"secret_ref=d.SecretReference(name={self.registry_secret!r})))"
            )
        ckpt = load = cache = UNSET
        if self.checkpoint_path is not UNSET:
            ckpt = (f"d.CheckpointingConfig(enabled={self.checkpoint_enabled!r}, "
                    f"checkpoint_path={self.checkpoint_path!r})")
        if self.download_folder is not UNSET:
            load = ("d.LoadCheckpointConfig(enabled=True, download_folder="
                    f"{self.download_folder!r}, checkpoints=["
                    "d.BasetenCheckpoint.from_latest_checkpoint(project_name='earlier')])")
        if self.mount_base_path is not UNSET:
            cache = f"d.CacheConfig(enabled=True, mount_base_path={self.mount_base_path!r})"
        image = f"d.Image({kw(base_image=val(self.base_image), docker_auth=docker_auth)})"
        compute = "d.Compute(" + kw(
            node_count=val(self.node_count), cpu_count=val(self.cpu_count), memory=val(self.memory),
            accelerator=val(self.accelerator), availability_model=val(self.availability_model)) + ")"
        runtime = "d.Runtime(" + kw(
            start_commands=repr(self.start_commands), environment_variables=env,
            checkpointing_config=ckpt, load_checkpoint_config=load, cache_config=cache) + ")"
        job = "d.TrainingJob(" + kw(
            image=image, compute=compute, runtime=runtime, name=val(self.job_name), weights=weights,
            priority=val(self.priority), enable_baseten_workdir=val(self.enable_baseten_workdir)) + ")"
        project = f"d.TrainingProject({kw(name=val(self.name), job=job, team_name=val(self.team_name))})"
        return ("from truss.base import truss_config\n"
                "from truss_train import definitions as d\n\n"
                f"project = {project}\n")


def site_for(root: Path, runtime: str = "none") -> SiteSettings:
    """A site whose storage roots all live under ``root`` (so nothing is written elsewhere)."""
    return SiteSettings(container_runtime=runtime, storage={
        "cluster_cache": f"{root}/site/cluster-cache",
        "node_cache": f"{root}/site/node-cache",
        "scratch": f"{root}/site/scratch",
        "cache": f"{root}/site/cache",
        "workspace": f"{root}/site/ws",
        "runtime": f"{root}/site/rt",
    })


def python_stub(path: Path) -> str:
    """An executable that stands in for the node interpreter: prints the leader address."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 127.0.0.1\n")
    path.chmod(0o755)
    return str(path)


def make_context(root: Path, **over: str) -> SubmitContext:
    config_path = over.get("config_path", f"{root}/config.py")
    values: dict[str, Any] = {
        "config_path": config_path, "source": config_path, "submit_id": SUBMIT_ID, "user": "alice",
        "uid": 1001, "home": f"{root}/home", "job_dir": f"{root}/job",
        "python": python_stub(root / "bin" / "python"), "version": "0.1.0",
    }
    values.update(over)
    return SubmitContext(**values)


def spec_from_config(root: Path, cfg: Cfg, runtime: str = "none", **ctx_over: str) -> JobSpec:
    """Write ``cfg`` to ``root/config.py`` and run it through the real loader and spec builder."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "config.py"
    path.write_text(cfg.source(), encoding="utf-8")
    project = load_training_project(str(path))
    return build_job_spec(project, site_for(root, runtime), make_context(root, **ctx_over))


def assert_clean_user_error(exc: UserError, source: str) -> None:
    """A user error is one line per problem, each naming the config file."""
    lines = exc.lines()
    assert lines, "a UserError with no problems"
    for line in lines:
        assert "\n" not in line and "\r" not in line, repr(line)
        assert line.startswith(f"{source}: "), repr(line)


# ---------------------------------------------------------------------------------------------------
# (a) and (b): what sbatch and bash make of the text
# ---------------------------------------------------------------------------------------------------

_C_SPACE = b" \t\n\v\f\r"


def sbatch_rejects(script: bytes) -> str | None:
    """Why sbatch would refuse the script before parsing it (``get_script_buffer`` in sbatch.c)."""
    if not script.strip(_C_SPACE):
        return "empty or whitespace only"
    if not script.startswith(b"#!"):
        return "no #! line"
    if b"\0" in script:
        return "contains a NUL character"
    if b"\r\n" in script:
        return "contains DOS line breaks (\\r\\n)"
    return None


def sbatch_directive_lines(script: bytes) -> list[str]:
    """The lines sbatch takes options from (``_opt_batch_script`` in sbatch/opt.c).

    Lines are split on ``\\n`` only; a line starting with ``#SBATCH`` or ``#SLURM`` is a directive; any
    other line whose first non-space byte is not ``#`` ends the directive block.
    """
    out = []
    for line in script.split(b"\n"):
        if line.startswith((b"#SBATCH", b"#SLURM")):
            out.append(line.decode("utf-8", "replace"))
            continue
        rest = line.lstrip(_C_SPACE)
        if rest and not rest.startswith(b"#"):
            break
    return out


def expected_directives(spec: JobSpec) -> list[str]:
    """The directives a job must request, built from the spec independently of the renderer."""
    job_dir = spec.context.job_dir
    out = [
        f"--job-name={spec.slurm_job_name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.cpus_per_task}",
        f"--mem={spec.mem_mib}M",
        f"--partition={spec.partition}",
    ]
    if spec.gpus_per_node:
        out.append(f"--gres=gpu:{spec.gres_type}:{spec.gpus_per_node}")
    out += [
        f"--chdir={job_dir}",
        f"--output={job_dir}/logs/slurm-%j.out",
        "--open-mode=append",
        "--export=NONE",
        "--requeue" if spec.requeue else "--no-requeue",
        f"--signal=B:USR2@{spec.restarts.stop_grace_s}",
        f"--comment=slurm-bt:{spec.context.submit_id}",
    ]
    return ["#SBATCH " + d for d in out]


_ONE_OPTION = re.compile(r"#SBATCH --[a-z-]+(=[^\s'\"#\\]+)?")


def check_batch_text(spec: JobSpec, script: str) -> bytes:
    """(a): sbatch accepts the script and reads exactly the expected directives. Returns the bytes."""
    data = script.encode("utf-8")  # UnicodeEncodeError here = the script cannot even be written
    assert sbatch_rejects(data) is None, sbatch_rejects(data)
    directives = sbatch_directive_lines(data)
    assert directives == expected_directives(spec)
    for line in directives:  # each line is one option to sbatch's tokenizer: no quotes, spaces or '#'
        assert _ONE_OPTION.fullmatch(line), line
    # the job name is a slug, not the user's text
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,120}", spec.slurm_job_name)
    return data


def bash_syntax_ok(path: Path) -> None:
    """(b)"""
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")


def write_scripts(spec: JobSpec, where: Path) -> tuple[Path, Path]:
    """Render both scripts, check (a) and (b), write them; the entry goes where the batch expects it."""
    batch = render_batch_script(spec)
    entry = render_node_entry(spec)
    batch_bytes = check_batch_text(spec, batch)
    where.mkdir(parents=True, exist_ok=True)
    batch_path = where / "job.sbatch"
    batch_path.write_bytes(batch_bytes)
    job_dir = Path(spec.context.job_dir)
    (job_dir / "src").mkdir(parents=True, exist_ok=True)
    (job_dir / "logs").mkdir(parents=True, exist_ok=True)
    entry_path = job_dir / ENTRY_NAME
    entry_path.write_bytes(entry.encode("utf-8"))
    bash_syntax_ok(batch_path)
    bash_syntax_ok(entry_path)
    return batch_path, entry_path


# ---------------------------------------------------------------------------------------------------
# (c) and (d): running the scripts with stubs
# ---------------------------------------------------------------------------------------------------

STUBS = textwrap.dedent(r"""
    srun() {
      local a step=unnamed
      for a in "$@"; do case "$a" in --job-name=*) step="${a#--job-name=}";; esac; done
      printf '%s\0' "$@" > "$BT_TEST_OUT/srun-$step.argv"
      env -0 > "$BT_TEST_OUT/srun-$step.env"
      if [ "$step" = bt-train ]; then
        (cd "$BT_TEST_JOBDIR" && PATH="$BT_TEST_BIN:$PATH" "${@: -2}")
      fi
    }
    export -f srun
    exec /bin/bash "$1"
""")

# `exec apptainer` in node_entry.sh needs a real executable; the stub srun puts it first on PATH, as
# the node's own PATH would hold the real one.
APPTAINER_STUB = textwrap.dedent(r"""
    #!/bin/bash
    printf '%s\0' "$@" > "$BT_TEST_OUT/apptainer.argv"
    exec "${@: -3}"
""").lstrip()

DUMP_COMMAND = 'env -0 > "$BT_TEST_OUT/entry.env"; pwd > "$BT_TEST_OUT/entry.pwd"'


class FakeStore:
    """The user's secret store, as the prepare step sees it: every name resolves to SECRET_VALUE."""

    def __init__(self, value: str) -> None:
        self.value = value

    def get(self, name: str) -> str:
        return self.value


def parse_env0(data: bytes) -> dict[str, str]:
    out = {}
    for record in data.split(b"\0"):
        if record:
            name, _, value = record.partition(b"=")
            out[name.decode()] = value.decode("utf-8", "surrogateescape")
    return out


def read_argv(path: Path) -> list[str]:
    return [a.decode("utf-8", "surrogateescape") for a in path.read_bytes().split(b"\0")[:-1]]


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path
    canary: Path
    cwd: Path

    def steps(self) -> set[str]:
        return {p.name[len("srun-"):-len(".argv")] for p in self.out.glob("srun-*.argv")}

    def srun(self, step: str) -> tuple[list[str], dict[str, str]]:
        return (read_argv(self.out / f"srun-{step}.argv"),
                parse_env0((self.out / f"srun-{step}.env").read_bytes()))

    def entry_env(self) -> dict[str, str]:
        return parse_env0((self.out / "entry.env").read_bytes())


def stub_bin(root: Path) -> str:
    bin_dir = root / "stub-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apptainer").write_text(APPTAINER_STUB)
    (bin_dir / "apptainer").chmod(0o755)
    return str(bin_dir)


def read_text_exact(path: Path) -> str:
    """File text without newline translation (``read_text`` would turn a ``\r`` into ``\n``)."""
    return path.read_bytes().decode("utf-8", "surrogateescape")


def slurm_environ(root: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin", "HOME": str(root / "home"), "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": NODE_NAME, "SLURM_JOB_ACCOUNT": "acct",
    }


def write_env_file(spec: JobSpec, secret_value: str = "") -> Path:
    """What the prepare step leaves for node_entry.sh: this node's NUL-separated environment."""
    environ = {"SLURM_JOB_ID": JOB_ID, "SLURM_NODEID": "0", "SLURMD_NODENAME": NODE_NAME,
               "SLURM_JOB_ACCOUNT": "acct"}
    values = node_environment(spec, environ, FakeStore(secret_value or SECRET_VALUE))  # type: ignore[arg-type]
    path = Path(runtime_dir(spec, JOB_ID)) / "node-0.env"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(encode_env(values))
    return path


def run_batch(spec: JobSpec, root: Path, *, secret_value: str = "") -> Run:
    """(c)+(d): run the batch script; the stub srun runs node_entry.sh for the training step."""
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)
    cwd = root / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    batch_path, _ = write_scripts(spec, root / "scripts")
    write_env_file(spec, secret_value)
    runner = root / "runner.sh"
    runner.write_text(STUBS)
    env = {**slurm_environ(root), "BT_TEST_OUT": str(out), "BT_TEST_JOBDIR": spec.context.job_dir,
           "BT_TEST_BIN": stub_bin(root)}
    proc = subprocess.run(["/bin/bash", str(runner), str(batch_path)], cwd=cwd, env=env,
                          capture_output=True, timeout=120)
    return Run(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
               out, root / "CANARY", cwd)


def expected_srun_argv(spec: JobSpec) -> tuple[list[str], list[str]]:
    """The argv of both srun steps after bash has expanded the script (job id 4242, one node)."""
    ctx = spec.context
    common = ["--export=ALL", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    prepare = [*common, "--job-name=bt-prepare", ctx.python, "-I", "-m", "slurm_bt.steps.prepare",
               f"{ctx.job_dir}/job.json"]
    train = [*common, "--job-name=bt-train", f"--output={ctx.job_dir}/logs/slurm-%j.node%n.out"]
    if spec.container_runtime == "pyxis":
        layout = job_layout(spec, job_id=JOB_ID, node=None)
        mounts = ",".join(f"{b.source}:{b.target}" + (":ro" if b.read_only else "") for b in layout.binds)
        train += [f"--container-image={container_image_ref(spec.image)}", f"--container-mounts={mounts}",
                  f"--container-workdir={layout.workdir}"]
    train += ["/bin/bash", f"{ctx.job_dir}/{ENTRY_NAME}"]
    return prepare, train


def expected_apptainer_argv(spec: JobSpec) -> list[str]:
    layout = job_layout(spec, job_id=JOB_ID, node=None)
    argv = ["exec", "--nv"]
    for b in layout.binds:
        argv += ["--bind", f"{b.source}:{b.target}" + (":ro" if b.read_only else "")]
    return [*argv, "--pwd", layout.workdir, f"docker://{spec.image}", "/bin/bash",
            f"{spec.context.job_dir}/{ENTRY_NAME}", "--in-container"]


def check_run(spec: JobSpec, run: Run, *, secret_value: str = SECRET_VALUE) -> None:
    """(c) and (d) for a batch run whose start commands end with DUMP_COMMAND."""
    assert run.returncode == 0, run.stderr
    assert not run.canary.exists(), "a payload was executed"
    assert list(run.cwd.iterdir()) == [], "the batch script wrote into its working directory"
    prepare_argv, train_argv = expected_srun_argv(spec)
    uploader = spec.checkpointing.enabled
    assert run.steps() == {"bt-prepare", "bt-train"} | ({"bt-checkpoints"} if uploader else set())
    argv1, env1 = run.srun("bt-prepare")
    argv2, env2 = run.srun("bt-train")
    assert argv1 == prepare_argv
    assert argv2 == train_argv
    envs = [env1, env2]
    if uploader:  # the background checkpoint uploader: its values, and the finish marker on exit
        argv3, env3 = run.srun("bt-checkpoints")
        envs.append(env3)
        assert argv3[-5:] == [spec.context.python, "-I", "-m", "slurm_bt.steps.checkpoint_agent",
                              f"{spec.context.job_dir}/job.json"]
        assert "--job-name=bt-checkpoints" in argv3
        assert Path(f"{spec.context.job_dir}/checkpoints.finish.{JOB_ID}").exists()
    for env in envs:
        for key, value in spec.env:
            assert env.get(key) == value, key
        assert env["BT_TRAINING_PROJECT_NAME"] == spec.project_name
        assert env["BT_TRAINING_JOB_NAME"] == (spec.job_name or spec.slurm_job_name)
        assert env["BT_LEADER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == str(spec.master_port_base + int(JOB_ID) % 10000)
        assert env["BT_JOB_SPEC"] == f"{spec.context.job_dir}/job.json"
        assert not any(SECRET_MARK in f"{k}={v}" for k, v in env.items()), "a secret reached the batch env"
    if spec.container_runtime == "pyxis" and spec.docker_auth:
        assert env2["ENROOT_CONFIG_PATH"] == runtime_dir(spec, JOB_ID) + "/enroot"
    if spec.container_runtime == "apptainer":
        assert read_argv(run.out / "apptainer.argv") == expected_apptainer_argv(spec)
    # (d): the start commands saw everything verbatim and the env file is gone.
    entry_env = run.entry_env()
    for key, value in spec.env:
        assert entry_env.get(key) == value, key
    for key, _ in spec.secret_env:
        assert entry_env.get(key) == secret_value, key
    for key, value in job_layout(spec, job_id=JOB_ID, node=NODE_NAME, account="acct").env:
        assert entry_env.get(key) == value, key
    assert "LD_PRELOAD" not in entry_env
    if spec.container_runtime == "apptainer":
        assert "APPTAINER_DOCKER_PASSWORD" not in entry_env
    assert read_text_exact(run.out / "entry.pwd")[:-1] == job_layout(spec, job_id=JOB_ID, node=None).workdir
    assert not (Path(runtime_dir(spec, JOB_ID)) / "node-0.env").exists(), "the env file was not deleted"


def with_payload(payload: str, root: Path) -> str:
    return payload.replace(CANARY, str(root / "CANARY"))


# ---------------------------------------------------------------------------------------------------
# Config fields
# ---------------------------------------------------------------------------------------------------

# field → (how the payload enters the config, container runtimes to try)
FieldCase = tuple[Callable[[str], Cfg], tuple[str, ...]]
ALL_RUNTIMES = ("none", "pyxis", "apptainer")
CONFIG_FIELDS: dict[str, FieldCase] = {
    "project_name": (lambda p: Cfg(name=p), ("none",)),
    "job_name": (lambda p: Cfg(job_name=p), ("none",)),
    "env_value": (lambda p: Cfg(env={"USER_VAR": p, "PLAIN": "plain value"}), ALL_RUNTIMES),
    "secret_name": (lambda p: Cfg(env={"TOKEN": Secret(p)}), ("none",)),
    "base_image": (lambda p: Cfg(base_image=p), ALL_RUNTIMES),
    "base_image_registry_path": (lambda p: Cfg(base_image=f"nvcr.io/{p}"), ("pyxis",)),
    "docker_auth_registry": (lambda p: Cfg(registry=p), ALL_RUNTIMES),
    "docker_auth_secret_name": (lambda p: Cfg(registry="ghcr.io", registry_secret=p), ("pyxis", "apptainer")),
    "weights_source": (lambda p: Cfg(weights=[(f"hf://org/repo{p}", "/app/w")]), ("none", "pyxis")),
    "weights_mount_location": (lambda p: Cfg(weights=[("hf://org/repo", f"/app/{p}")]), ALL_RUNTIMES),
    "checkpoint_path": (lambda p: Cfg(checkpoint_path=f"/mnt/{p}"), ALL_RUNTIMES),
    "checkpoint_path_disabled": (lambda p: Cfg(checkpoint_path=f"/mnt/{p}", checkpoint_enabled=False),
                                 ("pyxis",)),
    "download_folder": (lambda p: Cfg(download_folder=f"/data/{p}"), ALL_RUNTIMES),
    "mount_base_path": (lambda p: Cfg(mount_base_path=f"/cache/{p}"), ALL_RUNTIMES),
}

CONFIG_CASES = [
    pytest.param(field_name, runtime, payload_id, id=f"{field_name}-{runtime}-{payload_id}")
    for field_name, (_, runtimes) in CONFIG_FIELDS.items()
    for runtime in runtimes
    for payload_id in PAYLOADS
]


@pytest.mark.parametrize(("field_name", "runtime", "payload_id"), CONFIG_CASES)
def test_config_string_cannot_inject(tmp_path: Path, field_name: str, runtime: str, payload_id: str) -> None:
    payload = with_payload(PAYLOADS[payload_id], tmp_path)
    make_cfg, _ = CONFIG_FIELDS[field_name]
    cfg = make_cfg(payload)
    cfg.start_commands = ["true", DUMP_COMMAND]
    try:
        spec = spec_from_config(tmp_path, cfg, runtime)
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    check_run(spec, run_batch(spec, tmp_path))


def test_some_payloads_do_reach_the_scripts(tmp_path: Path) -> None:
    """Guard against the matrix passing vacuously: the raw payloads are accepted where truss accepts them."""
    payload = with_payload(PAYLOADS["single-quote"], tmp_path)
    spec = spec_from_config(tmp_path, Cfg(name=payload, job_name=payload, env={"V": payload},
                                          start_commands=[DUMP_COMMAND]), "pyxis")
    assert spec.project_name == spec.job_name == payload
    batch = render_batch_script(spec)
    assert shlex.quote(payload) in batch
    check_run(spec, run_batch(spec, tmp_path))


# ---------------------------------------------------------------------------------------------------
# SubmitContext fields: config_path (comment only), job_dir and the node python (paths on disk)
# ---------------------------------------------------------------------------------------------------

PATH_PAYLOADS = [k for k in PAYLOADS if k != "long"]  # a path component cannot be 100 kB


def _path_payload(payload: str) -> str:
    # One path component: '/' would only add directories, so keep it but make every part short enough.
    return "/".join(part[:200] or "_" for part in payload.split("/"))


@pytest.mark.parametrize("payload_id", list(PAYLOADS))
def test_config_path_cannot_inject(tmp_path: Path, payload_id: str) -> None:
    payload = with_payload(PAYLOADS[payload_id], tmp_path)
    cfg = Cfg(start_commands=[DUMP_COMMAND])
    spec = spec_from_config(tmp_path, cfg, "none", config_path=payload, source=payload)
    check_run(spec, run_batch(spec, tmp_path))


@pytest.mark.parametrize("runtime", ALL_RUNTIMES)
@pytest.mark.parametrize("payload_id", PATH_PAYLOADS)
def test_job_dir_cannot_inject(tmp_path: Path, payload_id: str, runtime: str) -> None:
    """A job_dir outside the #SBATCH-safe alphabet is refused by the renderer's own guard (a bug
    guard, not a user error: job dirs are built from slugs); the entry script still quotes it."""
    payload = with_payload(PAYLOADS[payload_id], tmp_path)
    job_dir = tmp_path / "jobs" / _path_payload(payload)
    spec = spec_from_config(tmp_path, Cfg(start_commands=[DUMP_COMMAND]), runtime, job_dir=str(job_dir))
    with pytest.raises(ValueError, match="unsafe #SBATCH value"):
        render_batch_script(spec)
    # node_entry.sh has no directives: run it directly, as srun would.
    (job_dir / "src").mkdir(parents=True)
    entry = job_dir / ENTRY_NAME
    entry.write_bytes(render_node_entry(spec).encode())
    bash_syntax_ok(entry)
    write_env_file(spec)
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 0, run.stderr
    assert not run.canary.exists()
    assert run.entry_env()["BT_SCRATCH_DIR"] == f"{tmp_path}/site/scratch/{JOB_ID}"
    assert read_text_exact(run.out / "entry.pwd")[:-1] == f"{job_dir}/src"


@pytest.mark.parametrize("runtime", ["none", "pyxis"])
@pytest.mark.parametrize("payload_id", PATH_PAYLOADS)
def test_node_python_path_cannot_inject(tmp_path: Path, payload_id: str, runtime: str) -> None:
    payload = with_payload(PAYLOADS[payload_id], tmp_path)
    python = python_stub(tmp_path / "weird" / _path_payload(payload) / "python")
    spec = spec_from_config(tmp_path, Cfg(start_commands=[DUMP_COMMAND]), runtime, python=python)
    check_run(spec, run_batch(spec, tmp_path))


def run_entry_directly(spec: JobSpec, root: Path, *args: str, extra_env: dict[str, str] | None = None) -> Run:
    out = root / "out"
    out.mkdir(parents=True, exist_ok=True)
    cwd = root / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**slurm_environ(root), "BT_TEST_OUT": str(out), **(extra_env or {})}
    env["PATH"] = f"{stub_bin(root)}:{env['PATH']}"
    proc = subprocess.run(["/bin/bash", f"{spec.context.job_dir}/{ENTRY_NAME}", *args], cwd=cwd, env=env,
                          capture_output=True, timeout=60)
    return Run(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
               out, root / "CANARY", cwd)


# ---------------------------------------------------------------------------------------------------
# (d) start_commands: run exactly as written, in order, in one shell
# ---------------------------------------------------------------------------------------------------


def entry_spec(root: Path, commands: list[str], runtime: str = "none", **cfg: Any) -> JobSpec:
    spec = spec_from_config(root, Cfg(start_commands=commands, **cfg), runtime)
    job_dir = Path(spec.context.job_dir)
    (job_dir / "src").mkdir(parents=True, exist_ok=True)
    entry = job_dir / ENTRY_NAME
    entry.write_bytes(render_node_entry(spec).encode())
    bash_syntax_ok(entry)
    write_env_file(spec)
    return spec


@pytest.mark.parametrize("payload_id", list(PAYLOADS))
def test_start_command_text_arrives_verbatim(tmp_path: Path, payload_id: str) -> None:
    """A command that prints a quoted payload prints exactly the payload: the array element is intact."""
    payload = with_payload(PAYLOADS[payload_id], tmp_path)
    command = f'printf %s {shlex.quote(payload)} > "$BT_TEST_OUT/cmd.out"'
    spec = entry_spec(tmp_path, [command, DUMP_COMMAND])
    assert spec.start_commands[0] == command
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (run.out / "cmd.out").read_bytes() == payload.encode()
    assert not run.canary.exists()


PIPEFAIL_REASON = (
    "BUG: node_entry.sh runs the start commands with `pipefail` still on (only `set +u` is undone,"
    " although its comment says 'start commands run with ordinary shell semantics'), so a pipeline"
    " whose first command fails or gets SIGPIPE (`yes | head -n1`, `x | tee log`) has a different"
    " status than when written in a shell, and the job stops there")


@pytest.mark.parametrize("payload_id", [
    p for p in PAYLOADS])
def test_start_command_behaves_like_bash_c(tmp_path: Path, payload_id: str) -> None:
    """The raw payload *as a command* does what ``bash -c`` does with it: no more, no less."""
    payload = with_payload(PAYLOADS[payload_id], tmp_path)
    direct = subprocess.run(["/bin/bash", "-c", payload], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                            capture_output=True, timeout=60)
    direct_made_canary = (tmp_path / "CANARY").exists()
    (tmp_path / "CANARY").unlink(missing_ok=True)
    spec = entry_spec(tmp_path, [payload, DUMP_COMMAND])
    run = run_entry_directly(spec, tmp_path)
    assert run.canary.exists() == direct_made_canary
    if direct.returncode:
        assert run.returncode == direct.returncode, (run.stderr, direct.stderr)
        assert not (run.out / "entry.env").exists(), "a command after the failing one ran"
    else:
        assert run.returncode == 0, run.stderr


def test_start_commands_share_one_shell(tmp_path: Path) -> None:
    spec = entry_spec(tmp_path, [
        "mkdir -p 'sub dir' && cd 'sub dir'",
        "export EXPORTED='a b'",
        "LOCAL=\"$(echo local)\"",
        "f() { echo \"fn:$1\"; }",
        'printf "%s|%s|%s|%s" "$PWD" "$EXPORTED" "$LOCAL" "$(f x)" > "$BT_TEST_OUT/shared"',
    ])
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 0, run.stderr
    src = f"{spec.context.job_dir}/src"
    assert (run.out / "shared").read_text() == f"{src}/sub dir|a b|local|fn:x"


def test_start_commands_run_in_order(tmp_path: Path) -> None:
    spec = entry_spec(tmp_path, [f'echo {i} >> "$BT_TEST_OUT/order"' for i in range(12)])
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (run.out / "order").read_text().split() == [str(i) for i in range(12)]


@pytest.mark.parametrize(("failing", "code"), [("(exit 7)", 7), ("false", 1), ("exit 3", 3),
                                               ("no-such-command-xyz", 127), ("echo 'unterminated", 2),
                                               ("true; (exit 42)", 42)])
def test_start_commands_stop_at_first_failure(tmp_path: Path, failing: str, code: int) -> None:
    spec = entry_spec(tmp_path, ['echo first >> "$BT_TEST_OUT/log"', failing,
                                 'echo after >> "$BT_TEST_OUT/log"'])
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == code, run.stderr
    assert (run.out / "log").read_text() == "first\n"


@pytest.mark.parametrize("command", ["yes | head -n1 > /dev/null", "false | true"])
def test_pipeline_status_is_ordinary_shell_status(tmp_path: Path, command: str) -> None:
    """Fixed: ``set +u +o pipefail`` before the loop (or document pipefail as part of the contract and
    correct the comment). The job must go on after a pipeline that bash itself reports as success."""
    spec = entry_spec(tmp_path, [command, 'echo after > "$BT_TEST_OUT/after"'])
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (run.out / "after").exists()


def test_multiline_start_command(tmp_path: Path) -> None:
    spec = entry_spec(tmp_path, ['for i in 1 2 3; do\n  echo "$i"\ndone > "$BT_TEST_OUT/multi"\n# comment'])
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 0, run.stderr
    assert (run.out / "multi").read_text() == "1\n2\n3\n"


@pytest.mark.parametrize("runtime", ALL_RUNTIMES)
def test_env_values_reach_start_commands_unevaluated(tmp_path: Path, runtime: str) -> None:
    """Plain values (batch script) and secrets (env file) reach the commands byte for byte."""
    canary = tmp_path / "CANARY"
    values = {name: with_payload(p, tmp_path) for name, p in [
        ("NEWLINES", f"line1\nline2\n#SBATCH --wrap=touch {CANARY}\n"),
        ("QUOTES", "'\"`\\"), ("SUBST", f"$(touch {CANARY})`touch {CANARY}`"),
        ("EQUALS", "a=b=c"), ("EMPTY", ""), ("SPACES", "  lead and trail  "),
        ("GLOB", "* ? [a-z] ~ {a,b}"), ("UNICODE", "h\u00e9\u2028\u0085\U0001f600"),
        ("LONG", "v" * 100_000),
    ]}
    cfg = Cfg(env={**values, "SECRET_ONE": Secret("one"), "SECRET_TWO": Secret("two")},
              start_commands=[DUMP_COMMAND], registry="ghcr.io" if runtime != "none" else UNSET)
    spec = spec_from_config(tmp_path, cfg, runtime)
    run = run_batch(spec, tmp_path, secret_value=with_payload(SECRET_VALUE, tmp_path))
    check_run(spec, run, secret_value=with_payload(SECRET_VALUE, tmp_path))
    env = run.entry_env()
    for name, value in values.items():
        assert env[name] == value, name
    assert not canary.exists()


def test_env_file_missing_fails_before_any_command(tmp_path: Path) -> None:
    spec = entry_spec(tmp_path, ['echo ran > "$BT_TEST_OUT/ran"'])
    (Path(runtime_dir(spec, JOB_ID)) / "node-0.env").unlink()
    run = run_entry_directly(spec, tmp_path)
    assert run.returncode == 1
    assert "prepare step did not finish" in run.stderr
    assert not (run.out / "ran").exists()


def test_secret_value_is_not_in_any_script(tmp_path: Path) -> None:
    spec = spec_from_config(tmp_path, Cfg(env={"TOKEN": Secret("hf_token")}, registry="ghcr.io"), "pyxis")
    for text in (render_batch_script(spec), render_node_entry(spec), spec.model_dump_json()):
        assert SECRET_MARK not in text
    assert "hf_token" in render_batch_script(spec)  # the name (in a comment), never the value


# ---------------------------------------------------------------------------------------------------
# Bugs found by these tests and fixed since (each test pins its fix)
# ---------------------------------------------------------------------------------------------------

CRLF_FIELDS: dict[str, FieldCase] = {
    "project_name": (lambda p: Cfg(name=p), ("none",)),
    "job_name": (lambda p: Cfg(job_name=p), ("none",)),
    "env_value": (lambda p: Cfg(env={"USER_VAR": p}), ("none",)),
    "base_image": (lambda p: Cfg(base_image=p), ("pyxis",)),
}


@pytest.mark.parametrize("field_name", list(CRLF_FIELDS))
def test_crlf_in_a_value_is_rejected_or_escaped(tmp_path: Path, field_name: str) -> None:
    """Fixed: emit values with control characters as ANSI-C ``$'...'`` words in ``quoting.shq`` (the
    script then holds only printable text, and the value still round-trips), or reject
    ``\\r``/control characters in these fields with a ConfigError."""
    make_cfg, (runtime,) = CRLF_FIELDS[field_name]
    try:
        spec = spec_from_config(tmp_path, make_cfg("line1\r\nline2"), runtime)
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    check_batch_text(spec, render_batch_script(spec))


NUL_FIELDS: dict[str, FieldCase] = {
    "project_name": (lambda p: Cfg(name=p), ("none",)),
    "job_name": (lambda p: Cfg(job_name=p), ("none",)),
    "env_value": (lambda p: Cfg(env={"USER_VAR": p}), ("none",)),
    "start_command": (lambda p: Cfg(start_commands=[f"echo {p}"]), ("none",)),
    "base_image": (lambda p: Cfg(base_image=p), ("pyxis",)),
    "checkpoint_path": (lambda p: Cfg(checkpoint_path=f"/mnt/{p}"), ("pyxis",)),
    "download_folder": (lambda p: Cfg(download_folder=f"/data/{p}"), ("apptainer",)),
}


@pytest.mark.parametrize("field_name", list(NUL_FIELDS))
def test_nul_in_a_string_is_a_config_error(tmp_path: Path, field_name: str) -> None:
    """Fixed: ``build_job_spec`` (or the loader's stricter checks) rejects NUL in every string that reaches
    a script or the environment, naming the field; the renderer's placeholder then cannot collide."""
    make_cfg, (runtime,) = NUL_FIELDS[field_name]
    with pytest.raises(ConfigError) as info:
        spec_from_config(tmp_path, make_cfg("a\x00JOB\x00b"), runtime)
    assert_clean_user_error(info.value, str(tmp_path / "config.py"))


@pytest.mark.parametrize("field_name", ["project_name", "env_value", "start_command", "job_name"])
def test_unencodable_string_is_a_config_error(tmp_path: Path, field_name: str) -> None:
    """Fixed: reject strings that are not encodable as UTF-8 (``s.encode()`` fails) in the loader's
    stricter pass, naming the field."""
    bad = "x\ud800y"
    cfg = {"project_name": Cfg(name=bad), "env_value": Cfg(env={"V": bad}),
           "start_command": Cfg(start_commands=[f"echo {bad}"]), "job_name": Cfg(job_name=bad)}[field_name]
    try:
        spec = spec_from_config(tmp_path, cfg)
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    render_batch_script(spec).encode()
    render_node_entry(spec).encode()
    spec.model_dump_json()


@pytest.mark.parametrize("name", ["UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO"])
def test_bash_readonly_env_names_are_rejected(tmp_path: Path, name: str) -> None:
    """Fixed: ``build_job_spec`` rejects these names (a small deny-list next to the identifier regex)."""
    cfg = Cfg(env={name: "5"}, start_commands=[DUMP_COMMAND])
    try:
        spec = spec_from_config(tmp_path, cfg)
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    check_run(spec, run_batch(spec, tmp_path))


@pytest.mark.parametrize("name", ["bt_env", "bt_kv", "bt_cmd", "bt_commands"])
@pytest.mark.parametrize("kind", ["plain", "secret"])
def test_entry_internal_names_do_not_collide(tmp_path: Path, name: str, kind: str) -> None:
    """Fixed: reject env names that start with ``bt_`` (reserved), or have the entry script use a
    function with ``local`` variables / names the identifier rule cannot produce."""
    value: Any = "user value" if kind == "plain" else Secret("s")
    cfg = Cfg(env={name: value}, start_commands=[DUMP_COMMAND])
    try:
        spec = spec_from_config(tmp_path, cfg)
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    check_run(spec, run_batch(spec, tmp_path))


def test_helpers_detect_injection() -> None:
    """The oracles themselves: a smuggled directive or a CRLF is caught."""
    script = b"#!/bin/bash\n# c\n#SBATCH --nodes=1\n\n  # x\n#SBATCH --wrap=evil\nset -e\n#SBATCH --late\n"
    assert sbatch_directive_lines(script) == ["#SBATCH --nodes=1", "#SBATCH --wrap=evil"]
    assert sbatch_directive_lines(b"#!/bin/sh\n#SLURM --x\n\t\n") == ["#SLURM --x"]
    assert sbatch_rejects(b"#!/bin/sh\r\necho\n") is not None
    assert sbatch_rejects(b"#!/bin/sh\necho '\0'\n") is not None
    assert sbatch_rejects(b"#!/bin/sh\necho 'a\rb'\n") is None
    assert not _ONE_OPTION.fullmatch("#SBATCH --job-name=a b")
    assert parse_env0(b"A=1\nB=2\0C=\0") == {"A": "1\nB=2", "C": ""}


def test_field_table_is_complete() -> None:
    """Every user string the renderer reads is in the matrix (update both when JobSpec grows)."""
    covered = {"project_name", "job_name", "env_value", "secret_name", "base_image", "docker_auth_registry",
               "docker_auth_secret_name", "weights_source", "weights_mount_location", "checkpoint_path",
               "download_folder", "mount_base_path"}
    assert covered <= set(CONFIG_FIELDS)
    string_fields = {name for name, f in JobSpec.model_fields.items() if f.annotation in (str, "str")}
    assert string_fields <= {"project_name", "project_id", "job_name", "slurm_job_name", "image",
                             "partition", "availability_model"}, string_fields



def test_secret_named_bt_env_cannot_redirect_the_env_file_deletion(tmp_path: Path) -> None:
    """Fixed: as above (reserve ``bt_*`` names), and/or have the entry read the file path into a variable
    that the loop cannot assign, e.g. ``exec 3< "$bt_env"; rm -f -- "$bt_env"`` *before* loading."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    try:
        spec = spec_from_config(tmp_path, Cfg(env={"bt_env": Secret("s")}, start_commands=[DUMP_COMMAND]))
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    run = run_batch(spec, tmp_path, secret_value=str(victim))
    assert run.returncode == 0, run.stderr
    assert victim.exists(), "node_entry.sh deleted the path held in the secret"
    assert not (Path(runtime_dir(spec, JOB_ID)) / "node-0.env").exists(), "secrets file left on tmpfs"


def test_env_value_longer_than_max_arg_strlen_is_rejected(tmp_path: Path) -> None:
    """Fixed: ``build_job_spec`` rejects ``len(f"{name}={value}".encode()) >= 131072`` naming the
    variable (and the prepare step should fail clearly for secrets that large)."""
    cfg = Cfg(env={"BIG": "v" * 200_000}, start_commands=[DUMP_COMMAND])
    try:
        spec = spec_from_config(tmp_path, cfg)
    except ConfigError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        return
    check_run(spec, run_batch(spec, tmp_path))
