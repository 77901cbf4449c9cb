"""Trust rules of ``file://`` checkpoint stores (issue #8 item 1, docs/checkpoints.md §Trust model).

A shared store root is world-writable with the sticky bit, so any user can create a directory under
any project name first, or plant a job directory with an index naming someone else. The rules:

* a project directory is used only if it is a team directory (the team weights tier's rule,
  ``slurm_bt.trusted_files.is_team_dir``): for uploads of the job's team, for loads of a team the
  reader is in;
* a job directory and everything below belong to one user and nobody else can write them; files
  are regular files of that user (never a symlink, FIFO or device);
* an index is accepted only from a job directory owned by the user it names, for the very
  ``<project>/<job>`` it was read from;
* every component is opened without following symlinks; a refusal names the directory and the fix.

The squatter/victim cases run as the real test users btu1 (btteam1) and btu2 (btteam2) through
``runuser``, so the kernel's group rules (who may ``chgrp`` to what) are the real ones.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_bt import trusted_files
from slurm_bt.checkpoints import store as store_mod
from slurm_bt.checkpoints.locations import parse_store_uri
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
    """A store root as admins make it (root-owned 1777) in a directory the test users can reach."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as several users")
    ensure_test_users()
    base = Path(tempfile.mkdtemp(prefix="ckpt-trust-", dir="/tmp"))
    os.chmod(base, 0o755)
    root = base / "store"
    root.mkdir()
    os.chmod(root, 0o1777)  # what the shared store root is
    yield root
    shutil.rmtree(base, ignore_errors=True)


def _uri(root: Path) -> str:
    return f"file://{root}"


