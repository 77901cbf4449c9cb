"""``slurm-bt admin install`` and ``slurm-bt admin doctor``: put the hooks on a node and check it.

Why a command and not a copy step in the docs: the hook wrappers must name an absolute interpreter
(slurmd gives hooks no ``PATH``), the storage roots must exist with exact
owners and modes before the first job (a missing root drains the node), and the slurm.conf lines
must match what the hooks assume. ``install`` does all of it and prints the config lines; ``doctor``
re-checks a node and prints each problem with its fix (exit 1 if anything is wrong).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from slurm_bt.cli.errors import handle_errors
from slurm_bt.errors import SlurmCommandError
from slurm_bt.posix.layout_owner import LayoutOwner, LayoutOwnerError
from slurm_bt.slurm.release import FEATURES, SlurmRelease, feature, features_in_use, parse_release, slurm_release

if TYPE_CHECKING:
    from slurm_bt.site.hook_settings import HookSettings
    from slurm_bt.site.settings import SiteSettings
    from slurm_bt.slurm.client import SlurmClient

__all__ = [
    "HANDOFF_UNIT",
    "Check",
    "admin_group",
    "container_runtime_checks",
    "doctor_checks",
    "release_checks",
    "render_handoff_units",
    "render_wrapper",
    "root_squash_checks",
    "slurm_conf_lines",
    "squashed_as",
]

_WRAPPER = """#!/bin/sh
# slurm-bt {kind} wrapper, written by `slurm-bt admin install` (contract: {kind}/README.md).
# slurmd runs it as root with no PATH: absolute interpreter, isolated Python (-I).
PY={python}
if [ ! -x "$PY" ]; then
    echo "slurm-bt {kind}: DRAIN: interpreter $PY is missing; fix: reinstall slurm-bt, rerun slurm-bt admin install" >&2
    exit 1
fi
exec "$PY" -I -m slurm_bt.hooks.{kind}{args}
"""


_UNQUOTED_UNSAFE = " \t\n'\"$`\\"


def _plain_abs_path(value: str, unsafe: str = _UNQUOTED_UNSAFE) -> bool:
    """An absolute path that can be written unquoted into a shell script or a unit file."""
    return value.startswith("/") and not any(c in value for c in unsafe)


def render_wrapper(kind: str, python: str, config: str | None, site: str | None) -> str:
    """The text of a hook wrapper (``kind`` is ``prolog`` or ``epilog``)."""
    if not _plain_abs_path(python):
        raise click.BadParameter(f"interpreter must be an absolute path without spaces or quotes: {python!r}")
    args = ""
    for flag, value in (("--config", config), ("--site", site)):
        if value:
            if not _plain_abs_path(value):
                raise click.BadParameter(f"{flag} must be an absolute path without spaces or quotes")
            args += f" {flag} {value}"
    return _WRAPPER.format(kind=kind, python=python, args=args)


_HANDOFF_SERVICE = """# slurm-bt: finish checkpoint uploads handed off by the epilog on Slurm node %i
# (written by `slurm-bt admin install`; docs/checkpoints.md). Enable: systemctl enable --now {timer}
[Unit]
Description=slurm-bt checkpoint hand-off sweep for node %i
After=network-online.target

[Service]
Type=oneshot
Nice=10
{environment}ExecStart={python} -I -m slurm_bt.checkpoints.handoff --node %i
"""

_HANDOFF_TIMER = """# slurm-bt: periodic checkpoint hand-off sweep for Slurm node %i (slurm-bt admin install).
[Unit]
Description=slurm-bt checkpoint hand-off sweep for node %i (timer)

[Timer]
OnBootSec=5min
OnUnitActiveSec=15min
RandomizedDelaySec=60

