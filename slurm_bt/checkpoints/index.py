"""The per-job checkpoint index: what was uploaded, by which node rank, with which sha256.

Why two levels: several nodes upload at once, and object stores have no cheap compare-and-swap on
one ``index.json``. Each rank therefore owns one part, ``ranks/rank-<n>.json`` (a single writer,
so no lost updates), and after every change rewrites ``index.json`` as the merge of all parts.
Readers merge the parts themselves (:func:`merge_parts`), so a stale ``index.json`` written by a
slower rank never hides a checkpoint; ``index.json`` is the convenient, documented view.

A checkpoint enters a rank's part only after every one of its files was uploaded and verified, so a
listed checkpoint is never partial on that rank.

When is a multi-node checkpoint *complete* (:func:`merge_parts`, docs/checkpoints.md)? Trainers
write checkpoints in two ways: DDP-style, rank 0 alone writes (the other nodes' ``BT_CHECKPOINT_DIR``
stays empty), or sharded (FSDP, DeepSpeed: every node writes its part). So the rule is taken from
the ranks that write checkpoints at all: a checkpoint is complete when every rank of the job either
lists it, or has *reported* that it writes none. A rank reports that through its part: ``final``
(its uploader made its last pass after the start commands ended) with nothing listed, or
``empty_at`` (its uploader saw no directory at all in its ``BT_CHECKPOINT_DIR``) at least
:data:`EMPTY_GRACE_S` after the checkpoint was uploaded, so a sharded rank that is still writing
its part (its directory exists, in progress) is never mistaken for a rank that writes nothing. A
rank that lists any checkpoint is a writer: a checkpoint it lacks is incomplete (``waiting`` while
it may still upload it, ``missing`` once its last pass is done) and never loaded.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "EMPTY_GRACE_S",
    "EMPTY_REFRESH_S",
    "INDEX_FORMAT",
    "CheckpointView",
    "FileEntry",
    "JobIndex",
    "RankCheckpoint",
    "RankIndex",
    "decode_relpath",
    "encode_relpath",
    "merge_parts",
    "natural_key",
    "parse_time",
    "utc_now",
]

INDEX_FORMAT = "slurm-bt-checkpoint-index/1"

EMPTY_GRACE_S = 60.0
"""How long after a checkpoint's upload a rank must still have seen an empty ``BT_CHECKPOINT_DIR``
to count as a rank that writes none (sharded trainers create their part's directory as they start
saving, well within this; the uploaders refresh ``empty_at`` every :data:`EMPTY_REFRESH_S`)."""

EMPTY_REFRESH_S = 30.0
"""How often a rank whose ``BT_CHECKPOINT_DIR`` stays empty republishes ``empty_at`` (one small write)."""


def parse_time(stamp: str) -> float:
    """Seconds since the epoch of an index timestamp (0.0 when it cannot be parsed)."""
    try:
        return _dt.datetime.fromisoformat(stamp).timestamp()
    except (TypeError, ValueError):
        return 0.0


def utc_now() -> str:
    """ISO-8601 UTC timestamp with seconds precision (what the index records)."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
_ESCAPE_BYTES = re.compile(rb"%([0-9A-Fa-f]{2})")


def _needs_escape(ch: str) -> bool:
    # Controls (C0, DEL, C1) break line-based tools, GCS object names and logs; a lone surrogate is
    # how Python spells a byte that is not UTF-8 (os.fsdecode) and cannot be stored in JSON or a key.
    o = ord(ch)
    return o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF


def _encode_component(raw: bytes) -> str:
    text = raw.decode("utf-8", "surrogateescape")
    if not any(_needs_escape(c) for c in text) and not _ESCAPE.search(text):
        return text  # the common case: the name as it is, so ordinary keys never change
    out = []
    for ch in text:
        if ch == "%" or _needs_escape(ch):
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape")))
        else:
            out.append(ch)
    return "".join(out)


def encode_relpath(raw: bytes | str) -> str:
    """A checkpoint file's relative path as stored in keys and indexes: printable UTF-8 that round-trips.

    Why: a job may name a file with bytes that are not UTF-8 or with a newline; such a name once
    failed the whole final flush (and its hand-off for ever). Names that are valid UTF-8 without
    control characters are kept as they are; any other component is percent-encoded: each
    non-UTF-8 byte, control character and ``%`` becomes ``%XX``. A plain name that merely looks
    encoded (``50%25.bin``) is encoded too, so :func:`decode_relpath` is its exact inverse. ``/``
    separates components and never appears inside one.
    """
    data = os.fsencode(raw) if isinstance(raw, str) else raw
    return "/".join(_encode_component(part) for part in data.split(b"/"))


