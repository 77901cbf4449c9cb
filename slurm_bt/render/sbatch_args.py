"""The ``sbatch`` options ``bt-sbatch`` refuses to pass through, and why (login node and laptop alike).

Why a module of its own: both the local submission (:mod:`slurm_bt.submit`) and the remote one
(:mod:`slurm_bt.remote.commands`, which checks before uploading anything) apply the same rule.

sbatch parses its options with ``getopt_long``, which takes any unambiguous prefix of a long option
(``--wra=...`` is ``--wrap``, ``--get-u`` is ``--get-user-env``): a refused option is refused in every
spelling sbatch would accept, and :func:`sbatch_partition` reads ``--part=X`` as ``--partition``.

A word that is not an option nor an option's value would be taken by sbatch as the batch script
(``bt-sbatch config.py -- other.sh`` runs ``other.sh`` instead of the generated script), so it is
refused too. Which options take a separate value comes from sbatch's own option table
(:data:`_VALUE_OPTIONS`); an option slurm-bt does not know is assumed to take none, so at worst its
value is refused with the hint to write ``--option=value``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from slurm_bt.errors import Problem, UserError
from slurm_bt.site.settings import STOP_SIGNALS

__all__ = ["FORBIDDEN_SBATCH_ARGS", "check_sbatch_args", "sbatch_excluded_nodes", "sbatch_names_nodes",
           "sbatch_partition"]

FORBIDDEN_SBATCH_ARGS = {
    "--export": "the job environment is explicit so that no secret from your shell reaches Slurm",
    "--export-file": "the job environment is explicit so that no secret from your shell reaches Slurm",
    "--get-user-env": "the job environment is explicit so that no secret from your shell reaches Slurm",
    "--wrap": "the batch script is generated from the config",
}


def check_sbatch_args(args: Sequence[str]) -> None:
    """Refuse pass-through options that would change the job's environment or script.

    Raises:
        UserError: one of ``args`` is in :data:`FORBIDDEN_SBATCH_ARGS` (in any spelling sbatch takes),
            a ``--signal`` names a signal the stop-signal rule refuses (``USR1``), or a word would be
            read by sbatch as the batch script.
    """
    for arg in args:
        name = arg.split("=", 1)[0]
        if len(name) <= 2 or not name.startswith("--"):
            continue
        # A prefix of a refused option is that option to getopt_long (or ambiguous, which sbatch
        # refuses anyway): no sbatch option that is allowed is a prefix of a refused one.
        refused = next((full for full in FORBIDDEN_SBATCH_ARGS if full.startswith(name)), None)
        if refused is not None:
            raise UserError("bt-sbatch", [Problem(name, f"not allowed: {FORBIDDEN_SBATCH_ARGS[refused]}")])
    signal_problem = _signal_problem(args)
    if signal_problem is not None:
        raise UserError("bt-sbatch", [signal_problem])
    stray = _positional_words(args)
    if stray:
        raise UserError("bt-sbatch", [Problem(
            stray[0], "not an sbatch option: sbatch would run it as the batch script instead of the one "
            "generated from the config (for an option's value, write --option=value)")])


# sbatch's options that take a *required* value, so ``--name VALUE``/``-X VALUE`` consume the next word
# (``sbatch --help`` of 22.05 plus its undocumented ones; optional values need ``=``, as getopt_long says).
_VALUE_OPTIONS = frozenset({
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "burst-buffer", "chdir", "cluster-constraint",
    "clusters", "comment", "constraint", "container", "container-id", "core-spec", "cores-per-socket", "cpu-freq",
    "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error", "exclude",
    "export-file", "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input", "job-name", "kill-on-invalid-dep",
    "licenses", "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus",
    "network", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "open-mode", "output", "partition", "power", "prefer", "priority", "profile", "qos",
    "reservation", "signal", "sockets-per-node", "switches", "thread-spec", "threads-per-core", "time", "time-min",
    "tmp", "tres-per-task", "uid", "wckey",
})
# Exact names that take no separate value although a value option starts with them (getopt_long
# prefers the exact match): ``--export`` (optional value) vs ``--export-file``...
_NO_VALUE_OPTIONS = frozenset({"export", "exclusive", "get-user-env", "hold", "nice", "propagate", "wrap",
                               "requeue", "no-requeue", "wait", "parsable", "quiet", "verbose", "reboot"})
_SHORT_VALUE = frozenset("aAbcCdDeFGiJLmMnNopqStwx")


def _positional_words(args: Sequence[str]) -> list[str]:
    """The words sbatch would read as the script and its arguments (not options, not their values)."""
    words: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if arg == "--":
            words += items[i:]
            break
        if arg.startswith("--"):
            name = arg[2:]
            if "=" not in name and name not in _NO_VALUE_OPTIONS and any(o.startswith(name) for o in _VALUE_OPTIONS):
                i += 1  # its value, whatever it looks like
        elif arg.startswith("-") and arg != "-":
            for j, ch in enumerate(arg[1:], start=1):
                if ch in _SHORT_VALUE:
                    if j == len(arg) - 1:
                        i += 1  # "-p gpu"; "-pgpu" carries its value
                    break
        else:
            words.append(arg)
    return words


# ``--si`` is the shortest prefix of ``--signal`` (no other sbatch option starts with "si").
_SIGNAL_MIN_PREFIX = len("--si")


def _signal_problem(args: Sequence[str]) -> Problem | None:
    """Why a ``--signal=[{R|B}:]SIG[@TIME]`` among ``args`` is refused, or None.

    A pass-through ``--signal`` replaces the batch script's own (docs/long-runs.md): what it sends
    before the end is a stop signal, so it follows the stop signal's rule (``[restarts] stop_signal``,
    ``BT_STOP_SIGNAL``): ``USR1`` never, whatever the spelling (``SIGUSR1``, ``usr1``, ``10``).
    """
    for value in _option_values(args, "--signal", _SIGNAL_MIN_PREFIX, short=""):  # no short form
        sig = value.rpartition(":")[2].partition("@")[0].strip().upper().removeprefix("SIG")
        if sig.isdigit():  # sbatch takes signal numbers too: 10 is USR1 on Linux
            try:
                sig = signal.Signals(int(sig)).name.removeprefix("SIG")
            except ValueError:
                pass
        if sig not in STOP_SIGNALS:
            return Problem("--signal", f"{value!r} is not allowed: the signal must be one of "
                           f"{', '.join(STOP_SIGNALS)}, as for the stop signal (never USR1: NCCL and "
                           "several launchers use it)")
    return None


# ``--part`` is the shortest prefix of ``--partition`` no other sbatch option shares (``--parsable``).
_PARTITION_MIN_PREFIX = len("--part")


def sbatch_partition(args: Sequence[str]) -> str | None:
    """The partition the pass-through options choose (``-p X``, ``-pX``, ``--partition[=]X``), if any.

    The last one wins, as in sbatch. Used to size a GPU job from the partition it will really run in
    (:func:`slurm_bt.slurm.node_shapes.gpu_share`); sbatch itself still validates the name.
    """
    chosen: str | None = None
    items = list(args)
    for i, arg in enumerate(items):
        name, eq, value = arg.partition("=")
        nxt = items[i + 1] if i + 1 < len(items) else None
        if name.startswith("--") and len(name) >= _PARTITION_MIN_PREFIX and "--partition".startswith(name):
            chosen = value if eq else nxt
        elif arg == "-p":
            chosen = nxt
        elif arg.startswith("-p") and not arg.startswith("--"):
            chosen = arg[2:]
    return chosen or None


def _option_values(args: Sequence[str], long_name: str, min_len: int, short: str) -> list[str]:
    """Every value given to one sbatch option, in order: ``--long=V``, ``--long V`` (and their
    unambiguous prefixes, at least ``min_len`` long), ``-s V``, ``-sV`` and ``-HsV`` (short clusters).

    Other options' values are skipped as in :func:`_positional_words` (``--comment -w`` names no node).
    """
    values: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        nxt = items[i + 1] if i + 1 < len(items) else ""
        i += 1
        if arg == "--":
            break
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            if len(name) >= min_len and long_name.startswith(name):
                values.append(value if eq else nxt)
            bare = name[2:]
            if not eq and bare not in _NO_VALUE_OPTIONS and any(o.startswith(bare) for o in _VALUE_OPTIONS):
                i += 1  # its value, whatever it looks like
        elif arg.startswith("-") and len(arg) > 1:
            for j, ch in enumerate(arg[1:], start=1):
                if ch == short:
                    values.append(arg[j + 1:] or nxt)
                if ch in _SHORT_VALUE:
                    if j == len(arg) - 1:
                        i += 1  # "-w n1": the next word is the value
                    break  # else the rest of the word is the value
    return values


def sbatch_names_nodes(args: Sequence[str]) -> bool:
    """Do the pass-through options require nodes by name (``-w``/``--nodelist``, ``-F``/``--nodefile``)?"""
    return bool(_option_values(args, "--nodelist", len("--nodel"), "w")
                or _option_values(args, "--nodefile", len("--nodef"), "F"))


def sbatch_excluded_nodes(args: Sequence[str]) -> str | None:
    """The node list the pass-through options exclude (``-x``/``--exclude``; the last one wins, as in sbatch)."""
    # ``--exclud``: ``--exclu`` is also ``--exclusive``.
    values = _option_values(args, "--exclude", len("--exclud"), "x")
    return values[-1] or None if values else None
