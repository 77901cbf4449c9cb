#!/usr/bin/python3
"""slurm-bt dev cluster: a real Slurm cluster (4 isolated nodes, 4 placeholder H100s each) on one host.

Works with Debian's Slurm 22.05 (Debian 12), 24.11 (Debian 13) and 26.05 (sid): `up` probes the
installed release (`slurmctld -V`) and writes what that release needs (see devcluster/README.md).

    devcluster.py up       install packages if missing, write configs, start daemons, verify (idempotent)
    devcluster.py up --shared local|gluster
                           the same, with <state>/shared on this disk (the default) or on a GlusterFS
                           volume with root squash on, as real sites export shared storage (remembered)
    devcluster.py up --isolated [--nodes N] | --host-nodes
                           the same, with each slurmd in an isolated machine of its own (the default; N nodes,
                           default 4: own network, hostname, processes, /tmp, /dev/shm, local disk;
                           devcluster/nodes.py) or two slurmds on this host's network (remembered; combines
                           with --shared)
    devcluster.py down     stop exactly the daemons whose PID files we own (SIGTERM, then SIGKILL)
    devcluster.py status   print each daemon with PID and alive/dead; exit 0 if all are up
    devcluster.py image build NAME [--pip PKG]... [--from DIR]
                           build an image from this host's python3 (+ pip packages, + a tree laid over
                           its root) and serve it in the dev registry under NAME (Docker Hub's names)
    devcluster.py image list   every image:tag the dev registry serves

Standalone, stdlib only, run as root with /usr/bin/python3.  No systemd needed: daemons are started directly.
State directory: $BT_DEVCLUSTER_DIR or /var/lib/slurm-bt-dev.  See devcluster/README.md.
"""

from __future__ import annotations

import fcntl
import grp
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

CLUSTER = "btdev"
# The nodes, name -> (address, slurmd port): set_layout() fills it for the remembered layout (<state>/layout):
#   host      n1, n2 on this host's network, 127.0.0.1 ports 6821/6822 (every slurmd shares this host's view);
#   isolated  n1..nN, each slurmd in a machine of its own (devcluster/nodes.py): 198.51.100.1x, port 6818.
NODES: dict[str, tuple[str, int]] = {}
LAYOUTS = ("host", "isolated")
LAYOUT = "host"
DEFAULT_ISOLATED_NODES = 4
HEAD_ADDR = "127.0.0.1"  # where the nodes reach slurmctld and the registries: the bridge address when isolated
PARTITIONS = ["gpu", "staging"]
GRES_TYPE = "h100"
GPUS_PER_NODE = 4
NODE_CPUS = 2
NODE_MEM_MB = 8000
CTLD_PORT = 6817
DBD_PORT = 6819
DB_NAME = "slurm_acct_db"
DB_USER = "slurm"
ACCOUNT = "default"
PACKAGES = ["slurm-wlm", "slurmdbd", "munge", "mariadb-server"]
# Binaries that must exist for the packages above to count as installed.
REQUIRED_BINARIES = [
    "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/sbin/munged",
    "/usr/bin/mysqld_safe", "/usr/bin/mariadb", "/usr/bin/sinfo", "/usr/bin/sacct", "/usr/bin/sacctmgr",
    "/usr/bin/munge",
]

ETC_SLURM = Path("/etc/slurm")
SLURM_CONF = ETC_SLURM / "slurm.conf"
GRES_CONF = ETC_SLURM / "gres.conf"
CGROUP_CONF = ETC_SLURM / "cgroup.conf"
DBD_CONF = ETC_SLURM / "slurmdbd.conf"
SLURM_LOG_DIR = Path("/var/log/slurm")
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN = Path("/run/munge")
# The socket MariaDB listens on: the client library's compiled-in default (what slurmdbd connects to), probed
# by probe_mariadb_socket(); Debian 12/13 use /run/mysqld/mysqld.sock, sid /run/mariadbd/mysqld.sock.
MYSQL_SOCK = Path("/run/mysqld/mysqld.sock")
MYSQL_RUN = MYSQL_SOCK.parent

STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev")).resolve()
RUN = STATE / "run"
LOG = STATE / "log"
SPOOL = STATE / "spool"
DEV = STATE / "dev"
PW_FILE = STATE / "db_password"
CLUSTER_JSON = STATE / "cluster.json"

REPO = Path(__file__).resolve().parent.parent
PROLOG = REPO / "prolog" / "slurm-bt-prolog"
EPILOG = REPO / "epilog" / "slurm-bt-epilog"

HEALTHY_NODE_STATES = {"idle", "mixed", "allocated", "completing"}


class Failure(Exception):
    """A step failed; message is printed, then the daemon's log tail."""

    def __init__(self, msg: str, log: Path | None = None):
        super().__init__(msg)
        self.log = log


# --------------------------------------------------------------------------------------------- daemons


class UsageError(Failure):
    """Bad input on the command line (exit 2)."""


class Daemon:
    def __init__(self, name: str, binaries: set[str], pidfile: Path, log: Path, args_must: tuple[str, ...] = ()):
        self.name = name
        self.binaries = binaries  # accepted basenames of argv[0] (or of any argv item for scripts)
        self.pidfile = pidfile
        self.log = log
        self.args_must = args_must  # consecutive argv items that must be present (e.g. -N n1)

    def read_pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def matches(self, pid: int) -> bool:
        """True if pid is alive (not a zombie) and its cmdline is our binary."""
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
            if st[st.rindex(")") + 2] in "ZX":
                return False
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            return False
        argv = [a.decode(errors="replace") for a in argv if a]
        if not argv:
            return False
        names = {os.path.basename(argv[0])}
        if self.name == "mysqld_safe":  # a shell script: /bin/sh /usr/bin/mysqld_safe ...
            names |= {os.path.basename(a) for a in argv[1:2]}
        if not names & self.binaries:
            return False
        if self.args_must:
            n = len(self.args_must)
            if not any(tuple(argv[i:i + n]) == self.args_must for i in range(len(argv))):
                return False
        return True

    def pid(self) -> int | None:
        """The live PID of this daemon according to its pid file, else None."""
        p = self.read_pid()
        return p if p is not None and self.matches(p) else None

    def stop(self, bound: float = 15.0) -> str:
        p = self.read_pid()
        if p is None:
            return "not running"
        if not self.matches(p):
            self.remove_pidfile()
            return f"already exited (pid {p}); removed pid file"
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline and self.matches(p):
            time.sleep(0.1)
        how = "stopped"
        if self.matches(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
            how = f"killed (SIGKILL after {bound:.0f}s)"
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and self.matches(p):
                time.sleep(0.1)
        self.remove_pidfile()
        return f"{how} (pid {p})"

    def remove_pidfile(self) -> None:
        try:
            self.pidfile.unlink()
        except FileNotFoundError:
            pass


MUNGED = Daemon("munged", {"munged"}, RUN / "munge" / "munged.pid", LOG / "munged.log")
MYSQLD_SAFE = Daemon("mysqld_safe", {"mysqld_safe"}, RUN / "mysqld_safe.pid", LOG / "mariadb.err")
MYSQLD = Daemon("mariadbd", {"mariadbd", "mysqld"}, RUN / "mysql" / "mysqld.pid", LOG / "mariadb.err")
SLURMDBD = Daemon("slurmdbd", {"slurmdbd"}, RUN / "slurm" / "slurmdbd.pid", SLURM_LOG_DIR / "slurmdbd.log")
SLURMCTLD = Daemon("slurmctld", {"slurmctld"}, RUN / "slurm" / "slurmctld.pid", SLURM_LOG_DIR / "slurmctld.log")


def _nodes_mod():  # devcluster/nodes.py: a sibling script, imported by path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import nodes

    return nodes


class Machine(Daemon):
    """An isolated node's machine: the init process that holds its namespaces (devcluster/nodes.py)."""

    def __init__(self, node: str):
        super().__init__(f"machine-{node}", {"python3"}, RUN / f"machine-{node}.pid", LOG / f"machine-{node}.log")
        self.node = node

    def matches(self, pid: int) -> bool:
        return super().matches(pid) and _nodes_mod().is_init(pid, self.node)


class MachineSlurmd(Daemon):
    """slurmd inside a machine: it daemonises there, so its PID file holds the machine's PID; the host finds it
    among the init's children (the daemon is reparented to the machine's PID 1)."""

    def __init__(self, node: str, machine: Machine):
        super().__init__(f"slurmd-{node}", {"slurmd"}, RUN / f"slurmd-{node}.pid", SLURM_LOG_DIR / f"slurmd-{node}.log",
                         ("-N", node))
        self.machine = machine

    def read_pid(self) -> int | None:
        init = self.machine.pid()
        if init is None:
            return None
        for child in _nodes_mod().children(init):
            if self.matches(child):
                return child
        return None

    def remove_pidfile(self) -> None:
        pass  # the file slurmd writes inside its machine is not ours


def _host_slurmd(n: str) -> Daemon:
    return Daemon(f"slurmd-{n}", {"slurmd"}, RUN / f"slurmd-{n}.pid", SLURM_LOG_DIR / f"slurmd-{n}.log", ("-N", n))


SLURMDS: dict[str, Daemon] = {}
MACHINES: dict[str, Machine] = {}
ALL_DAEMONS: list[Daemon] = []
LAYOUT_FILE = STATE / "layout"
NODE_LOCAL_MOUNT = STATE / "local"
HOSTS_FILE = STATE / "hosts"


def set_layout(layout: str, count: int) -> None:
    """Point the node tables at ``layout`` with ``count`` nodes (host: always n1, n2)."""
    global LAYOUT, HEAD_ADDR, NODES, SLURMDS, MACHINES, ALL_DAEMONS
    LAYOUT = layout
    if layout == "isolated":
        nodes = _nodes_mod()
        HEAD_ADDR = nodes.HEAD_ADDR
        NODES = {f"n{i}": (nodes.node_addr(i), 6818) for i in range(1, count + 1)}
        MACHINES = {n: Machine(n) for n in NODES}
        SLURMDS = {n: MachineSlurmd(n, MACHINES[n]) for n in NODES}
    else:
        HEAD_ADDR = "127.0.0.1"
        NODES = {"n1": ("127.0.0.1", 6821), "n2": ("127.0.0.1", 6822)}
        MACHINES = {}
        SLURMDS = {n: _host_slurmd(n) for n in NODES}
    ALL_DAEMONS = [MUNGED, MYSQLD_SAFE, MYSQLD, SLURMDBD, SLURMCTLD, *MACHINES.values(), *SLURMDS.values()]


set_layout("host", 2)  # main() switches to the remembered layout


def remembered_layout() -> tuple[str, int]:
    """(layout, node count) from <state>/layout ("isolated 4"), else isolated nodes (the default)."""
    try:
        words = LAYOUT_FILE.read_text().split()
        if len(words) == 2 and words[0] in LAYOUTS and words[1].isdigit() and 1 <= int(words[1]) <= 8:
            return words[0], int(words[1])
    except OSError:
        pass
    return "isolated", DEFAULT_ISOLATED_NODES


# --------------------------------------------------------------------------------------------- helpers


def step(msg: str) -> None:
    print(msg, flush=True)


def run(cmd: list[str], timeout: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw)
    except subprocess.TimeoutExpired as e:
        if check:
            raise Failure(f"command timed out after {timeout}s: {' '.join(cmd)}") from e
        return subprocess.CompletedProcess(cmd, 124, "", "timeout")
    if check and cp.returncode != 0:
        raise Failure(f"command failed ({cp.returncode}): {' '.join(cmd)}\n{cp.stdout}{cp.stderr}".rstrip())
    return cp


def spawn_daemon(cmd: list[str], name: str) -> None:
    """Run a self-daemonizing command; its early output goes to <state>/log/<name>.start.out."""
    out = LOG / f"{name}.start.out"
    with open(out, "wb") as f:
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True, timeout=30).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    if rc != 0:
        raise Failure(f"{name}: '{' '.join(cmd)}' exited {rc}: {out.read_text(errors='replace').strip()}")


