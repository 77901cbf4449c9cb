"""``slurm-bt cache evict`` run by an ordinary user on an entry they published (not root).

A published snapshot is sealed (0555 directories). Moving a directory to another parent rewrites
its ``..``, which Linux allows only with write permission on the directory itself, so for anyone
but root the move to the trash failed, after the manifest was already gone: the snapshot and its
blobs stayed behind with nothing naming them. The pin records of the evicted entry go too.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm_bt.weights.cluster_cache import ClusterCache
from tests.unit.test_cache_support import DirFetcher, allow, make_manifest, random_bytes, write_origin
from tests.unit.test_hooks_env import ensure_test_users
from tests.unit.test_hooks_prolog import as_user


@pytest.fixture()
def user_dir() -> object:
    if os.geteuid() != 0:
        pytest.fail("needs root (to create the test users); the suite runs as root")
    ensure_test_users()
    pw = pwd.getpwnam("btu1")
    d = Path(tempfile.mkdtemp(prefix="bt-evict-", dir="/var/tmp"))  # pytest's tmp is 0700 (root)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_user_evicts_own_sealed_entry_whole(user_dir: Path) -> None:
    def evict_as_user() -> dict[str, object]:
        from slurm_bt.cli import weights_cmd

        files = {"config.json": b"{}", "model.safetensors": random_bytes(1 << 20, 7)}
        write_origin(user_dir / "origin", files)
        cache = ClusterCache(user_dir / "tier")
        m = make_manifest(files, source="hf://org/evict-me")
        cache.ensure(m, DirFetcher(user_dir / "origin"), authorize=allow)
        cache.write_pin("hf-evict-me", m)
        snap = cache.snapshot_path(m)
        sealed = oct(os.stat(snap).st_mode & 0o777)
        weights_cmd._tiers = lambda team: [("team:t", cache)]  # type: ignore[assignment]  # (forked child)
        lines = weights_cmd.evict((m.manifest_id[:12],), dry_run=False, node=None, max_bytes=None,
                                  older_than_days=None, team=None)
        left = sorted(str(p.relative_to(cache.root)) for p in cache.root.rglob("*")
                      if p.is_file() and ".locks" not in p.parts and p.name != "CACHEDIR.TAG")
        return {"sealed": sealed, "lines": lines, "left": left, "snapshot": snap.exists()}

    out = as_user("btu1", evict_as_user)
    assert isinstance(out, dict)
    assert out["sealed"] == "0o555"  # the case that failed: a read-only snapshot directory
    assert out["lines"][-1] == "removed 1 entries", out["lines"]
    assert any("removed pin record hf-evict-me.json" in line for line in out["lines"]), out["lines"]
    assert out["snapshot"] is False and out["left"] == [], out["left"]


def test_node_evict_without_a_target_keeps_what_fits_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cache evict --node N`` without ``--max-bytes`` evicts down to the node cache's cap: with the
    default ``node_cache_max_bytes = 0`` that is 90% of the disk, not 0 bytes (which would drop every
    lease-free entry of the node)."""
    from slurm_bt.cli import weights_cmd
    from slurm_bt.weights.node_cache import NodeCache

    files = {"model.safetensors": random_bytes(1 << 20, 3)}
    write_origin(tmp_path / "origin", files)
    cluster = ClusterCache(tmp_path / "tier")
    m = make_manifest(files, source="hf://org/keep-me")
    cluster.ensure(m, DirFetcher(tmp_path / "origin"), authorize=allow)
    node = NodeCache(tmp_path / "node", 0)
    node.stage(m, [cluster], "1", authorize=allow)
    node.release("1")
    monkeypatch.setattr(weights_cmd, "_node", lambda name: node)
    lines = weights_cmd.evict((), dry_run=False, node="n1", max_bytes=None, older_than_days=None, team=None)
    assert node.is_ready(m), lines
    weights_cmd.evict((), dry_run=False, node="n1", max_bytes=0, older_than_days=None, team=None)
    assert not node.is_ready(m)


def test_evict_of_another_teams_entry_is_refused_naming_it(tmp_path: Path) -> None:
    """Issue 31: ``cache evict ID --team THEIRS`` by someone outside that team listed the tier, got
    EACCES and ended in "internal error". Now: exit 2, one line naming the entry, the team and why;
    an invalid ``--team`` is refused the same way. Nothing of the entry is touched."""
    import grp

    from click.testing import CliRunner

    if os.geteuid() != 0:
        pytest.fail("needs root (to create the test users); the suite runs as root")
    ensure_test_users()
    base = Path(tempfile.mkdtemp(prefix="bt-evict-team-", dir="/var/tmp"))
    try:
        os.chmod(base, 0o755)
        (base / "teams").mkdir(mode=0o1777)
        os.chmod(base / "teams", 0o1777)
        root = base / "teams" / "btteam1"
        root.mkdir()
        os.chown(root, 0, grp.getgrnam("btteam1").gr_gid)
        os.chmod(root, 0o2770)
        files = {"model.safetensors": random_bytes(1 << 16, 5)}
        write_origin(base / "origin", files)
        cache = ClusterCache(root, dir_mode=0o2770)
        m = make_manifest(files, source="hf://org/theirs")
        cache.ensure(m, DirFetcher(base / "origin"), authorize=allow)
        site = base / "site.toml"
        site.write_text(f'[storage]\ncluster_cache = "{base}"\nworkspace = "{base}/ws"\n')
        os.chmod(site, 0o644)

        def evict_as_btu2() -> list[tuple[int, str]]:
            from slurm_bt.cli.cache_cmd import cache_group

            env = {"SLURM_BT_SITE_CONFIG": str(site)}
            out = []
            for argv in (["evict", m.manifest_id[:12], "--team", "btteam1"], ["evict", "x", "--team", "../x"]):
                res = CliRunner().invoke(cache_group, argv, env=env)
                out.append((res.exit_code, res.stderr))
            return out

        (code, err), (code2, err2) = as_user("btu2", evict_as_btu2)  # type: ignore[misc]
        assert code == 2 and "internal error" not in err, err
        assert err == (f"slurm-bt cache evict: cannot evict entry '{m.manifest_id[:12]}' from the weights cache of "
                       f"team btteam1 ({root}): you are not a member of team btteam1; only its members (or root) "
                       "may evict its entries\n")
        assert code2 == 2 and err2.startswith("slurm-bt cache: --team: invalid team name '../x'"), err2
        assert cache.layout.read_manifest(m.manifest_id) is not None and cache.snapshot_path(m).is_dir()
    finally:
        shutil.rmtree(base, ignore_errors=True)