[Install]
WantedBy=timers.target
"""

HANDOFF_UNIT = "slurm-bt-resume-handoffs@"


def render_handoff_units(python: str, site: str | None) -> dict[str, str]:
    """The systemd template units (instance = Slurm node name) of the periodic hand-off sweep.

    The epilog already starts a sweep when it hands something off; this catches what a reboot or a
    store outage left behind.
    """
    for what, value in (("interpreter", python), ("--site", site)):
        if value is not None and not _plain_abs_path(value, _UNQUOTED_UNSAFE + "%"):  # % is a systemd specifier
            raise click.BadParameter(f"{what} must be an absolute path without spaces, quotes or %: {value!r}")
    environment = f"Environment=SLURM_BT_SITE_CONFIG={site}\n" if site else ""
    timer = f"{HANDOFF_UNIT}<node>.timer"
    return {
        f"{HANDOFF_UNIT}.service": _HANDOFF_SERVICE.format(timer=timer, environment=environment, python=python),
        f"{HANDOFF_UNIT}.timer": _HANDOFF_TIMER,
    }


def slurm_conf_lines(prolog: str, epilog: str, deadline_s: float, gres: dict[str, str],
                     release: SlurmRelease | None = None) -> list[str]:
    """The slurm.conf (and gres.conf) lines the hooks assume, with one comment line each.

    ``release`` (the Slurm release being configured; ``None``: unknown, 22.05's lines, which every
    later release still accepts) adds what newer releases offer (slurm_bt/slurm/release.py FEATURES).
    """
    timeout = max(120, int(deadline_s) + 30)
    # What this release has (the lines below switch on the features that need a switch).
    has = {f.name: release is not None and release.at_least(*f.since) for f in FEATURES}
    flags = "Alloc,Contain,DeferBatch" + (",ForceRequeueOnFail" if has["prolog_force_requeue_on_fail"] else "")
    lines = [
        "# --- slurm.conf ---" + (f" (Slurm {release})" if release is not None else ""),
        f"Prolog={prolog}",
        f"Epilog={epilog}",
        "# Alloc: prolog at allocation on every node; Contain: extern step; DeferBatch: the batch",
        "# script starts only after the prolog finished on ALL nodes (22.05: DeferBatch does not imply Alloc).",
    ]
    if has["prolog_force_requeue_on_fail"]:
        lines.append("# ForceRequeueOnFail (>= 23.02): a job whose prolog found a node fault is requeued onto "
                     "another node,")
        lines.append("# even when it asked for no requeue (a user mistake never fails the prolog: it fails the job).")
    lines.append(f"PrologFlags={flags}")
    lines.append(f"# Default is to wait forever; the hooks stop themselves after deadline_s={deadline_s:.0f} s.")
    if has["split_hook_timeouts"]:
        lines.append("# >= 25.05: one bound per hook (PrologEpilogTimeout is deprecated).")
        lines += [f"PrologTimeout={timeout}", f"EpilogTimeout={timeout}"]
    else:
        lines.append(f"PrologEpilogTimeout={timeout}")
    if has["requeue_expedite"]:
        lines.append("# >= 25.11: requeued long runs start again at once with top priority (--requeue=expedite);")
        lines.append("# merge it into an existing SlurmctldParameters line (a second line replaces the first).")
        lines.append("SlurmctldParameters=enable_expedited_requeue")
    lines += [
        "# Optional: a prolog failure requeues the job pending instead of held.",
        "SchedulerParameters=nohold_on_prolog_fail",
        "GresTypes=gpu",
        "AccountingStorageTRES=gres/gpu",
        "# job_comment keeps slurm-bt's submission id in sacct; add job_script,job_env only if coordinators",
        "# and admins may read every job's script and submit environment.",
        "AccountingStoreFlags=job_comment",
        "# Comments, work dirs and commands are visible to every user by default:",
        "PrivateData=jobs,usage",
        "# In each NodeName= line: Gres=gpu:<type>:<count>, and a feature of the node's own, e.g. its name",
        "# (NodeName=gpu07 Features=gpu07): jobs then prefer nodes that hold their weights (--prefer).",
    ]
    lines.append("# --- gres.conf ---")
    for accel, gtype in sorted(gres.items()):
        lines.append(f"# {accel}: NodeName=<nodes> Name=gpu Type={gtype} File=/dev/nvidia[0-7]")
    return lines


@dataclass(frozen=True)
class Check:
    """One doctor finding: ``ok`` or a problem with its fix."""

    name: str
    ok: bool
    problem: str = ""
    fix: str = ""
    warn: bool = False
    #: Not a finding: what doctor saw (the release, the features in use), printed as ``info``.
    info: bool = False


def _slurm() -> SlurmClient:
    from slurm_bt.cli.options import make_client

    client = make_client()
    client.timeout_s = 20  # doctor must answer even when slurmctld hangs
    return client


def _scontrol_config() -> dict[str, str] | None:
    """slurmctld's running config; ``None`` when scontrol fails (the doctor reports that)."""
    try:
        return _slurm().config()
    except SlurmCommandError:
        return None


def _local_nodes() -> list[str]:
    """Slurm node names served by this host (several in the dev cluster)."""
    host = socket.gethostname().split(".")[0]
    try:
        nodes = _slurm().nodes()
    except SlurmCommandError:
        return [host]
    names = [n["NodeName"] for n in nodes
             if n.get("NodeName") and n.get("NodeHostName", "").split(".")[0] == host]
    # A login or head host runs no slurmd: it has no node-local disks to check, and its own name
    # expanded into the %n roots would report a "missing scratch root" that no node has.
    return names if nodes else [host]


def _check_root_dir(name: str, path: str, *, allow_sticky: bool = False) -> Check:
    from slurm_bt.posix.safefs import UntrustedPath, open_trusted_dir

    try:
        fd = open_trusted_dir(path, allow_sticky_final=allow_sticky)
    except FileNotFoundError:
        return Check(name, False, f"{path} does not exist", f"mkdir -p {path} && chown root:root {path} && "
                     f"chmod 0755 {path} (or `slurm-bt admin install`)")
    except UntrustedPath as exc:
        return Check(name, False, str(exc), f"chown root:root and chmod go-w each component of {path}")
    except OSError as exc:
        return Check(name, False, f"{path}: {exc.strerror}", "check the mount")
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o002:
            return Check(name, False, f"{path} is world-writable (mode {stat.S_IMODE(st.st_mode):04o}): users can "
                         "pre-create job directories", f"chmod 0755 {path}", warn=True)
    finally:
        os.close(fd)
    return Check(name, True)


def _handoff_area_check(node: str, storage: dict[str, str], max_age_s: float = 3600.0) -> Check:
    """Hand-offs still waiting an hour after the epilog: its background sweep did not finish them."""
    import time

    from slurm_bt.checkpoints.locations import handoff_root

    area = Path(handoff_root(storage, node))
    try:  # an empty entry holds nothing to upload (the sweep removes it)
        entries = [e for e in area.iterdir() if e.is_dir() and not e.is_symlink() and any(e.iterdir())]
    except OSError:
        entries = []
    now = time.time()
    old = sorted(e.name for e in entries if now - e.stat().st_mtime > max_age_s)
    if not old:
        return Check(f"checkpoint hand-off area on {node}", True)
    return Check(f"checkpoint hand-off area on {node}", False,
                 f"{len(old)} hand-off(s) older than {max_age_s / 3600:g} h not uploaded yet in {area}: "
                 f"{', '.join(old[:5])}{' ...' if len(old) > 5 else ''}",
                 f"see the hook log for the sweep's errors, run `slurm-bt checkpoints resume-handoffs --node {node}` "
                 f"and enable the periodic sweep (slurm-bt admin install --systemd-dir)", warn=True)


