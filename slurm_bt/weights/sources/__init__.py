"""Weights sources behind one small interface: ``hf://``, ``s3://``, ``r2://``, ``gs://``.

``resolve`` turns a user's source URI into a pinned, verified manifest at submit time;
:mod:`slurm_bt.weights.download` fetches manifest files into a content-addressed directory.
Each backend's client (huggingface_hub, boto3, google-auth) is imported only when its scheme is
first used; importing this package imports none of them.
"""

from __future__ import annotations

from slurm_bt.weights.sources.base import Listing, RangeStream, RemoteFile, Source, TransportOptions, open_source
from slurm_bt.weights.sources.config import (
    SourceCredentials,
    SourceEndpoints,
    credentials_from_store,
    parse_credentials,
)
from slurm_bt.weights.sources.resolve import resolve
from slurm_bt.weights.sources.uri import SourceUri, parse_source_uri

__all__ = [
    "Listing",
    "RangeStream",
    "RemoteFile",
    "Source",
    "SourceCredentials",
    "SourceEndpoints",
    "SourceUri",
    "TransportOptions",
    "credentials_from_store",
    "open_source",
    "parse_credentials",
    "parse_source_uri",
    "resolve",
]