def wait_for(pred, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return True
        except Exception:  # a probe that errors means "not ready yet"  # noqa: S110
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(cannot read {path}: {e})"
    return "\n".join(lines[-n:])


def write_if_changed(path: Path, content: str, mode: int, owner: str = "root", group: str | None = None) -> bool:
    """Write atomically; return True if the content changed. Always fixes mode/owner."""
    uid = pwd.getpwnam(owner).pw_uid
    gid = grp.getgrnam(group or owner).gr_gid if (group or owner) != "root" else 0
    changed = True
    try:
        changed = path.read_text() != content
    except OSError:
        pass
    if changed:
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return changed


def mkdir(path: Path, mode: int, owner: str = "root", group: str | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    uid = pwd.getpwnam(owner).pw_uid
    gid = grp.getgrnam(group or owner).gr_gid if (group or owner) != "root" else 0
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def touch(path: Path, mode: int, owner: str) -> None:
    if not path.exists():
        path.touch()
    os.chown(path, pwd.getpwnam(owner).pw_uid, pwd.getpwnam(owner).pw_gid)
    os.chmod(path, mode)


def hostname() -> str:
    return socket.gethostname().split(".")[0]


# --------------------------------------------------------------------------------------------- release


class Release:
    """The installed Slurm release, from `slurmctld -V` ("slurm 24.11.5"), and what it needs from us."""

    def __init__(self, text: str):
        self.text = text  # e.g. "24.11.5"
        parts = [*text.split("."), "0", "0"][:2]
        self.major_minor = (int(parts[0]), int(parts[1]))

    def at_least(self, major: int, minor: int) -> bool:
        return self.major_minor >= (major, minor)

    @property
    def version(self) -> str:
        return f"{self.major_minor[0]:02d}.{self.major_minor[1]:02d}"


def probe_release() -> Release:
    cp = run(["/usr/sbin/slurmctld", "-V"], timeout=10)
    words = cp.stdout.split()
    if len(words) < 2 or not words[-1][:1].isdigit():
        raise Failure(f"release: cannot parse `slurmctld -V` output {cp.stdout.strip()!r}")
    return Release(words[-1])


def probe_mariadb_socket() -> Path:
    """The socket path compiled into MariaDB's client library: where slurmdbd looks for the server.

    slurmdbd's accounting_storage/mysql plugin links libmariadb.so.3 and sets no socket, so the library's
    built-in default decides; sid's build says /run/mariadbd/mysqld.sock, Debian 12/13's /run/mysqld/...
    The mariadb CLI prints no compiled default ("(No default value)"), so read it from the library.
    """
    for lib in sorted(Path("/usr/lib").glob("*/libmariadb.so.3")) + sorted(Path("/usr/lib").glob("libmariadb.so.3")):
        try:
            data = lib.read_bytes()
        except OSError:
            continue
        for m in re.finditer(rb"/[A-Za-z0-9_./-]+/(?:mysqld|mariadbd?)\.sock\0", data):
            return Path(m.group()[:-1].decode())
    return Path("/run/mysqld/mysqld.sock")


# --------------------------------------------------------------------------------------------- steps


def apt_install(packages: list[str], *, recommends: bool = True) -> None:
    """``apt-get update`` and ``install`` with package scripts kept from starting services."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # No systemd: keep package scripts from starting munge/mariadb/glusterd themselves (we start them by PID).
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = False
    if not policy.exists():
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        created_policy = True
    try:
        run(["apt-get", "update"], timeout=600, env=env)
        run(["apt-get", "install", "-y", *([] if recommends else ["--no-install-recommends"]), *packages],
            timeout=1200, env=env)
    finally:
        if created_policy:
            policy.unlink(missing_ok=True)


def ensure_packages() -> None:
    missing = [b for b in REQUIRED_BINARIES if not os.access(b, os.X_OK)]
    if not missing:
        return
    step(f"packages: installing {' '.join(PACKAGES)} (missing {', '.join(missing)})")
    apt_install(PACKAGES)
    still = [b for b in REQUIRED_BINARIES if not os.access(b, os.X_OK)]
    if still:
        raise Failure(f"packages: still missing after install: {', '.join(still)}")


def ensure_hooks() -> None:
    for hook in (PROLOG, EPILOG):
        if not hook.is_file():
            raise Failure(f"hooks: {hook} does not exist; Prolog/Epilog failures would drain the nodes")
        hook.chmod(hook.stat().st_mode | 0o555)


def ensure_dirs() -> bool:
    """Create directories and placeholder GPU devices; True if a device node was (re)created."""
    devices_changed = False
    mkdir(STATE, 0o755)
    mkdir(RUN, 0o755)
    mkdir(RUN / "munge", 0o755, "munge")
    mkdir(RUN / "mysql", 0o755, "mysql")
    mkdir(RUN / "slurm", 0o755, "slurm")
    mkdir(LOG, 0o755)
    mkdir(SPOOL, 0o755)
    mkdir(SPOOL / "slurmctld", 0o700, "slurm")
    mkdir(SPOOL / "slurmd", 0o755)
    for n in NODES:
        mkdir(SPOOL / "slurmd" / n, 0o755)
    mkdir(STATE / "node", 0o755)
    # Isolated layout: where each machine binds its own node/<n> (devcluster/nodes.py), the same path on every
    # node, as /local/nvme would be on a real one. Empty on the host.
    mkdir(NODE_LOCAL_MOUNT, 0o755)
    # Node-local stand-ins, one tree per slurmd (site storage roots use %n). The slurm-bt prolog
    # creates each job's scratch (0700, the job's user), so the scratch root is root-owned 0755:
    # users cannot pre-create (or plant symlinks at) job directories. The node weights cache is written
    # only by the prolog (root), so its root is root-owned 0755 too.
    for n in NODES:
        mkdir(STATE / "node" / n, 0o755)
        mkdir(STATE / "node" / n / "scratch", 0o755)
        mkdir(STATE / "node" / n / "weights", 0o755)
    mkdir(SLURM_LOG_DIR, 0o755, "slurm")
    mkdir(ETC_SLURM, 0o755)
    mkdir(MUNGE_RUN, 0o755, "munge")
    mkdir(MYSQL_RUN, 0o755, "mysql", "root")
    # Placeholder GPUs: char devices 1:3 (like /dev/null) so slurmd accepts them as devices.
    mkdir(DEV, 0o755)
    for n in NODES:
        mkdir(DEV / n, 0o755)
        for i in range(GPUS_PER_NODE):
            p = DEV / n / f"nvidia{i}"
            try:
                st = p.lstat()
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3):
                    continue
            except FileNotFoundError:
                st = None
            try:
                tmp = p.with_name(f".{p.name}.tmp")
                tmp.unlink(missing_ok=True)
                os.mknod(tmp, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
                os.chmod(tmp, 0o666)  # noqa: S103 - a /dev/null-like placeholder GPU device
                os.replace(tmp, p)
                devices_changed = True
            except OSError:
                # Fallback: plain file. slurmd then logs "is not a valid character or block device".
                if st is None:
                    p.touch(0o666)
                    devices_changed = True
    return devices_changed


def db_password() -> str:
    if PW_FILE.exists():
        os.chmod(PW_FILE, 0o600)
        return PW_FILE.read_text().strip()
    pw = secrets.token_hex(16)
    fd = os.open(PW_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(pw + "\n")
    return pw


def slurm_conf(rel: Release) -> str:
    host = hostname()
    lines = [
        "# Generated by slurm-bt devcluster/devcluster.py -- do not edit (rewritten by `up`).",
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={host}({HEAD_ADDR})",
        f"SlurmctldPort={CTLD_PORT}",
        "SlurmdPort=6818",
        "SlurmUser=slurm",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "SwitchType=switch/none",
        f"StateSaveLocation={SPOOL / 'slurmctld'}",
        f"SlurmdSpoolDir={SPOOL / 'slurmd'}/%n",
        f"SlurmctldPidFile={SLURMCTLD.pidfile}",
        f"SlurmdPidFile={RUN}/slurmd-%n.pid",
        f"SlurmctldLogFile={SLURMCTLD.log}",
        f"SlurmdLogFile={SLURM_LOG_DIR}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=2000",
        "GresTypes=gpu",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "KillWait=5",
        "InactiveLimit=0",
        "MinJobAge=300",
        "SlurmctldTimeout=60",
        "SlurmdTimeout=120",
        "MessageTimeout=10",
        "SchedulerType=sched/backfill",
        # Jobs start within ~1 s of submission (events trigger the scheduler; these bound the periodic passes).
        # SchedulerTimeSlice only matters for gang scheduling, so it is not set.
        "SchedulerParameters=nohold_on_prolog_fail,sched_interval=2,bf_interval=2,batch_sched_delay=0",
        "PriorityType=priority/basic",
        # Preemption for the long-run tests (docs/long-runs.md): jobs in the `preemptible` partition are requeued
        # when a job of the higher-tier `urgent` partition needs their node, after GraceTime (the partition's) in
        # which Slurm sends SIGTERM. gpu and staging say PreemptMode=OFF, so nothing else is ever preempted.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        # A requeued job waits cred_expire seconds (default 120) before it may start again; the long-run tests
        # requeue a job several times (docs/long-runs.md). Batch launch credentials are made after the prolog
        # (PrologFlags=DeferBatch), so a long prolog does not need a longer lifetime.
        "AuthInfo=cred_expire=30",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={DBD_PORT}",
        "AccountingStorageTRES=gres/gpu",
        # Worst case for secret-leak tests: Slurm stores every script, environment and comment.
        "AccountingStoreFlags=job_script,job_env,job_comment",
        # What docs/admin.md recommends (and `slurm-bt admin doctor` checks): users see only their jobs.
        "PrivateData=jobs,usage",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=5",
        f"Prolog={PROLOG}",
        f"Epilog={EPILOG}",
        # Contain (implies Alloc) works with proctrack/linuxproc here: jobs get an .extern step; slurmctld logs a
        # harmless "If using PrologFlags=Contain for pam_slurm_adopt ..." error. DeferBatch does NOT imply Alloc
        # on 22.05; with it the batch script starts only after the Prolog finished on all nodes.
        "PrologFlags=Alloc,Contain,DeferBatch",
        # 25.05 split the one timeout into PrologTimeout and EpilogTimeout (PrologEpilogTimeout is deprecated).
        *(["PrologTimeout=120", "EpilogTimeout=120"] if rel.at_least(25, 5) else ["PrologEpilogTimeout=120"]),
        # 25.11: jobs may ask for --requeue=expedite (restart at once, top priority), as admin install advises;
        # slurm-bt's long runs use it where this is set (slurm_bt/slurm/release.py requeue_option).
        *(["SlurmctldParameters=enable_expedited_requeue"] if rel.at_least(25, 11) else []),
        "",
    ]
    for name, (addr, port) in sorted(NODES.items()):
        # Features=<its name>: a feature of the node's own lets bt-sbatch --prefer the nodes whose cache holds
        # a job's weights (slurm_bt/slurm/prefer.py; admin install advises it).
        lines.append(
            f"NodeName={name} NodeHostname={name if LAYOUT == 'isolated' else host} NodeAddr={addr} Port={port} "
            f"CPUs={NODE_CPUS} Boards=1 "
            f"SocketsPerBoard=1 CoresPerSocket={NODE_CPUS} ThreadsPerCore=1 RealMemory={NODE_MEM_MB} "
            f"Gres=gpu:{GRES_TYPE}:{GPUS_PER_NODE} Features={name} State=UNKNOWN"
        )
    nodes = ",".join(sorted(NODES))  # "n1,n2"; Slurm prints it as n[1-2]
    lines += [
        f"PartitionName=gpu Nodes={nodes} Default=YES MaxTime=INFINITE OverSubscribe=NO PreemptMode=OFF State=UP",
        f"PartitionName=staging Nodes={nodes} Default=NO MaxTime=INFINITE OverSubscribe=NO PreemptMode=OFF State=UP",
        f"PartitionName=preemptible Nodes={nodes} Default=NO MaxTime=INFINITE OverSubscribe=NO PriorityTier=1 "
        "PreemptMode=REQUEUE GraceTime=20 State=UP",
        f"PartitionName=urgent Nodes={nodes} Default=NO MaxTime=INFINITE OverSubscribe=NO PriorityTier=10 "
        "PreemptMode=OFF State=UP",
        "",
    ]
    return "\n".join(lines)


def cgroup_conf(rel: Release) -> str | None:
    """cgroup.conf for this release, or None when none is needed.

    slurmd >= 23.02 initialises a cgroup plugin even with proctrack/linuxproc and task/none, and fails at
    start ("No filesystem mounted on /sys/fs/cgroup ... Unable to initialize cgroup plugin") where no
    cgroup filesystem is mounted (containers, namespaces). CgroupPlugin=disabled (new in 23.02) skips it;
    22.05 does not know that value, and needs no cgroup.conf at all.
    """
    if not rel.at_least(23, 2):
        return None
    return "\n".join([
        "# Generated by slurm-bt devcluster/devcluster.py -- do not edit (rewritten by `up`).",
        "# The dev cluster uses no cgroup plugin (proctrack/linuxproc, task/none); see devcluster/README.md.",
        "CgroupPlugin=disabled",
        "",
    ])


def gres_conf() -> str:
    lines = ["# Generated by slurm-bt devcluster/devcluster.py. Placeholder devices (char 1:3), one set per node.",
             "AutoDetect=off"]
    for name in sorted(NODES):
        lines.append(f"NodeName={name} Name=gpu Type={GRES_TYPE} File={DEV / name}/nvidia[0-{GPUS_PER_NODE - 1}]")
    return "\n".join(lines) + "\n"


def dbd_conf(pw: str) -> str:
    return "\n".join([
        "# Generated by slurm-bt devcluster/devcluster.py -- do not edit (rewritten by `up`).",
        "AuthType=auth/munge",
        "DbdHost=localhost",
        f"DbdPort={DBD_PORT}",
        "SlurmUser=slurm",
        "DebugLevel=info",
        f"LogFile={SLURMDBD.log}",
        f"PidFile={SLURMDBD.pidfile}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        f"StorageUser={DB_USER}",
        f"StoragePass={pw}",
        f"StorageLoc={DB_NAME}",
        "PrivateData=jobs,usage",
        "",
    ])


SLURM_CONF_STAMP = RUN / "slurm-conf.sha256"  # hash of slurm.conf+gres.conf the running daemons were started with
DBD_CONF_STAMP = RUN / "slurmdbd-conf.sha256"


def conf_hash(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()


def stamp_differs(stamp: Path, digest: str) -> bool:
    try:
        return stamp.read_text().strip() != digest
    except OSError:
        return True


def write_configs(pw: str, rel: Release) -> tuple[bool, bool]:
    """Write configs; returns (slurm daemons need restart, slurmdbd needs restart) if they run with older ones."""
    c1 = write_if_changed(SLURM_CONF, slurm_conf(rel), 0o644)
    c2 = write_if_changed(GRES_CONF, gres_conf(), 0o644)
    c3 = write_if_changed(DBD_CONF, dbd_conf(pw), 0o600, "slurm")
    cg = cgroup_conf(rel)
    c4 = write_if_changed(CGROUP_CONF, cg, 0o644) if cg is not None else False
    if cg is None and CGROUP_CONF.exists() and CGROUP_CONF.read_text().startswith("# Generated by slurm-bt"):
        CGROUP_CONF.unlink()  # ours, from a newer release's packages: 22.05 rejects CgroupPlugin=disabled
        c4 = True
    wrote = ((SLURM_CONF, c1), (GRES_CONF, c2), (DBD_CONF, c3), (CGROUP_CONF, c4))
    if any(c for _p, c in wrote):
        step(f"configs: wrote {', '.join(str(p) for p, c in wrote if c)}")
    return (stamp_differs(SLURM_CONF_STAMP, slurm_conf_hash()),
            stamp_differs(DBD_CONF_STAMP, conf_hash(DBD_CONF)))


def slurm_conf_hash() -> str:
    return conf_hash(*(p for p in (SLURM_CONF, GRES_CONF, CGROUP_CONF) if p.exists()))


def munge_works() -> bool:
    enc = run(["munge", "-n"], timeout=5, check=False)
    if enc.returncode != 0:
        return False
    dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, text=True, timeout=5)
    return dec.returncode == 0


def ensure_munge() -> None:
    if not MUNGE_KEY.exists():
        if shutil.which("mungekey"):
            run(["mungekey", "--create", f"--keyfile={MUNGE_KEY}"])
        else:
            MUNGE_KEY.write_bytes(os.urandom(1024))
        step(f"munged: created {MUNGE_KEY}")
    mu = pwd.getpwnam("munge")
    os.chown(MUNGE_KEY, mu.pw_uid, mu.pw_gid)
    os.chmod(MUNGE_KEY, 0o400)
    pid = MUNGED.pid()
    if pid:
        if munge_works():
            step(f"munged: running (pid {pid})")
            return
        MUNGED.stop()
    elif munge_works():
        step("munged: a munged not started by devcluster already answers on /run/munge; using it")
        return
    touch(MUNGED.log, 0o640, "munge")
    MUNGED.remove_pidfile()
    spawn_daemon(["runuser", "-u", "munge", "--", "/usr/sbin/munged", "-f", f"--pid-file={MUNGED.pidfile}",
                  f"--log-file={MUNGED.log}"], "munged")
    if not wait_for(lambda: MUNGED.pid() and munge_works(), 10):
        raise Failure("munged: did not come up within 10s", MUNGED.log)
    step(f"munged: started (pid {MUNGED.pid()})")


def mysql(sql: str, check: bool = True) -> subprocess.CompletedProcess:
    return run(["mariadb", "--protocol=socket", f"--socket={MYSQL_SOCK}", "-u", "root", "-N", "-B", "-e", sql],
               timeout=20, check=check)


def mariadb_answers() -> bool:
    return MYSQL_SOCK.exists() and mysql("SELECT 1", check=False).returncode == 0


def ensure_mariadb(pw: str) -> None:
    pid = MYSQLD.pid()
    if pid and mariadb_answers():
        step(f"mariadb: running (pid {pid})")
    elif not pid and mariadb_answers():
        step(f"mariadb: a server not started by devcluster already answers on {MYSQL_SOCK}; using it")
    else:
        if pid:
            MYSQLD.stop(30)
        MYSQLD_SAFE.stop(5)
        if not Path("/var/lib/mysql/mysql").is_dir():
            step("mariadb: initialising /var/lib/mysql")
            run(["mariadb-install-db", "--user=mysql", "--datadir=/var/lib/mysql"], timeout=120)
        touch(MYSQLD.log, 0o640, "mysql")
        MYSQLD.remove_pidfile()
        with open(LOG / "mysqld_safe.start.out", "wb") as out:
            proc = subprocess.Popen(
                ["/usr/bin/mysqld_safe", "--user=mysql", "--skip-syslog", f"--log-error={MYSQLD.log}",
                 f"--pid-file={MYSQLD.pidfile}", f"--socket={MYSQL_SOCK}", "--innodb-lock-wait-timeout=900"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                cwd="/",
            )
        MYSQLD_SAFE.pidfile.write_text(f"{proc.pid}\n")
        if not wait_for(lambda: proc.poll() is None and MYSQLD.pid() and mariadb_answers(), 40, 0.3):
            raise Failure(f"mariadb: did not answer on {MYSQL_SOCK} within 40s", MYSQLD.log)
        step(f"mariadb: started (mysqld_safe pid {proc.pid}, mariadbd pid {MYSQLD.pid()})")
    try:  # mariadbd writes it 0660; `status` as a normal user needs to read it
        os.chmod(MYSQLD.pidfile, 0o644)
    except OSError:
        pass
    mysql(
        f"CREATE DATABASE IF NOT EXISTS {DB_NAME}; "
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{pw}'; "
        f"ALTER USER '{DB_USER}'@'localhost' IDENTIFIED BY '{pw}'; "
        f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost'; FLUSH PRIVILEGES;"
    )


def dbd_answers() -> bool:
    cp = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], timeout=10, check=False)
    return cp.returncode == 0


def ensure_slurmdbd(restart: bool) -> None:
    pid = SLURMDBD.pid()
    if pid and restart:
        step(f"slurmdbd: config changed, restarting ({SLURMDBD.stop()})")
        pid = None
    if pid:
        if not wait_for(dbd_answers, 15):
            raise Failure(f"slurmdbd: running (pid {pid}) but sacctmgr gets no answer", SLURMDBD.log)
        step(f"slurmdbd: running (pid {pid})")
    else:
        SLURMDBD.remove_pidfile()
        spawn_daemon(["/usr/sbin/slurmdbd"], "slurmdbd")
        if not wait_for(lambda: SLURMDBD.pid() and dbd_answers(), 40, 0.5):
            raise Failure("slurmdbd: did not answer within 40s", SLURMDBD.log)
        step(f"slurmdbd: started (pid {SLURMDBD.pid()})")
    DBD_CONF_STAMP.write_text(conf_hash(DBD_CONF) + "\n")
    clusters = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"]).stdout.split()
    if CLUSTER not in clusters:
        run(["sacctmgr", "-i", "add", "cluster", CLUSTER])
        step(f"slurmdbd: added cluster {CLUSTER}")
    ensure_associations()


def ensure_associations() -> None:
    """Account `default` + an association for every existing human user (uid 1000..59999).

    AccountingStorageEnforce stays unset, so unassociated users can still run; but on 22.05 `sacct --json`
    reports "user": null for jobs of users without an association (text sacct is fine).
    """
    accounts = run(["sacctmgr", "-n", "-P", "list", "account", "format=account"]).stdout.split()
    if ACCOUNT not in accounts:
        run(["sacctmgr", "-i", "add", "account", ACCOUNT, f"cluster={CLUSTER}", "description=devcluster",
             "organization=slurm-bt"])
    have = set(run(["sacctmgr", "-n", "-P", "list", "user", "format=user"]).stdout.split())
    want = sorted({p.pw_name for p in pwd.getpwall() if 1000 <= p.pw_uid < 60000} - have)
    if want:
        run(["sacctmgr", "-i", "add", "user", ",".join(want), f"account={ACCOUNT}", f"cluster={CLUSTER}"])
        step(f"slurmdbd: associated users {','.join(want)} with account {ACCOUNT}")


def ctld_answers() -> bool:
    cp = run(["scontrol", "ping"], timeout=10, check=False)
    return cp.returncode == 0 and "is UP" in cp.stdout


def ensure_slurmctld(restart: bool) -> None:
    pid = SLURMCTLD.pid()
    if pid and restart:
        step(f"slurmctld: config changed, restarting ({SLURMCTLD.stop()})")
        pid = None
    if pid:
        if not wait_for(ctld_answers, 15):
            raise Failure(f"slurmctld: running (pid {pid}) but `scontrol ping` gets no answer", SLURMCTLD.log)
        step(f"slurmctld: running (pid {pid})")
        return
    SLURMCTLD.remove_pidfile()
    spawn_daemon(["/usr/sbin/slurmctld"], "slurmctld")
    if not wait_for(lambda: SLURMCTLD.pid() and ctld_answers(), 40, 0.3):
        raise Failure("slurmctld: did not answer `scontrol ping` within 40s", SLURMCTLD.log)
    step(f"slurmctld: started (pid {SLURMCTLD.pid()})")


def ensure_machines() -> None:
    """Isolated layout: each node's network and its machine (idempotent; a running machine and its jobs are
    left alone). The bridge is up already: cmd_up makes it before slurmctld."""
    nodes = _nodes_mod()
    try:
        if nodes.ensure_shared_root():
            step("nodes: / is now a shared mount, so the shared storage mounted later reaches the machines")
        for name, (addr, _port) in sorted(NODES.items()):
            nodes.ensure_node_net(name, addr)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        raise Failure(f"nodes: {e}") from e
    write_if_changed(HOSTS_FILE, nodes.hosts_file({n: a for n, (a, _p) in NODES.items()}, hostname()), 0o644)
    keep = nodes.tmp_to_keep(REPO)
    for name, m in MACHINES.items():
        pid = m.pid()
        if pid is not None and nodes.kept_by(pid) == str(keep or "-"):
            continue
        if pid is not None:  # started from another checkout, which this one's hooks are not in
            step(f"machine {name}: restarting to see {keep or 'no /tmp checkout'} ({m.stop()}; its jobs end)")
        with open(m.log, "ab") as out:
            proc = subprocess.Popen(nodes.init_argv(name, STATE / "node" / name, NODE_LOCAL_MOUNT, HOSTS_FILE, keep),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

        init = _machine_init(m, proc)
        if init is None:
            raise Failure(f"machine {name}: its init did not start", m.log)
        m.pidfile.write_text(f"{init}\n")
        step(f"machine {name}: started (init pid {init}, {NODES[name][0]})")


def _machine_init(m: Machine, proc: subprocess.Popen) -> int | None:
    """The init's PID as the host sees it: nsenter execs unshare, whose one child is the init."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = [c for c in _nodes_mod().children(proc.pid) if m.matches(c)]
        if found:
            return found[0]
        if proc.poll() is not None:
            return None
        time.sleep(0.1)
    return None


def ensure_slurmds(restart: bool) -> None:
    if LAYOUT == "isolated":
        ensure_machines()
    # A slurmd left running with a different config must restart too.
    for name, d in SLURMDS.items():
        pid = d.pid()
        if pid and restart:
            step(f"slurmd {name}: config changed, restarting ({d.stop()})")
            pid = None
        if pid:
            step(f"slurmd {name}: running (pid {pid})")
            continue
        d.remove_pidfile()
        enter = _nodes_mod().enter_argv(MACHINES[name].pid()) if name in MACHINES else []
        spawn_daemon([*enter, "/usr/sbin/slurmd", "-N", name], f"slurmd-{name}")
        if not wait_for(d.pid, 20):
            raise Failure(f"slurmd {name}: no live pid in {d.pidfile} within 20s", d.log)
        step(f"slurmd {name}: started (pid {d.pid()})")


def node_states() -> dict[str, str]:
    cp = run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
    states: dict[str, str] = {}
    for line in cp.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1].lower()  # e.g. idle, idle*, drained, down*
    return states


