"""Weights tiers on the real dev cluster against hostile users (issue #8 items 2, 7 and 8).

Ordinary users (btu1 in btteam1, btu2 in btteam2) run real jobs; the sources are the loopback fake
Hub (the nodes are this host). Each scenario fails on main before this change:

* **private weights stay private on nodes** (item 2): btu1 stages a private Hub repo with its token;
  afterwards btu2 can open none of the node-cache files holding it (main: 0444 files under 0555
  dirs under a 0755 root), and btu2's job that declares the same source *without* credentials,
  with a forged manifest and a COMPLETE marker planted in its own team tier, gets no node hit and
  never sees the bytes (main: node-hit, the private files mounted into btu2's job);
* **a user-created shared tier** (item 7): btu2 creates ``<cluster_cache>/shared`` before the
  admins and plants a complete entry with poisoned bytes for a public model; btu1's job must not
  take it (main: "cached in shared", no staging job, the node's hash check failed btu1's job);
* **a squatted team directory** (item 7): btu1 creates ``teams/btteam2`` in the world-writable
  ``teams/`` left by older stagers; btu2's job still stages and runs, and the squat is recorded for
  ``admin doctor`` (main: btu2's staging job refused the directory and the job failed);
* **kill -9 of a staging job** (item 8): its preallocated temp blob is gone after a later
  successful run (main: it stayed in the team tier).

After every job: no node drained, nothing of the job left (:func:`harness.aftermath`).
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import random
import re
import shutil
import stat
import subprocess
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.posix.squat_records import read_squats
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.weights.manifest import Manifest, ManifestFile
from slurm_bt.weights.plan import list_selected
from tests.integration.cluster_nodes import notes_dir
from tests.integration.hostile.harness import (
    BIN,
    admin_path,
    aftermath,
    as_user,
    attack,
    cluster,
    forget_squats,
    wait,
    write_job,
)
from tests.integration.hostile.weights_jobs import PROBE, readable_site, weights_job
from tests.servers.hf_hub import FakeHub, Faults

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(3)]

MiB = 1 << 20

@pytest.fixture(scope="module")
def site_env(tenants: dict[str, Any], fake_hub: FakeHub) -> Iterator[None]:
    """A site file the users can read, naming the fake Hub (``as_user`` passes the environment on)."""
    with readable_site("bt-tiers-site-", f"""
            [weights.endpoints]
            hf_endpoint = "{fake_hub.endpoint}"
            """):
        yield


def _base() -> Path:
    from slurm_bt.site.settings import SiteSettings

    return Path(SiteSettings().storage.cluster_cache)


def _node_root(node: str) -> Path:
    from slurm_bt.site.settings import SiteSettings, expand_path

    return Path(expand_path(SiteSettings().storage.node_cache, user="root", uid=0, home="/root", node=node))


def _first_node() -> str:
    return str(sorted(cluster()["nodes"])[0])


def _submit_json(user: str, config: Path, *sbatch: str) -> dict[str, Any]:
    argv = [str(BIN / "bt-sbatch"), "--json", str(config)]
    if sbatch:
        argv += ["--", *sbatch]
    proc = as_user(user, argv, cwd=config.parent)
    assert proc.returncode == 0, f"bt-sbatch as {user} failed: {proc.stderr}"
    out = json.loads(proc.stdout)
    assert isinstance(out, dict)
    return out


def _probe(logs: str) -> dict[str, str]:
    found = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs)]
    return found[0] if found else {}


def _staging_log(user: str, staging_id: str) -> str:
    home = Path(pwd.getpwnam(user).pw_dir)
    return "\n".join(p.read_text(errors="replace")
                     for p in home.glob(f".slurm-bt/projects/*/jobs/*/logs/staging-{staging_id}.out"))


def _hashes(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}


def _legacy_world_writable(*dirs: Path) -> None:
    """Put the tier roots back the way stagers before this change left them (1777), as on a cluster
    upgraded from main: the squats below need a world-writable parent."""
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o1777)


def _identity_layout() -> bool:
    """The shared storage squashes root and the site's shared_fs_identity owns teams/ (devcluster gluster
    mode, docs/admin.md): legacy world-writable tiers do not exist there (admin install made them the
    identity's), so a user cannot even create the names the squats below take."""
    return cluster().get("shared_fs") == "gluster"


def _squat_paths() -> set[str]:
    # each node's own /run/slurm-bt where nodes are isolated (cluster_nodes.notes_dir)
    return {s.path for n in cluster()["nodes"] for s in read_squats(str(n), state_root=str(notes_dir(str(n)).parent))}


# -- item 7: squats ----------------------------------------------------------------------------------------


def test_squatted_team_dir_is_sidestepped_and_the_victims_job_runs(site_env: None, fake_hub: FakeHub) -> None:
    with attack("weights: squat another team's cluster-tier directory"):
        tag = uuid.uuid4().hex[:8]
        files = {"model.safetensors": random.Random(tag).randbytes(MiB + 11), "config.json": b'{"a": 1}'}
        fake_hub.add_repo(f"Org/Squat-{tag}", files)
        base = _base()
        identity = _identity_layout()
        if not identity:
            _legacy_world_writable(base, base / "teams")
        victim = base / "teams" / "btteam2"
        admin = admin_path(base / "teams")
        if os.path.lexists(admin / "btteam2"):  # btu2's real tier from earlier runs: out of the way for this test
            os.rename(admin / "btteam2", admin / f".test-aside-{tag}")
            shutil.rmtree(admin / f".test-aside-{tag}", ignore_errors=True)
        # btu1 (btteam1) takes the name first, wide open, and plants a "manifest" in it
        taken = as_user("btu1", ["mkdir", "-m", "0777", "-p", str(victim / "manifests")])
        if identity:  # teams/ is the identity's 0755: the name cannot be taken
            assert taken.returncode != 0 and "Permission denied" in taken.stderr, taken
        else:
            assert taken.returncode == 0
            assert as_user("btu1", ["chmod", "0777", str(victim)]).returncode == 0
        config = write_job("btu2", weights_job("hostile-tiers", f"hf://org/squat-{tag}", ""), {"probe.py": PROBE})
        sub = _submit_json("btu2", config, f"--nodelist={_first_node()}")
        record, logs = wait("btu2", str(sub["job_id"]), timeout_s=240)
        staging = _staging_log("btu2", str(sub["staging_job_id"])) if sub.get("staging_job_id") else ""
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs, staging)
        assert _probe(logs) == _hashes(files)
        st = os.lstat(admin_path(victim))
        owner = pwd.getpwnam("slurmbt").pw_uid if identity else 0  # devcluster.py SHARED_IDENTITY
        assert (st.st_uid, st.st_gid) == (owner, grp.getgrnam("btteam2").gr_gid), "the squat was not replaced"
        assert stat.S_IMODE(st.st_mode) & 0o007 == 0
        if not identity:
            assert str(victim) in _squat_paths(), "the squat was not recorded for admin doctor"
            forget_squats(victim)
        st_teams = os.lstat(admin_path(base / "teams"))
        assert st_teams.st_uid == owner and not stat.S_IMODE(st_teams.st_mode) & 0o022, "teams/ still squattable"
        aftermath(str(sub["job_id"]), "btu2")


