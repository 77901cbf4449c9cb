"""Config-folder snapshots: upstream selection rules, ignore files, symlinks, limits, atomicity."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_bt import snapshot
from slurm_bt.errors import SnapshotError, StorageError
from slurm_bt.snapshot import DEFAULT_IGNORE_PATTERNS, SnapshotInfo, snapshot_config_dir
from tests.unit.test_hooks_env import ensure_test_users

IS_ROOT = os.getuid() == 0


@dataclass
class WS:
    """Stands in for truss_train.Workspace (the snapshot only duck-types it)."""

    workspace_root: str | None = None
    external_dirs: list[str] = field(default_factory=list)
    exclude_dirs: list[str] = field(default_factory=list)


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tree(root: Path) -> set[str]:
    """Every path under root, dirs with a trailing slash."""
    out = set()
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for d in dirs:
            out.add(os.path.normpath(os.path.join(rel, d)) + "/")
        for f in files:
            out.add(os.path.normpath(os.path.join(rel, f)))
    return out


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    p = tmp_path / "proj"
    write(p / "config.py", "project = 1\n")
    return p


@pytest.fixture
def out(tmp_path: Path) -> Path:
    o = tmp_path / "spool"
    o.mkdir()
    return o


def snap(config: Path, out: Path, ws: WS | None = None, **kw: int) -> tuple[SnapshotInfo, set[str]]:
    info = snapshot_config_dir(config, ws, out / "snap", **kw)
    return info, tree(out / "snap")


def assert_nothing_left(out: Path) -> None:
    assert os.listdir(out) == [], "a failed snapshot must leave nothing behind"


# --- default selection --------------------------------------------------------------------------


def test_default_ignores(proj: Path, out: Path) -> None:
    write(proj / "train.py")
    write(proj / "pkg" / "mod.py")
    write(proj / "pkg" / "__pycache__" / "mod.cpython-311.pyc")
    write(proj / "pkg" / "stale.pyc")
    write(proj / ".git" / "HEAD")
    write(proj / ".venv" / "bin" / "python")
    write(proj / "venv" / "lib" / "x.py")
    write(proj / "env" / "lib" / "x.py")
    write(proj / ".env", "TOKEN=1")
    write(proj / "run.log")
    write(proj / "logs" / "deep.log")
    write(proj / ".cache" / "x")
    write(proj / ".mypy_cache" / "x")
    write(proj / ".pytest_cache" / "x")
    write(proj / ".DS_Store")
    write(proj / ".idea" / "x.xml")
    write(proj / ".vscode" / "settings.json")
    write(proj / ".train.py.swp")
    write(proj / "data" / "env")  # a *file* called env is kept: `env/` is directory-only
    info, files = snap(proj / "config.py", out)
    assert files == {"config.py", "train.py", "pkg/", "pkg/mod.py", "logs/", "data/", "data/env"}
    assert info.files == 4
    assert info.total_bytes == len("project = 1\n") + 3
    assert info.top_level == ("config.py", "data", "logs", "pkg", "train.py")
    assert info.root == proj.resolve()
    assert info.dest == out / "snap"
    assert info.config_subdir == "."


def test_default_patterns_cover_the_brief() -> None:
    for name in ("__pycache__/", "*.py[cod]", ".git/", ".venv", "venv/", "env/", ".env", "*.log"):
        assert name in DEFAULT_IGNORE_PATTERNS


def test_snapshot_is_isolated_from_later_edits(proj: Path, out: Path) -> None:
    write(proj / "train.py", "v1")
    snap(proj / "config.py", out)
    write(proj / "train.py", "v2")
    (proj / "config.py").unlink()
    assert (out / "snap" / "train.py").read_text() == "v1"
    assert (out / "snap" / "config.py").exists()


def test_exec_bit_and_mtime_kept(proj: Path, out: Path) -> None:
    script = write(proj / "run.sh", "#!/bin/sh\n")
    script.chmod(0o750)
    os.utime(script, ns=(1_000_000_000, 1_234_567_890_123_456_789))
    sub = proj / "sub"
    write(sub / "f")
    os.utime(sub, ns=(1_000_000_000, 1_500_000_000_000_000_000))
    snap(proj / "config.py", out)
    copied = out / "snap" / "run.sh"
    assert stat.S_IMODE(copied.stat().st_mode) == 0o750
    assert copied.stat().st_mtime_ns == 1_234_567_890_123_456_789
    assert (out / "snap" / "sub").stat().st_mtime_ns == 1_500_000_000_000_000_000


def test_setuid_bits_dropped_and_dirs_stay_removable(proj: Path, out: Path) -> None:
    f = write(proj / "tool")
    f.chmod(0o4755)
    ro = proj / "readonly"
    write(ro / "x")
    ro.chmod(0o555)
    try:
        snap(proj / "config.py", out)
    finally:
        ro.chmod(0o755)
    assert stat.S_IMODE((out / "snap" / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "snap" / "readonly").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "snap").stat().st_mode) == 0o700


# --- .truss_ignore ------------------------------------------------------------------------------


def test_truss_ignore_replaces_defaults(proj: Path, out: Path) -> None:
    write(proj / ".truss_ignore", "# only data\ndata/\n\n")
    write(proj / "data" / "big.bin")
    write(proj / "run.log")
    write(proj / ".git" / "HEAD")
    _, files = snap(proj / "config.py", out)
    assert files == {"config.py", ".truss_ignore", "run.log", ".git/", ".git/HEAD"}


def test_truss_ignore_negation(proj: Path, out: Path) -> None:
    write(proj / ".truss_ignore", "*.txt\n!keep.txt\n.truss_ignore\n")
    write(proj / "a.txt")
    write(proj / "keep.txt")
    write(proj / "sub" / "b.txt")
    write(proj / "sub" / "keep.txt")
    _, files = snap(proj / "config.py", out)
    assert files == {"config.py", "keep.txt", "sub/", "sub/keep.txt"}


def test_truss_ignore_cannot_reinclude_inside_excluded_dir(proj: Path, out: Path) -> None:
    # gitignore: "It is not possible to re-include a file if a parent directory is excluded."
    write(proj / ".truss_ignore", "build/\n!build/keep.txt\n")
    write(proj / "build" / "keep.txt")
    _, files = snap(proj / "config.py", out)
    assert "build/keep.txt" not in files


def test_truss_ignore_directory_only_and_anchored(proj: Path, out: Path) -> None:
    write(proj / ".truss_ignore", "build/\n/top.txt\n")
    write(proj / "build" / "x.o")
    write(proj / "src" / "build" / "y.o")
    write(proj / "docs" / "build")  # a file named build: kept
    write(proj / "top.txt")
    write(proj / "src" / "top.txt")
    _, files = snap(proj / "config.py", out)
    assert "build/" not in files
    assert "src/build/" not in files
    assert "docs/build" in files
    assert "top.txt" not in files
    assert "src/top.txt" in files


def test_truss_ignore_wildcards(proj: Path, out: Path) -> None:
    write(proj / ".truss_ignore", "a/**/z.txt\nfile?.dat\n[xy].bin\n**/tmp\n")
    write(proj / "a" / "z.txt")
    write(proj / "a" / "b" / "c" / "z.txt")
    write(proj / "a" / "keep.txt")
    write(proj / "file1.dat")
    write(proj / "file10.dat")
    write(proj / "x.bin")
    write(proj / "z.bin")
    write(proj / "deep" / "er" / "tmp" / "junk")
    _, files = snap(proj / "config.py", out)
    assert {"a/z.txt", "a/b/c/z.txt", "file1.dat", "x.bin", "deep/er/tmp/"}.isdisjoint(files)
    assert {"a/keep.txt", "file10.dat", "z.bin", "deep/er/"} <= files


def test_truss_ignore_applies_to_external_dirs(tmp_path: Path, proj: Path, out: Path) -> None:
    write(proj / ".truss_ignore", "*.ckpt\n")
    write(tmp_path / "shared" / "lib.py")
    write(tmp_path / "shared" / "model.ckpt")
    write(tmp_path / "shared" / ".truss_ignore", "lib.py\n")  # only the root's file counts
    _, files = snap(proj / "config.py", out, WS(external_dirs=["../shared"]))
    assert {"shared/lib.py", "shared/.truss_ignore"} <= files
    assert "shared/model.ckpt" not in files


# --- workspace_root, external_dirs, exclude_dirs --------------------------------------------


def test_workspace_root(tmp_path: Path, out: Path) -> None:
    repo = tmp_path / "repo"
    write(repo / "proj" / "config.py")
    write(repo / "common" / "util.py")
    info, files = snap(repo / "proj" / "config.py", out, WS(workspace_root=".."))
    assert files == {"proj/", "proj/config.py", "common/", "common/util.py"}
    assert info.root == repo.resolve()
    assert info.top_level == ("common", "proj")
    assert info.config_subdir == "proj"


def test_workspace_root_absolute(tmp_path: Path, out: Path) -> None:
    repo = tmp_path / "repo"
    write(repo / "proj" / "config.py")
    _, files = snap(repo / "proj" / "config.py", out, WS(workspace_root=str(repo)))
    assert files == {"proj/", "proj/config.py"}


def test_config_dir_must_be_inside_workspace_root(tmp_path: Path, proj: Path, out: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out, WS(workspace_root="../elsewhere"))
    [problem] = info.value.problems
    assert problem.loc == "job.workspace.workspace_root"
    assert "must be inside workspace_root" in problem.message
    assert info.value.source == str(proj / "config.py")
    assert_nothing_left(out)


def test_external_dirs_copied_under_basename(tmp_path: Path, proj: Path, out: Path) -> None:
    write(tmp_path / "libs" / "shared" / "a.py")
    write(tmp_path / "more" / "b.py")
    info, files = snap(proj / "config.py", out, WS(external_dirs=["../libs/shared", str(tmp_path / "more")]))
    assert files == {"config.py", "shared/", "shared/a.py", "more/", "more/b.py"}
    assert info.top_level == ("config.py", "more", "shared")


def test_external_dir_problems_all_reported(tmp_path: Path, proj: Path, out: Path) -> None:
    write(proj / "shared" / "x.py")
    write(tmp_path / "a" / "shared" / "y.py")
    write(tmp_path / "b" / "lib" / "y.py")
    write(tmp_path / "c" / "lib" / "y.py")
    write(tmp_path / "afile")
    ws = WS(external_dirs=["../a/shared", "../b/lib", "../c/lib", "../missing", "../afile"])
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out, ws)
    problems = {p.loc: p.message for p in info.value.problems}
    assert problems["job.workspace.external_dirs[0]"].startswith("Name collision: 'shared'")
    assert "job.workspace.external_dirs[1]" not in problems
    assert problems["job.workspace.external_dirs[2]"].startswith("Name collision: 'lib'")
    assert problems["job.workspace.external_dirs[3]"].startswith("external_dir does not exist")
    assert problems["job.workspace.external_dirs[4]"].startswith("external_dir is not a directory")
    assert_nothing_left(out)


def test_external_dir_collision_with_excluded_name_is_fine(tmp_path: Path, proj: Path, out: Path) -> None:
    write(proj / "shared" / "old.py")
    write(tmp_path / "shared" / "new.py")
    _, files = snap(proj / "config.py", out, WS(external_dirs=["../shared"], exclude_dirs=["shared"]))
    assert "shared/new.py" in files
    assert "shared/old.py" not in files


def test_external_dir_inside_root_is_skipped_with_warning(
    proj: Path, out: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(proj / "inner" / "x.py")
    info, files = snap(proj / "config.py", out, WS(external_dirs=["inner"]))
    assert "inner/x.py" in files
    assert len(info.warnings) == 1
    assert "is inside workspace_root" in info.warnings[0]


def test_exclude_dirs(tmp_path: Path, out: Path) -> None:
    repo = tmp_path / "repo"
    write(repo / "proj" / "config.py")
    write(repo / "data" / "huge.bin")
    write(repo / "keep" / "data" / "small.bin")  # only the top level is matched
    _, files = snap(repo / "proj" / "config.py", out, WS(workspace_root="..", exclude_dirs=["../data"]))
    assert "data/" not in files
    assert "keep/data/small.bin" in files


def test_exclude_dir_that_is_a_symlink_matches_by_name(tmp_path: Path, proj: Path, out: Path) -> None:
    write(tmp_path / "bigdata" / "huge.bin")
    (proj / "data").symlink_to(tmp_path / "bigdata")
    _, files = snap(proj / "config.py", out, WS(exclude_dirs=["data"]))
    assert files == {"config.py"}


def test_exclude_dirs_must_be_top_level(tmp_path: Path, proj: Path, out: Path) -> None:
    write(proj / "a" / "b" / "x")
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out, WS(exclude_dirs=["a/b", "../../outside", "."]))
    messages = {p.loc: p.message for p in info.value.problems}
    assert "Only top-level directories can be excluded." in messages["job.workspace.exclude_dirs[0]"]
    assert "not inside workspace_root" in messages["job.workspace.exclude_dirs[1]"]
    assert "not inside workspace_root" in messages["job.workspace.exclude_dirs[2]"]
    assert_nothing_left(out)


def test_error_lines_name_file_and_field(tmp_path: Path, proj: Path, out: Path) -> None:
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out, WS(external_dirs=["../missing"]))
    [line] = info.value.lines()
    assert line.startswith(
        f"{proj / 'config.py'}: job.workspace.external_dirs[0]: external_dir does not exist"
    )


# --- size limit and atomicity ----------------------------------------------------------------


def test_too_big_leaves_nothing_behind(proj: Path, out: Path) -> None:
    write(proj / "weights.bin", "w" * 5000)
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out, max_bytes=1000)
    message = str(info.value)
    assert "Workspace size (5012 bytes) exceeds maximum allowed size (1000 bytes)" in message
    assert_nothing_left(out)


def test_size_counts_only_what_is_copied(proj: Path, out: Path) -> None:
    write(proj / ".git" / "pack", "p" * 5000)  # ignored by default, so not counted
    info, _ = snap(proj / "config.py", out, max_bytes=1000)
    assert info.total_bytes == len("project = 1\n")


def test_size_message_in_gigabytes() -> None:
    assert snapshot._human(5 * 1024**3) == "5GB"
    assert snapshot._human(int(5.5 * 1024**3)) == "5.50GB"
    assert snapshot._human(12) == "12 bytes"


def test_growth_during_copy_is_caught(proj: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = write(proj / "log.bin", "a" * 10)
    real_copy = snapshot._copy_file

    def grow_then_copy(entry: snapshot._Entry, target: str, dest: Path, budget: int) -> int:
        if entry.rel == "log.bin":
            f.write_text("a" * 5000)
        return real_copy(entry, target, dest, budget)

    monkeypatch.setattr(snapshot, "_copy_file", grow_then_copy)
    with pytest.raises(SnapshotError, match="grew during the copy"):
        snap(proj / "config.py", out, max_bytes=1000)
    assert_nothing_left(out)


def test_publish_failure_removes_temp(proj: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(proj / "sub" / "x")

    def fail(tmp: Path, final: Path) -> None:
        raise StorageError(str(final), "disk on fire")

    monkeypatch.setattr(snapshot, "publish_dir_atomic", fail)
    with pytest.raises(StorageError, match="disk on fire"):
        snap(proj / "config.py", out)
    assert_nothing_left(out)


def test_dest_must_not_exist(proj: Path, out: Path) -> None:
    (out / "snap").mkdir()
    with pytest.raises(StorageError, match="already exists"):
        snap(proj / "config.py", out)


def test_dest_inside_root_is_not_copied(proj: Path) -> None:
    spool = proj / ".slurm-bt"
    spool.mkdir()
    write(spool / "older" / "x")
    info = snapshot_config_dir(proj / "config.py", None, spool / "snap")
    assert tree(spool / "snap") == {"config.py"}
    assert any("snapshot destination" in w for w in info.warnings)


# --- symlinks and special files --------------------------------------------------------------


def test_symlinks_are_followed_and_copied_as_content(tmp_path: Path, proj: Path, out: Path) -> None:
    outside = write(tmp_path / "outside" / "data.txt", "outside content")
    (proj / "link.txt").symlink_to(outside)
    (proj / "linkdir").symlink_to(tmp_path / "outside")
    _, files = snap(proj / "config.py", out)
    assert files == {"config.py", "link.txt", "linkdir/", "linkdir/data.txt"}
    copied = out / "snap" / "link.txt"
    assert not copied.is_symlink()
    assert copied.read_text() == "outside content"
    assert not (out / "snap" / "linkdir").is_symlink()


def test_symlink_loop_to_ancestor_is_reported(proj: Path, out: Path) -> None:
    (proj / "sub").mkdir()
    (proj / "sub" / "up").symlink_to("..")
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out)
    [problem] = info.value.problems
    assert problem.message.startswith("sub/up: symlink loop")
    assert_nothing_left(out)


def test_symlink_cycle_is_reported(proj: Path, out: Path) -> None:
    (proj / "a").symlink_to("b")
    (proj / "b").symlink_to("a")
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out)
    assert sorted(p.message.split(":")[0] for p in info.value.problems) == ["a", "b"]
    assert_nothing_left(out)


def test_ignored_loops_and_broken_links_are_fine(proj: Path, out: Path) -> None:
    write(proj / ".truss_ignore", "up\ndangling\n")
    (proj / "up").symlink_to(".")
    (proj / "dangling").symlink_to("nowhere")
    _, files = snap(proj / "config.py", out)
    assert files == {"config.py", ".truss_ignore"}


def test_broken_symlink_is_reported(proj: Path, out: Path) -> None:
    (proj / "dangling").symlink_to("nowhere")
    with pytest.raises(SnapshotError, match="dangling: broken symlink to nowhere"):
        snap(proj / "config.py", out)


def test_same_dir_linked_twice_is_not_a_loop(tmp_path: Path, proj: Path, out: Path) -> None:
    write(tmp_path / "shared" / "x")
    (proj / "l1").symlink_to(tmp_path / "shared")
    (proj / "l2").symlink_to(tmp_path / "shared")
    _, files = snap(proj / "config.py", out)
    assert {"l1/x", "l2/x"} <= files


def test_problem_list_is_capped(proj: Path, out: Path) -> None:
    for i in range(40):
        (proj / f"dangling{i:02d}").symlink_to("nowhere")
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out)
    assert len(info.value.problems) == snapshot._MAX_PROBLEMS + 1
    assert info.value.problems[-1].message == "... and 15 more problems"


def test_fifo_is_reported_not_hung_on(proj: Path, out: Path) -> None:
    os.mkfifo(proj / "pipe")
    with pytest.raises(SnapshotError, match="pipe: not a regular file or directory"):
        snap(proj / "config.py", out)


UNREADABLE = r"""
import os, sys, tempfile
from pathlib import Path
from slurm_bt.errors import SnapshotError
from slurm_bt.snapshot import snapshot_config_dir
base = Path(tempfile.mkdtemp())
(base / "proj").mkdir()
(base / "proj" / "config.py").write_text("x = 1\n")
(base / "proj" / "secret.key").write_text("x")
(base / "proj" / "secret.key").chmod(0)
try:
    snapshot_config_dir(base / "proj" / "config.py", None, base / "out")