def decode_relpath(path: str) -> bytes:
    """The file name bytes behind an :func:`encode_relpath` path (what a download creates).

    Raises:
        ValueError: a component decodes to something that could leave the download folder
            (``..``, ``.``, empty, ``/`` or NUL inside).
    """
    parts = []
    for comp in path.split("/"):
        raw = _ESCAPE_BYTES.sub(lambda m: bytes([int(m.group(1), 16)]), comp.encode("utf-8", "surrogateescape"))
        if raw in (b"", b".", b"..") or b"/" in raw or b"\0" in raw:
            raise ValueError(f"unsafe path in the index: {path!r}")
        parts.append(raw)
    return b"/".join(parts)


def natural_key(name: str) -> tuple[object, ...]:
    """Sort ``checkpoint-9`` before ``checkpoint-10``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FileEntry(_Model):
    """One uploaded file. ``path`` is relative to the checkpoint directory (``/``-separated), in the
    :func:`encode_relpath` form (plain for ordinary names; decode with :func:`decode_relpath`)."""

    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RankCheckpoint(_Model):
    """One checkpoint as one rank uploaded it.

    Attributes:
        name: the directory name under ``BT_CHECKPOINT_DIR``.
        created: when the checkpoint was complete on the node (marker or last change), UTC.
        uploaded: when its upload was verified, UTC.
        completion: why it was considered complete: ``marker``, ``quiet`` or ``final`` (the start
            commands had ended, so nothing could still be writing it).
        files: every file, sorted by path.
        source_mtime: see below.
    """

    name: str
    created: str
    uploaded: str
    completion: str
    files: tuple[FileEntry, ...]
    source_mtime: float = 0.0
    """Newest mtime in the node's directory when it was uploaded (lets a rerun skip it unchanged)."""

    @property
    def size(self) -> int:
        """Total bytes."""
        return sum(f.size for f in self.files)


class RankIndex(_Model):
    """``ranks/rank-<n>.json``: everything one node rank uploaded for one job."""

    format: str = INDEX_FORMAT
    project_name: str
    project_id: str
    job_id: str
    user: str
    rank: int
    group_size: int
    updated: str
    checkpoints: tuple[RankCheckpoint, ...] = ()
    uploading: tuple[RankCheckpoint, ...] = ()
    """Checkpoints in flight: the files verified so far (lets a restart skip them; never listed)."""
    empty_at: str | None = None
    """Latest time this rank's uploader saw no directory at all in its ``BT_CHECKPOINT_DIR`` (None as
    soon as one appears): evidence that the trainer writes no checkpoint on this node."""
    expired: dict[str, float] = Field(default_factory=dict)
    """Checkpoints this rank deleted under the job's retention policy: name → the newest mtime they
    had (the uploader uploads such a name again only if the trainer rewrites it)."""
    final: bool = False
    """The uploader's last pass of the current run is done (the start commands had ended): what this
    rank lists is all it will list for that run. Reset when a restarted run's uploader starts."""

    def without(self, names: Iterable[str]) -> RankIndex:
        """A copy with the named checkpoints dropped (retention)."""
        drop = set(names)
        return self.model_copy(update={"checkpoints": tuple(c for c in self.checkpoints if c.name not in drop),
                                       "updated": utc_now()})

    def with_checkpoint(self, ckpt: RankCheckpoint) -> RankIndex:
        """A copy with ``ckpt`` added or replaced (by name), sorted naturally."""
        rest = [c for c in self.checkpoints if c.name != ckpt.name]
        ordered = sorted([*rest, ckpt], key=lambda c: natural_key(c.name))
        return self.model_copy(update={"checkpoints": tuple(ordered), "updated": utc_now()})

    def get(self, name: str) -> RankCheckpoint | None:
        """The named checkpoint, if this rank uploaded it."""
        return next((c for c in self.checkpoints if c.name == name), None)


