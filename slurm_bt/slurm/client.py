"""Every Slurm command slurm-bt runs, through one injected :class:`CommandRunner`.

:class:`SlurmClient` is the only caller of the Slurm client commands (``sbatch``, ``sacct``,
``squeue``, ``sstat``, ``scancel``, ``scontrol``, ``sacctmgr``) in slurm-bt: code elsewhere asks it,
never :mod:`subprocess` (tests/unit/test_slurm_seam.py fails the build otherwise), so
``tests.fakes.fake_slurm.FakeSlurm`` sees every command a test causes. Each command's grammar (argv
and the parser of its answer) lives in the module named after it (:mod:`~slurm_bt.slurm.sacct`,
:mod:`~slurm_bt.slurm.squeue`, :mod:`~slurm_bt.slurm.sstat`, :mod:`~slurm_bt.slurm.scontrol`,
:mod:`~slurm_bt.slurm.sacctmgr`, :mod:`~slurm_bt.slurm.sbatch`); the client runs them. It

* passes every command a *scrubbed* environment (:func:`~slurm_bt.slurm.runner.scrubbed_env`):
  sbatch stores its environment with the job, so the submitter's tokens must never reach it;
* asks one ``sacct`` for all watched jobs (never one call per job), retries it on transient
  failure (slurmdbd restarts, timeouts), and falls back to ``squeue`` for ids slurmdbd has not
  recorded yet (a just-submitted job can be missing from sacct for a few seconds) and for the
  reason of pending jobs sacct gives none (a requeued job on 24.11 and 26.05);
* forces ``SLURM_TIME_FORMAT=%s`` for queries, so times are epoch seconds whatever the user's
  locale or ``SLURM_TIME_FORMAT`` says, and the parser never guesses a time zone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from slurm_bt.errors import SlurmCommandError
from slurm_bt.slurm import sacctmgr, sbatch, scontrol
from slurm_bt.slurm.job_ids import JobId, job_id_args, parse_job_id
from slurm_bt.slurm.runner import CommandResult, CommandRunner, scrubbed_env
from slurm_bt.slurm.sacct import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    SACCT_USAGE_FIELDS,
    JobRow,
    StepUsage,
    build_sacct_argv,
    build_sacct_usage_argv,
    parse_sacct,
    parse_usage,
)
from slurm_bt.slurm.squeue import SQUEUE_FORMAT, build_squeue_argv, parse_squeue
from slurm_bt.slurm.sstat import build_sstat_argv, parse_sstat
from slurm_bt.slurm.values import ParsedRows

__all__ = ["QUERY_ENV", "SlurmClient"]

#: Environment forced on query commands: epoch times are unambiguous across time zones.
QUERY_ENV: Mapping[str, str] = {"SLURM_TIME_FORMAT": "%s"}

class SlurmClient:
    """Slurm commands for slurm-bt, all through one :class:`CommandRunner`.

    Args:
        runner: runs the commands (``SubprocessRunner()`` in production, ``FakeSlurm`` in tests).
        environ: the submitter's environment to scrub for every command; ``None`` reads
            :data:`os.environ` at each call.
        sleep: how to wait between sacct retries (injectable so tests do not sleep).
        timeout_s: per-command timeout.
    """

    def __init__(
        self,
        runner: CommandRunner,
        *,
        environ: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        timeout_s: float = 60,
    ) -> None:
        self.runner = runner
        self.environ = environ
        self._sleep = sleep
        self.timeout_s = timeout_s
        #: Warnings from the last :meth:`query` (unreadable rows, retried failures).
        self.last_warnings: list[str] = []

    # ------------------------------------------------------------------ commands

    def submit(
        self,
        script_text: str,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run ``sbatch --parsable [extra_args]`` with ``script_text`` on stdin; return the job id.

        Args:
            script_text: the complete batch script (``#!`` line and ``#SBATCH`` directives).
            extra_args: more sbatch options, one argv element each (never a shell string).
            env: the submitter's environment; it is *scrubbed* to the allow-list before sbatch
                sees it (default: this client's ``environ``). Put job variables in the script.

        Returns:
            The job id as text, e.g. ``"123"`` (the ``;cluster`` suffix of federations removed).

        Raises:
            SlurmCommandError: sbatch failed (its stderr and a hint are attached), or printed no
                job id.
        """
        argv = sbatch.build_sbatch_argv(extra_args)
        result = self._run(argv, input=script_text, env=env)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr, sbatch.sbatch_hint(result.stderr))
        job_id = sbatch.parse_sbatch_job_id(result.stdout)
        if job_id is None:
            raise SlurmCommandError(
                argv,
                result.returncode,
                result.stderr or f"unexpected sbatch output: {result.stdout.strip()[:200]!r}",
                "sbatch printed no job id; check `squeue --me` before submitting again",
            )
        return str(job_id)

    def query(
        self,
        job_ids: Iterable[str | int | JobId],
        *,
        steps: bool = False,
        duplicates: bool = False,
        retries: int = 2,
        retry_delay_s: float = 2.0,
        squeue_fallback: bool = True,
    ) -> list[JobRow]:
        """Status of many jobs with one ``sacct`` call, plus one ``squeue`` for ids sacct lacks and
        for pending jobs sacct gives no reason (their reason is taken from squeue).

        Args:
            job_ids: ids to ask about (``"123"``, ``"123_4"``, ``JobId``...).
            steps: include step rows.
            duplicates: one row per run of requeued jobs (``-D``); see :func:`latest_runs`.
            retries: extra sacct attempts after a failure, with doubling delay.
            retry_delay_s: first delay between attempts.
            squeue_fallback: ask squeue about ids that sacct did not return, and for the reason of
                pending jobs whose sacct row has none.

        Returns:
            sacct rows in sacct's order, then squeue rows for the missing ids. Ids that neither
            knows are simply absent.

        Raises:
            SlurmCommandError: sacct failed ``retries + 1`` times (the last failure).
            ValueError: a job id is malformed.
        """
        ids = [j if isinstance(j, JobId) else parse_job_id(str(j)) for j in job_ids]
        self.last_warnings = []
        if not ids:
            return []
        argv = build_sacct_argv(ids, steps=steps, duplicates=duplicates, delimiter=SACCT_DELIMITER)
        result = self._run_with_retries(argv, retries, retry_delay_s)
        rows = parse_sacct(result.stdout, SACCT_FIELDS, delimiter=SACCT_DELIMITER)
        self._note(rows, "sacct")
        out: list[JobRow] = list(rows)
        # Index by base id: matching every asked id against every row is quadratic (1000 jobs: 1M checks).
        by_base: dict[int, list[JobId]] = {}
        for r in rows:
            by_base.setdefault(r.job_id.base, []).append(r.job_id)
        missing = [j for j in ids if not any(_covers(j, got) for got in by_base.get(j.base, ()))]
        # 24.11 and 26.05's sacct keeps no reason for a requeued pending job (Reason=None) while squeue
        # says BeginTime (tests/data/sacct/2411_requeue_pending_*, 2605_...; docs/slurm-releases.md).
        # Those rows take squeue's reason, asked in the same one squeue call as the missing ids; a
        # status whose pending jobs all have a reason (held, queued, 22.05's requeued) runs no squeue.
        reasonless = {r.job_id for r in rows if r.state == "PENDING" and not r.reason and not r.is_step}
        if (missing or reasonless) and squeue_fallback:
            live = self._squeue([*missing, *reasonless])
            reasons = {r.job_id: r.reason for r in live if r.state == "PENDING" and r.reason}
            if reasons:
                # -D: the earlier runs' REQUEUED rows share the id; only the pending run takes the reason.
                out = [replace(r, reason=reasons[r.job_id])
                       if r.state == "PENDING" and not r.reason and r.job_id in reasons else r for r in out]
            out.extend(r for r in live if any(_covers(j, r.job_id) for j in missing))
        return out

    def live(self, job_ids: Iterable[str | int | JobId]) -> list[JobRow]:
        """What slurmctld alone knows about ``job_ids`` (``squeue --states=all``), no slurmdbd.

        Used when sacct fails (slurmdbd down): running and pending jobs, and jobs that finished
        less than ``MinJobAge`` ago, are still answered. Failures become :attr:`last_warnings`.
        """
        ids = [j if isinstance(j, JobId) else parse_job_id(str(j)) for j in job_ids]
        self.last_warnings = []
        return self._squeue(ids) if ids else []

    def usage(self, job_ids: Iterable[str | int | JobId], *, retries: int = 1) -> ParsedRows[StepUsage]:
        """Step usage (CPU time, peak memory, TRES) of finished and running steps, one sacct call.

        Raises:
            SlurmCommandError: sacct failed ``retries + 1`` times.
        """
        ids = [j if isinstance(j, JobId) else parse_job_id(str(j)) for j in job_ids]
        self.last_warnings = []
        argv = build_sacct_usage_argv(ids, delimiter=SACCT_DELIMITER)
        result = self._run_with_retries(argv, retries, 1.0)
        rows = parse_usage(result.stdout, SACCT_USAGE_FIELDS, source="sacct", delimiter=SACCT_DELIMITER)
        self._note(rows, "sacct")
        return rows

    def live_usage(self, job_ids: Iterable[str | int | JobId]) -> ParsedRows[StepUsage]:
        """Live usage of running steps from ``sstat`` (asks the slurmds through slurmctld).

        Slurm answers only for the caller's own jobs (or root); any refusal or a job that runs no
        step yet is an empty answer plus a warning, never an exception.
        """
        ids = [j if isinstance(j, JobId) else parse_job_id(str(j)) for j in job_ids]
        argv = build_sstat_argv(ids, delimiter=SACCT_DELIMITER)
        try:
            result = self._run(argv, env_overrides=QUERY_ENV)
        except SlurmCommandError as exc:
            self.last_warnings.append(f"sstat failed: {exc}")
            return ParsedRows[StepUsage]()
        rows = parse_sstat(result.stdout, delimiter=SACCT_DELIMITER)
        if not result.ok and not rows:
            lines = result.stderr.strip().splitlines()
            self.last_warnings.append(f"sstat: {lines[-1][:200] if lines else 'no answer'}")
        return rows

    def cancel(self, job_id: str | int | JobId, *, signal: str | None = None) -> None:
        """``scancel`` one job (or send ``signal``, e.g. ``"USR2"``).

        22.05 scancel exits 0 even for unknown or finished jobs (the error is only printed with
        ``-v``), so cancelling twice is harmless.

        Raises:
            SlurmCommandError: scancel exited non-zero (permission denied, controller down).
            ValueError: ``job_id`` is malformed.
        """
        jid = job_id if isinstance(job_id, JobId) else parse_job_id(str(job_id))
        argv = ["scancel"]
        if signal is not None:
            if not re.fullmatch(r"[A-Z0-9]+", signal):
                raise ValueError(f"invalid signal name: {signal!r}")
            argv.append(f"--signal={signal}")
        argv.extend(job_id_args([jid]))
        result = self._run(argv)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr, "do you own this job?")

    def node_addr(self, node_name: str) -> str:
        """The address other nodes can reach ``node_name`` at (``NodeAddr=`` of scontrol).

        Slurm node names need not resolve in DNS (on the dev cluster ``n1`` does not), so the leader
        address for rendezvous comes from here.

        Raises:
            SlurmCommandError: scontrol failed or the node is unknown.
            ValueError: ``node_name`` is not a plain node name.
        """
        argv = scontrol.build_show_node_argv(node_name)
        result = self._run(argv, env_overrides=QUERY_ENV)
        addr = next((n["NodeAddr"] for n in scontrol.parse_nodes(result.stdout) if n.get("NodeAddr")), "")
        if not result.ok or not addr:
            raise SlurmCommandError(
                argv,
                result.returncode,
                result.stderr or result.stdout or "no NodeAddr in scontrol output",
                "check the node name with `sinfo -N`",
            )
        return addr

    def nodes(self) -> list[dict[str, str]]:
        """Every node slurmctld knows (``scontrol show node``), as ``Key -> value`` dicts.

        Raises:
            SlurmCommandError: scontrol failed (controller down, munge broken).
        """
        argv = scontrol.build_show_node_argv()
        result = self._run(argv, env_overrides=QUERY_ENV)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr, "is slurmctld up? try `sinfo`")
        return scontrol.parse_nodes(result.stdout)

    def hostnames(self, nodelist: str) -> list[str]:
        """Expand a hostlist expression (``n[1-2],gpu07``) into node names, in Slurm's order.

        Raises:
            SlurmCommandError: scontrol failed or printed no name.
            ValueError: ``nodelist`` is empty or not a hostlist expression.
        """
        argv = scontrol.build_hostnames_argv(nodelist)
        result = self._run(argv)
        names = scontrol.parse_hostnames(result.stdout)
        if not result.ok or not names:
            raise SlurmCommandError(argv, result.returncode, result.stderr or "no node names",
                                    f"cannot expand the node list {nodelist!r}")
        return names

    def release(self, job_id: str | int | JobId, *, env: Mapping[str, str] | None = None) -> None:
        """``scontrol release`` a job submitted with ``--hold``.

        Args:
            job_id: the held job.
            env: the submitter's environment (scrubbed like sbatch's; default: this client's).

        Raises:
            SlurmCommandError: the release failed (the job stays held).
            ValueError: ``job_id`` is malformed.
        """
        argv = scontrol.build_release_argv(job_id)
        result = self._run(argv, env=env)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr,
                                    f"job {job_id} stays held; cancel it with scancel")

    def set_priority(self, job_id: str | int | JobId, priority: int) -> str | None:
        """``scontrol update JobId=ID Priority=N``: operators and admins may set any; users may only lower it.

        Returns:
            Slurm's note when it applied the value to a user's job but will not keep it (22.05: "Changes
            to job priority are not persistent, change nice instead"; scontrol then exits 1 although
            the job's priority did change), else None.

        Raises:
            SlurmCommandError: scontrol refused (raising without privilege, job not pending, unknown job).
            ValueError: ``job_id`` or ``priority`` is malformed.
        """
        argv = scontrol.build_update_priority_argv(job_id, priority)
        result = self._run(argv)
        if result.ok:
            return None
        if "not persistent" in result.stderr:
            return result.stderr.strip().splitlines()[-1][:300]
        raise SlurmCommandError(argv, result.returncode, result.stderr,
                                "Slurm lets operators and admins set a job's priority; a user may only lower "
                                "it (or raise their other jobs' nice: scontrol update JobId=<id> Nice=<n>)")

    def config(self) -> dict[str, str]:
        """The configuration slurmctld runs with (``scontrol show config``), one value per key.

        List-valued keys read the same on every release (``Prolog`` is ``"/a,/b"`` whether Slurm
        printed ``Prolog = /a,/b`` or, from 24.11, ``Prolog[0] = /a`` and ``Prolog[1] = /b``).

        Raises:
            SlurmCommandError: scontrol failed (controller down, munge broken).
        """
        argv = scontrol.build_show_config_argv()
        result = self._run(argv)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr, "check slurmctld and munge")
        return scontrol.parse_config(result.stdout)

    def default_account(self, user: str) -> str | None:
        """``user``'s default Slurm account (``sacctmgr``); ``None`` when slurmdbd does not say.

        Raises:
            SlurmCommandError: sacctmgr could not run at all (missing, timed out).
            ValueError: ``user`` is not a plain user name.
        """
        result = self._run(sacctmgr.build_default_account_argv(user))
        return sacctmgr.parse_default_account(result.stdout) if result.ok else None

    # ------------------------------------------------------------------ helpers

    def _run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        env_overrides: Mapping[str, str] | None = None,
    ) -> CommandResult:
        source = env if env is not None else self.environ
        return self.runner.run(
            argv,
            input=input,
            env=scrubbed_env(source, overrides=env_overrides),
            timeout_s=self.timeout_s,
        )

    def _run_with_retries(self, argv: Sequence[str], retries: int, delay_s: float) -> CommandResult:
        last: SlurmCommandError | None = None
        for attempt in range(max(0, retries) + 1):
            if attempt:
                self._sleep(delay_s * 2 ** (attempt - 1))
            try:
                result = self._run(argv, env_overrides=QUERY_ENV)
            except SlurmCommandError as exc:
                if exc.returncode == 127:  # sacct missing: retrying cannot help
                    raise
                last = exc
            else:
                if result.ok:
                    return result
                last = SlurmCommandError(
                    argv, result.returncode, result.stderr, "is slurmdbd up? `sacctmgr ping` tells"
                )
            self.last_warnings.append(f"{argv[0]} attempt {attempt + 1} failed: {last}")
        raise last if last is not None else SlurmCommandError(argv, -1, "not run", "retries must be >= 0")

    def _squeue(self, ids: Sequence[JobId]) -> list[JobRow]:
        # Ask about each job without its step: squeue knows allocations, not sacct's step rows.
        argv = build_squeue_argv(sorted({j.job for j in ids}, key=str), fmt=SQUEUE_FORMAT, all_states=True)
        try:
            result = self._run(argv, env_overrides=QUERY_ENV)
        except SlurmCommandError as exc:
            self.last_warnings.append(f"squeue fallback failed: {exc}")
            return []
        if not result.ok:
            # 22.05 exits 1 when the only id asked for is unknown; that is an answer, not an error.
            if "invalid job id" not in result.stderr.lower():
                self.last_warnings.append(f"squeue fallback failed: {result.stderr.strip()[:200]}")
            return []
        rows = parse_squeue(result.stdout, SQUEUE_FORMAT)
        self._note(rows, "squeue")
        return [r for r in rows if any(_covers(j, r.job_id) for j in ids)]

    def _note(self, rows: ParsedRows[JobRow] | ParsedRows[StepUsage], what: str) -> None:
        if rows.skipped:
            self.last_warnings.append(
                f"{what}: skipped {rows.skipped} unreadable row(s): {rows.warnings[:3]}"
            )


def _covers(asked: JobId, got: JobId) -> bool:
    """Does row id ``got`` answer a question about ``asked``? (``123`` covers ``123_4``, ``123+1``)."""
    if asked.base != got.base:
        return False
    if asked.array_task is not None and asked.array_task != got.array_task:
        return False
    if asked.het_offset is not None and asked.het_offset != got.het_offset:
        return False
    return asked.step is None or asked.step == got.step
