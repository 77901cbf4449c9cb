"""The one Slurm seam: no module outside slurm_bt/slurm/ runs a Slurm command itself.

Every Slurm client command must go through :class:`slurm_bt.slurm.client.SlurmClient`, so that the
environment is always scrubbed (sbatch stores its environment with the job) and
``tests.fakes.fake_slurm.FakeSlurm`` sees every command a test causes. This scans the source (AST,
not grep: docstrings and messages may name the commands freely) for the three ways around it:

* a process-spawning call (``subprocess.*``, ``os.exec*``/``os.spawn*``/``os.system``/``os.popen``,
  ``asyncio.create_subprocess_*``, ``pty.spawn``) whose arguments name a Slurm binary;
* a module that can spawn processes and also spells a Slurm binary as a string by itself (an argv
  built in one place and run in another), or looks one up with ``shutil.which``;
* ``<client>.runner.run(...)`` or ``SubprocessRunner().run(...)``: the runner without the client
  (no scrubbed environment unless the caller remembers it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "slurm_bt"
SEAM = ROOT / "slurm"
SLURM_BINARIES = frozenset(
    {"sbatch", "sacct", "squeue", "scontrol", "scancel", "sacctmgr", "sinfo", "sstat", "srun", "salloc",
     "sattach", "sbcast", "sprio", "sshare", "sdiag", "sreport", "strigger"}
)
_SPAWN_MODULES = {"subprocess", "pty", "asyncio"}
_OS_SPAWN_PREFIXES = ("exec", "spawn", "system", "popen", "posix_spawn")


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if SEAM not in p.parents)


def _names_slurm_binary(node: ast.AST) -> str | None:
    """The Slurm binary a string constant inside ``node`` names (``"scontrol"``, ``"/usr/bin/sacct"``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            word = sub.value.strip().split(" ", 1)[0].rsplit("/", 1)[-1]
            if word in SLURM_BINARIES:
                return word
    return None


def _is_spawn_call(call: ast.Call, imported: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner, attr = func.value.id, func.attr
        if owner in _SPAWN_MODULES and (owner != "asyncio" or attr.startswith("create_subprocess")):
            return True
        if owner == "os" and attr.startswith(_OS_SPAWN_PREFIXES):
            return True
    # ``from subprocess import run`` and friends.
    return isinstance(func, ast.Name) and func.id in imported


def _is_runner_bypass(call: ast.Call) -> bool:
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr == "run"):
        return False
    receiver = func.value
    if isinstance(receiver, ast.Attribute) and receiver.attr == "runner":
        return True
    return (isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name)
            and receiver.func.id == "SubprocessRunner")


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def violations(path: Path) -> list[str]:
    """What in ``path`` runs (or could run) a Slurm command outside the client."""
    tree = ast.parse(path.read_text(), filename=str(path))
    rel = path.relative_to(ROOT.parent)
    found: list[str] = []
    can_spawn = False
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            can_spawn |= any(a.name.split(".")[0] in _SPAWN_MODULES for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in _SPAWN_MODULES:
                can_spawn = True
                imported |= {a.asname or a.name for a in node.names}
            elif node.module == "os":
                imported |= {a.asname or a.name for a in node.names if a.name.startswith(_OS_SPAWN_PREFIXES)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if _is_spawn_call(node, imported):
                can_spawn = True
                binary = _names_slurm_binary(node)
                if binary:
                    found.append(f"{rel}:{node.lineno}: runs {binary} without the SlurmClient")
            if _is_runner_bypass(node):
                found.append(f"{rel}:{node.lineno}: calls the CommandRunner directly (no scrubbed env)")
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "which" and _names_slurm_binary(node)):
                found.append(f"{rel}:{node.lineno}: looks up {_names_slurm_binary(node)} to run it")
    if can_spawn:
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                word = node.value.strip().rsplit("/", 1)[-1]
                if word in SLURM_BINARIES:
                    found.append(f"{rel}:{node.lineno}: spawns processes and spells the command {word!r}")
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_slurm_command_outside_the_client(path: Path) -> None:
    assert violations(path) == []


def test_the_scan_catches_each_bypass(tmp_path: Path) -> None:
    # The shapes the issue found on main (node/leader.py, weights/plan.py twice, cli/admin_cmd.py).
    samples = {
        "leader.py": 'def f(client, nl):\n    return client.runner.run(["scontrol", "show", "hostnames", nl])\n',
        "plan.py": (
            "from slurm_bt.slurm.runner import SubprocessRunner\n"
            'def f(u):\n    return SubprocessRunner().run(["sacctmgr", "-n", "show", "user", u])\n'
        ),
        "admin.py": (
            "import shutil, subprocess\n"
            'def f():\n    exe = shutil.which("scontrol") or "/usr/bin/scontrol"\n'
            '    return subprocess.run([exe, "show", "config"])\n'
        ),
        "direct.py": 'import subprocess\nsubprocess.run(["squeue", "--me"], check=False)\n',
        "indirect.py": 'import os\nARGV = ["sinfo", "-N"]\ndef f():\n    os.execvp(ARGV[0], ARGV)\n',
    }
    pkg = tmp_path / "slurm_bt"
    pkg.mkdir()
    for name, src in samples.items():
        (pkg / name).write_text(src)
    global ROOT
    saved, ROOT = ROOT, pkg
    try:
        for name in samples:
            assert violations(pkg / name), name
        ok = pkg / "ok.py"
        ok.write_text('"""Runs sacct via the client."""\nimport subprocess\nsubprocess.run(["bwrap", "--version"])\n'
                      'def g(client):\n    return client.query(["1"])\n')
        assert violations(ok) == []
    finally:
        ROOT = saved