def _plant_shared(base: Path, m: Manifest) -> None:
    """As btu2: ``<base>/shared`` with a complete-looking entry for ``m`` whose blobs hold zeros."""
    shared = base / "shared"
    script = textwrap.dedent(f"""
        import os, sys
        root = {str(shared)!r}
        for d in ("blobs", "manifests", "snapshots/{m.manifest_id}"):
            os.makedirs(os.path.join(root, d), exist_ok=True)
        files = {json.dumps({f.path: [f.sha256, f.size] for f in m.files})}
        for path, (sha, size) in files.items():
            for p in (os.path.join(root, "blobs", sha), os.path.join(root, "snapshots/{m.manifest_id}", path)):
                os.makedirs(os.path.dirname(p), exist_ok=True)
                open(p, "wb").write(bytes(size))  # right size, wrong bytes
        open(os.path.join(root, "manifests", "{m.manifest_id}.json"), "wb").write(sys.stdin.buffer.read())
        """)
    proc = subprocess.run(["runuser", "-u", "btu2", "--", "python3", "-c", script], input=m.canonical_json(),
                          capture_output=True, check=False)
    if _identity_layout():  # the admin's root-owned shared tier is there already and not btu2's to write
        assert proc.returncode != 0 and b"Permission denied" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr


def test_user_created_shared_tier_is_not_trusted(site_env: None, fake_hub: FakeHub) -> None:
    with attack("weights: create the admin-curated shared tier first, with poisoned bytes"):
        tag = uuid.uuid4().hex[:8]
        rnd = random.Random(tag)
        # LFS-only (published sha256s): the manifest is known at submit, so a "complete" shared entry
        # is all it takes for main to skip staging
        files = {"model.safetensors": rnd.randbytes(MiB + 3), "extra.bin": rnd.randbytes(2 * MiB)}
        fake_hub.add_repo(f"Org/Shared-{tag}", files)
        source = f"hf://org/shared-{tag}"
        # the manifest bt-sbatch computes for it (weights.plan._pin_one), as btu2 can too
        listing, selected, revision = list_selected(source, allow=None, ignore=None, credentials=None,
                                                    endpoints=StorageEndpoints(hf_endpoint=fake_hub.endpoint))
        m = Manifest(kind=listing.uri.kind, source=listing.uri.canonical, revision=revision, files=tuple(
            ManifestFile(path=f.path, size=f.size, sha256=f.sha256 or "", etag=f.etag) for f in selected))
        base = _base()
        shared = base / "shared"
        identity = _identity_layout()
        if not identity:
            _legacy_world_writable(base)
            if os.path.lexists(shared):
                st = os.lstat(shared)
                if st.st_uid != 0 or os.listdir(shared):
                    pytest.skip(f"{shared} already holds an admin's or someone's tier; not touching it")
                os.rmdir(shared)
        try:
            _plant_shared(base, m)
            if not identity:
                assert os.lstat(shared).st_uid == pwd.getpwnam("btu2").pw_uid
            config = write_job("btu1", weights_job("hostile-tiers", source, ""), {"probe.py": PROBE})
            sub = _submit_json("btu1", config, f"--nodelist={_first_node()}")
            record, logs = wait("btu1", str(sub["job_id"]), timeout_s=240)
            assert record["current_status"] == "TRAINING_JOB_COMPLETED", (sub, record, logs)
            assert _probe(logs) == _hashes(files)  # the real bytes, staged into btu1's team tier
            assert sub.get("staging_job_id"), "the user-made shared tier was taken as a cache hit"
            st = os.lstat(admin_path(shared))
            assert st.st_uid == 0 and not stat.S_IMODE(st.st_mode) & 0o022, "the squatted shared tier is still there"
            if not identity:
                assert str(shared) in _squat_paths()
                forget_squats(shared)
            aftermath(str(sub["job_id"]), "btu1")
        finally:
            if os.path.lexists(admin_path(shared)) and os.lstat(admin_path(shared)).st_uid != 0:
                shutil.rmtree(admin_path(shared), ignore_errors=True)


