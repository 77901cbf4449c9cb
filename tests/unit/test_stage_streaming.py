"""The staging job fetches while it lists (issue 14, item 2: ``s5cmd cp`` does, and a 10,000-object
listing was ~0.7 s of a ~5 s stage on the bench VM).

``stage_source`` hands each pinned file the listing reaches (``Backend.list_files_streaming``) to
its download threads at once, and records the entry only when the whole listing matched the pin.
Here a two-page source holds its second page back until a download of the first page has begun:
the overlap is proven, not timed. A source changed after submit still fails the job with nothing
recorded, and a failed download stops the listing. The S3 backend's own streaming (pages served by
a scripted loopback server) is in tests/unit/test_s3_listing.py.
"""

from __future__ import annotations

import collections
import io
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.errors import SourceAccessError, SourceError
from slurm_bt.storage import registry
from slurm_bt.storage.base import Listing, RemoteFile, listing_digest
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.weights.cluster_cache import ClusterCache
from slurm_bt.weights.download import DownloadOptions
from slurm_bt.weights.plan import SourcePin, pin_key, select_listing
from slurm_bt.weights.stage_job import stage_source
from tests.unit.test_download_batch import Source, _bodies, _remote, _Stream

OPTS = DownloadOptions(backoff_base_s=0.0, max_retries=1, max_files=4)


class PagedSource(Source):
    """``bodies`` listed in two pages; each page's files are streamed as the page arrives, and the
    second page waits (up to 10 s) until a GET has begun. ``etags`` overrides what the listing says
    of a file's version (a source changed since submit); ``deny`` answers 403 for one file."""

    def __init__(self, bodies: dict[str, bytes], *, etags: dict[str, str] | None = None,
                 deny: str | None = None) -> None:
        super().__init__(bodies)
        self.etags = etags or {}
        self.deny = deny
        self.first_get = threading.Event()
        self.overlapped: bool | None = None
        self.interrupted = False
        self._lock = threading.Lock()

    def remote(self, path: str) -> RemoteFile:
        f = _remote(path, self.bodies[path])
        return RemoteFile(f.path, f.size, None, etag=self.etags.get(path, f.etag), checksums=f.checksums)

    def list_files(self) -> Listing:
        return self.list_files_streaming(lambda _f: None)

    def list_files_streaming(self, on_file: Callable[[RemoteFile], None]) -> Listing:
        paths = sorted(self.bodies)
        half = len(paths) // 2
        for p in paths[:half]:
            self._hand(on_file, p)
        self.overlapped = self.first_get.wait(10)  # the second page "arrives" once a GET has begun
        for p in paths[half:]:
            self._hand(on_file, p)
        files = tuple(self.remote(p) for p in paths)
        return Listing(self.uri, listing_digest(list(files)), files)

    def _hand(self, on_file: Callable[[RemoteFile], None], path: str) -> None:
        if self.deny is not None:  # paced, so that the refused GET's error is in before the listing ends
            time.sleep(0.02)
        try:
            on_file(self.remote(path))
        except BaseException:
            self.interrupted = True
            raise

    def open_range(self, file: Any, start: int, end: int | None) -> _Stream:
        with self._lock:
            self.requests.append((file.path, start))
        self.first_get.set()
        if file.path == self.deny:
            raise SourceAccessError(self.uri.canonical, "not authorized (403)", file=file.path)
        return _Stream(self.bodies[file.path][start:end])


def _pin(src: PagedSource) -> SourcePin:
    """What bt-sbatch pinned: the listing as it was at submit (no overrides)."""
    at_submit = PagedSource(src.bodies)
    at_submit.first_get.set()
    listing = at_submit.list_files()
    files, revision = select_listing(listing, None, None)
    return SourcePin(index=0, declared=listing.uri.canonical, kind="s3", source=listing.uri.canonical,
                     revision=revision, mount_location="/w",
                     pin_key=pin_key("s3", listing.uri.canonical, revision, files), files=tuple(files))


def _stage(src: PagedSource, root: Path, monkeypatch: pytest.MonkeyPatch, pin: SourcePin | None = None,
           opts: DownloadOptions = OPTS) -> Any:
    monkeypatch.setattr(registry, "open_backend", lambda *a, **k: src)
    return stage_source(pin or _pin(src), ClusterCache(root / "team", dir_mode=0o755),
                        ClusterCache(root / "shared"), credentials=None, endpoints=StorageEndpoints(),
                        options=opts, out=io.StringIO())


def _names(root: Path) -> list[str]:
    return [n for _, _, names in os.walk(root) for n in names]


