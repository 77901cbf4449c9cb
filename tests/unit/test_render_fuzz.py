"""Property-based mutations of a valid config, through the real loader, spec builder and renderer.

Property: every mutated config either raises a ``UserError`` whose lines are one line each and name the
config file, or renders two scripts that break the injection rules (see ``test_render_injection``); a
smaller sample is also executed with stubs, (c) and (d). Any other exception is a traceback for a user
mistake, i.e. a bug.

NUL, ``\\r\\n``, lone surrogates, bash-readonly and ``bt_*`` env names and values over MAX_ARG_STRLEN
have targeted tests in test_render_injection (they were bugs once); ``cpu_count <= 0`` has one below.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from slurm_bt.errors import UserError
from slurm_bt.render.batch_script import render_batch_script, render_node_entry
from tests.unit.test_render_injection import (
    CANARY,
    DUMP_COMMAND,
    Cfg,
    Secret,
    assert_clean_user_error,
    bash_syntax_ok,
    check_run,
    expected_directives,
    run_batch,
    sbatch_directive_lines,
    spec_from_config,
    with_payload,
    write_scripts,
)

FUZZ = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Shell/Slurm-meaningful fragments, mixed into random text so that hypothesis explores them often.
FRAGMENTS = ["\n", "\r", "'", '"', "`", "\\", "$", "$(touch {CANARY})", "`touch {CANARY}`", "${IFS}",
             "; touch {CANARY}", "#SBATCH --wrap=x", "\n#SBATCH --nodes=99\n", "#SLURM", "%j", "%n", ",",
             ":", " ", "\t", "\x1b[0m", "\u2028", "\u0085", "..", "/", "//", "*", "~", "{a,b}", "-",
             "--", "=", "JOB"]
_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
_BASH_SPECIAL = {"UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "BASH_VERSINFO", "PATH", "IFS", "HOME",
                 "PWD", "OLDPWD", "SHLVL", "BASH_ENV", "ENV", "USER", "LOGNAME", "BASHPID", "RANDOM",
                 "SRANDOM", "SECONDS", "LINENO", "GROUPS", "FUNCNAME", "HISTCMD", "EPOCHSECONDS",
                 "EPOCHREALTIME", "BASH_ARGV0", "BASH_COMMAND", "BASH_SUBSHELL", "OPTIND", "PS4",
                 "LD_PRELOAD", "LD_LIBRARY_PATH", "_"}


def _no_crlf(s: str) -> str:
    return re.sub(r"\r+\n", "\n", s)


text = st.lists(st.one_of(st.text(_CHARS, max_size=12), st.sampled_from(FRAGMENTS)), max_size=5).map(
    "".join).map(_no_crlf)
# What a user might plausibly type where a path goes: mostly absolute, sometimes not.
path_text = st.one_of(text.map(lambda s: "/" + s), text, st.sampled_from(["/mnt/ckpt", "/data/x", "/"]))
any_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=False),
                       st.lists(st.integers(), max_size=2))
env_name = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
        lambda n: n not in _BASH_SPECIAL and not n.startswith(("bt_", "BASH_", "SLURM", "BT_"))),
    st.text(_CHARS, max_size=6),
)
env_value = st.one_of(text, st.builds(Secret, name=text), any_scalar)
env_dict = st.dictionaries(env_name, env_value, max_size=4)
accelerator = st.one_of(
    st.sampled_from(["H100", "H100:2", "H100:8", "H100:0", "H100:x", "H100:2:3", "A100", "T4:1", "", "h100",
                     ":2", "H100:-1", "B200:3"]),
    text,
    st.fixed_dictionaries({"accelerator": st.sampled_from(["H100", "A10G", "nope"]),
                           "count": st.integers(-1, 16)}),
)
weights = st.lists(
    st.one_of(
        st.tuples(st.one_of(st.sampled_from(["hf://org/repo", "hf://org/repo@main", "s3://b/k", "gs://b/k",
                                             "https://h/p", "r2://a.b/k", "file:///x"]), text,
                            text.map(lambda s: "hf://org/" + s)),
                  path_text),
        any_scalar,
    ),
    max_size=3,
)
runtime = st.sampled_from(["none", "pyxis", "apptainer"])


# A valid base config; each example mutates one to three of its fields, so mutations mostly reach the
# renderer instead of all failing validation together.
BASE = Cfg(name="fuzz-project", base_image="nvcr.io/nvidia/pytorch:24.01", env={"PLAIN": "value"},
           start_commands=["python train.py"])
MUTATIONS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.one_of(text, text, any_scalar),
    "job_name": st.one_of(text, text, any_scalar),
    "base_image": st.one_of(text, text, any_scalar),
    "registry": st.one_of(text, st.just("ghcr.io")),
    "registry_secret": text,
    "env": st.one_of(env_dict, env_dict, any_scalar),
    "start_commands": st.one_of(st.lists(text, max_size=3), any_scalar, text),
    "weights": st.one_of(weights, any_scalar),
    "checkpoint_path": st.one_of(path_text, path_text, any_scalar),
    "checkpoint_enabled": st.one_of(st.booleans(), any_scalar),
    "download_folder": st.one_of(path_text, path_text, any_scalar),
    "mount_base_path": st.one_of(path_text, path_text, any_scalar),
    "node_count": st.one_of(st.integers(-2, 10**6), any_scalar),
    "cpu_count": st.one_of(st.integers(-3, 512), st.sampled_from(["4", 4.0, None])),
    "memory": st.one_of(st.sampled_from(["2Gi", "1G", "0", "-1Gi", "1.5Ti", "bogus", "10", "1e3", ".5Mi",
                                         "999999999999Ei", "0.0000001"]), text, any_scalar),
    "accelerator": accelerator,
    "availability_model": st.one_of(st.sampled_from(["spot", "dedicated", "SPOT"]), text, any_scalar),
    "priority": any_scalar,
    "team_name": st.one_of(text, any_scalar),
    "enable_baseten_workdir": st.one_of(st.booleans(), any_scalar),
}


@st.composite
def configs(draw: st.DrawFn) -> Cfg:
    fields = draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=3, unique=True))
    changes = {name: draw(MUTATIONS[name], label=name) for name in fields}
    return replace(BASE, **changes)


def _substitute(value: Any, root: Path) -> Any:
    """Point every {CANARY} in the generated values at this example's tmp dir."""
    if isinstance(value, str):
        return with_payload(value, root)
    if isinstance(value, list):
        return [_substitute(v, root) for v in value]
    if isinstance(value, tuple):
        return tuple(_substitute(v, root) for v in value)
    if isinstance(value, dict):
        return {_substitute(k, root): _substitute(v, root) for k, v in value.items()}
    if isinstance(value, Secret):
        return Secret(_substitute(value.name, root))
    return value


