"""The prolog and epilog end to end, in-process, on throwaway roots with real users and groups.

Covers: scratch 0700 for the job user (other users EACCES), team/project caches 2770 root:<group>
isolated between teams, the account→group map, user errors (a planted symlink at a cache dir, a
tampered job.json, a pre-created scratch entry) that fail the job through the status file while the
hook exits 0, node faults that exit 1 with a fix, step 1 reading the verdict, and the epilog run
twice (idempotent) keeping unconfirmed checkpoints.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_bt.compat import definitions as d
from slurm_bt.hooks import epilog, prolog
from slurm_bt.hooks.runner import run_hook
from slurm_bt.job_spec import SubmitContext, build_job_spec
from slurm_bt.posix.hook_env import SlurmHookEnv
from slurm_bt.posix.job_notes import read_hook_state
from slurm_bt.posix.privdrop import ChildError, run_as_job_user
from slurm_bt.site.settings import load_site_settings
from tests.unit.test_hooks_env import ensure_test_users, hook_environ

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hooks run as root")


@dataclass
class Site:
    base: Path
    hooks: Path
    site: Path
    state: str

    def scratch(self, job: str, node: str = "n1") -> Path:
        return self.base / "node" / node / "scratch" / job

    @property
    def cache(self) -> Path:
        return self.base / "shared" / "cache"


@pytest.fixture()
def site() -> Iterator[Site]:
    ensure_test_users()
    base = Path(tempfile.mkdtemp(prefix="bt-prolog-", dir="/tmp"))
    os.chmod(base, 0o755)
    for sub in ("node/n1/scratch", "node/n2/scratch", "shared/cache", "run", "etc", "shm"):
        (base / sub).mkdir(parents=True, mode=0o755)
        os.chmod(base / sub, 0o755)
    os.chmod(base / "shm", 0o1777)  # the runtime root, like /dev/shm (never the host's real one)
    # A file:// checkpoint store as an admin lays it out (root 1777, _teams 1777): a checkpointing job's
    # step 1 claims its team's project there, never in the dev cluster's store.
    for sub in ("shared/checkpoints", "shared/checkpoints/_teams"):
        (base / sub).mkdir(parents=True)
        os.chmod(base / sub, 0o1777)
    hooks = base / "etc" / "hooks.toml"
    hooks.write_text(f'log_file = "{base}/log/hooks.log"\ndeadline_s = 30\nscratch_min_free_mib = 0\n'
                     '[team_groups]\nextra-acct = "btextra"\nbad-acct = "btteam2"\n')
    site_file = base / "etc" / "site.toml"
    site_file.write_text(f'[storage]\nscratch = "{base}/node/%n/scratch"\ncache = "{base}/shared/cache"\n'
                         f'workspace = "{base}/ws/{{user}}"\nruntime = "{base}/shm"\n'
                         f'checkpoint_store = "file://{base}/shared/checkpoints"\n')
    yield Site(base, hooks, site_file, f"{base}/run/slurm-bt")
    subprocess.run(["chmod", "-R", "u+rwx", str(base)], capture_output=True, check=False)
    shutil.rmtree(base, ignore_errors=True)


def flush_incomplete(environ: Mapping[str, str], deadline_s: float, site: object = None) -> object:
    """Stand-in checkpoint flush: the store was unreachable."""
    return type("R", (), {"status": "incomplete", "message": "store unreachable"})()


def flush_done(environ: Mapping[str, str], deadline_s: float, site: object = None) -> object:
    """Stand-in checkpoint flush: everything confirmed uploaded."""
    assert environ["SLURM_JOB_USER"] == "btu1" and "PATH" not in environ
    return type("R", (), {"status": "done", "message": "uploaded 1 checkpoint(s)"})()


def flush_handed_off(environ: Mapping[str, str], deadline_s: float, site: object = None) -> object:
    """Stand-in checkpoint flush: the budget ran out and the rest went to the hand-off area."""
    return type("R", (), {"status": "handed-off", "message": "time budget ran out"})()


@pytest.fixture(autouse=True)
def fake_flush(monkeypatch: pytest.MonkeyPatch) -> None:
    """Never upload from unit tests: the checkpoint flush reports "not confirmed" unless a test says so."""
    monkeypatch.setattr(epilog, "checkpoint_flush", flush_incomplete)


def write_job(site: Site, user: str, *, project: str = "proj-a", cache: bool = True, job_dir_name: str = "j1",
              tamper: dict[str, object] | None = None) -> Path:
    """A real job.json (as bt-sbatch writes it) in the user's 0700 work dir; returns the work dir."""
    pw = pwd.getpwnam(user)
    work = site.base / "work" / user / job_dir_name
    work.mkdir(parents=True, exist_ok=True)
    for p in (work, work.parent):
        os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(p, 0o700)
    os.chmod(site.base / "work", 0o755)
    ctx = SubmitContext(config_path=str(work / "config.py"), source="config.py", submit_id="s1", user=user,
                        uid=pw.pw_uid, home=pw.pw_dir, job_dir=str(work), python="/usr/bin/python3",
                        version="0")
    proj = d.TrainingProject(name=project, job=d.TrainingJob(
        image=d.Image(base_image="python:3.11"),
        runtime=d.Runtime(cache_config=d.CacheConfig(enabled=cache, enable_legacy_hf_mount=True),
                          checkpointing_config=d.CheckpointingConfig(enabled=True))))
    spec = build_job_spec(proj, load_site_settings(site.site, environ={}), ctx)
    data = json.loads(spec.model_dump_json())
    if tamper:
        data["context"].update(tamper)
    (work / "job.json").write_text(json.dumps(data))
    os.chown(work / "job.json", pw.pw_uid, pw.pw_gid)
    return work


