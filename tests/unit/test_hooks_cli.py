"""``slurm-bt cache summarize`` and ``admin install``/``doctor`` pieces (wrappers, config lines, timer units)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurm_bt.cli.admin_cmd import (
    HANDOFF_UNIT,
    _handoff_area_check,
    admin_group,
    render_handoff_units,
    render_wrapper,
    slurm_conf_lines,
)
from slurm_bt.cli.cache_cmd import cache_group, summarize_project
from slurm_bt.errors import UserError


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    proj = tmp_path / "cache" / "teams" / "t1" / "projects" / "proj-a"
    (proj / "sub").mkdir(parents=True)
    (proj / "big.bin").write_bytes(b"x" * 3000)
    (proj / "sub" / "small.txt").write_bytes(b"y" * 10)
    os.symlink("/etc/passwd", proj / "link")
    os.utime(proj / "big.bin", (1_000_000, 1_000_000))
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\ncache = "{tmp_path}/cache"\n')
    monkeypatch.setenv("SLURM_BT_SITE_CONFIG", str(site))
    return tmp_path / "cache"


def test_summary_counts_sizes_without_following_links(cache: Path) -> None:
    [s] = summarize_project(cache, "proj-a")
    assert s.team == "t1" and s.file_count == 3 and s.total_size_bytes == 3010 + len("/etc/passwd")
    kinds = {e.filepath: e.type for e in s.entries}
    assert kinds == {"big.bin": "file", "sub": "directory", "sub/small.txt": "file", "link": "symlink"}


def test_unknown_project_is_a_user_error(cache: Path) -> None:
    with pytest.raises(UserError, match="no cache for project"):
        summarize_project(cache, "nope")


@pytest.mark.parametrize("fmt", ["cli-table", "csv", "json"])
def test_cli_formats_and_sorting(cache: Path, fmt: str) -> None:
    res = CliRunner().invoke(cache_group, ["summarize", "proj-a", "--sort", "size", "--order", "desc", "-o", fmt])
    assert res.exit_code == 0, res.output
    if fmt == "json":
        doc = json.loads(res.output)[0]
        assert doc["entries"][0]["filepath"] == "big.bin"
        assert doc["file_count"] == 3
    elif fmt == "csv":
        assert res.output.splitlines()[0] == "team,filepath,size_bytes,modified,type,permissions"
        assert res.output.splitlines()[1].startswith("t1,big.bin,3000,")
    else:
        assert "Cache summary for project proj-a (team t1)" in res.output and "3 files" in res.output


def test_wrapper_has_absolute_interpreter_and_isolated_python() -> None:
    text = render_wrapper("prolog", "/opt/bt/venv/bin/python", "/etc/slurm-bt/hooks.toml", None)
    assert "PY=/opt/bt/venv/bin/python" in text
    assert 'exec "$PY" -I -m slurm_bt.hooks.prolog --config /etc/slurm-bt/hooks.toml' in text
    for bad in ("python3", "/opt/my venv/python", "/x;rm -rf /"):
        with pytest.raises(click.BadParameter):
            render_wrapper("prolog", bad, None, None)


def test_conf_lines_cover_the_hook_assumptions() -> None:
    lines = "\n".join(slurm_conf_lines("/p", "/e", 90, {"H100": "h100"}))
    for needle in ("Prolog=/p", "Epilog=/e", "PrologFlags=Alloc,Contain,DeferBatch", "PrologEpilogTimeout=120",
                   "AccountingStorageTRES=gres/gpu", "AccountingStoreFlags=job_comment", "PrivateData=jobs",
                   "Type=h100"):
        assert needle in lines


def test_handoff_units_run_the_sweep_per_node_with_the_hook_site() -> None:
    units = render_handoff_units("/opt/bt/venv/bin/python", "/etc/slurm-bt/site.toml")
    service, timer = units[f"{HANDOFF_UNIT}.service"], units[f"{HANDOFF_UNIT}.timer"]
    assert "ExecStart=/opt/bt/venv/bin/python -I -m slurm_bt.checkpoints.handoff --node %i" in service
    assert "Environment=SLURM_BT_SITE_CONFIG=/etc/slurm-bt/site.toml" in service and "Type=oneshot" in service
    assert "OnUnitActiveSec=" in timer and "WantedBy=timers.target" in timer
    assert "Environment=" not in render_handoff_units("/usr/bin/python3", None)[f"{HANDOFF_UNIT}.service"]
    for bad in ("python3", "/opt/a b/python", "/opt/%h/python"):
        with pytest.raises(click.BadParameter):
            render_handoff_units(bad, None)


@pytest.mark.skipif(os.geteuid() != 0, reason="admin install writes root-owned files")
def test_admin_install_writes_hooks_and_timer_units_that_run(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\nscratch = "{tmp_path}/node/%n/scratch"\nnode_cache = "{tmp_path}/node/%n/weights"\n'
                    f'cache = "{tmp_path}/shared/cache"\ncheckpoint_store = "file://{tmp_path}/store"\n'
                    f'cluster_cache = "{tmp_path}/shared/weights"\n')
    units = tmp_path / "systemd"
    python = sys.executable
    result = CliRunner().invoke(admin_group, ["install", "--prefix", str(tmp_path / "usr"), "--python", python,
                                              "--site", str(site), "--node", "n7", "--systemd-dir", str(units)])
    assert result.exit_code == 0, result.output
    assert f"systemctl enable --now {HANDOFF_UNIT}n7.timer" in result.output
    for name in ("slurm-bt-prolog", "slurm-bt-epilog"):
        st = (tmp_path / "usr/libexec/slurm-bt" / name).stat()
        assert st.st_uid == 0 and st.st_mode & 0o777 == 0o755
    service = units / f"{HANDOFF_UNIT}.service"
    assert service.stat().st_mode & 0o777 == 0o644 and (units / f"{HANDOFF_UNIT}.timer").is_file()
    assert (tmp_path / "node/n7/scratch").is_dir()
    # the shared layout, made once (docs/admin.md): root's, with teams/ for the prolog to create teams in
    for rel, mode in (("shared/cache", 0o755), ("shared/cache/teams", 0o755), ("shared/weights", 0o755),
                      ("shared/weights/shared", 0o755), ("shared/weights/teams", 0o755), ("store", 0o1777),
                      ("store/_teams", 0o755)):
        st = (tmp_path / rel).lstat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, mode), rel
    # What systemd would run for node n7: the sweep finds an empty hand-off area and exits 0.
    line = next(ln for ln in service.read_text().splitlines() if ln.startswith("ExecStart="))
    env_line = next(ln for ln in service.read_text().splitlines() if ln.startswith("Environment="))
    key, _, value = env_line.removeprefix("Environment=").partition("=")
    argv = [a.replace("%i", "n7") for a in shlex.split(line.removeprefix("ExecStart="))]
    proc = subprocess.run(argv, env={"PATH": "/usr/bin:/bin", key: value}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_doctor_warns_about_handoffs_the_sweep_left_for_an_hour(tmp_path: Path) -> None:
    storage = {"scratch": f"{tmp_path}/node/%n/scratch"}
    area = tmp_path / "node/n1/checkpoint-handoff"
    assert _handoff_area_check("n1", storage).ok  # no area yet
    (area / "12.n1").mkdir(parents=True)
    old = time.time() - 7200
    os.utime(area / "12.n1", (old, old))
    assert _handoff_area_check("n1", storage).ok  # empty: nothing to upload
    (area / "12.n1" / "handoff.json").write_text("{}")
    os.utime(area / "12.n1", (time.time(), time.time()))
    assert _handoff_area_check("n1", storage).ok  # fresh: the background sweep is on it
    os.utime(area / "12.n1", (old, old))
    check = _handoff_area_check("n1", storage)
    assert not check.ok and check.warn and "12.n1" in check.problem and "resume-handoffs --node n1" in check.fix


@pytest.mark.parametrize("kind", ["prolog", "epilog"])
def test_checkout_wrappers_run_the_venv_install_sh_linked(tmp_path: Path, kind: str) -> None:
    """The dev cluster's Prolog/Epilog are the checkout's wrappers: they run the venv scripts/install.sh
    linked as ``<checkout>/.bt-venv`` (SLURM_BT_VENV may name another venv than the default, which then
    may hold another checkout: its hooks failed with "No module named slurm_bt" and drained the nodes)."""
    repo = Path(__file__).resolve().parents[2]
    checkout = tmp_path / "checkout"
    (checkout / kind).mkdir(parents=True)
    wrapper = checkout / kind / f"slurm-bt-{kind}"
    shutil.copy2(repo / kind / f"slurm-bt-{kind}", wrapper)
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text('#!/bin/sh\necho "ran $0 $*"\n')
    (venv_bin / "python").chmod(0o755)
    (checkout / ".bt-venv").symlink_to(tmp_path / "venv")
    proc = subprocess.run([str(wrapper), "x"], env={}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"ran {checkout / kind}/../.bt-venv/bin/python -I -m slurm_bt.hooks.{kind} x\n"
    # The linked venv is gone: the hook says so and fails (what slurmd turns into a drain with that
    # reason), rather than running whatever the default venv holds.
    shutil.rmtree(tmp_path / "venv")
    proc = subprocess.run([str(wrapper)], env={}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and f"slurm-bt {kind}: DRAIN: interpreter" in proc.stderr
    assert ".bt-venv/bin/python is missing" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="admin install writes root-owned files")
def test_admin_install_gives_the_teams_dirs_to_the_shared_fs_identity(tmp_path: Path) -> None:
    """Where root is squashed, the prolog creates teams as ``shared_fs_identity``: install hands it teams/."""
    import pwd

    from tests.unit.test_layout_owner import SVC, ensure_service_account

    ensure_service_account()
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\nscratch = "{tmp_path}/node/%n/scratch"\nnode_cache = "{tmp_path}/node/%n/weights"\n'
                    f'cache = "{tmp_path}/shared/cache"\ncluster_cache = "{tmp_path}/shared/weights"\n'
                    f'checkpoint_store = "file://{tmp_path}/store"\n')  # never the dev cluster's own store
    hooks = tmp_path / "hooks.toml"
    hooks.write_text(f'shared_fs_identity = "{SVC}"\n')
    # a squat by a user where the identity's directory belongs is reported, not taken over
    (tmp_path / "shared/weights/teams").mkdir(parents=True)
    os.chown(tmp_path / "shared/weights/teams", pwd.getpwnam("btu2").pw_uid, -1)
    args = ["install", "--prefix", str(tmp_path / "usr"), "--python", sys.executable, "--site", str(site),
            "--config", str(hooks), "--node", "n7"]
    result = CliRunner().invoke(admin_group, args)
    assert result.exit_code == 1 and "shared/weights/teams" in result.output and "not changed" in result.output
    os.rmdir(tmp_path / "shared/weights/teams")
    result = CliRunner().invoke(admin_group, args)
    assert result.exit_code == 0, result.output
    svc = pwd.getpwnam(SVC).pw_uid
    for rel, uid in (("shared/cache", 0), ("shared/cache/teams", svc), ("shared/weights/shared", 0),
                     ("shared/weights/teams", svc), ("store", 0), ("store/_teams", svc)):
        assert (tmp_path / rel).lstat().st_uid == uid, rel
    assert f"shared/cache/teams ({SVC} 0755" in result.output
