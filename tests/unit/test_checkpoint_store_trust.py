"""Trust rules of ``file://`` checkpoint stores (issue #8 item 1, docs/checkpoints.md §Trust model).

A shared store root is world-writable with the sticky bit, so any user can create a directory under
any project name first, or plant a job directory with an index naming someone else. The rules:

* ``_teams`` is the admin's (root-owned, sticky if world-writable), never created by a user;
* a team namespace ``_teams/<team>`` is used only if it is a team directory of the group whose slug
  is ``<team>``; for uploads the job's team, for loads a team the reader is in;
* a project directory is used only if it is a team directory (the team weights tier's rule,
  ``slurm_bt.trusted_files.is_team_dir``): for uploads of the job's team, for loads of a team the
  reader is in;
* a job directory and everything below belong to one user and nobody else can write them; files
  are regular files of that user (never a symlink, FIFO or device);
* an index is accepted only from a job directory owned by the user it names, for the very
  ``<project>/<job>`` it was read from;
* every component is opened without following symlinks; a refusal names the directory and the fix;
* two teams may use one project name (``_teams/<team>/<project>``), and stores from before team
  namespaces are still read at their legacy ``<project>/<job>``.

The squatter/victim cases run as the real test users btu1 (btteam1) and btu2 (btteam2) through
``runuser``, so the kernel's group rules (who may ``chgrp`` to what) are the real ones.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt import trusted_files
from slurm_bt.checkpoints import store as store_mod
from slurm_bt.checkpoints.locations import TEAMS_DIR, file_key, parse_store_uri
from slurm_bt.checkpoints.resolve import find_job, read_trusted_index
from slurm_bt.checkpoints.scan import CompletionTracker
from slurm_bt.checkpoints.store import FileStore, check_upload_location
from slurm_bt.checkpoints.upload import JobIdentity, RankUploader
from slurm_bt.errors import IntegrityError, UntrustedLocation
from slurm_bt.weights import cluster_cache
from tests.unit.test_hooks_env import ensure_test_users

PY = sys.executable
RUNUSER = shutil.which("runuser", path="/usr/sbin:/sbin:/usr/bin:/bin") or "runuser"


@pytest.fixture()
def shared(tmp_path: Path) -> Iterator[Path]:
    """A store root as admins make it (root-owned 1777, ``_teams`` 1777) in a directory the test users can reach."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as several users")
    ensure_test_users()
    base = Path(tempfile.mkdtemp(prefix="ckpt-trust-", dir="/tmp"))
    os.chmod(base, 0o755)
    root = base / "store"
    root.mkdir()
    os.chmod(root, 0o1777)  # what the shared store root is
    (root / TEAMS_DIR).mkdir()
    os.chmod(root / TEAMS_DIR, 0o1777)  # install -d -m 1777 <store>/_teams
    yield root
    shutil.rmtree(base, ignore_errors=True)


def _uri(root: Path) -> str:
    return f"file://{root}"


def _gid(group: str) -> int:
    return int(subprocess.check_output(["getent", "group", group], text=True).split(":")[2])


