"""``scontrol``: node addresses, hostlist expansion, releasing held jobs, and the running config.

:class:`~slurm_bt.slurm.client.SlurmClient` runs every ``scontrol`` slurm-bt needs
(``node_addr``, ``nodes``, ``hostnames``, ``release``, ``config``); this module holds the argv and
the parsers of the answers. All parsers are total (junk in, empty answer out).

Release differences handled here:

* ``show node``/``show config`` print ``Key=value`` pairs whose values may contain spaces
  (``OS=Linux 5.10.0-28 #1 SMP``, ``Reason=disk full [root@2026-11-22]``): a token that does not
  start a new ``Key=`` continues the previous value (:func:`parse_key_values`).
* ``show config`` prints ``Key = value`` lines (with spaces around ``=``), and from 24.11 a
  list-valued key as one line per element, ``Prolog[0] = /a`` ``Prolog[1] = /b``, where 22.05 printed
  ``Prolog = /a``. :func:`parse_config` folds the indexed form back into ``Prolog = /a,/b`` so a
  caller asks for ``Prolog`` on every release.
"""

from __future__ import annotations

import re

from slurm_bt.slurm.job_ids import JobId, job_id_args

__all__ = [
    "build_hostnames_argv",
    "build_release_argv",
    "build_show_config_argv",
    "build_show_node_argv",
    "parse_config",
    "parse_hostnames",
    "parse_key_values",
    "parse_nodes",
]

# Slurm node names (and the hostlist expressions that compress them: ``n[1-2],gpu-07``). The first
# character is never ``-``, so a value cannot become an option of scontrol.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-]*")
_HOSTLIST = re.compile(r"[A-Za-z0-9\[][A-Za-z0-9._\-\[\],]*")
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", re.DOTALL)
# ``Name = value`` or ``Name[3] = value`` of ``scontrol show config``.
_CONFIG_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)(?:\[([0-9]+)\])?\s*=\s?(.*)$")


def build_show_node_argv(node_name: str | None = None) -> list[str]:
    """``scontrol --oneliner show node [NAME]`` (one line per node).

    Raises:
        ValueError: ``node_name`` is not a plain node name.
    """
    argv = ["scontrol", "--oneliner", "show", "node"]
    if node_name is not None:
        if not _NODE_NAME.fullmatch(node_name):
            raise ValueError(f"not a node name: {node_name!r}")
        argv.append(node_name)
    return argv


def build_hostnames_argv(nodelist: str) -> list[str]:
    """``scontrol show hostnames EXPR``: expand a hostlist such as ``n[1-2]`` into names.

    Raises:
        ValueError: ``nodelist`` is empty or not a hostlist expression.
    """
    if not _HOSTLIST.fullmatch(nodelist):
        raise ValueError(f"not a Slurm node list: {nodelist!r}")
    return ["scontrol", "show", "hostnames", nodelist]


def build_release_argv(job_id: str | int | JobId) -> list[str]:
    """``scontrol release ID`` (a job submitted with ``--hold``).

    Raises:
        ValueError: ``job_id`` is malformed.
    """
    return ["scontrol", "release", *job_id_args([job_id])]


def build_update_priority_argv(job_id: str | int | JobId, priority: int) -> list[str]:
    """``scontrol update JobId=ID Priority=N`` (``slurm-bt train update --priority``).

    Raises:
        ValueError: ``job_id`` is malformed, or ``priority`` is below 1 (0 means "hold" to Slurm).
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority < 2**32 - 1:
        raise ValueError(f"priority must be an integer from 1 to {2**32 - 2}, got {priority!r}")
    [jid] = job_id_args([job_id])
    return ["scontrol", "update", f"JobId={jid}", f"Priority={priority}"]


def build_show_config_argv() -> list[str]:
    """``scontrol show config``: the configuration slurmctld is running with."""
    return ["scontrol", "show", "config"]


def parse_key_values(record: str) -> dict[str, str]:
    """Split ``Key=value Key2=value with spaces`` into pairs; the first occurrence of a key wins.

    A token that does not start with a capitalised ``Key=`` continues the previous value.
    """
    pairs: dict[str, str] = {}
    last: str | None = None
    for token in record.split():
        m = _KEY.match(token)
        if m and m.group(1)[0].isupper() and m.group(1) not in pairs:
            last = m.group(1)
            pairs[last] = m.group(2)
        elif last is not None:
            pairs[last] += " " + token
    return pairs


def parse_nodes(text: str) -> list[dict[str, str]]:
    """``scontrol show node`` (``--oneliner`` or the multi-line form) → one dict per node."""
    records: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("NodeName="):
            records.append(stripped)
        elif stripped and records:
            records[-1] += " " + stripped
    return [parse_key_values(r) for r in records]


def parse_hostnames(text: str) -> list[str]:
    """``scontrol show hostnames`` prints one node name a line; anything else is dropped."""
    return [w for w in text.split() if _NODE_NAME.fullmatch(w)]


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config`` → ``{"Prolog": "/a,/b", "PrologFlags": "Alloc,Contain", ...}``.

    Lines without ``=`` (``Configuration data as of ...``, section titles, ``Slurmctld(primary) at
    ... is UP``) are ignored. A later plain line for the same key wins (as it did before the
    indexed form existed); indexed lines (``Prolog[0] = /a``, 24.11+) are joined with ``,`` in index
    order, the way 22.05 prints a list on one line.
    """
    conf: dict[str, str] = {}
    indexed: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        m = _CONFIG_LINE.match(line.strip())
        if m is None:
            continue
        key, index, value = m.group(1), m.group(2), m.group(3).strip()
        if index is None:
            conf[key] = value
        elif len(index) < 6:  # an index is a small list position; bound it against junk
            indexed.setdefault(key, {})[int(index)] = value
    for key, items in indexed.items():
        conf.setdefault(key, ",".join(v for _, v in sorted(items.items()) if v and v != "(null)"))
    return conf