def _proctrack_check(proctrack: str) -> Check:
    """Who ends the processes a job leaves behind (setsid, nohup, double forks): Slurm or our epilog."""
    if proctrack == "proctrack/cgroup":
        return Check("leftover processes", True, f"ProctrackType={proctrack}: Slurm ends every process of a job")
    return Check("leftover processes", True,
                 f"ProctrackType={proctrack or '(unset)'}: processes that leave a job's process tree are ended by "
                 "the slurm-bt epilog when their user has no other job on this host (epilog/README.md)")


def _squats_check(node: str, state_root: str) -> Check:
    """Names that had to belong to someone, found taken by another user (records: slurm_bt.posix.squat_records)."""
    import time

    from slurm_bt.posix.squat_records import SQUATS_DIR, read_squats

    squats = read_squats(node, state_root)
    if not squats:
        return Check(f"squatted directories on {node}", True)
    shown = "; ".join(
        f"{sq.path} ({sq.kind} of uid {sq.owner_uid}, needed by uid {sq.victim_uid} job {sq.job_id}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(sq.seen_at))}"
        + (f", {sq.count} times" if sq.count > 1 else "") + f": {sq.action})" for sq in squats[:5])
    return Check(f"squatted directories on {node}", False,
                 f"{len(squats)} seen: {shown}" + (" ..." if len(squats) > 5 else ""),
                 "ask the owning users why (the hooks already sidestepped them); then "
                 f"`rm {state_root}/{node}/{SQUATS_DIR}/*.json`", warn=True)


def _runtime_root_check(template: str) -> Check:
    """The prolog creates ``slurm-bt-<uid>`` root-side here; a root a user could replace defeats that."""
    from slurm_bt.posix.safefs import UntrustedPath, open_trusted_dir

    root = template if "{" not in template else template.split("{", 1)[0].rstrip("/")
    try:
        os.close(open_trusted_dir(root or "/", allow_sticky_final=True))
    except FileNotFoundError:
        return Check("runtime root", False, f"{root} does not exist", f"mount a tmpfs at {root}", warn=True)
    except UntrustedPath as exc:
        return Check("runtime root", False, f"{exc}: users could take each other's runtime directories",
                     f"chown root:root {root} and chmod 1777 (or 0755) it", warn=True)
    except OSError as exc:
        return Check("runtime root", False, f"{root}: {exc.strerror}", "check the tmpfs", warn=True)
    return Check("runtime root", True)


def _timeout_value(conf: dict[str, str], key: str) -> int | None:
    """``PrologTimeout = 120`` / ``120 sec`` → 120; absent, unset or unreadable → ``None``."""
    raw = conf.get(key, "").split()
    try:
        return int(raw[0]) if raw else None
    except ValueError:
        return None


def _hook_timeout_checks(conf: dict[str, str], release: SlurmRelease | None, deadline_s: float) -> list[Check]:
    """How long slurmd lets each hook run: past the hooks' own deadline, but not for ever (65534: unset).

    From 25.05 the bound is per hook (``PrologTimeout``, ``EpilogTimeout``; each defaults to the
    deprecated ``PrologEpilogTimeout``); before, one ``PrologEpilogTimeout`` bounds both.
    """
    want = int(deadline_s) + 30
    common = _timeout_value(conf, "PrologEpilogTimeout")
    split = release is not None and release.at_least(*feature("split_hook_timeouts").since)
    keys = ("PrologTimeout", "EpilogTimeout") if split else ("PrologEpilogTimeout",)
    out: list[Check] = []
    for key in keys:
        value = _timeout_value(conf, key) if split else common
        if value is None and split:
            value = common  # 25.05+: an unset per-hook timeout falls back to PrologEpilogTimeout
        value = 65534 if value is None else value
        if value >= 65534 or value < deadline_s + 10:
            fix = f"{key}={want}" if not split else f"PrologTimeout={want} and EpilogTimeout={want} (Slurm >= 25.05)"
            out.append(Check(key, False, f"{key}={value} with hook deadline_s={deadline_s:.0f}", fix))
        else:
            out.append(Check(key, True))
    return out


def release_checks(release: SlurmRelease | None, conf: dict[str, str],
                   nodes: list[dict[str, str]] | None = None, node_cache: str | None = None) -> list[Check]:
    """``info`` lines: the Slurm release and, per feature of newer releases, whether slurm-bt uses it.

    ``nodes`` (``scontrol show node``) tells whether ``--prefer`` can favour a node: only a node with
    a feature of its own can be (slurm_bt/slurm/prefer.py); ``node_cache`` (the site's root) whether
    bt-sbatch can tell the nodes' caches apart (it needs ``%n``, slurm_bt/weights/placement.py).
    """
    from slurm_bt.slurm.prefer import prefer_expression

    if release is None:
        return [Check("Slurm release", True, "unknown (neither SLURM_VERSION nor `scontrol --version` says); "
                      "no optional feature is used", info=True)]
    out = [Check("Slurm release", True, f"Slurm {release} (docs/slurm-releases.md)", info=True)]
    in_use = features_in_use(release, conf)
    for f in FEATURES:
        if in_use[f.name] and f.name == "prefer" and nodes is not None and not any(
                prefer_expression(nodes, [n.get("NodeName", "")]) for n in nodes):
            state = ("available, no effect: no node has a feature of its own to prefer it by "
                     "(e.g. NodeName=gpu07 Features=gpu07)")
        elif in_use[f.name] and f.name == "prefer" and node_cache is not None and "%n" not in node_cache:
            state = f"available, no effect: storage.node_cache ({node_cache}) does not name the node (%n)"
        elif in_use[f.name]:
            state = "in use"
        elif not release.at_least(*f.since):
            state = f"not on {release.major:02d}.{release.minor:02d}"
        elif f.needs_config is not None:
            state = f"available, off: add {f.needs_config[1]} to {f.needs_config[0]}"
        else:
            state = "available"
        out.append(Check(f"feature {f.name} (>= {f.since_text})", True, f"{state}: {f.what}", info=True))
    return out


