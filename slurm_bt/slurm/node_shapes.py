"""What a partition's nodes have (CPUs, memory, GPUs), and a GPU request's share of them.

Why: a truss config sized for Baseten names GPUs and leaves ``cpu_count``/``memory`` at truss's
defaults (1 CPU, 2 GiB), because on Baseten the node shape follows the GPUs. On Slurm those defaults
would become ``--cpus-per-task=1 --mem=2048M`` next to 8 GPUs. When the site file does not say how
many CPUs and how much memory go with one GPU (``cpus_per_gpu``/``mem_per_gpu``),
:mod:`slurm_bt.job_spec` sizes the job from the nodes themselves: :func:`gpu_share` of the records
:meth:`slurm_bt.slurm.client.SlurmClient.nodes` returns (``scontrol --oneliner show node``).

Everything here is pure and total: a record with a missing or unreadable value is left out of the
answer (or its memory is unknown), never an exception.

Numbers read (``scontrol show node``, the same keys on 22.05, 24.11 and 26.05):

* CPUs: ``CPUEfctv`` (CPUs left to jobs after ``CoreSpecCount``/``CpuSpecList``; 22.05+) or, when a
  release does not print it, ``CPUTot``;
* memory: ``RealMemory`` minus ``MemSpecLimit`` (memory the admin reserved for the system and
  slurmd), in MiB as Slurm counts ``--mem``;
* GPUs: the ``gpu`` entries of ``Gres`` (``gpu:h100:4``, ``gpu:h100:4(S:0-1)``, ``gpu:4``,
  ``gpu:a100:2,gpu:h100:2``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slurm_bt.errors import SlurmCommandError

if TYPE_CHECKING:  # the client is passed in; only its type is needed here
    from slurm_bt.slurm.client import SlurmClient

__all__ = ["GpuShare", "NodeShape", "NodeSizes", "gpu_share", "node_shapes", "parse_gpu_gres",
           "read_node_sizes"]

_COUNT = re.compile(r"[0-9]{1,7}")
_PARENS = re.compile(r"\([^)]*\)")


@dataclass(frozen=True)
class NodeShape:
    """One node's size as jobs can use it.

    Attributes:
        name: the Slurm node name.
        partitions: the partitions the node is in.
        cpus: CPUs jobs can be given.
        mem_mib: memory jobs can be given (MiB), ``None`` when Slurm did not say.
        gpus: GPU count per GRES type (``""`` for GPUs configured without a type).
    """

    name: str
    partitions: tuple[str, ...]
    cpus: int
    mem_mib: int | None
    gpus: Mapping[str, int] = field(default_factory=dict)

    def gpu_count(self, gres_type: str | None) -> int:
        """GPUs of ``gres_type`` on this node (every GPU when ``gres_type`` is ``None``)."""
        if gres_type is None:
            return sum(self.gpus.values())
        return self.gpus.get(gres_type, 0)


@dataclass(frozen=True)
class NodeSizes:
    """What the submission learned about the nodes, handed to :func:`slurm_bt.job_spec.build_job_spec`.

    Attributes:
        shapes: every node Slurm listed.
        error: why no shapes could be read (Slurm unreachable...); ``None`` when they were.
        partition: the partition the job will run in when the submitter chose one on the sbatch
            command line (``-- --partition=X`` overrides the site's choice); ``None`` otherwise.
    """

    shapes: tuple[NodeShape, ...] = ()
    error: str | None = None
    partition: str | None = None


@dataclass(frozen=True)
class GpuShare:
    """The CPUs and memory that go with ``gpus`` GPUs on the partition's smallest-share node.

    Attributes:
        cpus: CPUs per node (at least 1).
        mem_mib: memory per node in MiB, ``None`` when no node said how much it has.
        cpus_basis: where ``cpus`` came from, for ``--dry-run`` (``4 of n1's 4 h100 GPUs: 2 of its 2 CPUs``).
        mem_basis: where ``mem_mib`` came from.
    """

    cpus: int
    mem_mib: int | None
    cpus_basis: str
    mem_basis: str


def parse_gpu_gres(text: str) -> dict[str, int]:
    """The GPUs of a ``Gres=`` value: ``{"h100": 4}``; ``""`` names untyped GPUs; junk gives ``{}``."""
    gpus: dict[str, int] = {}
    for item in _PARENS.sub("", text).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) not in (2, 3):
            continue
        gres_type = parts[1] if len(parts) == 3 else ""
        if not _COUNT.fullmatch(parts[-1]):
            continue
        gpus[gres_type] = gpus.get(gres_type, 0) + int(parts[-1])
    return gpus


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and _COUNT.fullmatch(value) else None


def node_shapes(records: Iterable[Mapping[str, str]]) -> list[NodeShape]:
    """``scontrol show node`` records (:func:`slurm_bt.slurm.scontrol.parse_nodes`) → shapes.

    A record without a name or a CPU count is left out: it cannot size anything.
    """
    shapes: list[NodeShape] = []
    for rec in records:
        name = rec.get("NodeName", "")
        cpus = _int(rec.get("CPUEfctv")) or _int(rec.get("CPUTot"))
        if not name or not cpus:
            continue
        real = _int(rec.get("RealMemory"))
        mem = None if not real else max(0, real - (_int(rec.get("MemSpecLimit")) or 0)) or None
        partitions = tuple(p for p in rec.get("Partitions", "").split(",") if p)
        shapes.append(NodeShape(name=name, partitions=partitions, cpus=cpus, mem_mib=mem,
                                gpus=parse_gpu_gres(rec.get("Gres", ""))))
    return shapes


def _gpu_words(count: int, gres_type: str | None) -> str:
    return f"{count} {gres_type} GPU{'s' if count != 1 else ''}" if gres_type else \
        f"{count} GPU{'s' if count != 1 else ''}"


def gpu_share(shapes: Iterable[NodeShape], *, partition: str, gres_type: str | None,
              gpus: int) -> GpuShare | str:
    """The share of CPUs and memory that goes with ``gpus`` GPUs per node in ``partition``.

    Each node that could run the job (in ``partition``, or one of them for ``a,b``; at least ``gpus``
    GPUs of ``gres_type``) offers ``its CPUs x gpus / its GPUs`` (rounded down, at least 1) and the
    same fraction of its memory; the job gets the smallest offer, so it fits on every node Slurm may
    choose. 4 of 4 GPUs is the whole node.

    Returns:
        the share, or a sentence saying why there is none (no node of the partition has that many
        GPUs of that type).
    """
    wanted = {p for p in partition.split(",") if p}  # sbatch takes a list: the job runs in one of them
    fitting = [s for s in shapes if wanted & set(s.partitions) and s.gpu_count(gres_type) >= gpus > 0]
    if not fitting:
        return f"no node of partition {partition} has {_gpu_words(gpus, gres_type)}"

    def cpus_of(s: NodeShape) -> int:
        return max(1, s.cpus * gpus // s.gpu_count(gres_type))

    def mem_of(s: NodeShape) -> int | None:
        return None if s.mem_mib is None else max(1, s.mem_mib * gpus // s.gpu_count(gres_type))

    def among(offers: set[int | None]) -> str:
        if len(fitting) == 1:
            return f" (partition {partition}'s only node with {_gpu_words(gpus, gres_type)})"
        which = "the same on" if len(offers) == 1 else "the smallest share among"
        return f" ({which} partition {partition}'s {len(fitting)} nodes with {_gpu_words(gpus, gres_type)})"

    cpu_node = min(fitting, key=cpus_of)
    cpus_basis = (f"{gpus} of {cpu_node.name}'s {_gpu_words(cpu_node.gpu_count(gres_type), gres_type)}: "
                  f"{cpus_of(cpu_node)} of its {cpu_node.cpus} CPUs{among({cpus_of(s) for s in fitting})}")
    with_mem = [s for s in fitting if s.mem_mib is not None]
    if not with_mem:
        return GpuShare(cpus=cpus_of(cpu_node), mem_mib=None, cpus_basis=cpus_basis,
                        mem_basis=f"Slurm reports no RealMemory for partition {partition}'s nodes")
    mem_node = min(with_mem, key=lambda s: mem_of(s) or 0)
    mem_basis = (f"{gpus} of {mem_node.name}'s {_gpu_words(mem_node.gpu_count(gres_type), gres_type)}: "
                 f"{mem_of(mem_node)} of its {mem_node.mem_mib} MiB{among({mem_of(s) for s in with_mem})}")
    return GpuShare(cpus=cpus_of(cpu_node), mem_mib=mem_of(mem_node), cpus_basis=cpus_basis,
                    mem_basis=mem_basis)


def read_node_sizes(client: SlurmClient, *, partition: str | None = None) -> NodeSizes:
    """Ask Slurm once for every node's size (``scontrol show node``); never raises.

    A failure (controller down, no Slurm on this machine, as for a ``--dry-run`` on a laptop) is
    returned as :attr:`NodeSizes.error` so the job is sized without the share and the user is told
    why, rather than the submission failing on a question it can do without.
    """
    try:
        return NodeSizes(shapes=tuple(node_shapes(client.nodes())), partition=partition)
    except SlurmCommandError as exc:
        return NodeSizes(error=str(exc), partition=partition)
