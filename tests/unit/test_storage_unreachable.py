"""An unreachable origin fails fast and the same way for every scheme (issue 24, item 5).

Each backend's SDK has its own retries under ours (base.retry_transient): the Azure SDK's default
policy made an unreachable account take 2 min 44 s to fail a listing, gcsfs's 2 min 14 s, while hf://
failed at once. Here every scheme lists a prefix on a port nothing listens on (connection refused, so
the bound is on retries alone) and must raise SourceUnavailableError (transient, exit status 1 at the
CLI) within seconds.
"""

from __future__ import annotations

import socket
import time

import pytest

from slurm_bt.errors import SourceUnavailableError
from slurm_bt.storage.base import TransportOptions
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.registry import open_backend
from slurm_bt.storage.url import parse_source_uri

#: Generous for a loaded 2-core machine; the SDKs' defaults took minutes.
BOUND_S = 20.0


@pytest.fixture(scope="module")
def closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("uri", ["azure://acct/cont/prefix", "s3://bucket/prefix", "gs://bucket/prefix",
                                 "hf://org/model"])
def test_unreachable_origin_fails_fast_as_unavailable(closed_port: str, uri: str) -> None:
    endpoints = StorageEndpoints(azure_endpoint_template=closed_port + "/{account}", s3_endpoint_url=closed_port,
                                 gcs_endpoint=closed_port, hf_endpoint=closed_port)
    backend = open_backend(parse_source_uri(uri), endpoints=endpoints,
                           options=TransportOptions(connect_timeout_s=2, read_timeout_s=5))
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailableError) as info:
        backend.list_files()
    assert time.monotonic() - t0 < BOUND_S, f"{uri}: failed only after {time.monotonic() - t0:.0f} s"
    assert info.value.transient, info.value