def _materialize(cfg: Cfg, root: Path) -> Cfg:
    return Cfg(**{k: _substitute(v, root) for k, v in vars(cfg).items()})


def _render_or_user_error(cfg: Cfg, root: Path, rt: str, *, record: bool = True) -> Any:
    """Load, build and render. Returns the spec, or None after checking a UserError's lines."""
    source = str(root / "config.py")
    try:
        spec = spec_from_config(root, cfg, rt)
    except UserError as exc:
        assert_clean_user_error(exc, source)
        if record:
            event(f"rejected: {type(exc).__name__}")
        return None
    if record:
        event(f"rendered ({rt})")
    # (a) and (b); both scripts must also be writable as UTF-8, as submit writes them.
    write_scripts(spec, root / "scripts")
    spec.model_dump_json()
    for line in sbatch_directive_lines(render_batch_script(spec).encode()):
        m = re.fullmatch(r"#SBATCH --(nodes|mem)=(\d+)M?", line)
        if m:
            assert int(m.group(2)) >= 1, line
    assert not (root / "CANARY").exists()
    return spec


@settings(FUZZ, max_examples=400)
@given(cfg=configs(), rt=runtime)
def test_fuzzed_configs_render_safely_or_fail_cleanly(cfg: Cfg, rt: str) -> None:
    with tempfile.TemporaryDirectory(prefix="bt-fuzz-") as tmp:
        root = Path(tmp)
        _render_or_user_error(_materialize(cfg, root), root, rt)