except SnapshotError as exc:
    print(exc)
    sys.exit(0)
sys.exit("no error")
"""


def test_unreadable_file_is_reported(proj: Path, out: Path) -> None:
    if not IS_ROOT:
        f = write(proj / "secret.key")
        f.chmod(0)
        with pytest.raises(SnapshotError, match=r"secret\.key: not readable"):
            snap(proj / "config.py", out)
        return
    # Root reads everything: check as an ordinary user (the login-node case), in a child.
    ensure_test_users()
    proc = subprocess.run(["runuser", "-u", "btu1", "--", sys.executable, "-I", "-c", UNREADABLE],
                          capture_output=True, text=True, cwd="/", timeout=60, check=False,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"secret\.key: not readable", proc.stdout), proc.stdout


# --- property: with nothing to ignore, the snapshot is an exact copy ----------------------------

_names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
_trees = st.recursive(
    st.binary(max_size=64),
    lambda children: st.dictionaries(_names, children, min_size=1, max_size=4),
    max_leaves=12,
)


def _materialise(root: Path, node: dict[str, object]) -> None:
    for name, child in node.items():
        if isinstance(child, dict):
            (root / name).mkdir()
            _materialise(root / name, child)
        else:
            assert isinstance(child, bytes)
            (root / name).write_bytes(child)


def _contents(root: Path) -> dict[str, bytes | None]:
    return {
        os.path.relpath(os.path.join(d, n), root): (Path(d, n).read_bytes() if n in fs else None)
        for d, ds, fs in os.walk(root)
        for n in ds + fs
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_trees)
def test_snapshot_copies_tree_exactly(tmp_path_factory: pytest.TempPathFactory, node: object) -> None:
    base = tmp_path_factory.mktemp("prop")
    src = base / "src"
    src.mkdir()
    if isinstance(node, dict):
        _materialise(src, node)
    write(src / "config.py")
    info = snapshot_config_dir(src / "config.py", None, base / "snap")
    assert _contents(base / "snap") == _contents(src)
    assert info.files == sum(1 for v in _contents(src).values() if v is not None)


# --- file count (issue 31, item 5) --------------------------------------------------------------


def test_too_many_files_is_refused_before_copying(proj: Path, out: Path) -> None:
    for i in range(5):
        write(proj / "data" / f"{i}.txt")
    with pytest.raises(SnapshotError) as info:
        snap(proj / "config.py", out, max_files=6)  # config.py, data/ and 5 files: 7
    assert info.value.lines() == [
        f"{proj / 'config.py'}: the config folder {proj} holds 7 files and directories, over this site's limit "
        "of 6 (max_snapshot_files); use exclude_dirs or a .truss_ignore file to leave some out"]
    assert_nothing_left(out)
    info_ok, _ = snap(proj / "config.py", out, max_files=7)
    assert info_ok.files == 6


def test_file_count_walk_stops_early_and_ignored_files_do_not_count(
        proj: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(20):
        write(proj / "data" / f"{i}.txt")
        write(proj / "__pycache__" / f"{i}.pyc")  # ignored by default: never counted
    monkeypatch.setattr(snapshot, "_WALK_FACTOR", 2)
    with pytest.raises(SnapshotError) as info:
        snapshot.check_snapshot(proj / "config.py", None, max_files=5)
    assert "holds more than 10 files and directories, over this site's limit of 5" in str(info.value)
    assert snapshot.check_snapshot(proj / "config.py", None, max_files=22).files == 21