def _as(user: str, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``store``, ``check_upload_location``, ``read_trusted_index``... imported) as ``user``."""
    prelude = ("import json, os, sys\n"
               "from slurm_bt.checkpoints.store import FileStore, check_upload_location, team_gid\n"
               "from slurm_bt.errors import StorageError, UntrustedLocation\n"
               "from slurm_bt.checkpoints.locations import parse_store_uri\n"
               "from slurm_bt.checkpoints.resolve import find_job, locate_index, read_trusted_index\n"
               "from slurm_bt.checkpoints.upload import read_job_index\n")
    return subprocess.run([RUNUSER, "-u", user, "--", PY, "-c", prelude + code, *args], capture_output=True,
                          text=True, timeout=timeout, cwd="/", check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def _publish(root: Path, project: str, job: str, user: str, data: bytes = b"weights", *,
             team: str = "btteam1") -> Path:
    """Upload a complete checkpoint into ``team``'s namespace, its index naming ``user`` (as root; callers chown it).

    As root with the team's gid, so ``_teams/<team>`` and the project are made ``root:<team> 2770``, as
    the prolog or an admin makes them.
    """
    src = root.parent / f"src-{team}-{project}-{job}"
    (src / "checkpoint-1").mkdir(parents=True, exist_ok=True)
    (src / "checkpoint-1" / "model.bin").write_bytes(data)
    (src / "checkpoint-1" / ".complete").touch()
    ident = JobIdentity(project, project, job, user, 0, 1, team)
    RankUploader(store=FileStore(parse_store_uri(_uri(root)), gid=_gid(team)), ident=ident, checkpoint_dir=src,
                 tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None).run_once()
    return root / TEAMS_DIR / team / project / job


def _publish_legacy(root: Path, project: str, job: str, user: str, data: bytes = b"weights", *,
                    team: str = "btteam1") -> Path:
    """A job as a version before team namespaces left it: ``<store>/<project>/<job>`` (a team project directory)."""
    _publish(root, project, job, user, data, team=team)
    legacy = root / project
    if not legacy.exists():
        legacy.mkdir()
        os.chown(legacy, 0, _gid(team))
        os.chmod(legacy, 0o2770)
    os.rename(root / TEAMS_DIR / team / project / job, legacy / job)
    for empty in (root / TEAMS_DIR / team / project, root / TEAMS_DIR / team):
        if not any(empty.iterdir()):
            empty.rmdir()
    return legacy / job


def _chown_tree(path: Path, user: str, group: str) -> None:
    chown = shutil.which("chown", path="/usr/bin:/bin") or "chown"
    subprocess.run([chown, "-R", f"{user}:{group}", str(path)], check=True)


def _plant(root: Path, project: str, job: str, *, victim: str = "btu1", squatter: str = "btu2",
           group: str = "btteam2", mode: int = 0o777) -> Path:
    """What a squatter did in a store from before team namespaces: their own project directory at the
    legacy location holding a job whose index names the victim."""
    job_dir = _publish_legacy(root, project, job, victim, data=b"PLANTED BYTES")
    _chown_tree(root / project, squatter, group)
    os.chmod(root / project, mode)
    return job_dir


def _plant_namespace(root: Path, team: str, *, squatter: str = "btu2", group: str = "btteam2",
                     mode: int = 0o777) -> Path:
    """What a squatter does now: ``_teams/<victim team>`` made first, as their own directory."""
    squat = root / TEAMS_DIR / team
    subprocess.run([RUNUSER, "-u", squatter, "--", "mkdir", str(squat)], check=True)
    _chown_tree(squat, squatter, group)
    os.chmod(squat, mode)
    return squat


# -- the rule is the team weights tier's, not a twin -------------------------------------------------

def test_project_rule_is_the_team_tier_rule() -> None:
    # Both modules use the one function in slurm_bt/trusted_files.py (no twin that could drift).
    assert getattr(store_mod, "is_team_dir") is getattr(cluster_cache, "is_team_dir") is trusted_files.is_team_dir


# -- direction (a): the owner's uploads never go into a squatted namespace or project -----------------

_UPLOAD_OPS = ("s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
               "for op in (lambda: check_upload_location(sys.argv[1], 'llm-ft', '7', account='btteam1'),\n"
               "           lambda: s.write_bytes('_teams/btteam1/llm-ft/7/ranks/rank-0.json', b'{}'),\n"
               "           lambda: s.upload_file(os.open('/etc/hostname', os.O_RDONLY), 1,\n"
               "                                 '_teams/btteam1/llm-ft/7/rank-0/c/x')):\n"
               "    try:\n        op(); print('WROTE')\n"
               "    except UntrustedLocation as e:\n        print('REFUSED', e)\n")


@pytest.mark.parametrize("mode", [0o777, 0o2770, 0o1777, 0o755])
def test_upload_into_a_squatted_team_namespace_is_refused_naming_the_dir(shared: Path, mode: int) -> None:
    squat = _plant_namespace(shared, "btteam1", mode=mode)
    out = _as("btu1", _UPLOAD_OPS, _uri(shared))
    assert "WROTE" not in out.stdout, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"REFUSED {squat}: ") for line in lines), out.stdout + out.stderr
    assert "btteam1" in lines[0] and f"rm -rf {squat}" in lines[0] and "install -d -m 2770 -g btteam1" in lines[0]
    assert os.listdir(squat) == [], "nothing may be written into the squatted directory"


@pytest.mark.parametrize("mode", [0o777, 0o2770, 0o1777])
def test_upload_into_a_squatted_project_is_refused_naming_the_dir(shared: Path, mode: int) -> None:
    # The namespace is the team's (the prolog made it); btu1, also in btextra, made the project for
    # btextra: a project of another team, even of one's own, is refused for btteam1's jobs.
    team_dir = shared / TEAMS_DIR / "btteam1"
    team_dir.mkdir()
    os.chown(team_dir, 0, _gid("btteam1"))
    os.chmod(team_dir, 0o2770)
    squat = team_dir / "llm-ft"
    squat.mkdir()
    _chown_tree(squat, "btu1", "btextra")
    os.chmod(squat, mode)
    out = _as("btu1", _UPLOAD_OPS, _uri(shared))
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"REFUSED {squat}: ") for line in lines), out.stdout + out.stderr
    assert "install -d -m 2770 -g btteam1" in lines[0] and "another TrainingProject name" in lines[0]
    assert os.listdir(squat) == []


def test_a_team_namespace_of_another_group_is_refused_for_uploads_and_loads(shared: Path) -> None:
    """``_teams/btteam1`` with btextra's group (made by btu1, in both): not btteam1's namespace."""
    wrong = shared / TEAMS_DIR / "btteam1"
    wrong.mkdir()
    _chown_tree(wrong, "btu1", "btextra")
    os.chmod(wrong, 0o2770)
    out = _as("btu1", _UPLOAD_OPS + "s = FileStore(parse_store_uri(sys.argv[1]))\n"
                                    "try:\n    s.list_dirs('_teams/btteam1')\n"
                                    "except UntrustedLocation as e:\n    print('READ REFUSED', e)\n"
                                    "print('teams', s.list_dirs('_teams'))\n", _uri(shared))
    lines = out.stdout.splitlines()
    assert all(line.startswith(f"REFUSED {wrong}: ") for line in lines[:3]), out.stdout + out.stderr
    assert lines[3].startswith(f"READ REFUSED {wrong}: is not the checkpoint namespace of a team 'btteam1'"), lines
    assert lines[4] == "teams []", "a namespace that is not its team's is not listed"


def test_upload_refuses_another_users_job_dir_and_symlinks(shared: Path) -> None:
    # btu1's own team namespace and project, as slurm-bt makes them; a job directory in it that is not btu1's.
    team_dir = shared / TEAMS_DIR / "btteam1"
    proj = team_dir / "mine"
    proj.mkdir(parents=True)
    for d in (team_dir, proj):
        os.chown(d, 0, _gid("btteam1"))
        os.chmod(d, 0o2770)
    (proj / "8").mkdir()
    _chown_tree(proj / "8", "btu2", "btteam1")
    os.chmod(proj / "8", 0o2755)
    # A symlink under a project name (never followed, whoever made it), and one btu2 planted as a team
    # namespace (btextra's), pointing at btteam1's.
    (team_dir / "alias").symlink_to(proj)
    subprocess.run([RUNUSER, "-u", "btu2", "--", "ln", "-s", str(team_dir), str(shared / TEAMS_DIR / "btextra")],
                   check=True)
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
                      "x = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btextra'))\n"
                      "for st, key in ((s, '_teams/btteam1/mine/8/index.json'),\n"
                      "                (s, '_teams/btteam1/alias/9/index.json'),\n"
                      "                (x, '_teams/btextra/mine/9/index.json'),\n"
                      "                (s, '_teams/btteam1/mine/9/index.json')):\n"
                      "    try:\n        st.write_bytes(key, b'{}'); print('WROTE', key)\n"
                      "    except UntrustedLocation as e:\n        print('REFUSED', e)\n", _uri(shared))
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"REFUSED {proj / '8'}: belongs to btu2, not btu1"), out.stdout + out.stderr
    assert lines[1].startswith(f"REFUSED {team_dir / 'alias'}: is a symlink"), out.stdout
    assert lines[2].startswith(f"REFUSED {shared / TEAMS_DIR / 'btextra'}: is a symlink"), out.stdout
    assert lines[3] == "WROTE _teams/btteam1/mine/9/index.json", "btu1's own team project stays usable"
    assert not (proj / "8" / "index.json").exists() and not (proj / "9" / "index.json").is_symlink()


def test_claim_creates_the_namespace_and_the_project_for_the_team(shared: Path) -> None:
    out = _as("btu1", "check_upload_location(sys.argv[1], 'fresh', '5', account='btteam1'); print('OK')", _uri(shared))
    assert out.stdout.strip() == "OK", out.stderr
    uid, gid = int(subprocess.check_output(["id", "-u", "btu1"])), _gid("btteam1")
    for d in (shared / TEAMS_DIR / "btteam1", shared / TEAMS_DIR / "btteam1" / "fresh"):
        st = os.lstat(d)
        assert oct(st.st_mode & 0o7777) == oct(0o2770) and (st.st_uid, st.st_gid) == (uid, gid), d
    assert not (shared / TEAMS_DIR / "btteam1" / "fresh" / "5").exists(), "only the project name is claimed"
    assert not (shared / "fresh").exists(), "nothing goes to the legacy location any more"


def test_two_teams_use_one_project_name_without_conflict(shared: Path) -> None:
    """The issue: in one file:// store, btteam1 and btteam2 each run a project called llama-finetune."""
    upload = ("from pathlib import Path\n"
              "from slurm_bt.checkpoints.scan import CompletionTracker\n"
              "from slurm_bt.checkpoints.store import team_group\n"
              "from slurm_bt.checkpoints.upload import JobIdentity, RankUploader\n"
              "src, job, account = Path(sys.argv[2]), sys.argv[3], sys.argv[4]\n"
              "(src / 'checkpoint-1').mkdir(parents=True)\n"
              "(src / 'checkpoint-1' / 'model.bin').write_bytes(job.encode())\n"
              "(src / 'checkpoint-1' / '.complete').touch()\n"
              "check_upload_location(sys.argv[1], 'llama-finetune', job, account=account)\n"
              "team, gid = team_group(account)\n"
              "ident = JobIdentity('llama-finetune', 'llama-finetune', job, os.environ.get('USER') or "
              "__import__('pwd').getpwuid(os.getuid()).pw_name, 0, 1, team)\n"
              "RankUploader(store=FileStore(parse_store_uri(sys.argv[1]), gid=gid), ident=ident, checkpoint_dir=src,\n"
              "             tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None).run_once()\n"
              "print('UPLOADED', team)\n")
    for user, team, job in (("btu1", "btteam1", "101"), ("btu2", "btteam2", "102")):
        src = Path(tempfile.mkdtemp(prefix=f"src-{user}-", dir="/tmp"))
        os.chown(src, int(subprocess.check_output(["id", "-u", user])), _gid(team))
        try:
            out = _as(user, upload, _uri(shared), str(src / "ckpt"), job, team)
        finally:
            shutil.rmtree(src, ignore_errors=True)
        assert out.stdout.strip() == f"UPLOADED {team}", out.stdout + out.stderr
        project = shared / TEAMS_DIR / team / "llama-finetune"
        assert os.lstat(project).st_gid == _gid(team) and (project / job / "index.json").is_file()
    # Each team's latest of "llama-finetune" is its own job; neither sees the other's.
    resolve = ("from slurm_bt.checkpoints.resolve import _resolve_one\n"
               "s = FileStore(parse_store_uri(sys.argv[1]))\n"
               "found, view = _resolve_one(s, {'typ': 'baseten_latest_checkpoint', 'project_name': 'llama-finetune'},"
               " None, team=sys.argv[2])\n"
               "print(found.team, found.index.job_id, found.index.user)\n"
               "other = '102' if sys.argv[2] == 'btteam1' else '101'\n"
               "print('other', find_job(s, other))\n")
    assert _as("btu1", resolve, _uri(shared), "btteam1").stdout.splitlines() == ["btteam1 101 btu1", "other None"]
    assert _as("btu2", resolve, _uri(shared), "btteam2").stdout.splitlines() == ["btteam2 102 btu2", "other None"]


