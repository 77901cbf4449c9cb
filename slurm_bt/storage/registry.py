"""The one registry: scheme -> backend class, imported only when a URL of that scheme is opened.

Importing :mod:`slurm_bt.storage` imports no client library (boto3, s3fs, gcsfs, adlfs,
huggingface_hub, aiohttp): hooks and the CLI start fast and a node without an optional package
still serves the other schemes. When a scheme's package is missing, :func:`open_backend` raises a
:class:`~slurm_bt.errors.MissingExtraError` naming the extra to install, instead of an internal error.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

from slurm_bt.errors import MissingExtraError
from slurm_bt.storage.base import Backend, TransportOptions
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.url import StorageUrl

__all__ = ["REGISTRY", "Entry", "backend_class", "open_backend"]


class Entry(NamedTuple):
    """Where a scheme's backend lives and which ``slurm-bt[extra]`` installs what it imports."""

    module: str
    cls: str
    extra: str | None


REGISTRY: dict[str, Entry] = {
    "s3": Entry("slurm_bt.storage.s3", "S3Backend", "s3"),
    "r2": Entry("slurm_bt.storage.s3", "S3Backend", "s3"),
    "cw": Entry("slurm_bt.storage.s3", "S3Backend", "s3"),
    "gs": Entry("slurm_bt.storage.gcs", "GcsBackend", "gcs"),
    "azure": Entry("slurm_bt.storage.azure", "AzureBackend", "azure"),
    "hf": Entry("slurm_bt.storage.hf", "HfBackend", "hf"),
    "https": Entry("slurm_bt.storage.https", "HttpsBackend", "https"),
    "file": Entry("slurm_bt.storage.file", "FileBackend", None),
}


def backend_class(url: StorageUrl) -> type[Backend]:
    """The backend class for ``url.scheme``, importing its module (and client libraries) now.

    Raises:
        MissingExtraError: a package the backend imports is missing.
    """
    entry = REGISTRY[url.scheme]
    try:
        module = importlib.import_module(entry.module)
    except ImportError as exc:
        if entry.extra is None or (exc.name or "").startswith("slurm_bt"):
            raise
        raise MissingExtraError(url.canonical, url.scheme, entry.extra, exc.name) from exc
    cls: type[Backend] = getattr(module, entry.cls)
    return cls


def open_backend(url: StorageUrl, *, credentials: Credentials | None = None,
                 endpoints: StorageEndpoints | None = None, options: TransportOptions | None = None) -> Backend:
    """Instantiate the backend for ``url`` (no request is made yet).

    Raises:
        MissingExtraError: the scheme's optional packages are not installed.
    """
    cls = backend_class(url)
    try:
        return cls(url, credentials=credentials, endpoints=endpoints or StorageEndpoints(),  # type: ignore[call-arg]
                   options=options or TransportOptions())
    except ImportError as exc:  # a backend importing a second package in its constructor
        entry = REGISTRY[url.scheme]
        if entry.extra is None:
            raise
        raise MissingExtraError(url.canonical, url.scheme, entry.extra, exc.name) from exc
