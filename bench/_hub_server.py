"""Serve a directory tree as fake-Hub repos from a separate process (``bench/weights_bench.py``).

Why a process: hf_transfer's ``download`` holds the GIL while it blocks, so an in-process server
thread would never answer it; and clients measured against an in-process server would compete with
it for the GIL. ``python bench/_hub_server.py DATA_DIR`` makes repo ``Bench/<name>`` from every
``DATA_DIR/<name>/`` folder, prints ``{"endpoint": ..., "commits": {name: commit}}`` on one line, and
serves until its stdin closes.

Nothing is held in memory: the fake Hub serves any buffer, so each file of 1 MiB or more is an
``mmap`` of the file on disk (page cache the kernel can drop, not this process's heap: a 16 GiB
sweep file would not fit otherwise), and smaller files are appended to one pack file per repo and
served as slices of its ``mmap`` (one descriptor for 100,000 files, where one ``mmap`` each would
keep one descriptor each). The git blob id is hashed in a stream (the fake Hub's own helper
prepends a header by concatenation, which would copy the whole file).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.servers.hf_hub import FakeHub

MiB = 1 << 20


class DiskHub(FakeHub):
    """The fake Hub with a streaming git blob id (the data are file-backed buffers)."""

    def blob_oid_of(self, data: Any) -> str:
        key = -id(data)
        cached = self._sha_cache.get(key)
        if cached is None or cached[0] is not data:
            h = hashlib.sha1(b"blob %d\0" % len(data), usedforsecurity=False)
            h.update(data)
            cached = (data, h.hexdigest())
            self._sha_cache[key] = cached
        return cached[1]


def load_repo(folder: Path, pack_dir: Path) -> dict[str, Any]:
    """``{relative path: buffer}`` for every file under ``folder``, file-backed (see the module doc)."""
    files: dict[str, Any] = {}
    small: list[tuple[str, int, int]] = []
    with tempfile.TemporaryFile(dir=pack_dir) as pack:
        offset = 0
        for root, dirs, names in os.walk(folder):
            dirs.sort()
            for n in sorted(names):
                p = Path(root) / n
                rel = str(p.relative_to(folder))
                size = p.stat().st_size
                if size >= MiB:
                    with open(p, "rb") as f:
                        files[rel] = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
                    continue
                data = p.read_bytes()
                pack.write(data)
                small.append((rel, offset, len(data)))
                offset += len(data)
        if offset:  # an all-empty pack cannot be mapped (every small file is then b"")
            pack.flush()
            whole = memoryview(mmap.mmap(pack.fileno(), 0, access=mmap.ACCESS_READ))
            for rel, off, size in small:
                files[rel] = whole[off : off + size]
        else:
            files.update((rel, b"") for rel, _, _ in small)
    return files


def main() -> int:
    data_dir = Path(sys.argv[1])
    hub = DiskHub().start()
    commits = {}
    for d in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        files = load_repo(d, data_dir)
        commits[d.name] = hub.add_repo(f"Bench/{d.name}", files)
        for data in files.values():  # hash before the clock starts: listings must not wait for it
            hub.sha256_of(data)
            hub.blob_oid_of(data)
    print(json.dumps({"endpoint": hub.endpoint, "commits": commits}), flush=True)
    sys.stdin.read()
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
