"""Serve a directory tree as fake-Hub repos from a separate process (``bench/weights_bench.py``).

Why a process: hf_transfer's ``download`` holds the GIL while it blocks, so an in-process server
thread would never answer it; and clients measured against an in-process server would compete with
it for the GIL. ``python bench/_hub_server.py DATA_DIR`` makes repo ``Bench/<name>`` from every
``DATA_DIR/<name>/`` folder, prints ``{"endpoint": ..., "commits": {name: commit}}`` on one line, and
serves until its stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.servers.hf_hub import FakeHub


def main() -> int:
    data_dir = Path(sys.argv[1])
    hub = FakeHub().start()
    commits = {}
    for d in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        files = {}
        for root, _, names in os.walk(d):
            for n in names:
                p = Path(root) / n
                files[str(p.relative_to(d))] = p.read_bytes()
        commits[d.name] = hub.add_repo(f"Bench/{d.name}", files)
        for data in files.values():
            hub.sha256_of(data)
    print(json.dumps({"endpoint": hub.endpoint, "commits": commits}), flush=True)
    sys.stdin.read()
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