def run(site: Site, kind: str, environ: dict[str, str]) -> int:
    body = prolog.prolog_body if kind == "prolog" else epilog.epilog_body
    record = prolog._record_user_error if kind == "prolog" else None
    return run_hook(kind, body, record, ["--config", str(site.hooks), "--site", str(site.site)], environ,
                    state_root=site.state)


def job_env(site: Site, user: str, job: str, work: Path, **extra: str) -> dict[str, str]:
    return hook_environ(user, job, SLURM_JOB_COMMENT="slurm-bt:s1", SLURM_JOB_WORK_DIR=str(work), **extra)


def as_user(user: str, fn: object) -> object:
    env = SlurmHookEnv.from_environ(hook_environ(user))
    return run_as_job_user(fn, env, timeout_s=20)  # type: ignore[arg-type]


def test_prolog_prepares_private_scratch_and_team_caches(site: Site) -> None:
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "11", work)) == 0
    u1, u2 = pwd.getpwnam("btu1"), pwd.getpwnam("btu2")
    sst = site.scratch("11").lstat()
    assert (sst.st_uid, sst.st_gid, stat.S_IMODE(sst.st_mode)) == (u1.pw_uid, u1.pw_gid, 0o700)
    team = site.cache / "teams" / "btteam1"
    for p, mode in ((team, 0o2750), (team / "shared", 0o2770), (team / "projects", 0o2750),
                    (team / "projects" / "proj-a", 0o2770)):
        st = p.lstat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, u1.pw_gid, mode), p
    state = read_hook_state("n1", "11", site.state)
    assert state.error is None and state.record is not None and state.record["team"] == "btteam1"

    # btu1 writes into its caches (files become group-readable through the default ACL) ...
    proj = team / "projects" / "proj-a"

    def write() -> int:
        (proj / "data.bin").write_bytes(b"x" * 10)
        (team / "shared" / "t.txt").write_text("team")
        return stat.S_IMODE(os.stat(proj / "data.bin").st_mode)

    assert as_user("btu1", write) & 0o060 == 0o060
    # ... and btu2 (another team) gets EACCES on the caches and on the scratch.
    for target in (proj, team / "shared", team, site.scratch("11")):
        with pytest.raises(ChildError) as info:
            as_user("btu2", lambda t=target: os.listdir(t))
        assert info.value.errno == errno.EACCES, target
    assert u2.pw_gid not in os.getgrouplist("btu1", u1.pw_gid)

    # Rerun (requeue on the same node): idempotent, same state.
    assert run(site, "prolog", job_env(site, "btu1", "11", work)) == 0
    assert (proj / "data.bin").read_bytes() == b"x" * 10


def test_account_maps_to_group_and_membership_is_checked(site: Site) -> None:
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "12", work, SLURM_JOB_ACCOUNT="extra-acct")) == 0
    assert read_hook_state("n1", "12", site.state).record["team"] == "btextra"  # type: ignore[index]
    # btu1 is not in btteam2: the job fails, the node does not drain.
    assert run(site, "prolog", job_env(site, "btu1", "13", work, SLURM_JOB_ACCOUNT="bad-acct")) == 0
    err = read_hook_state("n1", "13", site.state).error
    assert err is not None and "not a member of group 'btteam2'" in err
    assert not (site.cache / "teams" / "btteam2").exists()


