"""Harness of the hostile-user suite: ordinary users run jobs on the real dev cluster, then we check
what the jobs left behind.

Every scenario runs inside :func:`attack`, which counts it for the one summary line the suite prints
(``conftest.py``); :func:`aftermath` is the set of invariants that hold after *any* job, hostile or
not: no node drained, none of the job's processes, scratch, runtime directory or hook notes left.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.cluster_nodes import cluster_info, node_root, notes_dir, on_a_node, on_node

__all__ = ["BIN", "Tally", "aftermath", "as_user", "attack", "cluster", "forget_squats", "job_processes", "node_states",
           "submit", "tally", "wait", "write_job"]

BIN = Path(sys.executable).parent
STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))
RUNTIME_ROOT = Path("/dev/shm")
_HEALTHY = {"idle", "mix", "alloc", "comp"}


@dataclass
class Tally:
    """What the suite tried and how it ended; printed by ``conftest.pytest_terminal_summary``."""

    attacks: list[str] = field(default_factory=list)
    contained: list[str] = field(default_factory=list)
    breached: list[str] = field(default_factory=list)


tally = Tally()


@contextlib.contextmanager
def attack(name: str) -> Iterator[None]:
    """Run one hostile scenario; it counts as contained only if every assertion inside held."""
    tally.attacks.append(name)
    try:
        yield
    except BaseException:
        tally.breached.append(name)
        raise
    tally.contained.append(name)


@contextlib.contextmanager
def cancel_on_error(job_id: str) -> Iterator[None]:
    """Cancel ``job_id`` if the block fails: a held job left behind by a failed assertion would keep
    its user busy for every later test (a leftover test then waits for the user to have no job)."""
    try:
        yield
    except BaseException:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)
        raise


cluster = cluster_info  # the dev cluster's facts (cluster.json, which devcluster.py writes)


def admin_path(path: str | Path) -> Path:
    """``path`` as an admin sees it, for the test's own root-side setup and checks of the shared storage.

    Where the dev cluster's shared storage squashes root (``devcluster.py up --shared gluster``), root on
    this host acts as nobody there, as on the nodes; an admin works from a host where it is not squashed,
    which the dev cluster mounts at ``shared_admin_dir``. Paths outside the shared storage are unchanged.
    """
    try:
        info = cluster()
    except OSError:  # no dev cluster (collecting tests elsewhere): nothing to map
        return Path(path)
    shared = Path(str(info["shared_dir"]))
    admin = Path(str(info.get("shared_admin_dir") or shared))
    p = Path(path)
    try:
        return admin / p.relative_to(shared)
    except ValueError:
        return p


def as_user(user: str, argv: list[str], *, input: str | None = None, cwd: str | Path | None = None,
            timeout: float = 240, node: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` with a login-like environment (``runuser``), capturing text output; on
    ``node`` (as a process of that machine, cluster_nodes.on_node) when given, else on this host."""
    where = on_node(node) if node else []
    return subprocess.run([*where, "runuser", "-u", user, "--", *argv], input=input, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def write_job(user: str, config_body: str, files: dict[str, str] | None = None) -> Path:
    """Write ``config.py`` (dedented) and ``files`` into a fresh folder in ``user``'s home, as the user."""
    home = pwd.getpwnam(user).pw_dir
    work = Path(home) / f"hostile-{uuid.uuid4().hex[:10]}"
    as_user(user, ["mkdir", "-p", str(work)]).check_returncode()
    for name, text in {**(files or {}), "config.py": textwrap.dedent(config_body)}.items():
        as_user(user, ["tee", str(work / name)], input=text).check_returncode()
    return work / "config.py"


def submit(user: str, config: Path, *sbatch_args: str, site: Path | None = None) -> str:
    """``bt-sbatch --parsable config`` as ``user`` (with ``site`` as the site file when given);
    returns the training job's id."""
    argv = [str(BIN / "bt-sbatch"), "--parsable", str(config)]
    if site is not None:
        argv = ["env", f"SLURM_BT_SITE_CONFIG={site}", *argv]
    if sbatch_args:
        argv += ["--", *sbatch_args]
    proc = as_user(user, argv, cwd=config.parent)
    assert proc.returncode == 0, f"bt-sbatch as {user} failed: {proc.stderr}"
    job_id = proc.stdout.strip().splitlines()[-1].split(";")[0]
    assert re.fullmatch(r"\d+", job_id), proc.stdout
    return job_id


def wait(user: str, job_id: str, timeout_s: int = 180) -> tuple[dict[str, Any], str]:
    """Wait for the job to end; its status record (``status --json``) and every node's logs."""
    st = as_user(user, [str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", str(timeout_s),
                        "--json"], timeout=timeout_s + 60)
    assert st.returncode == 0, st.stderr
    logs = as_user(user, [str(BIN / "slurm-bt"), "logs", job_id]).stdout
    record = json.loads(st.stdout)[0]
    assert isinstance(record, dict)
    return record, logs


def node_states() -> dict[str, str]:
    """``{node: sinfo short state}``; a drained node shows ``drain``/``drng``/``down``."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                         check=False).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _user_jobs_running(user: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-u", user, "-t", "RUNNING,CONFIGURING,COMPLETING", "-o", "%i"],
                         capture_output=True, text=True, check=False).stdout
    return bool(out.strip())


def job_processes(uid: int) -> list[str]:
    """``pid comm`` of every process running as ``uid`` on the nodes (seen from this host, which sees every
    node's; where nodes are isolated, this host's own processes are the login side: not a job's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or not on_a_node(entry.name):
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        m = re.search(r"^Uid:\s+(\d+)\s+(\d+)", status, re.M)
        if m and uid in (int(m.group(1)), int(m.group(2))):
            name = re.search(r"^Name:\s+(.*)$", status, re.M)
            found.append(f"{entry.name} {name.group(1) if name else '?'}")
    return found


def _job_paths(job_id: str, uid: int) -> list[Path]:
    info = cluster()
    node_local = Path(info["node_local_dir"])
    paths = [node_local / n / "scratch" / job_id for n in info["nodes"]]
    paths += [notes_dir(n) / "jobs" / job_id for n in info["nodes"]]
    # the runtime root (/dev/shm) is each node's own where nodes are isolated: seen through node_root
    paths += {node_root(n) / RUNTIME_ROOT.relative_to("/") / f"slurm-bt-{uid}" / job_id for n in info["nodes"]}
    return paths


def _job_nodes(job_id: str) -> set[str] | None:
    """Every node any run of ``job_id`` was given (sacct, all runs of a requeued job); None when unknown,
    and then every node counts."""
    out = subprocess.run(["sacct", "-n", "-X", "-D", "-P", "-j", job_id, "-o", "NodeList"], capture_output=True,
                         text=True, timeout=30, check=False).stdout.split()
    lists = [n for n in out if n and n != "None" and not n.startswith("None")]
    if not lists:
        return None
    names = subprocess.run(["scontrol", "show", "hostnames", ",".join(lists)], capture_output=True, text=True,
                           timeout=30, check=False).stdout.split()
    return set(names) or None


def aftermath(job_id: str, user: str, *, timeout_s: float = 60) -> None:
    """Assert what must hold after any job of ``user`` ended (waits up to ``timeout_s`` for the epilogs).

    * no node the job ran on is drained or down (the other nodes are other tests' business: tests run
      side by side, and test_long_runs_nodes.py takes its own node down on purpose);
    * the job's scratch, hook notes and runtime directory are gone on every node;
    * when ``user`` has no other running job, no process of ``user`` is left on the nodes.
    """
    uid = pwd.getpwnam(user).pw_uid
    ran_on = _job_nodes(job_id)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [str(p) for p in _job_paths(job_id, uid) if os.path.lexists(p)]
        procs = [] if _user_jobs_running(user) else job_processes(uid)
        states = node_states()
        bad = {n: s for n, s in states.items()
               if (ran_on is None or n in ran_on) and s.rstrip("*~#!%$@^-") not in _HEALTHY}
        if not (left or procs or bad) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not bad, f"job {job_id}: nodes not healthy after it: {bad}"
    assert not left, f"job {job_id}: left behind {left}"
    assert not procs, f"job {job_id}: processes of {user} outlived it: {procs}"


def forget_squats(path: str | Path) -> None:
    """Drop the prolog's squat records naming ``path`` on every node, as an admin does after dealing
    with the squatter, so ``admin doctor`` is clean for the rest of the suite."""
    for node in cluster()["nodes"]:
        for rec in (notes_dir(node) / "squats").glob("*.json"):
            if str(path) in rec.read_text(errors="replace"):
                rec.unlink()