@settings(FUZZ, max_examples=40)
@given(cfg=configs(), rt=runtime)
def test_fuzzed_configs_execute_safely(cfg: Cfg, rt: str) -> None:
    """The sample that is also executed: (c) and (d)."""
    with tempfile.TemporaryDirectory(prefix="bt-fuzz-") as tmp:
        root = Path(tmp)
        cfg = _materialize(cfg, root)
        # Executable start commands: the fuzzed ones are text, and running random text as commands
        # would only test bash. Their quoting is covered by (b) above and by the injection tests.
        cfg.start_commands = [DUMP_COMMAND]
        cfg.enable_baseten_workdir = False  # /b10/workspace exists only inside a real container
        spec = _render_or_user_error(cfg, root, rt)
        if spec is None:
            return
        check_run(spec, run_batch(spec, root))


@settings(FUZZ, max_examples=60)
@given(commands=st.lists(text, min_size=1, max_size=4))
def test_fuzzed_start_commands_reach_the_entry_intact(commands: list[str]) -> None:
    """Whatever the text, the entry's array holds exactly the commands (checked by echoing them back)."""
    with tempfile.TemporaryDirectory(prefix="bt-fuzz-") as tmp:
        root = Path(tmp)
        commands = [with_payload(c, root) for c in commands]
        echo = [f'printf "%s\\0" {shlex.quote(c)} >> "$BT_TEST_OUT/cmds"' for c in commands]
        spec = spec_from_config(root, Cfg(start_commands=[*echo, DUMP_COMMAND]))
        assert list(spec.start_commands) == [*echo, DUMP_COMMAND]
        run = run_batch(spec, root)
        check_run(spec, run)
        assert (run.out / "cmds").read_bytes() == b"".join(c.encode() + b"\0" for c in commands)


def test_generators_reach_the_renderer() -> None:
    """Guard against a vacuous property: a hostile but valid config does render."""
    with tempfile.TemporaryDirectory(prefix="bt-fuzz-") as tmp:
        root = Path(tmp)
        cfg = _materialize(Cfg(name=f"a'b{CANARY}", env={"X": "$(x)\n#SBATCH"}), root)
        assert _render_or_user_error(cfg, root, "pyxis", record=False) is not None


@pytest.mark.parametrize("cpus", [0, -3])
def test_non_positive_cpu_count_is_a_config_error(tmp_path: Path, cpus: int) -> None:
    """``cpu_count < 1`` is refused by ``compat/stricter.py`` next to the ``node_count`` check."""
    try:
        spec = spec_from_config(tmp_path, Cfg(cpu_count=cpus))
    except UserError as exc:
        assert_clean_user_error(exc, str(tmp_path / "config.py"))
        assert any("job.compute.cpu_count" in line for line in exc.lines())
        return
    directives = sbatch_directive_lines(render_batch_script(spec).encode())
    assert directives == expected_directives(spec)
    assert spec.cpus_per_task >= 1, directives


def test_entry_and_batch_parse_for_every_runtime(tmp_path: Path) -> None:
    """bash -n on the unmutated base config for each runtime (the fuzz baseline)."""
    for rt in ("none", "pyxis", "apptainer"):
        root = tmp_path / rt
        spec = spec_from_config(root, Cfg(registry="ghcr.io"), rt)
        _, entry = write_scripts(spec, root / "scripts")
        bash_syntax_ok(entry)
        assert render_node_entry(spec).startswith("#!/bin/bash\n")
