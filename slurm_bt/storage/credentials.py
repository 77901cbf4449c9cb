"""Credentials for every scheme (:class:`Credentials`), parsed from the caller's secret store.

Secret formats (the value stored under ``auth_secret_name`` / ``?secret=`` in the user's
:class:`~slurm_bt.secrets_store.SecretStore`):

============  =====================================================================================
``hf``        the access token itself (``hf_...``); surrounding whitespace is ignored
``https``     a bearer token, sent as ``Authorization: Bearer``
``s3``        JSON ``{"aws_access_key_id": "...", "aws_secret_access_key": "...",
``r2``        "aws_session_token": "..."}`` (the session token is optional)
``cw``
``gs``        a service-account key JSON as downloaded from GCP (``"type": "service_account"``)
``azure``     JSON with exactly one of ``{"account_key": ...}``, ``{"sas_token": ...}`` or
              ``{"connection_string": ...}``
============  =====================================================================================

Without a secret, requests are anonymous (HF: no token is sent, not even a locally saved one;
S3-alikes: unsigned; GCS, Azure: anonymous); ambient credentials (environment, instance
profiles, ``~/.azure``) are never picked up, so a job never reads with the login node's identity.
No secret value ever appears in a message or a ``repr``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurm_bt.errors import Problem, SourceSpecError
from slurm_bt.secrets_store import SecretStore

__all__ = ["Credentials", "credentials_from_store", "parse_credentials"]


@dataclass(frozen=True, repr=False)
class Credentials:
    """Parsed credentials for one URL; ``repr`` never shows a value.

    Exactly one group is set: ``token`` (hf, https); the AWS key triple (s3, r2, cw);
    ``gcs_service_account`` (the parsed key JSON); one of the Azure fields.
    """

    token: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    gcs_service_account: Mapping[str, Any] | None = field(default=None)
    azure_account_key: str | None = None
    azure_sas_token: str | None = None
    azure_connection_string: str | None = None
    ambient: bool = False
    """Use the client library's default chain (environment, instance profile, metadata server).

    Only root-configured checkpoint stores without a secret ask for this (docs/checkpoints.md);
    weights sources never do.
    """

    @property
    def hf_token(self) -> str | None:
        """The Hub token (the same field as an HTTPS bearer token)."""
        return self.token

    def __repr__(self) -> str:
        kinds = [
            name
            for name, value in (
                ("token", self.token),
                ("aws_keys", self.aws_access_key_id),
                ("gcs_service_account", self.gcs_service_account),
                ("azure_account_key", self.azure_account_key),
                ("azure_sas_token", self.azure_sas_token),
                ("azure_connection_string", self.azure_connection_string),
            )
            if value
        ]
        if self.ambient:
            kinds.append("default-chain")
        return f"Credentials({', '.join(kinds) or 'anonymous'}, values hidden)"


def _bad(source: str, message: str) -> SourceSpecError:
    return SourceSpecError(source, [Problem("auth_secret_name", message)])


def parse_credentials(scheme: str, value: str, *, source: str, secret_name: str) -> Credentials:
    """Parse a secret's value in the format of ``scheme`` (module docstring).

    Raises:
        SourceSpecError: the value is not in the expected format; the message names the secret and
            the expected shape, never the value (JSON errors are not chained: they quote input).
    """
    if scheme in ("hf", "https"):
        token = value.strip()
        if not token or any(c.isspace() for c in token):
            what = "Hugging Face token" if scheme == "hf" else "bearer token"
            raise _bad(source, f"secret {secret_name!r} must hold a single {what}")
        return Credentials(token=token)
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if scheme in ("s3", "r2", "cw"):
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
        return Credentials(
            aws_access_key_id=data["aws_access_key_id"],
            aws_secret_access_key=data["aws_secret_access_key"],
            aws_session_token=session or None,
        )
    if scheme == "azure":
        fields = ("account_key", "sas_token", "connection_string")
        given = [k for k in fields if isinstance(data, dict) and isinstance(data.get(k), str) and data.get(k)]
        if not isinstance(data, dict) or len(given) != 1 or set(data) - set(fields):
            raise _bad(source, f"secret {secret_name!r} must be JSON with exactly one of "
                       '{"account_key": ...}, {"sas_token": ...} or {"connection_string": ...}')
        value = str(data[given[0]])
        if given[0] == "account_key":
            return Credentials(azure_account_key=value)
        if given[0] == "sas_token":
            return Credentials(azure_sas_token=value.lstrip("?"))
        return Credentials(azure_connection_string=value)
    if scheme == "gs":
        if not isinstance(data, dict) or data.get("type") != "service_account":
            raise _bad(source, f"secret {secret_name!r} must be a GCP service-account key JSON")
        return Credentials(gcs_service_account=data)
    raise _bad(source, f"{scheme}:// takes no secret")


def credentials_from_store(store: SecretStore, secret_name: str | None, scheme: str, *,
                           source: str) -> Credentials | None:
    """Read and parse ``secret_name`` from ``store``; None (anonymous) when no name is given.

    Raises:
        SecretError: the secret is missing or unreadable (from the store).
        SourceSpecError: the secret is not in the format ``scheme`` needs.
    """
    if not secret_name:
        return None
    return parse_credentials(scheme, store.get(secret_name), source=source, secret_name=secret_name)
