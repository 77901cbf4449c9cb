"""``slurm-bt cache summarize`` and the ``admin install`` pieces (wrapper text, config lines)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurm_bt.cli.admin_cmd import render_wrapper, slurm_conf_lines
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