# -- a store without _teams: never created by a user ------------------------------------------------

def test_a_missing_teams_dir_fails_the_upload_with_the_admins_command(shared: Path) -> None:
    os.rmdir(shared / TEAMS_DIR)
    out = _as("btu1", "try:\n    check_upload_location(sys.argv[1], 'llm-ft', '7', account='btteam1')\n"
                      "except StorageError as e:\n    print('FAILED', e)\n"
                      "s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
                      "try:\n    s.write_bytes('_teams/btteam1/llm-ft/7/index.json', b'{}')\n"
                      "except StorageError as e:\n    print('FAILED', e)\n", _uri(shared))
    teams = shared / TEAMS_DIR
    want = (f"FAILED {teams}: is missing: this checkpoint store has no team namespaces yet (the slurm-bt "
            f"prolog makes them); an admin runs slurm-bt admin install, or install -d -m 1777 {teams} where "
            "jobs run without the prolog")
    assert out.stdout.splitlines() == [want, want], out.stdout + out.stderr
    assert not teams.exists(), "a user never creates _teams: its owner could rename every team's directory away"


def test_root_creates_teams_as_the_admin_would(tmp_path: Path) -> None:
    store = FileStore(parse_store_uri(f"file://{tmp_path}/store"), gid=0)
    store.write_bytes("_teams/root/p/1/index.json", b"{}")
    st = os.lstat(tmp_path / "store" / TEAMS_DIR)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o1777)