def ensure_nodes_healthy() -> None:
    resumed: set[str] = set()

    def ok() -> bool:
        states = node_states()
        good = True
        for name in NODES:
            st = states.get(name, "missing")
            if st.rstrip("*~#!%$@^-") in HEALTHY_NODE_STATES and not st.endswith("*"):
                continue
            good = False
            base = st.rstrip("*~#!%$@^-")
            bad = "drain" in base or base in ("down", "fail", "failing")
            if name not in resumed and bad and not st.endswith("*"):
                run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
                resumed.add(name)
                step(f"nodes: {name} was {st}; resumed")
        return good

    if not wait_for(ok, 40, 0.5):
        states = node_states()
        bad = [n for n in NODES if states.get(n, "missing").rstrip("*~#!%$@^-") not in HEALTHY_NODE_STATES]
        reasons = run(["sinfo", "-R", "-h", "-o", "%n %E"], check=False).stdout.strip()
        logs = SLURMDS[bad[0]].log if bad else SLURMCTLD.log
        raise Failure(f"nodes: not healthy within 40s: {states} {reasons}", logs)
    step("nodes: " + " ".join(f"{k}={v}" for k, v in sorted(node_states().items())))


def write_cluster_json(rel: Release, shared: str = "local") -> None:
    data = {
        "cluster": CLUSTER,
        "slurm_release": rel.text,
        "slurm_version": rel.version,
        "nodes": {n: addr for n, (addr, _port) in sorted(NODES.items())},
        "node_ports": {n: port for n, (_addr, port) in sorted(NODES.items())},
        "partitions": PARTITIONS,
        "default_partition": "gpu",
        "gres_type": GRES_TYPE,
        "gpus_per_node": GPUS_PER_NODE,
        "cpus_per_node": NODE_CPUS,
        "mem_per_node_mb": NODE_MEM_MB,
        "state_dir": str(STATE),
        "shared_dir": str(STATE / "shared"),
        "shared_fs": shared,  # local, or gluster (root squashed: devcluster/README.md)
        "shared_root_squash": shared == "gluster",
        # where an admin (a host where root is not squashed) sees the shared storage: tests set up through it
        "shared_admin_dir": str(STATE / ("shared-admin" if shared == "gluster" else "shared")),
        "node_local_dir": str(STATE / "node"),  # node/<n>: each node's local disk, as the host sees it
        # host: every slurmd on this host's network; isolated: each in a machine of its own (devcluster/nodes.py)
        "layout": LAYOUT,
        "head_addr": HEAD_ADDR,  # where nodes reach the head (slurmctld, registries, the tests' servers)
        "head_alt_addr": _nodes_mod().HEAD_ALT_ADDR if LAYOUT == "isolated" else None,  # a second origin
        # isolated: the path where every node sees its own node/<n>
        "node_local_mount": str(NODE_LOCAL_MOUNT) if LAYOUT == "isolated" else None,
        "slurm_conf": str(SLURM_CONF),
        "prolog": str(PROLOG),
        "epilog": str(EPILOG),
    }
    write_if_changed(CLUSTER_JSON, json.dumps(data, indent=2) + "\n", 0o644)


