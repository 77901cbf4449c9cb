"""``slurm-bt metrics``: what a job used, from Slurm's own accounting, as a readable summary.

Sources (one call each, as the caller): ``sacct`` for the allocation and finished steps, ``sstat``
for steps still running (Slurm answers it only for the caller's own jobs). The numbers:

* CPU: CPU time used by all steps / (allocated CPUs * elapsed) = CPU efficiency;
* memory: the peak resident set of any task (``MaxRSS``) against the memory allocated per node;
* GPUs: allocated ``gres/gpu``; utilisation and GPU memory only when the site accounts
  ``gres/gpuutil``/``gres/gpumem`` (NVML), otherwise the summary says so rather than guessing.

Pictures: a bar for each efficiency, and with ``--watch`` a sparkline per metric over the samples
(truss's ``metrics`` refreshes every 30 s; we keep the same cadence by default).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from slurm_bt.slurm.client import SlurmClient
from slurm_bt.slurm.job_ids import JobId, parse_job_id
from slurm_bt.slurm.sacct import JobRow, StepUsage
from slurm_bt.units import format_bytes

__all__ = ["Metrics", "bar", "collect_metrics", "render_metrics", "sparkline"]

_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], *, lo: float | None = None, hi: float | None = None) -> str:
    """``[1, 5, 3]`` → ``▁█▄``; an empty list gives ``""``, a flat one the lowest bar."""
    if not values:
        return ""
    low = min(values) if lo is None else lo
    high = max(values) if hi is None else hi
    span = high - low
    out = []
    for v in values:
        frac = 0.0 if span <= 0 else min(max((v - low) / span, 0.0), 1.0)
        out.append(_SPARKS[round(frac * (len(_SPARKS) - 1))])
    return "".join(out)


def bar(fraction: float, width: int = 20) -> str:
    """``0.5`` → ``██████████░░░░░░░░░░`` (clamped to 0..1)."""
    frac = min(max(fraction, 0.0), 1.0)
    full = round(frac * width)
    return "█" * full + "░" * (width - full)



@dataclass
class Metrics:
    """One job's usage summary (all numbers from Slurm; ``None`` where Slurm did not say).

    Attributes:
        job_id: the job.
        state: its Slurm state.
        elapsed_s: wall time so far.
        nnodes: allocated nodes.
        alloc_cpus: allocated CPUs (all nodes).
        alloc_mem_bytes: allocated memory (all nodes).
        alloc_gpus: allocated GPUs (all nodes).
        cpu_used_s: CPU time used by all steps.
        peak_rss_bytes: largest resident set of any task; ``peak_rss_node`` where.
        gpu_util_pct: mean GPU utilisation, when accounted.
        gpu_mem_bytes: peak GPU memory, when accounted.
        steps: the per-step usage rows used.
        live: True when running steps were measured with sstat.
    """

    job_id: str
    state: str = ""
    elapsed_s: int | None = None
    nnodes: int | None = None
    alloc_cpus: int | None = None
    alloc_mem_bytes: int | None = None
    alloc_gpus: int = 0
    cpu_used_s: float | None = None
    peak_rss_bytes: int | None = None
    peak_rss_node: str = ""
    gpu_util_pct: float | None = None
    gpu_mem_bytes: float | None = None
    steps: list[StepUsage] = field(default_factory=list)
    live: bool = False

    @property
    def cpu_efficiency(self) -> float | None:
        """CPU time used / CPU time allocated (0..1), when both are known."""
        if self.cpu_used_s is None or not self.alloc_cpus or not self.elapsed_s:
            return None
        return self.cpu_used_s / (self.alloc_cpus * self.elapsed_s)

    @property
    def mem_per_node_bytes(self) -> int | None:
        """Allocated memory per node (what one task on one node could use)."""
        if not self.alloc_mem_bytes or not self.nnodes:
            return None
        return self.alloc_mem_bytes // self.nnodes

    @property
    def mem_efficiency(self) -> float | None:
        """Peak task RSS / memory per node (0..1)."""
        per_node = self.mem_per_node_bytes
        if self.peak_rss_bytes is None or not per_node:
            return None
        return self.peak_rss_bytes / per_node

    def as_dict(self) -> dict[str, Any]:
        """JSON shape for ``--json``."""
        return {
            "id": self.job_id,
            "slurm_state": self.state,
            "elapsed_s": self.elapsed_s,
            "nodes": self.nnodes,
            "cpus": self.alloc_cpus,
            "cpu_used_s": self.cpu_used_s,
            "cpu_efficiency": self.cpu_efficiency,
            "memory_bytes": self.alloc_mem_bytes,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_rss_node": self.peak_rss_node or None,
            "memory_efficiency": self.mem_efficiency,
            "gpus": self.alloc_gpus,
            "gpu_util_pct": self.gpu_util_pct,
            "gpu_memory_bytes": self.gpu_mem_bytes,
            "live": self.live,
            "steps": [
                {
                    "id": str(s.job_id),
                    "state": s.state or "RUNNING",
                    "source": s.source,
                    "cpu_s": _step_cpu(s),
                    "max_rss_bytes": s.max_rss_bytes,
                    "max_rss_node": s.max_rss_node or None,
                }
                for s in self.steps
            ],
        }


def _step_cpu(step: StepUsage) -> float | None:
    if step.total_cpu_s is not None and step.source == "sacct":
        return step.total_cpu_s
    return step.usage_tot.get("cpu", step.total_cpu_s)


def collect_metrics(client: SlurmClient, job_id: str, row: JobRow | None) -> Metrics:
    """Usage of ``job_id``: one sacct call for the steps, plus one sstat call while it runs.

    Args:
        client: runs the commands as the caller.
        job_id: the job.
        row: the job's allocation row from a status query (allocation sizes, state, elapsed).
    """
    jid: JobId = parse_job_id(job_id)
    m = Metrics(job_id=job_id)
    if row is not None:
        m.state = row.state
        m.elapsed_s = row.elapsed_s
        m.nnodes = row.nnodes
        m.alloc_cpus = row.alloc_tres.get("cpu")
        m.alloc_mem_bytes = row.alloc_tres.get("mem")
        m.alloc_gpus = row.gpus
    steps: dict[JobId, StepUsage] = {s.job_id: s for s in client.usage([jid])}
    if row is not None and row.state in {"RUNNING", "COMPLETING", "SUSPENDED"}:
        live = client.live_usage([jid])
        m.live = bool(live)
        for s in live:  # sstat is fresher than sacct for a running step
            steps[s.job_id] = s
    m.steps = sorted(steps.values(), key=lambda s: str(s.job_id))
    cpu = [c for c in (_step_cpu(s) for s in m.steps) if c is not None]
    m.cpu_used_s = sum(cpu) if cpu else None
    peaks = [(s.usage_max.get("mem", s.max_rss_bytes or 0), s) for s in m.steps]
    peaks = [(p, s) for p, s in peaks if p]
    if peaks:
        peak, step = max(peaks, key=lambda p: p[0])
        m.peak_rss_bytes = int(peak)
        m.peak_rss_node = step.usage_max_node.get("mem", step.max_rss_node)
    utils = [s.usage_ave["gres/gpuutil"] for s in m.steps if "gres/gpuutil" in s.usage_ave]
    m.gpu_util_pct = sum(utils) / len(utils) if utils else None
    gmem = [s.usage_max["gres/gpumem"] for s in m.steps if "gres/gpumem" in s.usage_max]
    m.gpu_mem_bytes = max(gmem) if gmem else None
    return m


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def render_metrics(m: Metrics, history: list[Metrics] | None = None) -> list[str]:
    """The human summary; ``history`` (oldest first, ending with ``m``) adds sparklines."""
    lines = [f"Job {m.job_id}  {m.state or 'UNKNOWN'}  elapsed {_duration(m.elapsed_s)}  "
             f"nodes {m.nnodes if m.nnodes is not None else '-'}" + ("  (live: sstat)" if m.live else "")]
    eff = m.cpu_efficiency
    cpu_line = f"  CPU     {_duration(m.cpu_used_s)} used of {m.alloc_cpus or '-'} CPUs"
    if eff is not None:
        cpu_line += f"  {bar(eff)} {eff * 100:5.1f}% efficiency"
    lines.append(cpu_line)
    meff = m.mem_efficiency
    mem_line = f"  Memory  peak {format_bytes(m.peak_rss_bytes)}"
    if m.peak_rss_node:
        mem_line += f" on {m.peak_rss_node}"
    mem_line += f" of {format_bytes(m.mem_per_node_bytes)} per node"
    if meff is not None:
        mem_line += f"  {bar(meff)} {meff * 100:5.1f}%"
    lines.append(mem_line)
    if m.alloc_gpus:
        gpu_line = f"  GPUs    {m.alloc_gpus} allocated"
        if m.gpu_util_pct is not None:
            gpu_line += f"  {bar(m.gpu_util_pct / 100)} {m.gpu_util_pct:5.1f}% utilisation"
        if m.gpu_mem_bytes is not None:
            gpu_line += f"  peak memory {format_bytes(m.gpu_mem_bytes)}"
        if m.gpu_util_pct is None and m.gpu_mem_bytes is None:
            gpu_line += " (utilisation not accounted on this cluster: needs AccountingStorageTRES=gres/gpuutil)"
        lines.append(gpu_line)
    else:
        lines.append("  GPUs    none allocated")
    if history and len(history) > 1:
        cpu_rates = _cpu_rates(history)
        if cpu_rates:
            lines.append(f"  CPU %   {sparkline(cpu_rates, lo=0, hi=100)}  now {cpu_rates[-1]:.0f}% "
                         f"(0-100% of allocated CPUs, {len(history)} samples)")
        mem = [float(h.peak_rss_bytes or 0) for h in history]
        lines.append(f"  Memory  {sparkline(mem, lo=0)}  max {format_bytes(max(mem))}")
        gpu = [h.gpu_util_pct for h in history if h.gpu_util_pct is not None]
        if gpu:
            lines.append(f"  GPU %   {sparkline(gpu, lo=0, hi=100)}")
    if m.steps:
        lines.append("  Steps:")
        for s in m.steps:
            lines.append(f"    {s.job_id!s:<14} {(s.state or 'RUNNING'):<10} cpu {_duration(_step_cpu(s)):>9}  "
                         f"max rss {format_bytes(s.usage_max.get('mem', s.max_rss_bytes)):>10}"
                         + (f" on {s.usage_max_node.get('mem', s.max_rss_node)}"
                            if s.usage_max_node.get("mem", s.max_rss_node) else ""))
    return lines


def _cpu_rates(history: list[Metrics]) -> list[float]:
    """CPU use between consecutive samples, as % of the allocated CPUs."""
    out = []
    for prev, cur in itertools.pairwise(history):
        if None in (prev.cpu_used_s, cur.cpu_used_s, prev.elapsed_s, cur.elapsed_s) or not cur.alloc_cpus:
            continue
        dt = float(cur.elapsed_s or 0) - float(prev.elapsed_s or 0)
        if dt <= 0:
            continue
        used = float(cur.cpu_used_s or 0) - float(prev.cpu_used_s or 0)
        out.append(max(0.0, min(100.0, used / (dt * cur.alloc_cpus) * 100)))
    return out