# -- item 8: kill -9 of a staging job ------------------------------------------------------------------------


def _temp_debris(team: Path, size: int) -> list[Path]:
    """Files of ``size`` bytes in the team tier that are not published blobs (temp files)."""
    out = []
    for dirpath, _, names in os.walk(team):
        for n in names:
            p = Path(dirpath) / n
            if p.parent == team / "blobs" and not n.startswith("."):
                continue
            if p.parent.parent == team / "snapshots" or "/snapshots/" in str(p):
                continue
            try:
                if os.lstat(p).st_size == size:
                    out.append(p)
            except OSError:
                pass
    return out


def test_killed_stagers_temp_blob_is_collected_by_the_next_run(site_env: None, fake_hub: FakeHub) -> None:
    with attack("weights: kill -9 a staging job mid-download"):
        tag = uuid.uuid4().hex[:8]
        size = 48 * MiB + 5
        files = {"model.safetensors": random.Random(tag).randbytes(size)}
        fake_hub.add_repo(f"Org/Killed-{tag}", files)
        config = write_job("btu1", weights_job("hostile-tiers", f"hf://org/killed-{tag}", ""), {"probe.py": PROBE})
        team = admin_path(_base() / "teams" / "btteam1")  # looked at as an admin: root may be squashed
        with fake_hub.faults(Faults(paths={"model.safetensors"}, stall_after=4 * MiB, stall_s=90.0, times=-1)):
            first = _submit_json("btu1", config)
            staging = str(first["staging_job_id"])
            deadline = time.monotonic() + 240  # the staging job may queue behind other tests' jobs
            while not _temp_debris(team, size) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert _temp_debris(team, size), "the staging job never started its download"
            subprocess.run(["scancel", "--signal=KILL", "--full", staging], check=True)
            wait("btu1", str(first["job_id"]), timeout_s=120)
        assert _temp_debris(team, size), "precondition: the killed stager left its preallocated temp file"
        second = _submit_json("btu1", config)
        record, logs = wait("btu1", str(second["job_id"]), timeout_s=240)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
        assert _probe(logs) == _hashes(files)
        left = _temp_debris(team, size)
        assert not left, f"temp files of the killed stager stayed in the team tier: {left}"
        aftermath(str(second["job_id"]), "btu1")


# -- item 2: private weights on the node ---------------------------------------------------------------------


def _set_secret(user: str, name: str, value: str) -> None:
    proc = as_user(user, [str(BIN / "slurm-bt"), "secrets", "set", name], input=value + "\n")
    assert proc.returncode == 0, proc.stderr


def _files_with(root: Path, sha: str, size: int) -> list[Path]:
    out = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath) / n
            try:
                if os.lstat(p).st_size == size and stat.S_ISREG(os.lstat(p).st_mode) and \
                        hashlib.sha256(p.read_bytes()).hexdigest() == sha:
                    out.append(p)
            except OSError:
                pass
    return out


