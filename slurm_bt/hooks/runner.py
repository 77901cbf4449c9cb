"""The exit-code policy every slurm-bt hook runs under.

Slurm turns *any* non-zero Prolog exit into a drained node and a held job, and a non-zero Epilog
into a drained node; it waits forever unless ``PrologEpilogTimeout`` is set (docs/footguns.md,
"Slurm behaviours the hooks rely on"). So each hook body runs inside :func:`run_hook`, which

* reads the trusted environment once (:class:`~slurm_bt.posix.hook_env.SlurmHookEnv`) and the root-owned
  policy and site files;
* arms an internal deadline (``deadline_s``, below ``PrologEpilogTimeout``) with ``SIGALRM``;
* classifies every outcome:

  ======================  =========================================================  ==========
  outcome                 what happens                                               exit code
  ======================  =========================================================  ==========
  success                 one line in the hook log                                   0
  :class:`HookUserError`  prolog: reason written to ``/run/slurm-bt/<node>/jobs/<id>/  0
                          prolog-error``; the job's step 1 prints it and fails
  :class:`NodeFault`      ``slurm-bt <hook> on <node>: DRAIN: <what>; fix: <how>`` on  1
                          stderr (slurmd logs it) and in the hook log and
                          ``/run/slurm-bt/<node>/last-fault`` (``admin doctor``)
  internal deadline       node fault ("exceeded its deadline in <phase>")            1
  any other exception     a bug: prolog fails *the job* ("internal error"), epilog   0
                          logs it; never drains the cluster for a bug
  ======================  =========================================================  ==========

* stays quiet: nothing on stdout, diagnostics in a root-owned log (``/var/log/slurm-bt/hooks.log``,
  0600), stderr only for node faults.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from slurm_bt.errors import HookDeadline, HookUserError, NodeFault
from slurm_bt.jobhost.context import HookContext, HookLog
from slurm_bt.posix.hook_env import HookEnvError, SlurmHookEnv
from slurm_bt.posix.job_notes import STATE_ROOT
from slurm_bt.posix.safefs import write_file_at
from slurm_bt.site.hook_settings import HookConfigError, HookSettings, load_hook_settings, load_trusted_site
from slurm_bt.site.settings import SiteSettings

__all__ = ["run_hook"]


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise HookDeadline()


def _record_fault(state_root: str, node: str, line: str) -> None:
    """Leave the last node fault where ``slurm-bt admin doctor`` shows it (best effort)."""
    with contextlib.suppress(Exception):  # the fault itself is already on stderr and in the log
        from slurm_bt.posix.job_notes import open_node_state

        fd = open_node_state(node, state_root)
        try:
            write_file_at(fd, "last-fault", (line + "\n").encode(), mode=0o644)
        finally:
            os.close(fd)


def _owner_from_prolog(env: SlurmHookEnv, state_root: str, log: HookLog) -> SlurmHookEnv:
    """The job's real owner when slurmd ran the epilog as "uid 0" for a job the prolog ran for someone else.

    Why: Slurm 26.05 runs the epilog of a job whose node was set DOWN (the job requeued elsewhere)
    with ``SLURM_JOB_UID=0``/``SLURM_JOB_USER=root``. Taken at its word, the epilog then looked for root's
    runtime directory (the user's, with its secrets, stayed behind) and handed the user's
    checkpoints off to an upload running *as root* (docs/slurm-releases.md). The prolog's ``owner``
    note for this job on this node is root-written from the prolog's own trusted environment, so
    it is used instead; without one (a root job, or a node whose /run was wiped) uid 0 stands.
    """
    import dataclasses
    import pwd

    from slurm_bt.jobhost.leftovers import recorded_job_owner

    owner = recorded_job_owner(state_root, env.node, env.job_id)
    if owner is None or owner[0] == 0:
        return env
    uid, gid = owner
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        log.warning(f"slurmd gave uid 0 for job {env.job_id}; the prolog recorded uid {uid}, which has no "
                    "passwd entry here: running as uid 0")
        return env
    log.warning(f"slurmd gave uid 0 for job {env.job_id} (as Slurm 26.05 does when a job's node was set DOWN); "
                f"the prolog recorded uid {uid} ({pw.pw_name}): the epilog works for them")
    return dataclasses.replace(env, uid=uid, gid=gid, user=pw.pw_name, home=pw.pw_dir)


def run_hook(
    kind: str,
    body: Callable[[HookContext], None],
    on_user_error: Callable[[HookContext, str], None] | None,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    state_root: str = STATE_ROOT,
) -> int:
    """Run a hook body under the exit-code policy (module docstring) and return the exit code.

    Args:
        kind: ``prolog`` or ``epilog`` (used in messages).
        body: the hook's work.
        on_user_error: records a :class:`HookUserError` for the job (the prolog writes the status
            file); ``None`` only logs it. If recording fails, that is a node fault.
        argv: ``--config PATH`` (hook policy) and ``--site PATH`` (site file); from the wrapper.
        environ: the hook environment (``os.environ`` by default).
        state_root: root of the job-keyed notes (tests use a temporary directory).
    """
    started = time.monotonic()
    parser = argparse.ArgumentParser(prog=f"slurm-bt-{kind}", add_help=False)
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--site", type=Path, default=None)
    try:
        args, _ = parser.parse_known_args(list(argv) if argv is not None else sys.argv[1:])
    except SystemExit:
        args = argparse.Namespace(config=None, site=None)
    env_map = os.environ if environ is None else environ
    node = env_map.get("SLURMD_NODENAME", "?")[:64]

    def fault(log: HookLog, what: str, fix: str) -> int:
        line = f"slurm-bt {kind} on {node}: DRAIN: {what}; fix: {fix}"
        log.error(line)
        print(line, file=sys.stderr, flush=True)
        _record_fault(state_root, node, line)
        return 1

    config_error: HookConfigError | None = None
    settings = HookSettings()
    site = SiteSettings()
    try:
        settings = load_hook_settings(args.config)
        site = load_trusted_site(args.site)
    except HookConfigError as exc:
        config_error = exc
    log = HookLog(settings.log_file, f"{kind}[{os.getpid()}]")
    if config_error is not None:
        code = fault(log, str(config_error), config_error.fix)
        log.close()
        return code
    try:
        try:
            env = SlurmHookEnv.from_environ(env_map)
        except HookEnvError as exc:
            return fault(log, f"invalid hook environment: {exc}",
                         "run this only as a slurmd Prolog/Epilog; check the user database (NSS) on this node")
        if kind == "epilog" and env.uid == 0:
            env = _owner_from_prolog(env, state_root, log)
        log.tag = f"{kind}[{os.getpid()}] job={env.job_id} node={env.node} uid={env.uid}"
        ctx = HookContext(env=env, settings=settings, site=site, log=log, started=started,
                          deadline=started + settings.deadline_s, state_root=state_root,
                          site_path=str(args.site) if args.site is not None else None)
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, settings.deadline_s)
        try:
            try:
                body(ctx)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except HookUserError as exc:
            log.warning(f"job refused in phase {ctx.phase}: {exc.reason}")
            if on_user_error is not None:
                try:
                    on_user_error(ctx, exc.reason)
                except Exception as rec_exc:
                    return fault(log, f"cannot record the job failure ({rec_exc}) for: {exc.reason}",
                                 f"check that {state_root} is writable by root")
            return 0
        except NodeFault as exc:
            return fault(log, exc.what, exc.fix)
        except HookDeadline:
            return fault(log, f"{kind} exceeded its {settings.deadline_s:.0f} s deadline in phase {ctx.phase}",
                         "check the node's disks and the shared filesystem (hung mounts), then resume the node")
        except Exception as exc:
            log.error(f"internal error in phase {ctx.phase}: {type(exc).__name__}: {exc}\n"
                      + traceback.format_exc())
            if on_user_error is not None:
                try:
                    on_user_error(ctx, f"internal error in the slurm-bt {kind} on {env.node} "
                                       f"({type(exc).__name__}); an admin can find details in {settings.log_file}")
                except Exception:
                    return fault(log, f"internal error and cannot record it: {exc}", f"see {settings.log_file}")
            return 0
        finally:
            signal.signal(signal.SIGALRM, previous)
        log.info(f"ok in {time.monotonic() - started:.3f} s" + (": " + ", ".join(ctx.notes) if ctx.notes else ""))
        return 0
    finally:
        log.close()
