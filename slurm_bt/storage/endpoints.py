"""Where each scheme's servers are (:class:`StorageEndpoints`): configuration, not code.

On-prem S3, the R2 and CoreWeave account endpoints, Azure's account endpoint, a Hub mirror and
the loopback test servers all go through the same code path; the site file embeds this model
(docs/storage.md lists every field).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

__all__ = ["StorageEndpoints"]


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    return v.rstrip("/")


class StorageEndpoints(BaseModel):
    """Per-scheme endpoints and integrity settings; defaults are the public clouds.

    Attributes:
        hf_endpoint: Hub base URL (``HF_ENDPOINT``); a mirror or the test server.
        s3_endpoint_url: S3 API URL; None = AWS (region-resolved by boto3).
        s3_region: region for SigV4 signing.
        s3_addressing_style: ``path`` for most on-prem servers, ``auto`` for AWS.
        s3_checksum_when_required: set boto3's ``request_checksum_calculation`` and
            ``response_checksum_validation`` to ``when_required`` (S3-alikes that send whole-object
            checksums on ranged replies or reject the aws-chunked CRC trailer). Reads are verified
            by our own sha256 either way.
        s3_data_plane: how object bytes are read. ``presigned`` (default): boto3 presigns each GET
            (no network call) and the bytes go through the urllib3 range engine shared with HF, GCS
            and HTTPS, which measured faster than botocore's stream (bench/results/weights.md);
            ``boto3``: ``GetObject`` through botocore.
        s3_etag_md5: the ETag of a single-part object is the MD5 of its content (S3 documents it;
            SSE-KMS/SSE-C objects are recognised and exempted), so reads check it. Turn off for an
            S3-compatible store whose ETags are something else.
        r2_endpoint_template: R2 S3 endpoint; ``{account_id}`` is replaced (a template without
            it names one endpoint for every account: a gateway, or the test server).
        r2_checksum_when_required: ``s3_checksum_when_required`` for R2, on by default: R2 has
            rejected SDK default checksums several times.
        r2_etag_md5: ``s3_etag_md5`` for R2.
        cw_endpoint_template: CoreWeave AI Object Storage S3 endpoint; ``{region}`` is replaced by
            ``cw_region`` (a template without it names one endpoint: a gateway, the test server).
        cw_region: the CoreWeave availability zone used for signing and in the template.
        cw_addressing_style: CoreWeave serves virtual-hosted buckets; ``path`` for test servers.
        cw_checksum_when_required: ``s3_checksum_when_required`` for CoreWeave.
        cw_etag_md5: ``s3_etag_md5`` for CoreWeave.
        gcs_endpoint: GCS JSON API base URL (fake-gcs-server in tests).
        azure_endpoint_template: Blob service URL of an account; ``{account}`` is replaced
            (Azurite: ``http://127.0.0.1:10000/{account}``).
        https_ca_bundle: PEM file of the CAs trusted for ``https://`` sources instead of the
            system store (a private mirror, the test server). Verification is never turned off.
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
    cw_endpoint_template: str = "https://cwobject.com"
    cw_region: str = "us-east-04a"
    cw_addressing_style: Literal["auto", "path", "virtual"] = "virtual"
    cw_checksum_when_required: bool = True
    cw_etag_md5: bool = True
    gcs_endpoint: str = "https://storage.googleapis.com"
    azure_endpoint_template: str = "https://{account}.blob.core.windows.net"
    https_ca_bundle: str | None = None

    @field_validator("hf_endpoint", "gcs_endpoint", "r2_endpoint_template", "cw_endpoint_template",
                     "azure_endpoint_template")
    @classmethod
    def _url(cls, v: str) -> str:
        return _http_url(v)

    @field_validator("s3_endpoint_url")
    @classmethod
    def _opt_url(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @field_validator("https_ca_bundle")
    @classmethod
    def _abs(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"must be an absolute path, got {v!r}")
        return v

    def r2_endpoint(self, account_id: str) -> str:
        """The S3 endpoint URL of one R2 account."""
        return self.r2_endpoint_template.replace("{account_id}", account_id)

    def cw_endpoint(self) -> str:
        """The S3 endpoint URL of CoreWeave AI Object Storage."""
        return self.cw_endpoint_template.replace("{region}", self.cw_region)

    def azure_endpoint(self, account: str) -> str:
        """The Blob service URL of one storage account."""
        return self.azure_endpoint_template.replace("{account}", account)