def test_downloads_start_while_the_listing_goes_on_and_each_file_is_fetched_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = _bodies(40)
    src = PagedSource(bodies)
    outcome = _stage(src, tmp_path, monkeypatch)
    assert src.overlapped is True  # a GET began before the listing's second page
    assert outcome.tier == "miss" and {f.path for f in outcome.manifest.files} == set(bodies)
    gets = collections.Counter(path for path, _ in src.requests)
    assert set(gets) == set(bodies) and set(gets.values()) == {1}  # streamed files are not handed out twice
    team = ClusterCache(tmp_path / "team")
    assert team.has(outcome.manifest)
    snap = team.snapshot_path(outcome.manifest)
    assert all((snap / p).read_bytes() == b for p, b in bodies.items())


def test_without_streaming_every_file_is_still_fetched_biggest_first(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The default ``list_files_streaming`` (hf, gs, azure ...) streams nothing: all files follow the listing."""
    bodies = {f"s{i}": os.urandom(100 * (i + 1)) for i in range(6)}

    class Plain(PagedSource):
        def list_files_streaming(self, on_file: Callable[[RemoteFile], None]) -> Listing:
            files = tuple(self.remote(p) for p in sorted(self.bodies))
            return Listing(self.uri, listing_digest(list(files)), files)

    src = Plain(bodies)
    outcome = _stage(src, tmp_path, monkeypatch, opts=DownloadOptions(backoff_base_s=0.0, max_files=1))
    assert outcome.tier == "miss"
    assert [p for p, _ in src.requests] == sorted(bodies, key=lambda p: -len(bodies[p]))


def test_a_source_changed_after_submit_fails_with_nothing_recorded(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = _bodies(20)
    changed = sorted(bodies)[-1]  # on the second page: the first page was already being fetched
    src = PagedSource(bodies, etags={changed: '"replaced"'})
    pin = _pin(src)
    with pytest.raises(SourceError, match="source changed since submit"):
        _stage(src, tmp_path, monkeypatch, pin)
    assert src.overlapped is True
    assert changed not in {p for p, _ in src.requests}  # not in the pin as listed: never fetched
    team = tmp_path / "team"
    assert not [p for p in (team / "manifests").rglob("*") if p.is_file()]
    assert not [p for p in (team / "snapshots").rglob("*") if p.is_file()]
    assert not (team / "pins").exists() or not os.listdir(team / "pins")
    names = _names(team)
    assert not [n for n in names if ".tmp-" in n], names


def test_a_failed_download_stops_the_listing_and_is_what_is_raised(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = _bodies(20)
    src = PagedSource(bodies, deny=sorted(bodies)[0])
    with pytest.raises(SourceAccessError, match="not authorized"):
        _stage(src, tmp_path, monkeypatch)
    assert src.interrupted  # the listing was stopped, not run to its end
    names = _names(tmp_path / "team")
    assert not [n for n in names if ".tmp-" in n], names
    assert not [p for p in (tmp_path / "team" / "manifests").rglob("*") if p.is_file()]


def test_small_files_run_more_at_once_than_bigger_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small files (one GET each) on up to ``max_small_files`` threads: against a store a round trip away
    that is their rate (behind a 20 ms proxy: 17 s for 10,000 objects with 16, 8-9 s with 64); bigger
    files stay at most ``max_files`` at a time. The first 12 small GETs wait for each other (a barrier):
    the stage passes only if 12 are in flight together."""
    small = {f"a/{i:03d}": os.urandom(3000) for i in range(40)}
    big = {f"z/{i}": os.urandom(300_000) for i in range(6)}
    opts = DownloadOptions(backoff_base_s=0.0, max_retries=1, max_files=2, max_small_files=12,
                           small_file_max=64 << 10, parallel_threshold=1 << 30)
    together = threading.Barrier(12, timeout=20)
    lock = threading.Lock()
    state = {"small_gets": 0, "big": 0, "big_max": 0}

    class Counted(PagedSource):
        def open_range(self, file: Any, start: int, end: int | None) -> _Stream:
            if file.path in small:
                with lock:
                    state["small_gets"] += 1
                    first = state["small_gets"] <= 12
                if first:
                    together.wait()
                return super().open_range(file, start, end)
            with lock:
                state["big"] += 1
                state["big_max"] = max(state["big_max"], state["big"])
            time.sleep(0.05)
            stream = super().open_range(file, start, end)
            close = stream.close

            def closed() -> None:
                with lock:
                    state["big"] -= 1
                close()

            stream.close = closed  # type: ignore[method-assign]
            return stream

    src = Counted({**small, **big})
    outcome = _stage(src, tmp_path, monkeypatch, opts=opts)
    assert outcome.tier == "miss" and len(outcome.manifest.files) == 46
    assert not together.broken  # 12 small GETs were in flight at once
    assert 1 <= state["big_max"] <= 2  # never more bigger files than max_files