def test_planted_symlink_in_cache_fails_the_job_not_the_node(site: Site) -> None:
    (site.cache / "teams").mkdir(mode=0o755)
    os.symlink("/etc", site.cache / "teams" / "btteam1")  # e.g. left by a compromised admin script
    before = os.stat("/etc")
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "14", work)) == 0
    err = read_hook_state("n1", "14", site.state).error
    assert err is not None and "is a symlink" in err
    after = os.stat("/etc")
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)


@pytest.mark.parametrize("tamper,needle", [
    ({"uid": 0, "user": "root"}, "was written for 'root'"),
    ({"uid": "x"}, "not a valid slurm-bt job spec"),
])
def test_tampered_job_json_fails_the_job(site: Site, tamper: dict[str, object], needle: str) -> None:
    work = write_job(site, "btu1", tamper=tamper)
    assert run(site, "prolog", job_env(site, "btu1", "15", work)) == 0
    err = read_hook_state("n1", "15", site.state).error
    assert err is not None and needle in err


def test_job_json_symlink_to_shadow_is_read_as_the_user(site: Site) -> None:
    work = write_job(site, "btu1")
    (work / "job.json").unlink()
    os.symlink("/etc/shadow", work / "job.json")
    assert run(site, "prolog", job_env(site, "btu1", "16", work)) == 0
    err = read_hook_state("n1", "16", site.state).error
    assert err is not None and "Permission denied" in err


def test_precreated_scratch_in_legacy_sticky_root_is_refused(site: Site) -> None:
    root = site.scratch("17").parent
    os.chmod(root, 0o1777)
    os.symlink("/etc", root / "17")  # mallory guessed the next job id
    os.lchown(root / "17", pwd.getpwnam("btu2").pw_uid, -1)
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "17", work)) == 0
    err = read_hook_state("n1", "17", site.state).error
    assert err is not None and "scratch directory" in err and "symlink" in err
    assert os.stat("/etc").st_uid == 0


def test_node_fault_exits_nonzero_with_a_fix(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    shutil.rmtree(site.base / "node" / "n1")
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "18", work)) == 1
    err = capfd.readouterr().err
    assert "DRAIN: scratch root" in err and "fix:" in err
    assert (Path(site.state) / "n1" / "last-fault").read_text().startswith("slurm-bt prolog on n1: DRAIN")


def test_untrusted_policy_file_is_a_node_fault(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    os.chown(site.hooks, pwd.getpwnam("btu1").pw_uid, -1)
    assert run(site, "prolog", job_env(site, "btu1", "19", site.base)) == 1
    assert "could rewrite hook policy" in capfd.readouterr().err


def test_non_slurm_bt_jobs_are_left_alone(site: Site) -> None:
    assert run(site, "prolog", hook_environ("btu1", "20")) == 0
    assert not site.scratch("20").exists()


def test_step1_prints_the_prolog_reason(site: Site) -> None:
    from slurm_bt.errors import PrologRefusedError
    from slurm_bt.steps.prepare import prepare_node

    work = write_job(site, "btu1", tamper={"uid": 0, "user": "root"})
    assert run(site, "prolog", job_env(site, "btu1", "21", work)) == 0
    with pytest.raises(PrologRefusedError, match=r"refused this job on node n1: .*written for 'root'"):
        prepare_node(work / "job.json", {"SLURM_JOB_ID": "21", "SLURMD_NODENAME": "n1"}, state_root=site.state)


def test_epilog_twice_removes_scratch_keeps_unconfirmed_checkpoints(site: Site) -> None:
    work = write_job(site, "btu1")
    env = job_env(site, "btu1", "22", work)
    assert run(site, "prolog", env) == 0
    scratch = site.scratch("22")
    u1 = pwd.getpwnam("btu1")
    (scratch / "mnt" / "checkpoints" / "checkpoint-1").mkdir(parents=True)
    (scratch / "mnt" / "checkpoints" / "checkpoint-1" / "w").write_text("w")
    (scratch / "tmp" / "deep").mkdir(parents=True)
    os.symlink("/etc", scratch / "tmp" / "etc")
    for dirpath, dirnames, filenames in os.walk(scratch):
        for n in dirnames + filenames:
            os.lchown(Path(dirpath, n), u1.pw_uid, u1.pw_gid)
    env["SLURM_SCRIPT_CONTEXT"] = "epilog_slurmd"
    for _ in range(2):
        assert run(site, "epilog", env) == 0
        assert sorted(p.name for p in scratch.iterdir()) == ["mnt"]
        assert (scratch / "mnt" / "checkpoints" / "checkpoint-1" / "w").read_text() == "w"
        assert not Path(site.state, "n1", "jobs", "22").exists()
    record = json.loads((scratch.parent / ".slurm-bt-handoff" / "22.json").read_text())
    assert record["paths"] == [f"{scratch.parent}/22/mnt/checkpoints"] and record["user"] == "btu1"
    assert os.path.isdir("/etc/security")


def test_epilog_without_checkpoints_removes_everything_and_tolerates_no_prolog(site: Site) -> None:
    env = hook_environ("btu1", "23", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    assert run(site, "epilog", env) == 0  # never prologged: nothing to do
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "23", work)) == 0
    (site.scratch("23") / "junk").write_text("x")
    assert run(site, "epilog", env) == 0 and not site.scratch("23").exists()