def test_private_weights_are_not_readable_or_reusable_by_another_team(site_env: None, fake_hub: FakeHub) -> None:
    with attack("weights: read or reuse another team's private weights on a node"):
        tag = uuid.uuid4().hex[:8]
        rnd = random.Random(tag)
        files = {"model.safetensors": rnd.randbytes(2 * MiB + 5), "config.json": b'{"private": true}'}
        repo = f"Acme/Private-{tag}"
        token = f"hf_{tag}"
        fake_hub.add_repo(repo, files, private=True, readers={token})
        public = {"model.safetensors": rnd.randbytes(MiB + 1), "config.json": b'{"public": true}'}
        fake_hub.add_repo(f"Org/Pub-{tag}", public)
        node = _first_node()

        # btu1 stages the private repo with its token and reads it
        _set_secret("btu1", f"hf_priv_{tag}", token)
        auth = f", auth_secret_name='hf_priv_{tag}'"
        config = write_job("btu1", weights_job("hostile-tiers", f"hf://acme/private-{tag}", auth), {"probe.py": PROBE})
        first = _submit_json("btu1", config, f"--nodelist={node}")
        record, logs = wait("btu1", str(first["job_id"]), timeout_s=240)
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
        assert _probe(logs) == _hashes(files)
        aftermath(str(first["job_id"]), "btu1")

        # btu2 cannot open any node-cache file holding it (nor list where it is)
        sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
        holders = _files_with(_node_root(node), sha, len(files["model.safetensors"]))
        assert holders, "precondition: the private model is in the node cache"
        script = "import sys\nfor p in sys.argv[1:]:\n    try:\n        open(p, 'rb').read(1); print('READ', p)\n" \
                 "    except OSError as e:\n        print('DENIED', p, e.strerror)\n"
        probe = as_user("btu2", ["python3", "-c", script, *map(str, holders)])
        assert "READ" not in probe.stdout and probe.stdout.count("DENIED") == len(holders), probe.stdout
        grep = as_user("btu2", ["grep", "-rli", f"private-{tag}", str(_node_root(node))])
        assert not grep.stdout.strip(), f"btu2 can find the private source's manifest: {grep.stdout}"

        # btu2: a public job first (creates btteam2's tier), then the same config held, rewritten to
        # declare the private source WITHOUT credentials, with btu1's manifest and a planted marker
        pub_config = write_job("btu2", weights_job("hostile-tiers", f"hf://org/pub-{tag}", ""), {"probe.py": PROBE})
        warm = _submit_json("btu2", pub_config, f"--nodelist={node}")
        wait("btu2", str(warm["job_id"]), timeout_s=240)
        held = _submit_json("btu2", pub_config, f"--nodelist={node}", "--hold")
        assert not held.get("staging_job_id"), held
        job_dir = Path(str(held["job_dir"]))
        manifest = (Path(str(first["job_dir"])) / "weights" / "0.json").read_bytes()  # what btu2 would need to know
        m = Manifest.model_validate_json(manifest)
        forge = textwrap.dedent(f"""
            import json, os, sys
            job = {str(job_dir)!r}
            manifest = sys.stdin.buffer.read()
            open(os.path.join(job, "weights", "0.json"), "wb").write(manifest)
            spec = json.load(open(os.path.join(job, "job.json")))
            spec["weights"][0]["source"] = "hf://acme/private-{tag}"
            spec["weights"][0].pop("auth_secret_name", None)
            json.dump(spec, open(os.path.join(job, "job.json"), "w"))
            tier = {str(_base() / "teams" / "btteam2")!r}
            os.makedirs(os.path.join(tier, "manifests"), exist_ok=True)
            open(os.path.join(tier, "manifests", "{m.manifest_id}.json"), "wb").write(manifest)
            """)
        proc = subprocess.run(["runuser", "-u", "btu2", "--", "python3", "-c", forge], input=manifest,
                              capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr
        assert as_user("btu2", ["scontrol", "release", str(held["job_id"])]).returncode == 0
        record2, logs2 = wait("btu2", str(held["job_id"]), timeout_s=240)
        got = _probe(logs2)
        assert got.get("model.safetensors") != sha, "btu2's job was served btu1's private weights"
        assert record2["current_status"] != "TRAINING_JOB_COMPLETED", (record2, logs2)
        weights = record2.get("weights") or {}
        tiers = [e.get("tier") for e in (weights.get("nodes") or {}).get(node, [])]
        assert "node-hit" not in tiers, weights
        aftermath(str(held["job_id"]), "btu2")