# --------------------------------------------------------------------------------------------- commands


def use_mariadb_socket(sock: Path) -> None:
    global MYSQL_SOCK, MYSQL_RUN
    MYSQL_SOCK, MYSQL_RUN = sock, sock.parent


# ------------------------------------------------------------------------------- the shared filesystem
# <state>/shared stands in for the site's shared filesystem: the cluster cache, the project/team caches
# and the file:// checkpoint store. `up --shared MODE` picks how (kept in <state>/shared-mode):
#   local    a directory on this host's disk, where root can do anything (the default);
#   gluster  a GlusterFS volume (Debian's glusterfs-server + the FUSE client) mounted there with
#            `server.root-squash on`: root on the nodes acts as nobody on it, as on an NFS export with
#            root_squash (the default of every NFS export) or a Lustre/GPFS site that squashes root. The
#            brick (the volume's data) is <state>/gluster/brick; the volume is named btshared.
# The layout an admin creates once (root-owned cache root, 1777 checkpoint store) is made with the squash
# turned off for a moment, as an admin does from a host that is not squashed; then it is turned on again.

SHARED = STATE / "shared"
SHARED_ADMIN = STATE / "shared-admin"  # gluster mode: the same volume, root not squashed (the admin's view)
SHARED_MODE_FILE = STATE / "shared-mode"
SHARED_MODES = ("local", "gluster")
GLUSTER_DIR = STATE / "gluster"
GLUSTER_VOLUME = "btshared"
GLUSTER_PACKAGES = ["glusterfs-server", "glusterfs-client"]
GLUSTERD = Daemon("glusterd", {"glusterd"}, RUN / "glusterd.pid", LOG / "glusterd.log")


