"""``azure://account/container/prefix``: Azure Blob Storage through adlfs and azure-storage-blob.

Where fsspec serves: adlfs (``AzureBlobFileSystem``) lists (size, ETag and ``Content-MD5`` come
with the listing), stats, writes small blobs and lists "directories".

Where it does not: adlfs reads through its async client without a per-request ETag condition, so
the byte path uses azure-storage-blob's synchronous ``download_blob(offset, length, etag=...,
match_condition=IfNotModified)``: a blob replaced after it was listed fails with 412 ("changed since
it was resolved") instead of mixing two versions. The listing's ``Content-MD5`` (set by the
uploader for whole-blob uploads) is checked on the same pass that computes the sha256.

Account endpoint: ``azure_endpoint_template`` in the site file (Azurite in tests). Credentials:
an account key, a SAS token or a connection string from the secret store (credentials.py);
without one, anonymous (public containers). ``DefaultAzureCredential`` is never used.
"""

from __future__ import annotations

import base64
from typing import Any

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.storage._fs import FsspecBackend
from slurm_bt.storage.base import BodyStream, Pinned, RangeStream, RemoteFile, TransportOptions
from slurm_bt.storage.checksums import OriginChecksum
from slurm_bt.storage.credentials import Credentials
from slurm_bt.storage.endpoints import StorageEndpoints
from slurm_bt.storage.url import StorageUrl

__all__ = ["SDK_RETRIES", "AzureBackend"]

#: Retries the Azure SDK makes inside one call (its default is 10, with back-off up to minutes).
SDK_RETRIES = 0


