"""Checks where slurm-bt is deliberately stricter than truss, plus memory parsing.

Upstream accepts ``node_count=0``, ``memory="bogus"`` and ``mount_location="/etc/../x"``; Baseten's
backend sorts that out later. On Slurm these values reach ``sbatch`` and root-run prolog scripts,
so the loader rejects them up front. The checks live here, not in the models, so that building
the objects in plain Python still behaves exactly like upstream; every message says
"(slurm-bt is stricter than truss here)" so users know a Baseten-valid config was refused on
purpose.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Iterator
from typing import Any

import pydantic

from slurm_bt.compat.truss_config import Resources
from slurm_bt.errors import Problem

__all__ = [
    "STRICTER",
    "memory_to_bytes",
    "memory_to_mib",
    "mount_location_problem",
    "stricter_problems",
]

STRICTER = "(slurm-bt is stricter than truss here)"

# Upstream's unit table (``Resources._MEMORY_UNITS``), plus "" for plain bytes.
_MEMORY_UNITS: dict[str, int] = {"": 1, **Resources._MEMORY_UNITS}
_MEMORY_RE = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<unit>[A-Za-z]*)")
_MIB = 1024**2

_MAX_PATH_BYTES = 4096
_FORBIDDEN_ROOTS = ("/etc", "/proc", "/sys", "/dev", "/run", "/boot", "/usr", "/bin", "/sbin", "/lib")
_SLURM_SPOOL = re.compile(r"^/var/spool/slurm[^/]*(/|$)")


def memory_to_bytes(memory: str) -> int:
    """Bytes for a Kubernetes-style quantity (``"2Gi"``, ``"512M"``, ``"1.5G"``, ``"1000"``).

    Raises:
        ValueError: the string is not a non-negative number with an optional known unit.
    """
    match = _MEMORY_RE.fullmatch(memory)
    if match is None:
        raise ValueError(
            f"memory {memory!r} is not a number with an optional unit "
            f"({', '.join(u for u in _MEMORY_UNITS if u)})"
        )
    unit = match.group("unit")
    if unit not in _MEMORY_UNITS:
        units = ", ".join(u for u in _MEMORY_UNITS if u)
        raise ValueError(f"memory {memory!r} has unknown unit {unit!r}; use one of {units}")
    # Decimal, not float: "1.1Gi" must not gain or lose a byte to binary rounding.
    return math.ceil(decimal.Decimal(match.group("num")) * _MEMORY_UNITS[unit])


def memory_to_mib(s: str) -> int:
    """Memory in MiB, rounded up, for ``sbatch --mem``; e.g. ``"2Gi"`` -> 2048, ``"1G"`` -> 954.

    Rounding up means a job never gets less than it asked for.

    Raises:
        ValueError: as :func:`memory_to_bytes`.
    """
    return -(-memory_to_bytes(s) // _MIB)


def mount_location_problem(path: str) -> str | None:
    """Why ``path`` is unsafe as a mount point on a shared cluster node, or None if it is fine.

    Relative paths are left alone: upstream already rejects them with its own message.
    """
    if not path.startswith("/"):
        return None
    if any(c in path for c in ("\x00", "\n", "\r")):
        return f"mount_location must not contain NUL or newline characters {STRICTER}"
    if len(path.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        return f"mount_location is longer than {_MAX_PATH_BYTES} bytes {STRICTER}"
    body = path[:-1] if len(path) > 1 and path.endswith("/") else path
    if "//" in body or any(part in (".", "..") for part in body.split("/")):
        return f"mount_location {path!r} must be a normalised path (no '.', '..' or '//') {STRICTER}"
    if body == "/":
        return f"mount_location must not be '/' {STRICTER}"
    for root in (*_FORBIDDEN_ROOTS, "/lib32", "/lib64"):
        if body == root or body.startswith(root + "/"):
            return f"mount_location {path!r} is under the system directory {root} {STRICTER}"
    if _SLURM_SPOOL.match(body):
        return f"mount_location {path!r} is under the Slurm spool directory {STRICTER}"
    return None


def _get(obj: Any, name: str) -> Any:
    """Field ``name`` of a model or key of a dict; None when absent (trees may be half-valid)."""
    if isinstance(obj, pydantic.BaseModel):
        return getattr(obj, name, None)
    if isinstance(obj, dict):
        return obj.get(name)
    return None


def _string_problems(value: Any, loc: str) -> Iterator[Problem]:
    """NUL bytes and unencodable text (lone surrogates) anywhere in the config.

    Every string may end up in a script, a path or the environment: a NUL cannot be represented in
    any of them, and a lone surrogate cannot even be written out as UTF-8.
    """
    if isinstance(value, str):
        if "\0" in value:
            yield Problem(loc, f"contains a NUL byte {STRICTER}")
        else:
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                yield Problem(loc, f"is not valid Unicode text (lone surrogate) {STRICTER}")
    elif isinstance(value, pydantic.BaseModel):
        extra = value.__pydantic_extra__ or {}
        for name in [*type(value).model_fields, *extra]:
            yield from _string_problems(getattr(value, name, None), f"{loc}.{name}" if loc else name)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _string_problems(key, f"{loc}[{key!r}]")
            yield from _string_problems(item, f"{loc}.{key}" if isinstance(key, str) and key.isidentifier()
                                        else f"{loc}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _string_problems(item, f"{loc}[{i}]")


def _problems(job: Any) -> Iterator[Problem]:
    compute = _get(job, "compute")
    node_count = _get(compute, "node_count")
    if isinstance(node_count, int) and not isinstance(node_count, bool) and node_count < 1:
        yield Problem("job.compute.node_count", f"must be at least 1, got {node_count} {STRICTER}")
    cpu_count = _get(compute, "cpu_count")
    if isinstance(cpu_count, int) and not isinstance(cpu_count, bool) and cpu_count < 1:
        yield Problem("job.compute.cpu_count", f"must be at least 1, got {cpu_count} {STRICTER}")
    memory = _get(compute, "memory")
    if isinstance(memory, str):
        try:
            if memory_to_bytes(memory) <= 0:
                yield Problem("job.compute.memory", f"must be greater than 0, got {memory!r} {STRICTER}")
        except ValueError as exc:
            yield Problem("job.compute.memory", f"{exc} {STRICTER}")
    weights = _get(job, "weights")
    if isinstance(weights, (list, tuple)):
        for i, weight in enumerate(weights):
            location = _get(weight, "mount_location")
            if isinstance(location, str):
                message = mount_location_problem(location)
                if message:
                    yield Problem(f"job.weights[{i}].mount_location", message)


def stricter_problems(project: Any) -> list[Problem]:
    """slurm-bt's extra checks on a project (validated, or a raw tree of models and dicts).

    Values of the wrong type are skipped: pydantic already reports those, once.
    """
    text = list(_string_problems(project, ""))
    seen = {p.loc for p in text}  # one problem per field: a NUL makes other checks of it moot
    return [*text, *(p for p in _problems(_get(project, "job")) if p.loc not in seen)]