class CheckpointView(_Model):
    """One checkpoint of a job across its ranks (what ``list`` shows and ``resolve`` pins).

    Attributes:
        name: checkpoint name.
        created: the latest ``created`` among its ranks.
        ranks: rank → files, for every rank that uploaded it.
        complete: every rank of the job (``group_size``) has it or has reported that it writes no
            checkpoint (module docstring); only complete checkpoints are latest or loadable.
        waiting: ranks that lack it but may still upload it (or have not reported yet).
        missing: ranks that write checkpoints, made their last pass, and lack it: never complete.
        uploaded: when its last rank's upload was verified, UTC.
    """

    name: str
    created: str
    ranks: dict[int, tuple[FileEntry, ...]]
    complete: bool
    waiting: tuple[int, ...] = ()
    missing: tuple[int, ...] = ()
    uploaded: str = ""

    @property
    def size(self) -> int:
        """Total bytes over all ranks."""
        return sum(f.size for files in self.ranks.values() for f in files)

    @property
    def file_count(self) -> int:
        """Number of files over all ranks."""
        return sum(len(files) for files in self.ranks.values())


class JobIndex(_Model):
    """``index.json``: the merged view of one job's checkpoints."""

    format: str = INDEX_FORMAT
    project_name: str
    project_id: str
    job_id: str
    user: str
    group_size: int
    updated: str
    checkpoints: tuple[CheckpointView, ...] = ()
    expired: tuple[str, ...] = ()
    """Checkpoint names some rank deleted under the retention policy (never loadable again)."""

    def get(self, name: str) -> CheckpointView | None:
        """The named checkpoint, or None."""
        return next((c for c in self.checkpoints if c.name == name), None)

    def latest(self) -> CheckpointView | None:
        """The newest *complete* checkpoint (by ``created``, then natural name order)."""
        done = [c for c in self.checkpoints if c.complete]
        return max(done, key=lambda c: (c.created, natural_key(c.name)), default=None)


def _lacking(part: RankIndex | None, uploaded: float) -> str:
    """Why a rank that does not list a checkpoint uploaded at ``uploaded`` (epoch) does not block it.

    ``ok``: the rank writes no checkpoints (it reported so); ``missing``: it writes checkpoints and
    its last pass is done; ``waiting``: it has not reported (yet) or may still upload it.
    """
    if part is None:
        return "waiting"
    if part.checkpoints:
        return "missing" if part.final else "waiting"
    if part.empty_at is None:
        return "waiting"
    if part.final or parse_time(part.empty_at) >= uploaded + EMPTY_GRACE_S:
        return "ok"
    return "waiting"


def merge_parts(parts: Iterable[RankIndex]) -> JobIndex | None:
    """Merge rank parts into the job's index (None when there are none); completeness per the module docstring."""
    plist = sorted(parts, key=lambda p: p.rank)
    if not plist:
        return None
    first = plist[0]
    group = max(p.group_size for p in plist)
    by_rank = {p.rank: p for p in plist}
    by_name: dict[str, dict[int, RankCheckpoint]] = {}
    for part in plist:
        for ckpt in part.checkpoints:
            by_name.setdefault(ckpt.name, {})[part.rank] = ckpt
    expired = {n for p in plist for n in p.expired}
    views = []
    for name in sorted(by_name, key=natural_key):
        ranks = by_name[name]
        uploaded = max(c.uploaded for c in ranks.values())
        at = parse_time(uploaded)
        verdicts = {r: _lacking(by_rank.get(r), at) for r in range(group) if r not in ranks}
        waiting = tuple(r for r, v in verdicts.items() if v == "waiting")
        missing = tuple(r for r, v in verdicts.items() if v == "missing")
        views.append(CheckpointView(
            name=name,
            created=max(c.created for c in ranks.values()),
            ranks={r: c.files for r, c in sorted(ranks.items())},
            # A name some rank deleted under retention lacks that rank's part for good.
            complete=not waiting and not missing and name not in expired,
            waiting=waiting,
            missing=missing,
            uploaded=uploaded,
        ))
    return JobIndex(project_name=first.project_name, project_id=first.project_id, job_id=first.job_id,
                    user=first.user, group_size=group, updated=max(p.updated for p in plist),
                    checkpoints=tuple(views),
                    expired=tuple(sorted(expired, key=natural_key)))