def _as(user: str, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` (with ``store``, ``check_upload_location``, ``read_trusted_index``... imported) as ``user``."""
    prelude = ("import json, os, sys\n"
               "from slurm_bt.checkpoints.store import FileStore, check_upload_location, team_gid\n"
               "from slurm_bt.errors import UntrustedLocation\n"
               "from slurm_bt.checkpoints.locations import parse_store_uri\n"
               "from slurm_bt.checkpoints.resolve import find_job, read_trusted_index\n"
               "from slurm_bt.checkpoints.upload import read_job_index\n")
    return subprocess.run([RUNUSER, "-u", user, "--", PY, "-c", prelude + code, *args], capture_output=True,
                          text=True, timeout=timeout, cwd="/", check=False,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def _publish(root: Path, project: str, job: str, user: str, data: bytes = b"weights") -> Path:
    """Upload one complete checkpoint with an index naming ``user`` (as root; callers chown it)."""
    src = root.parent / f"src-{project}-{job}"
    (src / "checkpoint-1").mkdir(parents=True, exist_ok=True)
    (src / "checkpoint-1" / "model.bin").write_bytes(data)
    (src / "checkpoint-1" / ".complete").touch()
    ident = JobIdentity(project, project, job, user, 0, 1)
    RankUploader(store=FileStore(parse_store_uri(_uri(root))), ident=ident, checkpoint_dir=src,
                 tracker=CompletionTracker(quiet_s=3600), log=lambda r, m: None).run_once()
    return root / project / job


def _chown_tree(path: Path, user: str, group: str) -> None:
    chown = shutil.which("chown", path="/usr/bin:/bin") or "chown"
    subprocess.run([chown, "-R", f"{user}:{group}", str(path)], check=True)


def _plant(root: Path, project: str, job: str, *, victim: str = "btu1", squatter: str = "btu2",
           group: str = "btteam2", mode: int = 0o777) -> Path:
    """What a squatter does: their own project directory holding a job whose index names the victim."""
    job_dir = _publish(root, project, job, victim, data=b"PLANTED BYTES")
    _chown_tree(root / project, squatter, group)
    os.chmod(root / project, mode)
    return job_dir


# -- the rule is the team weights tier's, not a twin -------------------------------------------------

def test_project_rule_is_the_team_tier_rule() -> None:
    # Both modules use the one function in slurm_bt/trusted_files.py (no twin that could drift).
    assert getattr(store_mod, "is_team_dir") is getattr(cluster_cache, "is_team_dir") is trusted_files.is_team_dir


# -- direction (a): the owner's uploads never go into a squatted project ----------------------------

@pytest.mark.parametrize("mode", [0o777, 0o2770, 0o1777, 0o755])
def test_upload_into_squatted_project_is_refused_naming_the_dir(shared: Path, mode: int) -> None:
    squat = shared / "llm-ft"
    subprocess.run([RUNUSER, "-u", "btu2", "--", "mkdir", str(squat)], check=True)
    os.chmod(squat, mode)
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
                      "for op in (lambda: check_upload_location(sys.argv[1], 'llm-ft', '7', account='btteam1'),\n"
                      "           lambda: s.write_bytes('llm-ft/7/ranks/rank-0.json', b'{}'),\n"
                      "           lambda: s.upload_file(os.open('/etc/hostname', os.O_RDONLY), 1,\n"
                      "                                 'llm-ft/7/rank-0/c/x')):\n"
                      "    try:\n        op(); print('WROTE')\n"
                      "    except UntrustedLocation as e:\n        print('REFUSED', e)\n", _uri(shared))
    assert "WROTE" not in out.stdout, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"REFUSED {squat}: ") for line in lines), out.stdout + out.stderr
    assert "btteam1" in lines[0] and f"rm -rf {squat}" in lines[0] and "install -d -m 2770 -g btteam1" in lines[0]
    assert os.listdir(squat) == [], "nothing may be written into the squatted directory"


def test_upload_refuses_another_users_job_dir_and_a_symlinked_project(shared: Path) -> None:
    # btu1's own project, as slurm-bt makes it; a job directory in it that is not btu1's.
    proj = shared / "mine"
    proj.mkdir()
    os.chown(proj, 0, int(subprocess.check_output(["getent", "group", "btteam1"], text=True).split(":")[2]))
    os.chmod(proj, 0o2770)
    (proj / "8").mkdir()
    _chown_tree(proj / "8", "btu2", "btteam1")
    os.chmod(proj / "8", 0o2755)
    # A symlink under a project name, pointing at btu1's real project.
    subprocess.run([RUNUSER, "-u", "btu2", "--", "ln", "-s", str(proj), str(shared / "alias")], check=True)
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
                      "for key in ('mine/8/index.json', 'alias/9/index.json', 'mine/9/index.json'):\n"
                      "    try:\n        s.write_bytes(key, b'{}'); print('WROTE', key)\n"
                      "    except UntrustedLocation as e:\n        print('REFUSED', e)\n", _uri(shared))
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"REFUSED {proj / '8'}: belongs to btu2, not btu1"), out.stdout + out.stderr
    assert lines[1].startswith(f"REFUSED {shared / 'alias'}: is a symlink"), out.stdout
    assert lines[2] == "WROTE mine/9/index.json", "btu1's own team project stays usable"
    assert not (proj / "8" / "index.json").exists() and not (proj / "9" / "index.json").is_symlink()


def test_claim_creates_the_project_for_the_team(shared: Path) -> None:
    out = _as("btu1", "check_upload_location(sys.argv[1], 'fresh', '5', account='btteam1'); print('OK')", _uri(shared))
    assert out.stdout.strip() == "OK", out.stderr
    st = os.lstat(shared / "fresh")
    assert oct(st.st_mode & 0o7777) == oct(0o2770)
    assert (st.st_uid, st.st_gid) == (int(subprocess.check_output(["id", "-u", "btu1"])),
                                      int(subprocess.check_output(["id", "-g", "btu1"])))
    assert not (shared / "fresh" / "5").exists(), "only the project name is claimed before training"


# -- direction (b): planted job directories and forged indexes are never loaded -------------------

def test_forged_index_in_squatted_project_is_never_loaded(shared: Path) -> None:
    _plant(shared, "llm-ft", "99999")
    code = ("s = FileStore(parse_store_uri(sys.argv[1]))\n"
            "for what, op in (('list', lambda: s.list_dirs('llm-ft')),\n"
            "                 ('index', lambda: read_trusted_index(s, 'llm-ft', '99999')),\n"
            "                 ('raw', lambda: s.read_bytes('llm-ft/99999/ranks/rank-0.json')),\n"
            "                 ('find', lambda: find_job(s, '99999'))):\n"
            "    try:\n        print(what, 'GOT', op())\n"
            "    except UntrustedLocation as e:\n        print(what, 'REFUSED', e)\n"
            "print('projects', s.list_dirs(''))\n")
    out = _as("btu1", code, _uri(shared))
    assert "PLANTED" not in out.stdout and "GOT" not in out.stdout.replace("find GOT None", ""), out.stdout + out.stderr
    for what in ("list", "index", "raw"):
        assert f"{what} REFUSED {shared / 'llm-ft'}: is not a checkpoint project directory of a team you belong to" \
            in out.stdout, out.stdout + out.stderr
    assert f"rm -rf {shared / 'llm-ft'}" in out.stdout
    assert "find GOT None" in out.stdout and "projects []" in out.stdout, "a squat is not a project of btu1's"


def test_resolve_fails_naming_the_squatted_dir(shared: Path, tmp_path: Path) -> None:
    """``from_latest_checkpoint(project_name=...)`` as btu1 against a squatted, planted project."""
    from slurm_bt.job_spec import slugify

    squat = slugify("LLM FT", default="project")  # the project id the name maps to (docs/compatibility.md)
    _plant(shared, squat, "99999")
    code = ("from slurm_bt.checkpoints.resolve import _resolve_one\n"
            "s = FileStore(parse_store_uri(sys.argv[1]))\n"
            "try:\n"
            "    index, view = _resolve_one(s, {'typ': 'baseten_latest_checkpoint', 'project_name': 'LLM FT'}, None)\n"
            "    print('LOADED', index.user, index.job_id)\n"
            "except (LookupError, UntrustedLocation) as e:\n    print('REFUSED', e)\n")
    out = _as("btu1", code, _uri(shared))
    assert out.stdout.startswith(f"REFUSED {shared / squat}: "), out.stdout + out.stderr


def test_index_naming_another_user_than_the_job_dir_owner_is_refused(shared: Path) -> None:
    # A real team project (root:btteam1 2770); btu2 cannot enter it, so use root to place a job dir
    # owned by btu2 whose index names btu1 (what a teammate of a shared group could do).
    gid = int(subprocess.check_output(["getent", "group", "btteam1"], text=True).split(":")[2])
    job = _publish(shared, "team", "500", "btu1", data=b"PLANTED BYTES")
    os.chown(shared / "team", 0, gid)
    os.chmod(shared / "team", 0o2770)
    _chown_tree(job, "btu2", "btteam1")
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]))\n"
                      "try:\n    print('GOT', read_trusted_index(s, 'team', '500'))\n"
                      "except UntrustedLocation as e:\n    print('REFUSED', e)\n", _uri(shared))
    assert out.stdout.startswith(f"REFUSED file://{shared}/team/500: its index names user 'btu1' but the job "
                                 "directory belongs to btu2"), out.stdout + out.stderr
    assert f"rm -rf {job}" in out.stdout
    # The owner's own job in the same project loads.
    _chown_tree(job, "btu1", "btteam1")
    out = _as("btu1", "s = FileStore(parse_store_uri(sys.argv[1]))\n"
                      "print(read_trusted_index(s, 'team', '500').user)\n", _uri(shared))
    assert out.stdout.strip() == "btu1", out.stderr


def test_index_copied_to_another_job_is_refused(shared: Path) -> None:
    job = _publish(shared, "proj", "600", "root")
    shutil.copytree(job, shared / "proj" / "601")
    store = FileStore(parse_store_uri(_uri(shared)))
    assert read_trusted_index(store, "proj", "600") is not None
    with pytest.raises(UntrustedLocation, match=r"holds the index of proj/600"):
        read_trusted_index(store, "proj", "601")
    assert find_job(store, "600") is not None


@pytest.mark.parametrize("where", ["job", "ranks", "file", "checkpoint"])
def test_symlinks_below_the_project_are_never_followed(shared: Path, where: str) -> None:
    job = _publish(shared, "proj", "700", "root")
    elsewhere = _publish(shared, "other", "700", "root", data=b"ELSEWHERE")
    target = {"job": (shared / "proj" / "700", elsewhere),
              "ranks": (job / "ranks", elsewhere / "ranks"),
              "file": (job / "ranks" / "rank-0.json", elsewhere / "ranks" / "rank-0.json"),
              "checkpoint": (job / "rank-0" / "checkpoint-1", elsewhere / "rank-0" / "checkpoint-1")}[where]
    shutil.rmtree(target[0]) if target[0].is_dir() else target[0].unlink()
    target[0].symlink_to(target[1])
    store = FileStore(parse_store_uri(_uri(shared)))
    if where == "checkpoint":
        index = json.loads((elsewhere / "ranks" / "rank-0.json").read_text())
        entry = index["checkpoints"][0]["files"][0]
        with pytest.raises(UntrustedLocation, match="symlink"):
            store.download_file(f"proj/700/rank-0/checkpoint-1/{entry['path']}", shared.parent / "dl" / "x",
                                size=entry["size"], sha256=entry["sha256"])
        assert not (shared.parent / "dl" / "x").exists()
        return
    before = (elsewhere / "ranks" / "rank-0.json").read_bytes()
    with pytest.raises(UntrustedLocation, match="symlink"):
        store.read_bytes("proj/700/ranks/rank-0.json")
    if where == "file":  # a write replaces the link itself (temp + rename), never writes through it
        store.write_bytes("proj/700/ranks/rank-0.json", b"{}")
        assert not target[0].is_symlink() and target[0].read_bytes() == b"{}"
    else:
        with pytest.raises(UntrustedLocation, match="symlink"):
            store.write_bytes("proj/700/ranks/rank-0.json", b"{}")
    assert (elsewhere / "ranks" / "rank-0.json").read_bytes() == before


def test_fifo_or_foreign_file_as_index_is_refused_without_blocking(shared: Path) -> None:
    job = _publish(shared, "proj", "800", "root")
    part = job / "ranks" / "rank-0.json"
    part.unlink()
    os.mkfifo(part)
    store = FileStore(parse_store_uri(_uri(shared)))
    with pytest.raises(UntrustedLocation, match="not a regular file"):
        store.read_bytes("proj/800/ranks/rank-0.json")  # would block for ever if the FIFO were opened
    part.unlink()
    part.write_text("{}")
    os.chown(part, 65534, 0)
    with pytest.raises(UntrustedLocation, match="was not written by the job's user root"):
        store.read_bytes("proj/800/ranks/rank-0.json")


def test_job_dir_writable_by_others_is_refused(shared: Path) -> None:
    job = _publish(shared, "proj", "900", "root")
    os.chmod(job, 0o2777)
    store = FileStore(parse_store_uri(_uri(shared)))
    with pytest.raises(UntrustedLocation, match="can be written by others"):
        store.read_bytes("proj/900/ranks/rank-0.json")
    with pytest.raises(UntrustedLocation, match="can be written by others"):
        store.write_bytes("proj/900/index.json", b"{}")


def test_store_root_rules(shared: Path) -> None:
    os.chmod(shared, 0o777)  # world-writable without the sticky bit: anyone could rename projects
    store = FileStore(parse_store_uri(_uri(shared)))
    with pytest.raises(UntrustedLocation, match="without the sticky bit"):
        store.write_bytes("p/1/index.json", b"{}")
    os.chmod(shared, 0o1777)
    link = shared.parent / "link"
    os.chmod(shared.parent, 0o1777)  # a world-writable parent where btu2 could plant it
    subprocess.run([RUNUSER, "-u", "btu2", "--", "ln", "-s", str(shared), str(link)], check=True)
    with pytest.raises(UntrustedLocation, match="is a symlink owned by btu2"):
        FileStore(parse_store_uri(f"file://{link}")).read_bytes("p/1/index.json")


def test_download_of_an_oversized_file_stops_at_its_index_size(shared: Path) -> None:
    job = _publish(shared, "proj", "950", "root", data=b"0123456789")
    index = json.loads((job / "ranks" / "rank-0.json").read_text())
    entry = index["checkpoints"][0]["files"][0]
    with open(job / "rank-0" / "checkpoint-1" / entry["path"], "ab") as f:
        f.truncate(1 << 30)  # sparse: a "huge" file a reader must not copy in full
    dest = shared.parent / "dl" / "model.bin"
    store = FileStore(parse_store_uri(_uri(shared)))
    with pytest.raises(IntegrityError, match=r"11 bytes"):
        store.download_file(f"proj/950/rank-0/checkpoint-1/{entry['path']}", dest, size=10, sha256=entry["sha256"])
    assert not dest.exists()


def test_owner_and_team_round_trip(shared: Path) -> None:
    """The legitimate flow still works: btu1 uploads and reads back; btu2 (another team) sees nothing."""
    write = ("s = FileStore(parse_store_uri(sys.argv[1]), gid=team_gid('btteam1'))\n"
             "s.write_bytes('ok/1/ranks/rank-0.json', b'{}')\n"
             "print(s.read_bytes('ok/1/ranks/rank-0.json'), s.list_dirs(''), s.list_dirs('ok'))\n")
    out = _as("btu1", write, _uri(shared))
    assert out.stdout.strip() == "b'{}' ['ok'] ['1']", out.stdout + out.stderr
    out = _as("btu2", "s = FileStore(parse_store_uri(sys.argv[1]))\nprint(s.list_dirs(''))\n"
                      "try:\n    s.read_bytes('ok/1/ranks/rank-0.json')\n"
                      "except UntrustedLocation as e:\n    print('REFUSED', e)\n", _uri(shared))
    assert out.stdout.splitlines()[0] == "[]" and "REFUSED" in out.stdout, out.stdout + out.stderr


def test_check_upload_location_is_a_no_op_for_object_stores() -> None:
    check_upload_location("s3://bucket/prefix", "p", "1", account=None)  # nothing to check, no client import


def test_a_project_being_created_by_another_node_of_the_job_is_waited_for(shared: Path) -> None:
    """Nodes of one job race to create the project: one sees it between ``mkdir 0700`` and ``fchown``."""
    import threading

    gid = int(subprocess.check_output(["getent", "group", "btteam1"], text=True).split(":")[2])
    (shared / "racy").mkdir(mode=0o700)  # as the other node left it a moment ago (same uid: root here)
    os.chmod(shared / "racy", 0o700)

    def finish() -> None:
        os.chown(shared / "racy", -1, gid)
        os.chmod(shared / "racy", 0o2770)

    timer = threading.Timer(0.3, finish)
    timer.start()
    try:
        FileStore(parse_store_uri(_uri(shared)), gid=gid).write_bytes("racy/1/index.json", b"{}")
    finally:
        timer.join()
    assert (shared / "racy" / "1" / "index.json").read_bytes() == b"{}"
