"""Azurite (the Azure Blob emulator, from npm) on loopback: blob service only, no telemetry.

scripts/install.sh installs it into /opt/slurm-bt/azurite. Its well-known development account
(``devstoreaccount1`` and the published key) is the credential; Azurite serves the account in the
URL path, so the endpoint template is ``http://127.0.0.1:<port>/{account}``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import _proc

ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
PREFIX = Path("/opt/slurm-bt/azurite")


def azurite_binary() -> str | None:
    """Path of ``azurite-blob`` (the install prefix first, then PATH), or None."""
    candidate = PREFIX / "node_modules" / ".bin" / "azurite-blob"
    return str(candidate) if candidate.exists() else shutil.which("azurite-blob")


@dataclass
class Azurite:
    """A running Azurite blob endpoint."""

    port: int
    proc: subprocess.Popen[bytes]
    root: Path

    @property
    def endpoint_template(self) -> str:
        """``azure_endpoint_template`` for the storage settings."""
        return f"http://{_proc.HOST}:{self.port}/{{account}}"

    @property
    def connection_string(self) -> str:
        """A connection string for the development account."""
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint=http://{_proc.HOST}:{self.port}/{ACCOUNT};")

    def service(self) -> Any:
        """An azure-storage-blob service client for the development account."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def create_container(self, name: str) -> None:
        """Create ``name`` (already there is fine)."""
        from azure.core.exceptions import ResourceExistsError

        try:
            self.service().create_container(name)
        except ResourceExistsError:
            pass

    def stop(self) -> None:
        """Kill the process group."""
        _proc.stop(self.proc)


def start_azurite(root: Path) -> Azurite:
    """Start ``azurite-blob`` on a free loopback port with data under ``root``."""
    binary = azurite_binary()
    if binary is None:
        raise RuntimeError("azurite not installed (scripts/install.sh installs it from npm)")
    root.mkdir(parents=True, exist_ok=True)
    port = _proc.free_port()
    argv = [binary, "--blobHost", _proc.HOST, "--blobPort", str(port), "--location", str(root / "data"),
            "--disableTelemetry", "--skipApiVersionCheck", "--silent"]
    log = root / "azurite.log"
    proc = _proc.start(argv, log, root)
    try:
        _proc.wait_port(port, proc, 60, log)
    except BaseException:
        _proc.stop(proc)
        raise
    return Azurite(port, proc, root)
