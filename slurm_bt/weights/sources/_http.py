"""Plain-HTTP ranged reads over urllib3 for the HF and GCS data planes.

huggingface_hub and google-cloud-storage are used for metadata only: their download paths read
whole files through one stream (and huggingface_hub checks only the size, threats R6). A raw
urllib3 pool gives large reads, kept-alive connections shared by all range workers, per-read
timeouts and exact control of ``Range``/``If-Match``. urllib3 ships with botocore and requests, so
this adds no dependency; it is imported lazily like every client.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.weights.sources.base import BodyStream

__all__ = ["http_status_error", "make_pool", "open_http_range"]


def make_pool(connect_timeout_s: float, read_timeout_s: float, max_connections: int) -> Any:
    """A urllib3 PoolManager with our timeouts and no automatic retries (the engine retries)."""
    import urllib3

    return urllib3.PoolManager(
        num_pools=8,
        maxsize=max_connections,
        block=False,
        timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
        retries=urllib3.Retry(total=False, redirect=5, raise_on_redirect=True),
    )


def http_status_error(status: int, uri: str, *, file: str | None, offset: int | None, what: str) -> SourceError:
    """Map an HTTP status to the error tree (401/403 access, 404 missing, 5xx/429 transient)."""
    if status in (401, 403):
        return SourceAccessError(
            uri, f"not authorized for {uri} (HTTP {status}); check auth_secret_name and access to the source",
            file=file,
        )
    if status == 404:
        return SourceNotFoundError(uri, f"{what} not found (HTTP 404)", file=file)
    if status in (408, 429) or status >= 500:
        return SourceUnavailableError(uri, f"origin answered HTTP {status}", file=file, offset=offset, transient=True)
    if status == 412:
        return SourceError(uri, "object changed since it was resolved (HTTP 412); resolve the source again",
                           file=file, offset=offset)
    return SourceError(uri, f"unexpected HTTP {status} for {what}", file=file, offset=offset)


def open_http_range(
    pool: Any,
    url: str,
    *,
    uri: str,
    file: str,
    start: int,
    end: int | None,
    headers: Mapping[str, str],
) -> BodyStream:
    """GET ``url`` for bytes ``[start, end)``; ``partial`` tells whether the Range was honoured.

    Raises:
        SourceError: mapped from the status (see :func:`http_status_error`); connection failures
            are :class:`SourceUnavailableError`.
    """
    import urllib3.exceptions

    hdrs = dict(headers)
    if start > 0 or end is not None:
        hdrs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
    try:
        resp = pool.request("GET", url, headers=hdrs, preload_content=False, decode_content=False)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise SourceUnavailableError(
            uri, f"origin unreachable: {type(exc).__name__}: {exc}", file=file, offset=start, transient=True
        ) from exc
    if resp.status not in (200, 206):
        resp.drain_conn()
        resp.release_conn()
        raise http_status_error(resp.status, uri, file=file, offset=start, what=f"file {file!r}")
    import urllib3.exceptions

    def close() -> None:  # never reuse a half-read socket
        resp.release_conn() if resp.isclosed() else resp.close()

    return BodyStream(resp.read, close, partial=resp.status == 206, uri=uri, file=file, start=start,
                      errors=(urllib3.exceptions.HTTPError, OSError))