def flush_broken(environ: Mapping[str, str], deadline_s: float, site: object = None) -> object:
    """Stand-in checkpoint flush whose module cannot be imported (a broken install)."""
    raise ModuleNotFoundError("No module named 'slurm_bt.no_such_module'")


@pytest.mark.parametrize("target,kept", [("flush_done", False), ("flush_incomplete", True), ("flush_broken", True)])
def test_only_a_confirmed_flush_lets_checkpoints_go(site: Site, monkeypatch: pytest.MonkeyPatch, target: str,
                                                  kept: bool) -> None:
    monkeypatch.setattr(epilog, "checkpoint_flush", globals()[target])
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "24", work)) == 0
    ckpt = site.scratch("24") / "mnt" / "checkpoints" / "checkpoint-1"
    ckpt.mkdir(parents=True)
    (ckpt / "w").write_text("w")
    assert run(site, "epilog", job_env(site, "btu1", "24", work, SLURM_SCRIPT_CONTEXT="epilog_slurmd")) == 0
    assert (ckpt / "w").exists() is kept
    assert site.scratch("24").exists() is kept


def test_internal_deadline_is_a_node_fault(site: Site, capfd: pytest.CaptureFixture[str]) -> None:
    site.hooks.write_text(site.hooks.read_text().replace("deadline_s = 30", "deadline_s = 0.5"))
    start = time.monotonic()
    code = run_hook("prolog", lambda ctx: time.sleep(10), prolog._record_user_error,
                    ["--config", str(site.hooks), "--site", str(site.site)], hook_environ("btu1", "25"),
                    state_root=site.state)
    assert code == 1 and time.monotonic() - start < 3
    assert "DRAIN: prolog exceeded its" in capfd.readouterr().err


def test_a_bug_fails_the_job_not_the_node(site: Site) -> None:
    def buggy(ctx: object) -> None:
        raise KeyError("oops")

    code = run_hook("prolog", buggy, prolog._record_user_error, ["--config", str(site.hooks), "--site", str(site.site)],
                    hook_environ("btu1", "26"), state_root=site.state)
    assert code == 0
    err = read_hook_state("n1", "26", site.state).error
    assert err is not None and "internal error in the slurm-bt prolog" in err
    assert "KeyError: 'oops'" in (site.base / "log" / "hooks.log").read_text()


@pytest.mark.parametrize("policy", ["background", "off"])
def test_handed_off_flush_starts_a_detached_sweep_unless_off(site: Site, monkeypatch: pytest.MonkeyPatch,
                                                             policy: str) -> None:
    monkeypatch.setattr(epilog, "checkpoint_flush", flush_handed_off)
    site.hooks.write_text(f'resume_handoffs = "{policy}"\n' + site.hooks.read_text())
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "26", work)) == 0
    assert run(site, "epilog", job_env(site, "btu1", "26", work, SLURM_SCRIPT_CONTEXT="epilog_slurmd")) == 0
    log = site.base / "log" / "hooks.log"
    final = [ln for ln in log.read_text().splitlines() if "epilog" in ln and "26" in ln][-1]
    assert ("handoff-sweep pid=" in final) is (policy == "background"), final
    if policy == "background":
        # The sweep is detached (own session) and reports to the hook log; this node's area is empty.
        pid = int(final.split("handoff-sweep pid=")[1].split()[0].rstrip(",;"))
        try:
            assert os.getsid(pid) == pid
        except ProcessLookupError:
            pass  # already finished
        try:  # in this test the hook ran in-process, so the sweep is our child: its exit status is ours to read
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        except ChildProcessError:
            pass  # reaped by subprocess' own bookkeeping


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old), follow_symlinks=False)