def _node_weights_bounds_check(node: str, site: SiteSettings, settings: HookSettings) -> Check:
    """What still bounds a node miss on ``node`` (slurm_bt/weights/node_stager.py ``node_bounds``)."""
    from slurm_bt.site.settings import expand_path
    from slurm_bt.weights.node_stager import node_bounds, policy_from_settings

    root = expand_path(site.storage.node_cache, user="root", uid=0, home="/root", node=node)
    if not os.path.isdir(root):
        return Check(f"node weights cache bounds on {node}", True, f"{root} not created yet (the first job "
                     "with weights creates it)", info=True)
    ok, line = node_bounds(root, site.weights.node_cache_max_bytes, site.weights.node_cache_reserve_bytes,
                           policy_from_settings(settings))
    return Check(f"node weights cache bounds on {node}", ok, line,
                 "" if ok else "free space on the node-local disk or raise weights.node_cache_max_bytes", info=ok)


# -- container runtimes (docs/admin.md §Container runtimes) ------------------------------------------------

PLUGSTACK_FILES = ("/etc/slurm/plugstack.conf", "/etc/slurm-llnl/plugstack.conf")


def _fuse_open_as(user: str, path: str = "/dev/fuse") -> str | None:
    """Open ``path`` read-write as ``user`` (posix.privdrop.run_as_uid: forked, dropped, bounded);
    None if it worked, else the error."""
    import pwd

    from slurm_bt.posix.privdrop import ChildError, run_as_uid

    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return f"no user {user!r} to try with"

    def try_open() -> None:
        os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))

    try:
        run_as_uid(try_open, uid=pw.pw_uid, gid=pw.pw_gid, timeout_s=10.0)
    except ChildError as exc:
        return str(exc) or "failed"
    return None


def container_runtime_checks(runtime: str, *, which: Callable[[str], str | None] = shutil.which,
                             fuse: str = "/dev/fuse", plugstack: tuple[str, ...] = PLUGSTACK_FILES,
                             probe_user: str | None = "nobody") -> list[Check]:
    """One line per thing the site's ``container_runtime`` needs on this host, each with what to do.

    charliecloud: ``ch-run`` (and ``unsquashfs`` when this Charliecloud has no ``--write-fake``:
    slurm_bt/render/batch_script.py CH_RUN_PRELUDE) and a ``/dev/fuse`` users can open (ch-run mounts
    the squashfs with FUSE, unprivileged); pyxis: ``enroot`` and the pyxis SPANK plugin in
    plugstack.conf; apptainer: ``apptainer``. ``probe_user`` opens /dev/fuse for real when doctor runs
    as root (mode bits alone miss an LSM or a device cgroup rule).
    """
    import subprocess

    if runtime == "none":
        return [Check("container runtime", True, "none: jobs run on the nodes, images are ignored", info=True)]
    checks: list[Check] = []
    if runtime == "charliecloud":
        ch_run = which("ch-run")
        if ch_run is None:
            return [Check("charliecloud (ch-run)", False, "ch-run is not installed",
                          "apt-get install charliecloud-runtime squashfs-tools (every compute node)")]
        env = dict(os.environ, USER=os.environ.get("USER", "root"))
        try:
            fake = subprocess.run([ch_run, "--feature=overlayfs"], capture_output=True, env=env, timeout=10,
                                  check=False).returncode == 0
        except (OSError, subprocess.SubprocessError):
            fake = False
        if fake:
            checks.append(Check("charliecloud (ch-run)", True,
                                f"{ch_run}: --write-fake (the squashfs is run as it is)"))
        elif which("unsquashfs") is None:
            checks.append(Check("charliecloud (ch-run)", False, f"{ch_run} has no --write-fake (Charliecloud < 0.33) "
                                "and unsquashfs is missing: jobs cannot unpack their image",
                                "apt-get install squashfs-tools (or Charliecloud >= 0.33)"))
        else:
            checks.append(Check("charliecloud (ch-run)", True, f"{ch_run}: no --write-fake (Charliecloud < 0.33): each "
                                "job unpacks its image into node-local scratch (seconds per GB; >= 0.33 avoids it)"))
        try:
            st = os.stat(fuse)
        except OSError as exc:
            checks.append(Check("/dev/fuse", False, f"{fuse}: {exc.strerror}", "modprobe fuse"))
            return checks
        if not stat.S_ISCHR(st.st_mode) or (st.st_mode & 0o006) != 0o006:
            checks.append(Check("/dev/fuse", False, f"{fuse} is mode {stat.S_IMODE(st.st_mode):04o}: users cannot "
                                "mount their job's squashfs", f"chmod 0666 {fuse} (and a udev rule: "
                                'KERNEL=="fuse", MODE="0666")'))
        elif os.geteuid() == 0 and probe_user and (err := _fuse_open_as(probe_user, fuse)) is not None:
            checks.append(Check("/dev/fuse", False, f"{probe_user} cannot open {fuse}: {err}",
                                "check the device cgroup / LSM policy for /dev/fuse"))
        else:
            checks.append(Check("/dev/fuse", True))
    elif runtime == "pyxis":
        checks.append(Check("pyxis (enroot)", which("enroot") is not None, "" if which("enroot") else
                            "enroot is not installed", "install enroot (+ enroot+caps) on every compute node"))
        files = [Path(p) for p in plugstack]
        files += [f for p in plugstack for f in sorted(Path(p + ".d").glob("*.conf"))]
        found = any("spank_pyxis.so" in f.read_text(errors="replace") for f in files if f.is_file())
        checks.append(Check("pyxis (plugstack.conf)", found, "" if found else
                            "no spank_pyxis.so line in plugstack.conf", "add `required /usr/lib/slurm/"
                            "spank_pyxis.so` to plugstack.conf (or plugstack.conf.d/pyxis.conf), restart slurmd"))
    elif runtime == "apptainer":
        checks.append(Check("apptainer", which("apptainer") is not None, "" if which("apptainer") else
                            "apptainer is not installed", "install apptainer on every compute node"))
    return checks