def test_a_teams_dir_made_by_a_user_is_refused(shared: Path) -> None:
    os.rmdir(shared / TEAMS_DIR)
    subprocess.run([RUNUSER, "-u", "btu2", "--", "mkdir", "-m", "1777", str(shared / TEAMS_DIR)], check=True)
    out = _as("btu2", "try:\n    check_upload_location(sys.argv[1], 'p', '7', account='btteam2')\n"
                      "except UntrustedLocation as e:\n    print('REFUSED', e)\n", _uri(shared))
    refused = f"REFUSED {shared / TEAMS_DIR}: is owned by btu2, not by root"
    assert out.stdout.startswith(refused), out.stdout + out.stderr
    assert f"install -d -m 1777 {shared / TEAMS_DIR}" in out.stdout


# -- direction (b): planted job directories and forged indexes are never loaded -------------------

def test_forged_index_in_squatted_legacy_project_is_never_loaded(shared: Path) -> None:
    _plant(shared, "llm-ft", "99999")
    code = ("s = FileStore(parse_store_uri(sys.argv[1]))\n"
            "for what, op in (('list', lambda: s.list_dirs('llm-ft')),\n"
            "                 ('index', lambda: read_trusted_index(s, 'llm-ft', '99999', team=None)),\n"
            "                 ('raw', lambda: s.read_bytes('llm-ft/99999/ranks/rank-0.json')),\n"
            "                 ('locate', lambda: locate_index(s, 'llm-ft', '99999', teams=['btteam1'])),\n"
            "                 ('find', lambda: find_job(s, '99999'))):\n"
            "    try:\n        print(what, 'GOT', op())\n"
            "    except UntrustedLocation as e:\n        print(what, 'REFUSED', e)\n"
            "print('projects', s.list_dirs(''))\n")
    out = _as("btu1", code, _uri(shared))
    assert "PLANTED" not in out.stdout and "GOT" not in out.stdout.replace("find GOT None", ""), out.stdout + out.stderr
    for what in ("list", "index", "raw", "locate"):
        assert f"{what} REFUSED {shared / 'llm-ft'}: is not a checkpoint project directory of a team you belong to" \
            in out.stdout, out.stdout + out.stderr
    assert f"rm -rf {shared / 'llm-ft'}" in out.stdout
    assert "find GOT None" in out.stdout and "projects []" in out.stdout, "a squat is not a project of btu1's"