def test_prolog_sweeps_scratch_whose_epilog_never_ran_and_nothing_else(site: Site) -> None:
    """A node crash left job 901's scratch; the next prolog removes it, never an active job's."""
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "902", work)) == 0  # 902 runs on this node (has notes)
    root = site.scratch("x").parent
    u1 = pwd.getpwnam("btu1")
    for job in ("901", "903", "904", "905"):
        (root / job / "tmp").mkdir(parents=True, exist_ok=True)
        (root / job / "tmp" / "big").write_bytes(b"x" * 1000)
        os.symlink("/etc", root / job / "tmp" / "etc")
        os.symlink(str(site.cache), root / job / "other-team")
        os.chown(root / job, u1.pw_uid, u1.pw_gid)
    (root / "handoff-like").mkdir()
    os.symlink("/etc", root / "906")
    (root / ".slurm-bt-handoff").mkdir(exist_ok=True)
    (root / ".slurm-bt-handoff" / "904.json").write_text("{}")  # checkpoints kept for a hand-off
    for name in ("901", "902", "904", "905", "handoff-like"):
        _age(root / name, 7200)
    _age(root / "906", 7200)
    # 903 is stale but recent (e.g. a requeue between note reset and scratch): kept this time.
    assert run(site, "prolog", job_env(site, "btu1", "907", work)) == 0
    left = sorted(p.name for p in root.iterdir())
    assert left == [".slurm-bt-handoff", "902", "903", "904", "906", "907", "handoff-like"], left
    assert os.path.isdir("/etc/security") and site.cache.is_dir(), "symlink targets untouched"
    log = (site.base / "log" / "hooks.log").read_text()
    assert f"stale scratch {root}/901" in log and f"stale scratch {root}/905" in log
    assert "902" not in [ln.split("stale scratch ")[-1].split()[0].rsplit("/", 1)[-1]
                         for ln in log.splitlines() if "stale scratch" in ln]


def test_stale_scratch_sweep_can_be_turned_off(site: Site) -> None:
    site.hooks.write_text("stale_scratch_after_s = 0\n" + site.hooks.read_text())
    root = site.scratch("x").parent
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "911", work)) == 0
    (root / "910").mkdir()
    _age(root / "910", 10 * 86400)
    assert run(site, "prolog", job_env(site, "btu1", "912", work)) == 0
    assert (root / "910").is_dir()


def flush_names_user(environ: Mapping[str, str], deadline_s: float, site: object = None) -> object:
    """Stand-in checkpoint flush (runs in the epilog's child) that says whom it ran for, in the hook log."""
    who = f"{environ['SLURM_JOB_USER']}:{environ['SLURM_JOB_UID']}:{os.getuid()}"
    return type("R", (), {"status": "done", "message": f"flushed for {who}"})()


def test_epilog_given_uid_0_for_a_users_job_works_for_the_owner_the_prolog_recorded(
        site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm 26.05 runs the epilog of a job killed by its node going DOWN with SLURM_JOB_UID=0: the runtime
    directory with the user's secrets must still go and the flush must run for the user, not for root."""
    monkeypatch.setattr(epilog, "checkpoint_flush", flush_names_user)
    work = write_job(site, "btu1")
    assert run(site, "prolog", job_env(site, "btu1", "27", work)) == 0
    u1 = pwd.getpwnam("btu1")
    runtime = site.base / "shm" / f"slurm-bt-{u1.pw_uid}"
    (runtime / "27").mkdir()
    (runtime / "27" / "node-0.env").write_text("SECRET=1")
    as_root = {**hook_environ("root", "27"), "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
    assert run(site, "epilog", as_root) == 0
    log = Path(site.base, "log", "hooks.log").read_text()
    assert f"flushed for btu1:{u1.pw_uid}:" in log and "flushed for root" not in log, log[-2000:]
    assert f"the prolog recorded uid {u1.pw_uid} (btu1)" in log
    assert not (runtime / "27").exists() and not site.scratch("27").exists()
    # A real root job (its prolog recorded uid 0) keeps uid 0.
    assert run(site, "prolog", hook_environ("root", "28")) == 0
    assert run(site, "epilog", {**hook_environ("root", "28"), "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}) == 0
    log = Path(site.base, "log", "hooks.log").read_text()
    assert "job=28 node=n1 uid=0" in log and "recorded uid" not in log.split("job=28", 1)[1]
