"""Shared helpers for the weights-cache tests (no tests here): fake sources, fetchers, authorizers."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.atomic import syncfs as real_syncfs
from slurm_bt.weights.manifest import Manifest, ManifestFile


def make_manifest(files: Mapping[str, bytes], source: str = "hf://org/model", revision: str = "a" * 40) -> Manifest:
    """A manifest pinning ``files`` (path → content)."""
    return Manifest(
        kind="hf",
        source=source,
        revision=revision,
        files=tuple(
            ManifestFile(path=p, size=len(b), sha256=hashlib.sha256(b).hexdigest()) for p, b in files.items()
        ),
    )


def write_origin(origin: Path, files: Mapping[str, bytes]) -> None:
    """Lay ``files`` out under ``origin`` as the fake upstream."""
    for p, b in files.items():
        dst = origin / p
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(b)


class DirFetcher:
    """A picklable fetcher copying from a local "origin" dir; logs each fetch to ``log_dir``."""

    def __init__(self, origin: Path, log_dir: Path | None = None, corrupt: bool = False) -> None:
        self.origin = origin
        self.log_dir = log_dir
        self.corrupt = corrupt

    def __call__(self, f: ManifestFile, tmp_dir: Path) -> Path:
        dst = tmp_dir / "download"
        shutil.copyfile(self.origin / f.path, dst)
        if self.corrupt and f.size:
            with open(dst, "r+b") as fh:  # same-length corruption (huggingface_hub would accept it)
                b = fh.read(1)
                fh.seek(0)
                fh.write(bytes([b[0] ^ 0xFF]))
        if self.log_dir is not None:
            (self.log_dir / f"{f.sha256}.{os.getpid()}.{os.urandom(4).hex()}").touch()
        return dst


def allow(_m: Manifest) -> None:
    """An authorizer that lets everyone in."""


def deny(m: Manifest) -> None:
    """An authorizer for a user whose token lacks access (the sources layer's job in production)."""
    raise PermissionError(f"not authorized for {m.source}")


def random_bytes(n: int, seed: int = 0) -> bytes:
    """Deterministic incompressible bytes (never benchmark or test with zeros)."""
    out = bytearray()
    h = hashlib.sha256(str(seed).encode()).digest()
    while len(out) < n:
        h = hashlib.sha256(h).digest()
        out += h * 64 if n > 1 << 20 else h
    return bytes(out[:n])


class Cancelled(Exception):
    """What a test's progress callback raises to cancel a node fill (as the node stager's does)."""


def fill_cancelled_after(node: Any, manifest: Manifest, tier: Any, calls: int) -> None:
    """``node.fill(manifest, [tier])`` whose progress callback cancels on its ``calls``-th call."""
    seen = [0]

    def progress(_n: int) -> None:
        seen[0] += 1
        if seen[0] == calls:
            raise Cancelled

    with pytest.raises(Cancelled):
        node.fill(manifest, [tier], progress=progress)


class SyncCounts:
    """Counts cache_layout's ``syncfs`` and every ``os.fsync`` while ``monkeypatch`` is active."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.syncfs = 0
        self.fsync = 0
        real_fsync = os.fsync

        def counting_syncfs(fd: int) -> None:
            self.syncfs += 1
            real_syncfs(fd)

        def counting_fsync(fd: int) -> None:
            self.fsync += 1
            real_fsync(fd)

        monkeypatch.setattr("slurm_bt.weights.cache_layout.syncfs", counting_syncfs)
        monkeypatch.setattr(os, "fsync", counting_fsync)