def test_forged_index_in_a_squatted_namespace_is_never_loaded(shared: Path) -> None:
    squat = _plant_namespace(shared, "btteam1")
    job = _publish(shared, "llm-ft", "99998", "btu1", data=b"PLANTED BYTES", team="btteam2")
    os.rename(job.parent, squat / "llm-ft")
    _chown_tree(squat, "btu2", "btteam2")
    code = ("s = FileStore(parse_store_uri(sys.argv[1]))\n"
            "for what, op in (('index', lambda: read_trusted_index(s, 'llm-ft', '99998', team='btteam1')),\n"
            "                 ('find', lambda: find_job(s, '99998'))):\n"
            "    try:\n        print(what, 'GOT', op())\n"
            "    except UntrustedLocation as e:\n        print(what, 'REFUSED', e)\n")
    out = _as("btu1", code, _uri(shared))
    assert "GOT" not in out.stdout, out.stdout + out.stderr
    assert out.stdout.count(f"REFUSED {squat}: is not the checkpoint namespace of a team 'btteam1'") == 2, out.stdout


def test_resolve_fails_naming_the_squatted_dir(shared: Path, tmp_path: Path) -> None:
    """``from_latest_checkpoint(project_name=...)`` as btu1 against a squatted legacy project, then namespace."""
    from slurm_bt.job_spec import slugify

    squat = slugify("LLM FT", default="project")  # the project id the name maps to (docs/compatibility.md)
    _plant(shared, squat, "99999")
    code = ("from slurm_bt.checkpoints.resolve import _resolve_one\n"
            "s = FileStore(parse_store_uri(sys.argv[1]))\n"
            "try:\n"
            "    found, view = _resolve_one(s, {'typ': 'baseten_latest_checkpoint', 'project_name': 'LLM FT'}, None,\n"
            "                               team='btteam1')\n"
            "    print('LOADED', found.index.user, found.index.job_id)\n"
            "except (LookupError, UntrustedLocation) as e:\n    print('REFUSED', e)\n")
    out = _as("btu1", code, _uri(shared))
    assert out.stdout.startswith(f"REFUSED {shared / squat}: "), out.stdout + out.stderr
    namespace = _plant_namespace(shared, "btteam1")
    out = _as("btu1", code, _uri(shared))
    assert out.stdout.startswith(f"REFUSED {namespace}: "), out.stdout + out.stderr