# -- end container runtimes


def squashed_as(folder: str) -> str | None:
    """Who root acts as on ``folder``'s filesystem when root is squashed there, else None.

    A root-squashing export (NFS's default ``root_squash``, a Lustre nodemap without ``admin``, GlusterFS's
    ``server.root-squash``) maps root to an unprivileged identity: a file root creates is owned by that
    uid, and where that identity may not write (a root-owned 0755 directory) root's create is refused
    although root owns the directory and has write permission. The probe is a file created and removed
    again; None also when the folder cannot be probed (missing, read-only: other checks report those)."""
    probe = os.path.join(folder, f".bt-doctor-squash-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    except PermissionError:
        try:
            st = os.stat(folder)
        except OSError:
            return None
        return "an unprivileged user" if st.st_uid == 0 and st.st_mode & stat.S_IWUSR else None
    except OSError:
        return None
    try:
        uid = os.fstat(fd).st_uid
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return f"uid {uid}" if uid != 0 else None


SQUASH_FIX = ("name a service account in hooks.toml (shared_fs_identity = \"slurmbt\": a user in every team group, "
              "the same uid on the file servers), then run `slurm-bt admin install` once from a host where root is "
              "not squashed; or export the filesystem to the compute nodes without root squash (docs/admin.md "
              "\"Root-squashed shared filesystems\")")


def _identity_dir_problem(path: str, owner: LayoutOwner) -> str | None:
    """Why ``path`` is not a directory the layout owner can create team directories in, or None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner.uid or stat.S_IMODE(st.st_mode) & 0o022:
        return f"{path} is not {owner.name}'s 0755 directory (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _squash_feature(feature: str, root: str, owner: LayoutOwner | None, breaks: str, creates_as: str, works: str,
                    *, sub: str = "teams", warn: bool = False) -> list[Check]:
    """One feature's root-squash check: nothing where root is not squashed on ``root``; else whether the
    layout owner (``owner``, None: root) can create what the feature needs in ``<root>/<sub>``."""
    who = squashed_as(root) if os.path.isdir(root) else None
    name = f"root squash: {feature}"
    if who is None:
        return []
    if owner is None:
        return [Check(name, False, f"root acts as {who} on {root}: {breaks}", SQUASH_FIX, warn=warn)]
    problem = _identity_dir_problem(f"{root}/{sub}", owner)
    if problem is not None:
        return [Check(name, False, f"root acts as {who} on {root} and {creates_as} as {owner.name}, but {problem}",
                      "run `slurm-bt admin install` once from a host where root is not squashed", warn=warn)]
    return [Check(name, True, f"root acts as {who}; {owner.name} {works}")]


def root_squash_checks(cache: str, cluster_cache: str, checkpoint_store: str,
                       identity: str | None = None, team_groups: dict[str, str] | None = None) -> list[Check]:
    """Per feature: does it work where root on this node is squashed on the shared filesystem?

    With ``identity`` (hooks.toml ``shared_fs_identity``) the prolog creates team directories as that
    user: the checks then look at what it needs (its directories, its team groups). Only meaningful as
    root; each root is probed where it exists (a missing one is reported elsewhere)."""
    if os.geteuid() != 0:
        return []
    checks: list[Check] = []
    owner: LayoutOwner | None = None
    if identity is not None:
        try:
            owner = LayoutOwner.resolve(identity)
            checks.append(Check(f"shared_fs_identity {identity}", True, f"uid {owner.uid}"))
        except LayoutOwnerError as exc:
            checks.append(Check(f"shared_fs_identity {identity}", False, str(exc),
                                "create the account on every node and file server (the same uid), or fix hooks.toml"))
        if owner is not None:
            import grp

            for account, group in sorted((team_groups or {}).items()):
                with contextlib.suppress(KeyError):
                    problem = owner.group_problem(grp.getgrnam(group).gr_gid)
                    if problem is not None:
                        checks.append(Check(f"shared_fs_identity in team group {group}", False,
                                            f"account {account}: {problem}", f"usermod -aG {group} {owner.name}"))
    reads = ("the node copies read team tiers as the job user, which squashing does not change; the shared "
             "tier must be made from a host that is not squashed")
    checks += _squash_feature("project and team caches", cache, owner,
                              "the prolog creates <cache>/teams/<team> and the project caches as root, so every job "
                              "with CacheConfig enabled is refused (job refused in phase caches: Permission denied)",
                              "the prolog creates team caches", "creates the team caches")
    checks += _squash_feature("weights and images", cluster_cache, owner,
                              f"staging jobs' prologs cannot create {cluster_cache}/teams/<team> as root, so a team's "
                              f"first staging job fails ({reads})",
                              "staging jobs' prologs create team tiers", f"creates the team tiers; {reads}")
    if checkpoint_store.startswith("file://"):
        path = checkpoint_store[len("file://"):].rstrip("/")
        checks += _squash_feature("checkpoint store", path, owner,
                                  f"the prolog cannot create the teams' namespaces {path}/_teams/<team> as root "
                                  "(uploads, the flush and hand-off resumes run as the job user, which squashing "
                                  "does not change)", "the prolog creates the teams' namespaces",
                                  "creates the teams' namespaces; uploads run as the job user", sub="_teams",
                                  warn=True)
    return checks


def doctor_checks(nodes: list[str], config: Path | None, site_path: Path | None) -> list[Check]:
    """Run every check for this host's ``nodes``; see the module docstring."""
    from slurm_bt.posix.job_notes import STATE_ROOT
    from slurm_bt.site.hook_settings import HookConfigError, load_hook_settings, load_trusted_site
    from slurm_bt.site.settings import expand_path

    checks: list[Check] = []
    if os.geteuid() != 0:
        checks.append(Check("running as root", False, "some checks need root", "run `sudo slurm-bt admin doctor`",
                            warn=True))
    try:
        settings = load_hook_settings(config)
        checks.append(Check("hook policy (hooks.toml)", True))
    except HookConfigError as exc:
        checks.append(Check("hook policy (hooks.toml)", False, str(exc), exc.fix))
        return checks
    try:
        site = load_trusted_site(site_path)
        checks.append(Check("site file (site.toml)", True))
    except HookConfigError as exc:
        checks.append(Check("site file (site.toml)", False, str(exc), exc.fix))
        return checks

    conf = _scontrol_config()
    if conf is None:
        checks.append(Check("slurm config", False, "`scontrol show config` failed", "check slurmctld and munge"))
    else:
        for key, kind in (("Prolog", "prolog"), ("Epilog", "epilog")):
            value = conf.get(key, "(null)")
            if f"slurm-bt-{kind}" not in value:
                checks.append(Check(f"slurm.conf {key}", False, f"{key}={value}",
                                    f"set {key}=<prefix>/libexec/slurm-bt/slurm-bt-{kind} (slurm-bt admin install)"))
                continue
            p = Path(value)
            try:
                st = p.stat()
                ok = st.st_uid == 0 and not st.st_mode & 0o022 and os.access(p, os.X_OK)
                text = p.read_text(errors="replace")
                py = next((ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("PY=")), None)
            except OSError as exc:
                checks.append(Check(f"{key} script", False, f"{value}: {exc.strerror}", "slurm-bt admin install"))
                continue
            if not ok:
                checks.append(Check(f"{key} script", False, f"{value} must be root-owned, executable, not writable "
                                    "by others", f"chown root:root {value} && chmod 0755 {value}"))
            elif py and not os.access(py, os.X_OK):
                checks.append(Check(f"{key} script", False, f"interpreter {py} is missing", "slurm-bt admin install"))
            else:
                checks.append(Check(f"{key} script", True))
        release = parse_release(conf.get("SLURM_VERSION", "")) or slurm_release(_slurm())
        try:
            known_nodes: list[dict[str, str]] | None = _slurm().nodes()
        except SlurmCommandError:
            known_nodes = None
        checks += release_checks(release, conf, known_nodes, site.storage.node_cache)
        flags = conf.get("PrologFlags", "")
        if "Alloc" not in flags or "DeferBatch" not in flags:
            checks.append(Check("PrologFlags", False, f"PrologFlags={flags}",
                                "PrologFlags=Alloc,Contain,DeferBatch (prolog on every node before the batch step)"))
        elif release is not None and release.at_least(*feature("prolog_force_requeue_on_fail").since) and \
                "ForceRequeueOnFail" not in flags.split(","):
            checks.append(Check("PrologFlags", True, f"add ForceRequeueOnFail (Slurm >= 23.02): PrologFlags={flags},"
                                "ForceRequeueOnFail requeues a job whose prolog found a node fault onto another node "
                                "even when it asked for no requeue"))
        else:
            checks.append(Check("PrologFlags", True))
        checks.append(_proctrack_check(conf.get("ProctrackType", "")))
        checks += _hook_timeout_checks(conf, release, settings.deadline_s)
        if "gres/gpu" not in conf.get("AccountingStorageTRES", ""):
            checks.append(Check("AccountingStorageTRES", False, "GPUs are not accounted",
                                "AccountingStorageTRES=gres/gpu"))
        if "jobs" not in conf.get("PrivateData", ""):
            checks.append(Check("PrivateData", False, "every user can read other jobs' comments and commands",
                                "PrivateData=jobs,usage (in slurm.conf and slurmdbd.conf)", warn=True))

    for node in nodes:
        pw_kw = {"user": "root", "uid": 0, "home": "/root", "node": node}
        scratch = expand_path(site.storage.scratch, **pw_kw)  # type: ignore[arg-type]
        chk = _check_root_dir(f"scratch root on {node}", scratch, allow_sticky=True)
        checks.append(chk)
        if chk.ok:
            vfs = os.statvfs(scratch)
            free_mib = vfs.f_bavail * vfs.f_frsize // (1024 * 1024)
            if free_mib < settings.scratch_min_free_mib:
                checks.append(Check(f"scratch space on {node}", False, f"{free_mib} MiB free < "
                                    f"{settings.scratch_min_free_mib} MiB", "free space on the node-local disk"))
            from slurm_bt.checkpoints.locations import HANDOFF_RECORDS_DIR

            handoff = Path(scratch) / HANDOFF_RECORDS_DIR
            if handoff.is_dir() and (pending := sorted(handoff.glob("*.json"))):
                checks.append(Check(f"checkpoint hand-offs on {node}", False, f"{len(pending)} job(s) left "
                                    f"checkpoints that were not confirmed uploaded: {handoff}",
                                    "upload or archive them, then remove the job dirs and records", warn=True))
        checks.append(_handoff_area_check(node, site.storage.model_dump()))
        checks.append(_node_weights_bounds_check(node, site, settings))
        from slurm_bt.checkpoints.handoff import quarantined_handoffs  # hand-offs that failed max_failures times

        if quarantined := quarantined_handoffs(site.storage.model_dump(), node):
            checks.append(Check(f"quarantined hand-offs on {node}", False, f"{len(quarantined)}: " + "; ".join(
                q.line() for q in quarantined[:5]), "fix the cause (hook log), then `slurm-bt checkpoints "
                f"resume-handoffs --node {node} --retry-quarantined`, or let max_age_s remove them", warn=True))
        checks.append(_squats_check(node, STATE_ROOT))
        fault = Path(f"{STATE_ROOT}/{node}/last-fault")
        if fault.is_file():
            checks.append(Check(f"last hook fault on {node}", False, fault.read_text(errors="replace").strip(),
                                f"fix the cause, `rm {fault}`, then `scontrol update nodename={node} state=resume`",
                                warn=True))
    checks.append(_runtime_root_check(site.storage.runtime))
    checks += container_runtime_checks(site.container_runtime)
    cache = expand_path(site.storage.cache, user="root", uid=0, home="/root")
    squash = root_squash_checks(cache, expand_path(site.storage.cluster_cache, user="root", uid=0, home="/root"),
                                site.storage.checkpoint_store, settings.shared_fs_identity, settings.team_groups)
    checks += squash
    chk = _check_root_dir("shared cache root", cache)
    checks.append(chk)
    if chk.ok and not any(c.name == "root squash: project and team caches" for c in squash):
        probe = Path(cache) / f".doctor-{os.getpid()}"
        try:
            probe.mkdir()
            from slurm_bt.posix.safefs import set_default_group_acl

            fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
            try:
                acl = set_default_group_acl(fd)
            finally:
                os.close(fd)
            checks.append(Check("shared cache ACLs", acl, "" if acl else "no POSIX ACL support on the cache "
                                "filesystem", "" if acl else "mount with acl, or tell users to set umask 0007",
                                warn=not acl))
        except OSError as exc:
            checks.append(Check("shared cache writable", False, f"{cache}: {exc.strerror}", "check the mount"))
        finally:
            shutil.rmtree(probe, ignore_errors=True)
    import grp

    for account, group in sorted(settings.team_groups.items()):
        try:
            grp.getgrnam(group)
        except KeyError:
            checks.append(Check(f"team group of account {account}", False, f"group {group!r} does not exist",
                                f"groupadd {group} (on every node) or fix [team_groups]"))
    store = site.storage.checkpoint_store
    if store.startswith("file://"):
        path = store[len("file://"):]
        checks.append(Check("checkpoint store", os.path.isdir(path), "" if os.path.isdir(path) else
                            f"{path} does not exist", f"mkdir -p {path} on the shared filesystem"))
    else:
        checks.append(Check("checkpoint store", True, f"{store}: remote store not probed", ""))
    return checks


@dataclass(frozen=True)
class LayoutDir:
    """A directory of the shared layout that ``admin install`` creates once (docs/admin.md)."""

    path: str
    owner: str
    mode: int
    why: str


def shared_layout(site: SiteSettings, identity: str | None) -> list[LayoutDir]:
    """The shared filesystem's directories an admin creates once, parents first (pure).

    Why here: the prolog creates team directories *in* them as the layout owner (root, or the
    ``shared_fs_identity`` where root is squashed), so they must exist with the right owner before
    the first job; where root is squashed only a host without the squash can create root's.
    """
    from slurm_bt.site.settings import expand_path

    owner = identity or "root"

    def path(template: str) -> str:
        return expand_path(template, user="root", uid=0, home="/root").rstrip("/")

    cache, cluster = path(site.storage.cache), path(site.storage.cluster_cache)
    out = [LayoutDir(cache, "root", 0o755, "project and team caches"),
           LayoutDir(f"{cache}/teams", owner, 0o755, "the prolog creates <team> in it"),
           LayoutDir(cluster, "root", 0o755, "weights and images cluster cache"),
           LayoutDir(f"{cluster}/shared", "root", 0o755, "the admin-curated shared tier"),
           LayoutDir(f"{cluster}/teams", owner, 0o755, "staging jobs' prologs create <team> in it")]
    store = site.storage.checkpoint_store
    if store.startswith("file://"):
        root = store[len("file://"):].rstrip("/")
        out.append(LayoutDir(root, "root", 0o1777, "the file:// checkpoint store (legacy project directories)"))
        out.append(LayoutDir(f"{root}/_teams", owner, 0o755, "the prolog creates each team's namespace in it"))
    return out


def _install_shared_layout(dirs: list[LayoutDir], dry_run: bool) -> bool:
    """Create ``dirs`` (owner and mode corrected on root-owned or the owner's own); True if any failed.

    A directory that exists with another owner is left alone and reported: it may be a user's squat,
    which an admin removes by hand, never chowned to the layout owner here.
    """
    import pwd

    failed = False
    for d in dirs:
        line = f"{d.path} ({d.owner} {d.mode:04o}: {d.why})"
        if dry_run:
            click.echo(f"would create {line}")
            continue
        click.echo(f"ensuring {line}")
        try:
            uid = pwd.getpwnam(d.owner).pw_uid
            os.makedirs(os.path.dirname(d.path), 0o755, exist_ok=True)  # e.g. a fresh mount's top directory
            with contextlib.suppress(FileExistsError):
                os.mkdir(d.path, 0o700)
            st = os.lstat(d.path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, uid):
                click.echo(f"  not changed: owned by uid {st.st_uid} (or not a directory); check it, remove it and "
                           "rerun", err=True)
                failed = True
                continue
            os.chown(d.path, uid, -1)
            os.chmod(d.path, d.mode)
        except KeyError:
            click.echo(f"  failed: user {d.owner} does not exist (shared_fs_identity in hooks.toml)", err=True)
            failed = True
        except PermissionError as exc:
            who = squashed_as(os.path.dirname(d.path)) if os.path.isdir(os.path.dirname(d.path)) else None
            hint = (f"root acts as {who} here (root squash): run `slurm-bt admin install` on a host where root is "
                    "not squashed, such as a file server" if who else "check the permissions of its parent")
            click.echo(f"  failed: {exc.strerror}; {hint}", err=True)
            failed = True
        except OSError as exc:
            click.echo(f"  failed: {exc.strerror}", err=True)
            failed = True
    return failed


def _write_root_file(dest: Path, text: str, mode: int) -> None:
    """Publish a root-owned file: unique temp, fsync, rename (a crash never leaves half a unit or hook)."""
    from slurm_bt.atomic import write_file_atomic

    dest.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    write_file_atomic(dest, text.encode(), mode=mode)
    os.chown(dest, 0, 0)


@click.group(name="admin", context_settings={"help_option_names": ["-h", "--help"]})
def admin_group() -> None:
    """Install and check the slurm-bt Prolog/Epilog on a node (run as root)."""


@admin_group.command(name="install")
@click.option("--prefix", default="/usr/local", show_default=True, help="Wrappers go to PREFIX/libexec/slurm-bt.")
@click.option("--python", "python", default=sys.executable, show_default=True,
              help="Absolute interpreter with slurm-bt installed (baked into the wrappers).")
@click.option("--config", default=None, help="Hook policy file passed to the hooks (default /etc/slurm-bt/hooks.toml).")
@click.option("--site", default=None, help="Site file passed to the hooks (default /etc/slurm-bt/site.toml).")
@click.option("--node", "nodes", multiple=True, help="Node names served by this host (for %n roots).")
@click.option("--systemd-dir", default=None, metavar="DIR",
              help="Also write the periodic checkpoint hand-off sweep's systemd units here (/etc/systemd/system).")
@click.option("--dry-run", is_flag=True, help="Print what would be done.")
def install_command(prefix: str, python: str, config: str | None, site: str | None, nodes: tuple[str, ...],
                    systemd_dir: str | None, dry_run: bool) -> None:
    """Write the hook wrappers, create this node's storage roots and print the slurm.conf lines."""
    with handle_errors("slurm-bt admin"):
        from slurm_bt.site.hook_settings import load_hook_settings, load_trusted_site
        from slurm_bt.site.settings import expand_path

        settings = load_hook_settings(Path(config) if config else None)
        site_settings = load_trusted_site(Path(site) if site else None)
        if not dry_run and os.geteuid() != 0:
            raise click.ClickException("run as root (the hooks and roots must be root-owned)")
        libexec = Path(prefix) / "libexec" / "slurm-bt"
        paths = {}
        for kind in ("prolog", "epilog"):
            text = render_wrapper(kind, python, config, site)
            dest = libexec / f"slurm-bt-{kind}"
            paths[kind] = str(dest)
            click.echo(f"{'would write' if dry_run else 'writing'} {dest}")
            if not dry_run:
                libexec.mkdir(parents=True, exist_ok=True, mode=0o755)
                _write_root_file(dest, text, 0o755)  # slurmd must execute it; root-owned
        served = nodes or tuple(_local_nodes())
        roots = []
        for node in served:
            roots.append(expand_path(site_settings.storage.scratch, user="root", uid=0, home="/root", node=node))
            roots.append(expand_path(site_settings.storage.node_cache, user="root", uid=0, home="/root", node=node))
        for root in dict.fromkeys(roots):
            click.echo(f"{'would create' if dry_run else 'ensuring'} {root} (root:root 0755)")
            if not dry_run:
                p = Path(root)
                p.mkdir(parents=True, exist_ok=True)
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode) or st.st_uid != 0:
                    raise click.ClickException(f"{root} exists and is not a root-owned directory; fix it by hand")
                os.chmod(p, 0o755)  # noqa: S103 - storage roots: root-owned, traversable
        layout_failed = _install_shared_layout(shared_layout(site_settings, settings.shared_fs_identity), dry_run)
        if systemd_dir is not None:
            for name, text in render_handoff_units(python, site).items():
                dest = Path(systemd_dir) / name
                click.echo(f"{'would write' if dry_run else 'writing'} {dest}")
                if not dry_run:
                    _write_root_file(dest, text, 0o644)
            units = " ".join(f"{HANDOFF_UNIT}{n}.timer" for n in served) or f"{HANDOFF_UNIT}<node>.timer"
            click.echo(f"then: systemctl daemon-reload && systemctl enable --now {units}")
        gres = {name: m.gres_type for name, m in site_settings.accelerators.items()}
        # The lines depend on the release (timeouts split in 25.05, ForceRequeueOnFail from 23.02):
        # this node's Slurm commands say which one (the controller runs the same or a newer one).
        release = slurm_release(_slurm())
        click.echo("\nAdd these lines to slurm.conf / gres.conf on every node and the controller, then "
                   f"`scontrol reconfigure`{f' (written for Slurm {release})' if release else ''}:\n")
        for line in slurm_conf_lines(paths["prolog"], paths["epilog"], settings.deadline_s, gres, release):
            click.echo(line)
        click.echo("\nThen run `slurm-bt admin doctor` on each node.")
        if layout_failed:
            raise SystemExit(1)


