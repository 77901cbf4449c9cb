"""Where sources live (:class:`SourceEndpoints`) and how we authenticate (:class:`SourceCredentials`).

Endpoints are configuration, not code, so that on-prem S3, the R2 account endpoint and the
loopback test servers all go through the same code path; the site config embeds this model.

Secret formats (the value stored under ``auth_secret_name`` in the user's
:class:`~slurm_bt.secrets_store.SecretStore`):

========  =====================================================================================
``hf``    the access token itself (``hf_...``); surrounding whitespace is ignored
``s3``    JSON ``{"aws_access_key_id": "...", "aws_secret_access_key": "...",
``r2``    "aws_session_token": "..."}`` (the session token is optional)
``gs``    a service-account key JSON as downloaded from GCP (``"type": "service_account"``)
========  =====================================================================================

Public sources need no secret (HF: no token is sent, not even a locally saved one; S3/R2:
unsigned requests; GCS: anonymous). No secret value ever appears in a message or a ``repr``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from slurm_bt.errors import Problem, SourceSpecError
from slurm_bt.secrets_store import SecretStore
from slurm_bt.weights.manifest import SourceKind

__all__ = [
    "SourceCredentials",
    "SourceEndpoints",
    "credentials_from_store",
    "parse_credentials",
]


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    return v.rstrip("/")


class SourceEndpoints(BaseModel):
    """Per-backend endpoints and integrity settings; defaults are the public clouds.

    Attributes:
        hf_endpoint: Hub base URL (``HF_ENDPOINT``); a mirror or the test server.
        s3_endpoint_url: S3 API URL; None = AWS (region-resolved by boto3).
        s3_region: region for SigV4 signing.
        s3_addressing_style: ``path`` for most on-prem servers, ``auto`` for AWS.
        s3_checksum_when_required: set boto3's ``request_checksum_calculation`` and
            ``response_checksum_validation`` to ``when_required`` (S3-alikes that send whole-object
            checksums on ranged replies or reject the aws-chunked CRC trailer). We verify sha256
            ourselves either way (threats R6).
        s3_data_plane: how S3/R2 object bytes are read. ``presigned`` (default): boto3 presigns each
            GET (SigV4 query string, no network call) and the bytes go through the same urllib3
            range engine as HF and GCS, which measured faster than botocore's response stream
            (bench/results/weights.md); ``boto3``: ``GetObject`` through botocore.
        s3_etag_md5: the ETag of a single-part object (32 hex digits, no ``-N``) is the MD5 of its
            content, as S3 documents (SSE-KMS/SSE-C objects are recognised and exempted), so
            downloads check it. Turn off only for an S3-compatible store whose ETags are something
            else (the download then fails with "md5 mismatch ... ETag" on every single-part object).
        r2_endpoint_template: R2 S3 endpoint; ``{account_id}`` is replaced (a template without
            it names one endpoint for every account: a gateway, or the test server).
        r2_checksum_when_required: the same switch for R2, on by default: R2 has rejected SDK
            default checksums several times (transfer-perf.md §2).
        r2_etag_md5: ``s3_etag_md5`` for R2 (whose single-part ETags are MD5s too).
        gcs_endpoint: GCS JSON API base URL (fake-gcs-server in tests).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    hf_endpoint: str = "https://huggingface.co"
    s3_endpoint_url: str | None = None
    s3_region: str = "us-east-1"
    s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
    s3_checksum_when_required: bool = False
    s3_data_plane: Literal["presigned", "boto3"] = "presigned"
    s3_etag_md5: bool = True
    r2_endpoint_template: str = "https://{account_id}.r2.cloudflarestorage.com"
    r2_checksum_when_required: bool = True
    r2_etag_md5: bool = True
    gcs_endpoint: str = "https://storage.googleapis.com"

    @field_validator("hf_endpoint", "gcs_endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)

    @field_validator("s3_endpoint_url")
    @classmethod
    def _opt_url(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @field_validator("r2_endpoint_template")
    @classmethod
    def _template(cls, v: str) -> str:
        # Without '{account_id}' every account shares one endpoint (an R2-compatible gateway, tests).
        return _http_url(v)

    def r2_endpoint(self, account_id: str) -> str:
        """The S3 endpoint URL of one R2 account."""
        return self.r2_endpoint_template.replace("{account_id}", account_id)


@dataclass(frozen=True, repr=False)
class SourceCredentials:
    """Parsed credentials for one source; ``repr`` never shows a value.

    Exactly one group is set: ``hf_token``; or the AWS key triple (s3, r2); or
    ``gcs_service_account`` (the parsed key JSON).
    """

    hf_token: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    gcs_service_account: Mapping[str, Any] | None = field(default=None)

    def __repr__(self) -> str:
        kinds = [
            name
            for name, value in (
                ("hf_token", self.hf_token),
                ("aws_keys", self.aws_access_key_id),
                ("gcs_service_account", self.gcs_service_account),
            )
            if value
        ]
        return f"SourceCredentials({', '.join(kinds) or 'anonymous'}, values hidden)"


def _bad(source: str, message: str) -> SourceSpecError:
    return SourceSpecError(source, [Problem("auth_secret_name", message)])


def parse_credentials(kind: SourceKind, value: str, *, source: str, secret_name: str) -> SourceCredentials:
    """Parse a secret's value in the format of ``kind`` (module docstring).

    Raises:
        SourceSpecError: the value is not in the expected format; the message names the secret and
            the expected shape, never the value (JSON errors are not chained: they quote input).
    """
    if kind == "hf":
        token = value.strip()
        if not token or any(c.isspace() for c in token):
            raise _bad(source, f"secret {secret_name!r} must hold a single Hugging Face token")
        return SourceCredentials(hf_token=token)
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if kind in ("s3", "r2"):
        ok = isinstance(data, dict) and all(
            isinstance(data.get(k), str) and data.get(k) for k in ("aws_access_key_id", "aws_secret_access_key")
        )
        session = data.get("aws_session_token") if isinstance(data, dict) else None
        if not ok or (session is not None and not isinstance(session, str)):
            raise _bad(
                source,
                f"secret {secret_name!r} must be JSON "
                '{"aws_access_key_id": ..., "aws_secret_access_key": ..., "aws_session_token"?: ...}',
            )
        assert isinstance(data, dict)
        return SourceCredentials(
            aws_access_key_id=data["aws_access_key_id"],
            aws_secret_access_key=data["aws_secret_access_key"],
            aws_session_token=session or None,
        )
    if not isinstance(data, dict) or data.get("type") != "service_account":
        raise _bad(source, f"secret {secret_name!r} must be a GCP service-account key JSON")
    return SourceCredentials(gcs_service_account=data)


def credentials_from_store(
    store: SecretStore, secret_name: str | None, kind: SourceKind, *, source: str
) -> SourceCredentials | None:
    """Read and parse ``secret_name`` from ``store``; None (anonymous) when no name is given.

    Raises:
        SecretError: the secret is missing or unreadable (from the store).
        SourceSpecError: the secret is not in the format ``kind`` needs.
    """
    if not secret_name:
        return None
    return parse_credentials(kind, store.get(secret_name), source=source, secret_name=secret_name)