def test_index_naming_another_user_than_the_job_dir_owner_is_refused(shared: Path) -> None:
    # A real team namespace and project (root:btteam1 2770); btu2 cannot enter it, so use root to place a
    # job dir owned by btu2 whose index names btu1 (what a teammate of a shared group could do).
    job = _publish(shared, "team", "500", "btu1", data=b"PLANTED BYTES")
    _chown_tree(job, "btu2", "btteam1")
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]))\n"
                      "try:\n    print('GOT', read_trusted_index(s, 'team', '500', team='btteam1'))\n"
                      "except UntrustedLocation as e:\n    print('REFUSED', e)\n", _uri(shared))
    assert out.stdout.startswith(f"REFUSED file://{shared}/_teams/btteam1/team/500: its index names user 'btu1' but "
                                 "the job directory belongs to btu2"), out.stdout + out.stderr
    assert f"rm -rf {job}" in out.stdout
    # The owner's own job in the same project loads.
    _chown_tree(job, "btu1", "btteam1")
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]))\n"
                      "print(read_trusted_index(s, 'team', '500', team='btteam1').user)\n", _uri(shared))
    assert out.stdout.strip() == "btu1", out.stderr


def test_index_copied_to_another_job_is_refused(shared: Path) -> None:
    job = _publish(shared, "proj", "600", "root")
    shutil.copytree(job, job.parent / "601")
    store = FileStore(parse_store_uri(_uri(shared)))
    assert read_trusted_index(store, "proj", "600", team="btteam1") is not None
    with pytest.raises(UntrustedLocation, match=r"holds the index of proj/600"):
        read_trusted_index(store, "proj", "601", team="btteam1")
    found = find_job(store, "600")
    assert found is not None and found.team == "btteam1"


# -- stores from before team namespaces: read at the legacy location --------------------------------

def test_legacy_jobs_are_found_and_loaded_where_they_are(shared: Path, tmp_path: Path) -> None:
    old = _publish_legacy(shared, "llm-ft", "300", "btu1", data=b"LEGACY")
    _chown_tree(old, "btu1", "btteam1")
    code = ("from pathlib import Path\n"
            "from slurm_bt.checkpoints.resolve import _resolve_one\n"
            "s = FileStore(parse_store_uri(sys.argv[1]))\n"
            "found = find_job(s, '300')\n"
            "print('find', found.team, found.index.job_id)\n"
            "print('locate', locate_index(s, 'llm-ft', '300', teams=['btteam1']).team)\n"
            "found, view = _resolve_one(s, {'typ': 'baseten_latest_checkpoint', 'project_name': 'llm-ft'}, None,"
            " team='btteam1')\n"
            "print('latest', found.team, found.index.job_id)\n"
            "f = view.ranks[0][0]\n"
            "key = found.file_key(0, view.name, f.path)\n"
            "s.download_file(key, Path(sys.argv[2]) / 'x', size=f.size, sha256=f.sha256)\n"
            "print('bytes', (Path(sys.argv[2]) / 'x').read_bytes())\n")
    dl = Path(tempfile.mkdtemp(prefix="dl-", dir="/tmp"))
    os.chown(dl, int(subprocess.check_output(["id", "-u", "btu1"])), -1)
    try:
        out = _as("btu1", code, _uri(shared), str(dl))
    finally:
        shutil.rmtree(dl, ignore_errors=True)
    assert out.stdout.splitlines() == ["find None 300", "locate None", "latest None 300", "bytes b'LEGACY'"], \
        out.stdout + out.stderr


def test_the_team_namespace_comes_first_and_a_job_in_both_is_found_once(shared: Path) -> None:
    # The store being migrated: job 300 copied into the namespace, 301 only at the legacy location (a
    # newer job id: what a store of another team with this project name could hold there).
    for job in ("300", "301"):
        _chown_tree(_publish_legacy(shared, "llm-ft", job, "root", data=b"LEGACY" + job.encode()), "root", "btteam1")
    new = _publish(shared, "llm-ft", "300", "root", data=b"NEW")
    assert new.is_dir() and (shared / "llm-ft" / "300").is_dir()
    from slurm_bt.checkpoints.resolve import _resolve_one

    store = FileStore(parse_store_uri(_uri(shared)))
    found = find_job(store, "300")
    assert found is not None and found.team == "btteam1", "the namespace's copy, once"
    legacy = find_job(store, "301")
    assert legacy is not None and legacy.team is None
    found, _ = _resolve_one(store, {"typ": "baseten_latest_checkpoint", "project_name": "llm-ft"}, None,
                            team="btteam1")
    assert (found.team, found.index.job_id) == ("btteam1", "300"), "the team's project first, not the legacy one"
    found, _ = _resolve_one(store, {"typ": "baseten_latest_checkpoint", "project_name": "llm-ft"}, None,
                            team="btteam2")
    assert (found.team, found.index.job_id) == (None, "301"), "another team without the project: the legacy one"
    assert found.file_key(0, "checkpoint-1", "model.bin") == "llm-ft/301/rank-0/checkpoint-1/model.bin"


