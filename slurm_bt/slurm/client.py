"""Submit, watch and cancel Slurm jobs through an injected :class:`CommandRunner`.

:class:`SlurmClient` is the only code that knows Slurm's command-line grammar. It

* passes every command a *scrubbed* environment (:func:`~slurm_bt.slurm.runner.scrubbed_env`):
  sbatch stores its environment with the job, so the submitter's tokens must never reach it;
* asks one ``sacct`` for all watched jobs (never one call per job), retries it on transient
  failure (slurmdbd restarts, timeouts), and falls back to ``squeue`` for ids slurmdbd has not
  recorded yet (a just-submitted job can be missing from sacct for a few seconds);
* forces ``SLURM_TIME_FORMAT=%s`` for queries, so times are epoch seconds whatever the user's
  locale or ``SLURM_TIME_FORMAT`` says, and the parser never guesses a time zone.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from slurm_bt.errors import SlurmCommandError
from slurm_bt.slurm.job_ids import JobId, parse_job_id
from slurm_bt.slurm.runner import CommandResult, CommandRunner, scrubbed_env
from slurm_bt.slurm.sacct import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SacctRow,
    SacctRows,
    build_sacct_argv,
    build_squeue_argv,
    parse_sacct,
    parse_squeue,
)
from slurm_bt.slurm.usage import (
    SACCT_USAGE_FIELDS,
    SSTAT_FIELDS,
    UsageRows,
    build_sacct_usage_argv,
    build_sstat_argv,
    parse_usage,
)

__all__ = ["QUERY_ENV", "SlurmClient"]

#: Environment forced on query commands: epoch times are unambiguous across time zones.
QUERY_ENV: Mapping[str, str] = {"SLURM_TIME_FORMAT": "%s"}

# (pattern in sbatch's stderr, what the user can do). First match wins.
_SBATCH_HINTS: tuple[tuple[str, str], ...] = (
    (r"invalid partition", "check the partition name with `sinfo -s`"),
    (r"node configuration is not available", "no node has that many GPUs/CPUs/memory; compare with `sinfo`"),
    (r"invalid generic resource|gres", "check the GPU type/count against `sinfo -o '%P %G'`"),
    (r"invalid account|association", "check your Slurm account with `sacctmgr show assoc user=$USER`"),
    (r"time limit", "lower the time limit or pick a partition that allows it"),
    (r"qos", "check the QOS limits with `sacctmgr show qos`"),
    (r"unable to contact slurm controller|connection refused|timed out", "is slurmctld up? try `sinfo`"),
)
_DEFAULT_SBATCH_HINT = "sbatch rejected the job; `bt-sbatch --dry-run` prints the script it was given"
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")


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
        args = [str(a) for a in extra_args]
        argv = ["sbatch", "--parsable", *args]
        result = self._run(argv, input=script_text, env=env)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr, _sbatch_hint(result.stderr))
        lines = [ln.strip() for ln in result.stdout.splitlines() if ln.strip()]
        first = lines[-1].split(";", 1)[0] if lines else ""
        try:
            job_id = parse_job_id(first)
        except ValueError:
            raise SlurmCommandError(
                argv,
                result.returncode,
                result.stderr or f"unexpected sbatch output: {result.stdout.strip()[:200]!r}",
                "sbatch printed no job id; check `squeue --me` before submitting again",
            ) from None
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
    ) -> list[SacctRow]:
        """Status of many jobs with one ``sacct`` call, plus ``squeue`` for ids sacct lacks.

        Args:
            job_ids: ids to ask about (``"123"``, ``"123_4"``, ``JobId``...).
            steps: include step rows.
            duplicates: one row per run of requeued jobs (``-D``); see :func:`latest_runs`.
            retries: extra sacct attempts after a failure, with doubling delay.
            retry_delay_s: first delay between attempts.
            squeue_fallback: ask squeue about ids that sacct did not return.

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
        out: list[SacctRow] = list(rows)
        # Index by base id: matching every asked id against every row is quadratic (1000 jobs: 1M checks).
        by_base: dict[int, list[JobId]] = {}
        for r in rows:
            by_base.setdefault(r.job_id.base, []).append(r.job_id)
        missing = [j for j in ids if not any(_covers(j, got) for got in by_base.get(j.base, ()))]
        if missing and squeue_fallback:
            out.extend(self._squeue(missing))
        return out

    def live(self, job_ids: Iterable[str | int | JobId]) -> list[SacctRow]:
        """What slurmctld alone knows about ``job_ids`` (``squeue --states=all``), no slurmdbd.

        Used when sacct fails (slurmdbd down): running and pending jobs, and jobs that finished
        less than ``MinJobAge`` ago, are still answered. Failures become :attr:`last_warnings`.
        """
        ids = [j if isinstance(j, JobId) else parse_job_id(str(j)) for j in job_ids]
        self.last_warnings = []
        return self._squeue(ids) if ids else []

    def usage(self, job_ids: Iterable[str | int | JobId], *, retries: int = 1) -> UsageRows:
        """Step usage (CPU time, peak memory, TRES) of finished and running steps, one sacct call.

        Raises:
            SlurmCommandError: sacct failed ``retries + 1`` times.
        """
        ids = [j if isinstance(j, JobId) else parse_job_id(str(j)) for j in job_ids]
        self.last_warnings = []
        argv = build_sacct_usage_argv(ids, delimiter=SACCT_DELIMITER)
        result = self._run_with_retries(argv, retries, 1.0)
        rows = parse_usage(result.stdout, SACCT_USAGE_FIELDS, source="sacct", delimiter=SACCT_DELIMITER)
        if rows.skipped:
            self.last_warnings.append(f"sacct: skipped {rows.skipped} unreadable row(s): {rows.warnings[:3]}")
        return rows

    def live_usage(self, job_ids: Iterable[str | int | JobId]) -> UsageRows:
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
            return UsageRows()
        rows = parse_usage(result.stdout, SSTAT_FIELDS, source="sstat", delimiter=SACCT_DELIMITER)
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
        argv.append(str(jid))
        result = self._run(argv)
        if not result.ok:
            raise SlurmCommandError(argv, result.returncode, result.stderr, "do you own this job?")

    def node_addr(self, node_name: str) -> str:
        """The address other nodes can reach ``node_name`` at (``NodeAddr=`` of scontrol).

        Slurm node names need not resolve in DNS (slurm-facts.md §5), so the leader address for
        rendezvous comes from here.

        Raises:
            SlurmCommandError: scontrol failed or the node is unknown.
            ValueError: ``node_name`` is not a plain node name.
        """
        if not _NODE_NAME.fullmatch(node_name):
            raise ValueError(f"not a node name: {node_name!r}")
        argv = ["scontrol", "--oneliner", "show", "node", node_name]
        result = self._run(argv, env_overrides=QUERY_ENV)
        text = result.stdout
        m = re.search(r"(?:^|\s)NodeAddr=(\S+)", text)
        if not result.ok or m is None:
            raise SlurmCommandError(
                argv,
                result.returncode,
                result.stderr or text or "no NodeAddr in scontrol output",
                "check the node name with `sinfo -N`",
            )
        return m.group(1)

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

    def _squeue(self, ids: Sequence[JobId]) -> list[SacctRow]:
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

    def _note(self, rows: SacctRows, what: str) -> None:
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


def _sbatch_hint(stderr: str) -> str:
    low = stderr.lower()
    for pattern, hint in _SBATCH_HINTS:
        if re.search(pattern, low):
            return hint
    return _DEFAULT_SBATCH_HINT
