"""One storage layer for weights sources and checkpoint stores (docs/storage.md).

``parse_url`` -> ``open_backend`` -> a :class:`~slurm_bt.storage.base.Backend` for ``hf``, ``s3``,
``r2``, ``cw``, ``gs``, ``azure``, ``https`` and ``file`` URLs. Importing this package imports no
client library; each backend's packages are imported when a URL of its scheme is first opened.
"""

from __future__ import annotations

from slurm_bt.storage.base import Backend, Listing, RangeStream, RemoteFile, TransportOptions
from slurm_bt.storage.credentials import Credentials, credentials_from_store, parse_credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.registry import open_backend
from slurm_bt.storage.url import StorageUrl, parse_url

__all__ = [
    "Backend",
    "Credentials",
    "Listing",
    "RangeStream",
    "RemoteFile",
    "StorageEndpoints",
    "StorageUrl",
    "TransportOptions",
    "credentials_from_store",
    "open_backend",
    "parse_credentials",
    "parse_url",
]