class AzureBackend(FsspecBackend):
    """A prefix of an Azure Blob container."""

    writable = True

    def __init__(self, url: StorageUrl, *, credentials: Credentials | None, endpoints: StorageEndpoints,
                 options: TransportOptions) -> None:
        """Build the adlfs filesystem and the blob client for ``url``'s account; no request yet."""
        import adlfs
        from azure.storage.blob import BlobServiceClient

        assert url.account is not None
        self.url = url
        self.list_retries = options.list_retries
        creds = credentials or Credentials()
        account_url = endpoints.azure_endpoint(url.account)
        # The SDK's default retry policy makes 10 attempts with exponential back-off: an unreachable
        # account took 2 min 44 s to fail (and one SDK retry still cost ~37 s per listing). Our own calls
        # retry transient errors (options.list_retries, base.retry_transient; the downloads resume), so
        # the SDK makes none.
        timeouts: dict[str, Any] = {"connection_timeout": options.connect_timeout_s,
                                    "read_timeout": options.read_timeout_s, "retry_total": SDK_RETRIES}
        fs_kwargs: dict[str, Any] = {"account_name": url.account, "skip_instance_cache": True,
                                     "use_listings_cache": False}
        credential: Any = None
        if creds.azure_connection_string:
            fs_kwargs["connection_string"] = creds.azure_connection_string
            self._service = BlobServiceClient.from_connection_string(creds.azure_connection_string, **timeouts)
        else:
            if creds.azure_account_key:
                fs_kwargs["account_key"] = creds.azure_account_key
                credential = {"account_name": url.account, "account_key": creds.azure_account_key}
            elif creds.azure_sas_token:
                fs_kwargs["sas_token"] = creds.azure_sas_token
                credential = creds.azure_sas_token
            else:
                fs_kwargs["anon"] = True
            # Only the account URL is given; adlfs then never falls back to DefaultAzureCredential.
            fs_kwargs["account_host"] = account_url.split("://", 1)[1].split("/", 1)[0]
            self._service = BlobServiceClient(account_url, credential=credential, **timeouts)
            if not account_url.startswith("https://") or "/" in account_url.split("://", 1)[1]:
                # Azurite-style endpoints (http, account in the path) need a connection string.
                conn = f"DefaultEndpointsProtocol={account_url.split('://')[0]};AccountName={url.account};" \
                       f"BlobEndpoint={account_url};"
                if creds.azure_account_key:
                    conn += f"AccountKey={creds.azure_account_key};"
                elif creds.azure_sas_token:
                    conn += f"SharedAccessSignature={creds.azure_sas_token};"
                fs_kwargs = {"connection_string": conn, "skip_instance_cache": True, "use_listings_cache": False}
                if not (creds.azure_account_key or creds.azure_sas_token):
                    fs_kwargs["anon"] = True
        self.fs = adlfs.AzureBlobFileSystem(**fs_kwargs)
        # adlfs builds its async client with the SDK's defaults and takes no retry settings: the same
        # account, credential and bounds as the synchronous client above, in its place.
        from azure.storage.blob.aio import BlobServiceClient as AsyncBlobServiceClient

        conn_str = fs_kwargs.get("connection_string")
        self.fs.service_client = (
            AsyncBlobServiceClient.from_connection_string(conn_str, **timeouts) if conn_str
            else AsyncBlobServiceClient(account_url, credential=credential, **timeouts))
        self._container = self._service.get_container_client(url.container)

    def _root(self) -> str:
        return f"{self.url.container}/{self.url.prefix}" if self.url.prefix else self.url.container

    def _to_remote(self, path: str, info: dict[str, Any]) -> RemoteFile:
        checks: tuple[OriginChecksum, ...] = ()
        settings = info.get("content_settings") or {}
        md5 = settings.get("content_md5") if isinstance(settings, dict) else getattr(settings, "content_md5", None)
        if md5:
            raw = bytes(md5) if not isinstance(md5, str) else base64.b64decode(md5)
            if len(raw) == 16:
                checks = (OriginChecksum("md5", raw.hex(), "Content-MD5"),)
        etag = info.get("etag")
        return RemoteFile(path, int(info["size"]), None, etag=str(etag) if etag else None, checksums=checks)

    def _map(self, exc: Exception, *, file: str | None, offset: int | None = None) -> SourceError:
        from azure.core.exceptions import (
            ClientAuthenticationError,
            HttpResponseError,
            ResourceModifiedError,
            ResourceNotFoundError,
            ServiceRequestError,
            ServiceResponseError,
        )

        src = self.url.canonical
        if isinstance(exc, ResourceNotFoundError):
            return SourceNotFoundError(src, "container or blob not found", file=file)
        if isinstance(exc, ResourceModifiedError):
            return SourceError(src, "object changed since it was resolved (412); resolve again", file=file,
                               offset=offset)
        if isinstance(exc, ClientAuthenticationError) or (
                isinstance(exc, HttpResponseError) and exc.status_code in (401, 403)):
            return SourceAccessError(src, f"not authorized for {src}; check the credentials "
                                     "(auth_secret_name / ?secret=)", file=file)
        if isinstance(exc, (ServiceRequestError, ServiceResponseError)) or (
                isinstance(exc, HttpResponseError) and (exc.status_code or 0) >= 500):
            return SourceUnavailableError(src, f"origin unreachable: {type(exc).__name__}", file=file,
                                          offset=offset, transient=True)
        return SourceError(src, f"{type(exc).__name__}: {exc}", file=file, offset=offset)

    def open_range(self, file: Pinned, start: int, end: int | None) -> RangeStream:
        """``download_blob`` of ``[start, end)`` with ``If-Match`` = the listed ETag."""
        from azure.core import MatchConditions

        kwargs: dict[str, Any] = {"offset": start, "length": None if end is None else end - start}
        if file.etag:
            kwargs.update(etag=file.etag, match_condition=MatchConditions.IfNotModified)
        if start == 0 and end is None:
            kwargs.pop("offset"), kwargs.pop("length")
        try:
            downloader = self._container.get_blob_client(self.url.key_for(file.path)).download_blob(**kwargs)
        except Exception as exc:
            raise self._map(exc, file=file.path, offset=start) from exc
        chunks = downloader.chunks()
        buffer = bytearray()

        def read(n: int) -> bytes:
            while len(buffer) < n:
                try:
                    buffer.extend(next(chunks))
                except StopIteration:
                    break
            out = bytes(buffer[:n])
            del buffer[:n]
            return out

        return BodyStream(read, lambda: None, partial=True, uri=self.url.canonical, file=file.path, start=start)

    def close(self) -> None:
        """Close the blob client's sessions."""
        self._service.close()