@pytest.mark.parametrize("where", ["job", "ranks", "file", "checkpoint"])
def test_symlinks_below_the_project_are_never_followed(shared: Path, where: str) -> None:
    job = _publish(shared, "proj", "700", "root")
    elsewhere = _publish(shared, "other", "700", "root", data=b"ELSEWHERE")
    target = {"job": (job, elsewhere),
              "ranks": (job / "ranks", elsewhere / "ranks"),
              "file": (job / "ranks" / "rank-0.json", elsewhere / "ranks" / "rank-0.json"),
              "checkpoint": (job / "rank-0" / "checkpoint-1", elsewhere / "rank-0" / "checkpoint-1")}[where]
    shutil.rmtree(target[0]) if target[0].is_dir() else target[0].unlink()
    target[0].symlink_to(target[1])
    store = FileStore(parse_store_uri(_uri(shared)), gid=_gid("btteam1"))
    part = "_teams/btteam1/proj/700/ranks/rank-0.json"
    if where == "checkpoint":
        index = json.loads((elsewhere / "ranks" / "rank-0.json").read_text())
        entry = index["checkpoints"][0]["files"][0]
        with pytest.raises(UntrustedLocation, match="symlink"):
            store.download_file(file_key("proj", "700", 0, "checkpoint-1", entry["path"], team="btteam1"),
                                shared.parent / "dl" / "x", size=entry["size"], sha256=entry["sha256"])
        assert not (shared.parent / "dl" / "x").exists()
        return
    before = (elsewhere / "ranks" / "rank-0.json").read_bytes()
    with pytest.raises(UntrustedLocation, match="symlink"):
        store.read_bytes(part)
    if where == "file":  # a write replaces the link itself (temp + rename), never writes through it
        store.write_bytes(part, b"{}")
        assert not target[0].is_symlink() and target[0].read_bytes() == b"{}"
    else:
        with pytest.raises(UntrustedLocation, match="symlink"):
            store.write_bytes(part, b"{}")
    assert (elsewhere / "ranks" / "rank-0.json").read_bytes() == before


def test_fifo_or_foreign_file_as_index_is_refused_without_blocking(shared: Path) -> None:
    job = _publish(shared, "proj", "800", "root")
    part = job / "ranks" / "rank-0.json"
    part.unlink()
    os.mkfifo(part)
    store = FileStore(parse_store_uri(_uri(shared)))
    key = "_teams/btteam1/proj/800/ranks/rank-0.json"
    with pytest.raises(UntrustedLocation, match="not a regular file"):
        store.read_bytes(key)  # would block for ever if the FIFO were opened
    part.unlink()
    part.write_text("{}")
    os.chown(part, 65534, 0)
    with pytest.raises(UntrustedLocation, match="was not written by the job's user root"):
        store.read_bytes(key)


def test_job_dir_writable_by_others_is_refused(shared: Path) -> None:
    job = _publish(shared, "proj", "900", "root")
    os.chmod(job, 0o2777)
    store = FileStore(parse_store_uri(_uri(shared)), gid=_gid("btteam1"))
    with pytest.raises(UntrustedLocation, match="can be written by others"):
        store.read_bytes("_teams/btteam1/proj/900/ranks/rank-0.json")
    with pytest.raises(UntrustedLocation, match="can be written by others"):
        store.write_bytes("_teams/btteam1/proj/900/index.json", b"{}")


def test_store_root_rules(shared: Path) -> None:
    os.chmod(shared, 0o777)  # world-writable without the sticky bit: anyone could rename projects
    store = FileStore(parse_store_uri(_uri(shared)))
    with pytest.raises(UntrustedLocation, match="without the sticky bit"):
        store.write_bytes("_teams/root/p/1/index.json", b"{}")
    os.chmod(shared, 0o1777)
    os.chmod(shared / TEAMS_DIR, 0o777)  # the same rule for _teams
    with pytest.raises(UntrustedLocation, match=f"{shared / TEAMS_DIR}: is writable by others without the sticky"):
        store.write_bytes("_teams/root/p/1/index.json", b"{}")
    os.chmod(shared / TEAMS_DIR, 0o1777)
    link = shared.parent / "link"
    os.chmod(shared.parent, 0o1777)  # a world-writable parent where btu2 could plant it
    subprocess.run([RUNUSER, "-u", "btu2", "--", "ln", "-s", str(shared), str(link)], check=True)
    with pytest.raises(UntrustedLocation, match="is a symlink owned by btu2"):
        FileStore(parse_store_uri(f"file://{link}")).read_bytes("_teams/root/p/1/index.json")