def shared_mode(requested: str | None = None) -> str:
    """The shared-storage mode: ``requested`` (then remembered), else the remembered one, else local."""
    if requested is not None:
        write_if_changed(SHARED_MODE_FILE, requested + "\n", 0o644)
        return requested
    try:
        mode = SHARED_MODE_FILE.read_text().strip()
    except FileNotFoundError:
        return "local"
    return mode if mode in SHARED_MODES else "local"


def _shared_layout(identity: str | None = None) -> None:
    """What `slurm-bt admin install` creates on the shared filesystem (its `shared_layout`), for the dev site.

    ``identity``: the gluster mode's ``shared_fs_identity``, which owns the teams/ directories the prolog
    creates team directories in (root is squashed there); else root owns them."""
    owner = identity or "root"
    mkdir(SHARED, 0o1777)
    # Root of the project/team caches: root-owned so that only the prolog creates team directories
    # (2770 <owner>:<group>) in it; see docs/admin.md.
    mkdir(SHARED / "cache", 0o755)
    mkdir(SHARED / "cache" / "teams", 0o755, owner, "root")
    # The weights and images cluster cache (site default <shared>/weights): root's, its shared tier root's,
    # teams/ the layout owner's (the staging job's prolog creates teams/<team> in it).
    mkdir(SHARED / "weights", 0o755)
    mkdir(SHARED / "weights" / "shared", 0o755)
    mkdir(SHARED / "weights" / "teams", 0o755, owner, "root")
    # The dev site's file:// checkpoint store (docs/checkpoints.md): created by the admin, root-owned 1777,
    # as `admin doctor` and the prepare step require. Left to the first job, it would belong to that user
    # and every later job would be refused ("is owned by another user, not root").
    mkdir(SHARED / "checkpoints", 0o1777)
    # Its team namespaces (docs/checkpoints.md): the prolog creates _teams/<team> as the layout owner.
    mkdir(SHARED / "checkpoints" / "_teams", 0o755, owner, "root")