@admin_group.command(name="doctor")
@click.option("--config", type=click.Path(path_type=Path), default=None, help="Hook policy file.")
@click.option("--site", "site_path", type=click.Path(path_type=Path), default=None, help="Site file.")
@click.option("--node", "nodes", multiple=True, help="Node names to check (default: those on this host).")
def doctor_command(config: Path | None, site_path: Path | None, nodes: tuple[str, ...]) -> None:
    """Check this node's hook setup; print each problem with its fix (exit 1 on any failure)."""
    with handle_errors("slurm-bt admin"):
        local = list(nodes) or _local_nodes()
        checks = doctor_checks(local, config, site_path)
        if not local:
            click.echo(f"info  compute node checks: {socket.gethostname()} runs no node of this cluster; run "
                       "`slurm-bt admin doctor` on each node (or name one with --node where its disks are "
                       "visible here)")
        failed = False
        for c in checks:
            if c.info:
                click.echo(f"info  {c.name}: {c.problem}")
                continue
            if c.ok:
                click.echo(f"ok    {c.name}" + (f" ({c.problem})" if c.problem else ""))
                continue
            failed = failed or not c.warn
            click.echo(f"{'WARN' if c.warn else 'FAIL'}  {c.name}: {c.problem}")
            if c.fix:
                click.echo(f"      fix: {c.fix}")
        raise SystemExit(1 if failed else 0)