def test_download_of_an_oversized_file_stops_at_its_index_size(shared: Path) -> None:
    job = _publish(shared, "proj", "950", "root", data=b"0123456789")
    index = json.loads((job / "ranks" / "rank-0.json").read_text())
    entry = index["checkpoints"][0]["files"][0]
    with open(job / "rank-0" / "checkpoint-1" / entry["path"], "ab") as f:
        f.truncate(1 << 30)  # sparse: a "huge" file a reader must not copy in full
    dest = shared.parent / "dl" / "model.bin"
    store = FileStore(parse_store_uri(_uri(shared)))
    with pytest.raises(IntegrityError, match=r"11 bytes"):
        store.download_file(file_key("proj", "950", 0, "checkpoint-1", entry["path"], team="btteam1"), dest, size=10,
                            sha256=entry["sha256"])
    assert not dest.exists()


def test_owner_and_team_round_trip(shared: Path) -> None:
    """The legitimate flow still works: btu1 uploads and reads back; btu2 (another team) sees nothing."""
    write = ("s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
             "s.write_bytes('_teams/btteam1/ok/1/ranks/rank-0.json', b'{}')\n"
             "print(s.read_bytes('_teams/btteam1/ok/1/ranks/rank-0.json'), s.list_dirs(''), s.list_dirs('_teams'),\n"
             "      s.list_dirs('_teams/btteam1'), s.list_dirs('_teams/btteam1/ok'))\n")
    out = _as("btu1", write, _uri(shared))
    assert out.stdout.strip() == "b'{}' [] ['btteam1'] ['ok'] ['1']", out.stdout + out.stderr
    out = _as("btu2", "s = FileStore(parse_store_uri(sys.argv[1]))\nprint(s.list_dirs('_teams'))\n"
                      "try:\n    s.read_bytes('_teams/btteam1/ok/1/ranks/rank-0.json')\n"
                      "except UntrustedLocation as e:\n    print('REFUSED', e)\n", _uri(shared))
    assert out.stdout.splitlines()[0] == "[]" and "REFUSED" in out.stdout, out.stdout + out.stderr


def test_check_upload_location_is_a_no_op_for_object_stores() -> None:
    check_upload_location("s3://bucket/prefix", "p", "1", account=None)  # nothing to check, no client import


def test_a_project_being_created_by_another_node_of_the_job_is_waited_for(shared: Path) -> None:
    """Nodes of one job race to create the project: one sees it between ``mkdir 0700`` and ``fchown``."""
    import threading

    gid = _gid("btteam1")
    team_dir = shared / TEAMS_DIR / "btteam1"
    (team_dir / "racy").mkdir(parents=True, mode=0o700)  # as the other node left it a moment ago (same uid: root)
    os.chmod(team_dir, 0o700)
    os.chmod(team_dir / "racy", 0o700)

    def finish() -> None:
        for d in (team_dir, team_dir / "racy"):
            os.chown(d, -1, gid)
            os.chmod(d, 0o2770)

    timer = threading.Timer(0.3, finish)
    timer.start()
    try:
        FileStore(parse_store_uri(_uri(shared)), gid=gid).write_bytes("_teams/btteam1/racy/1/index.json", b"{}")
    finally:
        timer.join()
    assert (team_dir / "racy" / "1" / "index.json").read_bytes() == b"{}"


def test_the_team_of_a_job_is_a_group_of_its_user(shared: Path) -> None:
    """``team_group``: the prolog's group (or the account) only if the user is in it, else the primary group."""
    out = _as("btu1", "from slurm_bt.checkpoints.store import team_group\n"
                      "for account in ('btextra', 'btteam2', 'no-such-group', None):\n"
                      "    print(team_group(account)[0])\n")
    assert out.stdout.split() == ["btextra", "btteam1", "btteam1", "btteam1"], out.stdout + out.stderr


def test_teams_may_belong_to_the_sites_shared_layout_identity(shared: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where root is squashed the prolog makes ``_teams`` as hooks.toml's ``shared_fs_identity``."""
    btu2 = int(subprocess.check_output(["id", "-u", "btu2"]))
    os.chown(shared / TEAMS_DIR, btu2, -1)  # btu2 plays the service identity here
    with pytest.raises(UntrustedLocation, match="is owned by btu2, not by root"):
        FileStore(parse_store_uri(_uri(shared)), gid=0).write_bytes("_teams/root/p/1/index.json", b"{}")
    monkeypatch.setattr(store_mod, "_layout_identity_uid", lambda: btu2)
    FileStore(parse_store_uri(_uri(shared)), gid=0).write_bytes("_teams/root/p/1/index.json", b"{}")
    assert (shared / TEAMS_DIR / "root" / "p" / "1" / "index.json").read_bytes() == b"{}"