# The gluster mode's shared_fs_identity (docs/admin.md "Root-squashed shared filesystems"): a system account
# in every team group that creates team directories where root cannot. `up --shared gluster` creates it, adds
# it to every group of a regular user (gid 1000-59999; tests add it to the groups they create) and names it in
# /etc/slurm-bt/hooks.toml; `up --shared local` removes that hooks.toml again (root creates them).
SHARED_IDENTITY = "slurmbt"
HOOKS_FILE = Path("/etc/slurm-bt/hooks.toml")
HOOKS_MARKER = "# managed by devcluster/devcluster.py (shared mode gluster): delete this line to keep your own edits"


def ensure_shared_identity() -> None:
    try:
        pwd.getpwnam(SHARED_IDENTITY)
    except KeyError:
        run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SHARED_IDENTITY])
        step(f"shared: created the service account {SHARED_IDENTITY} (shared_fs_identity)")
    teams = sorted(g.gr_name for g in grp.getgrall() if 1000 <= g.gr_gid < 60000)
    if teams:
        run(["usermod", "-aG", ",".join(teams), SHARED_IDENTITY])


def ensure_hooks_file(mode: str) -> None:
    mine = HOOKS_FILE.exists() and HOOKS_FILE.read_text(errors="replace").startswith(HOOKS_MARKER)
    if HOOKS_FILE.exists() and not mine:
        step(f"hooks: {HOOKS_FILE} is the admin's (no marker line): left as it is")
        return
    if mode != "gluster":
        if mine:
            HOOKS_FILE.unlink()
            step(f"hooks: removed {HOOKS_FILE} (root creates team directories on the local shared directory)")
        return
    text = (f"{HOOKS_MARKER}\n# The shared filesystem squashes root: team directories are created as this account.\n"
            f'shared_fs_identity = "{SHARED_IDENTITY}"\n')
    if mine and HOOKS_FILE.read_text(errors="replace") == text:
        return
    mkdir(HOOKS_FILE.parent, 0o755)
    tmp = HOOKS_FILE.with_name(f".hooks.toml.{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, HOOKS_FILE)
    step(f"hooks: {HOOKS_FILE}: shared_fs_identity = {SHARED_IDENTITY}")


def _gluster(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return run(["gluster", "--mode=script", *args], check=check, timeout=timeout)


def _root_squashed(folder: Path) -> bool:
    """True when root cannot create an entry in the root-owned 0755 ``folder`` (it acts as nobody).

    The stdlib twin of ``slurm_bt.cli.admin_cmd.squashed_as``: this script runs before slurm-bt's venv
    exists, so it cannot import it."""
    probe = folder / f".devcluster-squash-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except PermissionError:
        return True
    os.close(fd)
    probe.unlink()
    return False


def _ensure_gluster_packages() -> None:
    if shutil.which("glusterd") and shutil.which("mount.glusterfs"):
        return
    step(f"packages: installing {' '.join(GLUSTER_PACKAGES)}")
    apt_install(GLUSTER_PACKAGES, recommends=False)


def _umount_admin_view() -> None:
    if os.path.ismount(SHARED_ADMIN):
        run(["umount", str(SHARED_ADMIN)], timeout=60, check=False)


def ensure_shared(mode: str) -> None:
    if mode == "local":
        _umount_admin_view()
        if os.path.ismount(SHARED):  # back from gluster: the local directory is under the mount
            run(["umount", str(SHARED)], timeout=60)
            step(f"shared: unmounted the GlusterFS volume from {SHARED}")
        _shared_layout()
        return
    _ensure_gluster_packages()
    if GLUSTERD.pid() is None:
        mkdir(GLUSTER_DIR, 0o700)
        spawn_daemon(["glusterd", "-p", str(GLUSTERD.pidfile), f"--log-file={GLUSTERD.log}"], GLUSTERD.name)
        if not wait_for(lambda: _gluster("volume", "list", check=False).returncode == 0, 30):
            raise Failure("glusterd did not answer within 30 s", GLUSTERD.log)
        step(f"glusterd: started (pid {GLUSTERD.pid()})")
    info = _gluster("volume", "info", GLUSTER_VOLUME, check=False)
    if info.returncode != 0:
        brick = GLUSTER_DIR / "brick"
        mkdir(brick, 0o755)
        # `force`: the brick is on the root filesystem, which gluster refuses by default
        _gluster("volume", "create", GLUSTER_VOLUME, f"{hostname()}:{brick}", "force")
        step(f"shared: created GlusterFS volume {GLUSTER_VOLUME} (brick {brick})")
        info = _gluster("volume", "info", GLUSTER_VOLUME)
    if "Status: Started" not in info.stdout:
        _gluster("volume", "start", GLUSTER_VOLUME, "force")
    _gluster("volume", "set", GLUSTER_VOLUME, "server.root-squash", "off")
    SHARED.mkdir(parents=True, exist_ok=True)
    if not os.path.ismount(SHARED):
        run(["mount", "-t", "glusterfs", f"127.0.0.1:/{GLUSTER_VOLUME}", str(SHARED)], timeout=60)
        step(f"shared: mounted GlusterFS {GLUSTER_VOLUME} at {SHARED}")

    ensure_shared_identity()

    def layout_made() -> bool:  # the option reaches the brick within a moment, not at once
        try:
            _shared_layout(SHARED_IDENTITY)
            return True
        except PermissionError:
            return False

    # The option reaches the brick when it reloads its graph: usually within seconds, but once over 30 s
    # on a busy 2-core machine (2026-11-28), so allow 90.
    if not wait_for(layout_made, 90, 0.5):
        raise Failure(f"could not create the shared layout on {SHARED} with root squash off", GLUSTERD.log)
    _gluster("volume", "set", GLUSTER_VOLUME, "server.root-squash", "on")
    if not wait_for(lambda: _root_squashed(SHARED / "cache"), 90, 0.5):
        raise Failure(f"root is still not squashed on {SHARED} 90 s after server.root-squash on", GLUSTERD.log)
    step(f"shared: {SHARED} is GlusterFS volume {GLUSTER_VOLUME} with root squash on")
    # The admin's view, as from a file server where root is not squashed: a second FUSE mount whose
    # client pid is negative, which GlusterFS exempts from root squash (its own internal clients, such as
    # geo-replication, mount that way). Tests set up and inspect the shared storage as an admin through it.
    SHARED_ADMIN.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not os.path.ismount(SHARED_ADMIN):
        run(["glusterfs", "--volfile-server=127.0.0.1", f"--volfile-id={GLUSTER_VOLUME}", "--client-pid=-1",
             str(SHARED_ADMIN)], timeout=60)
        if not wait_for(lambda: os.path.ismount(SHARED_ADMIN), 30, 0.3):
            raise Failure(f"the admin's mount {SHARED_ADMIN} did not appear", GLUSTERD.log)
        step(f"shared: the admin's view (root not squashed) at {SHARED_ADMIN}")


def stop_shared() -> None:
    _umount_admin_view()
    if os.path.ismount(SHARED):
        run(["umount", str(SHARED)], timeout=60, check=False)
        step(f"shared: unmounted {SHARED}")
    if GLUSTERD.pid() is not None:
        _gluster("volume", "stop", GLUSTER_VOLUME, check=False)  # ends the brick process glusterd started
    step(f"{GLUSTERD.name}: {GLUSTERD.stop(15.0)}")


# ------------------------------------------------------------------------------- dev container registry
# The quick start's image comes from a registry on this host: the site's default [containers] mirror maps
# docker.io to 127.0.0.1:5443 (slurm_bt/site/settings.py), so `python:3.11-slim` is pulled from here.
# Two docker-registry processes share one self-signed CA (openssl): "public" (5443, anonymous pulls,
# the docker.io mirror) and "private" (5444, htpasswd user `dev`, password in registry/private/password,
# root-only) to try DockerAuth by hand. The example image is built from this host's files without
# Docker or network (devcluster/oci_image.py) and pushed once; `up` is idempotent.

REGISTRY_DIR = STATE / "registry"
REGISTRY_PORTS = {"public": 5443, "private": 5444}
# The quick start's image: without it the site file falls back to container_runtime = "none".
EXAMPLE_IMAGES = [("library/python", "3.11-slim")]
# The image examples/multinode_gpu and the README's "Using it" config name, as a CPU stand-in (like the
# placeholder GPUs): the base image plus torch's CPU wheel for the host's python (pip resolves it from the
# machine's index; `torch==2.13.0` is the CPU build these machines carry) and numpy. torchrun, DDP with
# gloo and torch.save work in it; CUDA does not. Built once (cached under /var/tmp/slurm-bt-oci, about a
# minute) and pushed by `up`. BT_DEVCLUSTER_TORCH_IMAGE=0 skips it (devcluster/releases.py does: the
# release roots' python has no such wheel and their tests do not run the examples).
TORCH_IMAGE = ("pytorch/pytorch", "2.7.0-cuda12.8-cudnn9-runtime")
TORCH_PACKAGES = ["torch==2.13.0", "numpy"]


def _registry_daemon(kind: str) -> Daemon:
    return Daemon(f"registry-{kind}", {"docker-registry"}, RUN / f"registry-{kind}.pid",
                  REGISTRY_DIR / kind / "registry.log", ("serve", str(REGISTRY_DIR / kind / "config.yml")))


REGISTRIES = {kind: _registry_daemon(kind) for kind in REGISTRY_PORTS}


def _oci_image():  # devcluster/oci_image.py: a sibling script, imported by path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import oci_image

    return oci_image


def ensure_registry() -> None:
    try:
        _ensure_registry()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:  # the builder's and tools' errors
        raise Failure(f"registry: {e}", REGISTRY_DIR / "public" / "registry.log") from e


def _ensure_registry() -> None:
    missing = [t for t in ("docker-registry", "skopeo", "umoci", "openssl", "htpasswd") if not shutil.which(t)]
    if missing:
        step(f"registry: skipped, not installed: {' '.join(missing)} (scripts/install.sh installs them)")
        return
    oci = _oci_image()
    mkdir(REGISTRY_DIR, 0o755)
    tls = REGISTRY_DIR / "tls"
    for kind, port in REGISTRY_PORTS.items():
        users = None
        if kind == "private":
            pw_file = REGISTRY_DIR / kind / "password"
            (REGISTRY_DIR / kind).mkdir(parents=True, exist_ok=True)
            if not pw_file.is_file():
                pw_file.write_text(secrets.token_urlsafe(18) + "\n")
                os.chmod(pw_file, 0o600)
            users = {"dev": pw_file.read_text().strip()}
        reg = oci.Registry(REGISTRY_DIR / kind, port, users=users, ca_dir=tls, addr=HEAD_ADDR)
        d = REGISTRIES[kind]
        if d.pid() is not None and (not reg.config.is_file()
                                    or f'"addr": "{reg.host}"' not in reg.config.read_text(errors="replace")):
            step(f"{d.name}: moving to {reg.host} ({d.stop()})")  # the layout changed the head's address
        if d.pid() is None:
            reg.prepare()
            with open(d.log, "ab") as out:
                proc = subprocess.Popen(reg.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            d.pidfile.write_text(f"{proc.pid}\n")
            if not wait_for(lambda p=port: socket.create_connection((HEAD_ADDR, p), timeout=0.5).close() is None,
                            20):
                raise Failure(f"{d.name} did not listen on {reg.host}", d.log)
            step(f"{d.name}: started (pid {proc.pid}, https://{reg.host})")
    os.chmod(tls, 0o755)  # noqa: S103 - the CA certificate is read by every user's skopeo (site ca_bundle)
    public = _public_registry()
    for repo, tag in EXAMPLE_IMAGES:
        if oci.has_tag(public, repo, tag):
            continue
        digest = oci.push(oci.base_layout(), "base", public, repo, tag)
        step(f"registry: pushed {repo}:{tag} ({digest}) built from this host's files")
    if os.environ.get("BT_DEVCLUSTER_TORCH_IMAGE", "1") != "0" and not oci.has_tag(public, *TORCH_IMAGE):
        name = f"{TORCH_IMAGE[0]}:{TORCH_IMAGE[1]}"
        step(f"registry: building {name} (python3 + {' '.join(TORCH_PACKAGES)}; about a minute, once)")
        try:
            digest = oci.push(oci.python_image(TORCH_PACKAGES), "image", public, *TORCH_IMAGE)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            # Not fatal: the cluster and the quick start's image do not need it; the next `up` tries again.
            step(f"registry: WARNING: could not build {name}, so examples/multinode_gpu cannot run yet: "
                 f"{str(e)[-500:]}")
        else:
            step(f"registry: pushed {name} ({digest}): a CPU stand-in for the GPU image")


_NAME_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_NAME = re.compile(rf"^(?P<repo>{_NAME_PART}(?:/{_NAME_PART})*)"
                         r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?$")


def dev_registry_repo(name: str) -> tuple[str, str]:
    """(repository, tag) under which the dev registry serves ``name`` as a config writes it.

    The dev registry is the site's mirror for Docker Hub, so names follow Docker Hub's rules:
    ``python:3.11-slim`` is ``library/python:3.11-slim``, a missing tag is ``latest``, and a
    ``docker.io/`` prefix is dropped. A name on another registry is refused: jobs pull only Docker Hub
    names through this mirror (docs/containers.md §6)."""
    ref = name.strip()
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        if first not in ("docker.io", "index.docker.io", "registry-1.docker.io"):
            raise UsageError(f"image {name!r}: the dev registry mirrors Docker Hub only; name the image as on "
                             "Docker Hub (e.g. myteam/trainer:v1)")
        ref = rest
    m = _IMAGE_NAME.match(ref)
    if m is None:
        raise UsageError(f"image {name!r} is not an image name (lowercase path components, optional :tag)")
    repo = m.group("repo")
    return (repo if "/" in repo else f"library/{repo}"), (m.group("tag") or "latest")


def cmd_image(args: list[str]) -> int:
    """``image build NAME [--pip PKG]... [--from DIR]`` and ``image list`` (devcluster/README.md)."""
    import argparse

    parser = argparse.ArgumentParser(prog="devcluster.py image", description="images the dev registry serves")
    sub = parser.add_subparsers(dest="verb", required=True)
    build = sub.add_parser("build", help="build an image from this host's python3 (+ pip packages, + a tree) "
                                         "and serve it under NAME")
    build.add_argument("name", help="the name configs use, as on Docker Hub (python:3.11-slim, myteam/trainer:v1)")
    build.add_argument("--pip", action="append", default=[], metavar="PKG",
                       help="a pip requirement installed for the image's python3 (repeatable)")
    build.add_argument("--from", dest="from_dir", type=Path, metavar="DIR",
                       help="a directory laid over the image's root (DIR/opt/x becomes /opt/x)")
    sub.add_parser("list", help="every image and tag the dev registry serves")
    opts = parser.parse_args(args)
    if opts.verb == "build":  # the input first: a bad name is exit 2 wherever the registry is
        repo, tag = dev_registry_repo(opts.name)
        if opts.from_dir is not None and not opts.from_dir.is_dir():
            raise UsageError(f"image build: --from {opts.from_dir}: not a directory")
    public = _public_registry()
    if REGISTRIES["public"].pid() is None:
        raise Failure("the dev registry is not running: run `devcluster.py up` first")
    if opts.verb == "list":
        for repo, tags in _registry_catalog(public):
            shown = repo.removeprefix("library/")
            for tag in tags:
                print(f"{shown}:{tag}\t{public.host}/{repo}:{tag}")
        return 0
    if os.geteuid() != 0:
        raise Failure("image build: run as root (the build cache under /var/tmp/slurm-bt-oci is root's)")
    oci = _oci_image()
    step(f"image: building {opts.name} from this host's python3" + (f" + {' '.join(opts.pip)}" if opts.pip else "")
         + (f" + {opts.from_dir}/" if opts.from_dir else ""))
    try:
        layout = oci.python_image(list(opts.pip), opts.from_dir)
        digest = oci.push(layout, "image", public, repo, tag)
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        raise Failure(f"image build {opts.name}: {e}") from e
    step(f"image: {public.host}/{repo}:{tag} ({digest}); configs use Image(base_image={opts.name!r})")
    return 0


def _registry_catalog(registry) -> list[tuple[str, list[str]]]:
    """(repository, tags) the registry serves, from its /v2/_catalog and tags/list APIs."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(registry.ca))

    def get(path: str) -> dict:
        with urllib.request.urlopen(f"https://{registry.host}{path}", context=ctx, timeout=20) as r:
            return json.loads(r.read())

    out = []
    for repo in sorted(get("/v2/_catalog?n=1000").get("repositories") or []):
        out.append((repo, sorted(get(f"/v2/{repo}/tags/list").get("tags") or [])))
    return out


def stop_registries() -> None:
    for d in REGISTRIES.values():
        step(f"{d.name}: {d.stop(10.0)}")


def ensure_fuse() -> None:
    """/dev/fuse 0666, as on a normal Debian 12 machine (here it is 0600): job users' ch-run mounts the
    job's squashfs image with FUSE, unprivileged (docs/containers.md §Runtimes)."""
    fuse = Path("/dev/fuse")
    try:
        st = fuse.stat()
    except OSError:
        run(["modprobe", "fuse"], check=False)
        if not fuse.exists():
            step("fuse: /dev/fuse is missing: charliecloud jobs cannot mount their image")
            return
        st = fuse.stat()
    if st.st_mode & 0o666 != 0o666:
        fuse.chmod(0o666)
        step("fuse: /dev/fuse made 0666 (users mount squashfs images)")


# ------------------------------------------------------------------------------- the dev site file
# The dev cluster runs jobs inside their image, as a real site with a container runtime does: `up`
# writes /etc/slurm-bt/site.toml with `container_runtime = "charliecloud"` (every other setting is
# slurm-bt's default, which describes this dev cluster). It never overwrites a file it did not write
# (the marker line); without ch-run, the example image or a usable /dev/fuse it writes "none" and says
# why. The test suite names its own site file (tests/conftest.py): tests choose their runtime.

SITE_FILE = Path("/etc/slurm-bt/site.toml")


def _public_registry():  # the oci_image.Registry that serves the example image
    return _oci_image().Registry(REGISTRY_DIR / "public", REGISTRY_PORTS["public"], ca_dir=REGISTRY_DIR / "tls",
                                 addr=HEAD_ADDR)
SITE_MARKER = "# managed by devcluster/devcluster.py: delete this line to keep your own edits"


def ensure_site_file() -> None:
    if SITE_FILE.exists() and not SITE_FILE.read_text(errors="replace").startswith(SITE_MARKER):
        step(f"site: {SITE_FILE} is the admin's (no marker line): left as it is")
        return
    why = []
    if not shutil.which("ch-run"):
        why.append("ch-run is not installed")
    if not Path("/dev/fuse").exists() or Path("/dev/fuse").stat().st_mode & 0o666 != 0o666:
        why.append("/dev/fuse is not 0666")
    if not why:
        try:
            served = REGISTRIES["public"].pid() is not None and all(
                _oci_image().has_tag(_public_registry(), repo, tag) for repo, tag in EXAMPLE_IMAGES)
        except (OSError, subprocess.SubprocessError):
            served = False
        if not served:
            why.append("the dev registry does not serve the example image")
    runtime = "none" if why else "charliecloud"
    text = (f"{SITE_MARKER}\n"
            "# The dev cluster's site file (docs/site-config.md); anything not set here is slurm-bt's default.\n"
            + (f"# container_runtime is none because {', '.join(why)}.\n" if why else
               "# Jobs run inside their pinned image with Charliecloud (docs/containers.md).\n")
            + f'container_runtime = "{runtime}"\n'
            + ("# The isolated nodes reach the dev registry at the head's address (devcluster/README.md, Nodes).\n"
               f'[containers]\nregistry_mirrors = {{ "docker.io" = "{HEAD_ADDR}:{REGISTRY_PORTS["public"]}" }}\n'
               if LAYOUT == "isolated" else ""))
    mkdir(SITE_FILE.parent, 0o755)
    if SITE_FILE.exists() and SITE_FILE.read_text(errors="replace") == text:
        return
    tmp = SITE_FILE.with_name(f".site.toml.{os.getpid()}")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, SITE_FILE)
    step(f"site: {SITE_FILE}: container_runtime = {runtime}" + (f" ({', '.join(why)})" if why else ""))


def switch_layout(layout: str, count: int) -> None:
    """Stop the nodes of the remembered layout when ``up`` asks for another one, then remember the new one."""
    if (layout, count) == remembered_layout():
        return
    old_layout = LAYOUT
    for d in [*SLURMDS.values(), *MACHINES.values()]:  # the old layout's: a machine's jobs end with it
        step(f"{d.name}: {d.stop()}")
    if old_layout == "isolated":
        nodes = _nodes_mod()
        for name in NODES:
            nodes.remove_node_net(name)
        if layout != "isolated":
            nodes.remove_bridge()
    write_if_changed(LAYOUT_FILE, f"{layout} {count}\n", 0o644)
    set_layout(layout, count)
    step(f"layout: {layout}, {count} nodes")


def cmd_up(shared: str | None = None, layout: tuple[str, int] | None = None) -> int:
    t0 = time.monotonic()
    ensure_packages()
    rel = probe_release()
    use_mariadb_socket(probe_mariadb_socket())
    step(f"release: Slurm {rel.text} (MariaDB socket {MYSQL_SOCK})")
    if layout is not None:
        switch_layout(*layout)
    if LAYOUT == "isolated":
        try:  # before slurmctld: it is reached at the bridge's address, by the host's clients too
            _nodes_mod().ensure_bridge()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            raise Failure(f"nodes: {e}") from e
    ensure_hooks()
    devices_changed = ensure_dirs()
    mode = shared_mode(shared)
    ensure_shared(mode)
    ensure_hooks_file(mode)
    pw = db_password()
    slurm_changed, dbd_changed = write_configs(pw, rel)
    if devices_changed:
        step(f"gpus: placeholder devices (re)created under {DEV}")
    ensure_munge()
    ensure_mariadb(pw)
    ensure_slurmdbd(dbd_changed)
    ensure_slurmctld(slurm_changed)
    ensure_slurmds(slurm_changed or devices_changed)
    SLURM_CONF_STAMP.write_text(slurm_conf_hash() + "\n")
    ensure_nodes_healthy()
    write_cluster_json(rel, mode)
    ensure_registry()
    ensure_fuse()
    ensure_site_file()
    step(f"up: cluster {CLUSTER} (Slurm {rel.text}) ready in {time.monotonic() - t0:.1f}s (state {STATE})")
    return 0


def cmd_down() -> int:
    # Reverse start order. mariadbd first, then its mysqld_safe wrapper (which ignores SIGTERM and exits
    # by itself after a clean server shutdown).
    stop_registries()
    # An isolated node's machine stops after its slurmd: like a node that powers off, its jobs end with it.
    order = [*reversed(SLURMDS.values()), *MACHINES.values(), SLURMCTLD, SLURMDBD, MYSQLD, MYSQLD_SAFE, MUNGED]
    for d in order:
        bound = 30.0 if d is MYSQLD else (3.0 if d is MYSQLD_SAFE else 15.0)
        step(f"{d.name}: {d.stop(bound)}")
    if shared_mode() == "gluster" or GLUSTERD.pid() is not None or os.path.ismount(SHARED):
        stop_shared()
    return 0


def cmd_status() -> int:
    all_up = True
    try:
        print(f"release      Slurm {probe_release().text}")
    except Failure as e:
        print(f"release      unknown ({e})")
    for d in ALL_DAEMONS:
        pid_in_file = d.read_pid()
        pid = d.pid()
        if pid:
            print(f"{d.name:<12} pid {pid:<8} alive")
        else:
            all_up = False
            print(f"{d.name:<12} pid {pid_in_file if pid_in_file else '-':<8} dead")
    for d in REGISTRIES.values():  # informational: a cluster without the registry still runs jobs
        pid = d.pid()
        print(f"{d.name:<12} pid {pid if pid else '-':<8} {'alive' if pid else 'dead'}")
    print(f"layout       {LAYOUT}: " + " ".join(f"{n}={addr}" for n, (addr, _p) in sorted(NODES.items())))
    mode = shared_mode()
    if mode == "gluster":
        pid = GLUSTERD.pid()
        mounted = os.path.ismount(SHARED)
        print(f"{GLUSTERD.name:<12} pid {pid if pid else '-':<8} {'alive' if pid else 'dead'}")
        all_up = all_up and pid is not None and mounted
        print(f"shared       {SHARED}: GlusterFS {GLUSTER_VOLUME}, root squash on, "
              f"{'mounted' if mounted else 'NOT mounted'}")
    else:
        print(f"shared       {SHARED}: local directory")
    if SLURMCTLD.pid():
        try:
            states = node_states()
            print("nodes        " + " ".join(f"{k}={v}" for k, v in sorted(states.items())))
            if any(states.get(n, "missing").rstrip("*~#!%$@^-") not in HEALTHY_NODE_STATES
                   or states.get(n, "").endswith("*") for n in NODES):
                all_up = False
        except Failure:
            all_up = False
    print("status: up" if all_up else "status: not (fully) up")
    return 0 if all_up else 1


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "image":
        set_layout(*remembered_layout())  # the registry's address depends on it
        try:
            return cmd_image(argv[2:])
        except Failure as e:
            print(f"ERROR: {e}", file=sys.stderr)
            return 2 if isinstance(e, UsageError) else 1
    shared = None
    layout: tuple[str, int] | None = None
    opts = argv[2:] if len(argv) >= 2 and argv[1] == "up" else []
    argv = argv[:2] if opts else argv
    while opts:  # up [--shared MODE] [--isolated [--nodes N] | --host-nodes]
        if opts[0] == "--shared" and len(opts) >= 2 and opts[1] in SHARED_MODES:
            shared, opts = opts[1], opts[2:]
        elif opts[0] == "--isolated":
            layout, opts = ("isolated", layout[1] if layout else DEFAULT_ISOLATED_NODES), opts[1:]
        elif opts[0] == "--nodes" and len(opts) >= 2 and opts[1].isdigit() and 1 <= int(opts[1]) <= 8:
            layout, opts = ("isolated", int(opts[1])), opts[2:]
        elif opts[0] == "--host-nodes":
            layout, opts = ("host", 2), opts[1:]
        else:
            argv = []
            break
    if len(argv) != 2 or argv[1] not in ("up", "down", "status"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if os.geteuid() != 0 and argv[1] != "status":
        print("devcluster: must run as root", file=sys.stderr)
        return 2
    os.umask(0o022)
    try:
        if argv[1] != "status":  # serialise concurrent up/down runs
            STATE.mkdir(parents=True, exist_ok=True)
            lock = open(STATE / ".lock", "w")
            fcntl.flock(lock, fcntl.LOCK_EX)
        set_layout(*remembered_layout())
        if argv[1] == "up":
            return cmd_up(shared, layout)
        return {"down": cmd_down, "status": cmd_status}[argv[1]]()
    except Failure as e:
        print(f"ERROR: {e}", file=sys.stderr)
        if e.log is not None:
            print(f"--- last lines of {e.log} ---\n{tail(e.log)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
