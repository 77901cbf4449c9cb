"""Plain-HTTP ranged reads over urllib3: the data plane of the hf, gs, https and s3 (presigned) backends.

Why below fsspec here: HfFileSystem, gcsfs and HTTPFileSystem read through aiohttp streams sized
for random access (block caches, one request per ``read``), check at most the size, and offer no
per-request ``If-Match``/generation pin we control. A raw urllib3 pool gives large reads,
kept-alive connections shared by all range workers of the download engine, per-read timeouts and
exact control of ``Range``/``If-Match``, which bench/results/weights.md measured faster. urllib3
ships with botocore and requests, so it adds no dependency; it is imported lazily like every client.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Mapping
from typing import Any

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError, SourceUnavailableError
from slurm_bt.storage.base import BodyStream

__all__ = ["http_status_error", "make_pool", "open_http_range"]


def make_pool(connect_timeout_s: float, read_timeout_s: float, max_connections: int, *,
              ca_bundle: str | None = None) -> Any:
    """A urllib3 PoolManager with our timeouts and no automatic retries (the engine retries).

    ``ca_bundle``: PEM file of the CAs to trust instead of the system store; certificates are
    verified either way (urllib3's default ``CERT_REQUIRED``).
    """
    import urllib3

    extra: dict[str, Any] = {"ca_certs": ca_bundle} if ca_bundle else {}
    return urllib3.PoolManager(
        **extra,
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
            uri, f"not authorized for {uri} (HTTP {status}); check the credentials (auth_secret_name / ?secret=) "
            "and access to it",
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
    except urllib3.exceptions.SSLError as exc:
        # A certificate the trusted CAs do not vouch for is not transient: retrying cannot fix it.
        raise SourceError(uri, f"TLS verification failed: {exc}; trust the server's CA with "
                          "https_ca_bundle in the site file", file=file) from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise SourceUnavailableError(
            uri, f"origin unreachable: {type(exc).__name__}: {exc}", file=file, offset=start, transient=True
        ) from exc
    if resp.status not in (200, 206):
        resp.drain_conn()
        resp.release_conn()
        raise http_status_error(resp.status, uri, file=file, offset=start, what=f"file {file!r}")

    def close() -> None:  # never reuse a half-read socket
        resp.release_conn() if resp.isclosed() else resp.close()

    return _HttpBody(resp, close, partial=resp.status == 206, uri=uri, file=file, start=start,
                     errors=(urllib3.exceptions.HTTPError, http.client.HTTPException, OSError))


class _HttpBody(BodyStream):
    """A response body that can also ``readinto`` a caller's buffer without an intermediate copy.

    Why: urllib3's own ``readinto`` is ``read`` plus a copy, and each 1 MiB ``read`` allocates a
    fresh 1 MiB object (an ``mmap`` and 256 page faults in glibc); for a 4 GiB object that is
    4,096 of them plus 4 GiB of extra copying on the cores that also hash. The body is read through
    the standard library response under urllib3's (``decode_content=False`` is asked for, so the
    bytes are the same either way); urllib3 still owns the connection and its release.
    """

    def __init__(self, resp: Any, close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(resp.read, close, **kwargs)
        fp = getattr(resp, "_fp", None)  # the http.client response; a caller uses read or readinto, not both
        self._raw = fp if isinstance(fp, http.client.HTTPResponse) else None
        self._resp = resp

    def readinto(self, buf: memoryview) -> int:
        """Up to ``len(buf)`` bytes into ``buf``; 0 at end."""
        try:
            if self._raw is not None:
                n = self._raw.readinto(buf)
            else:
                data = self._resp.read(len(buf))
                n = len(data)
                buf[:n] = data
        except self._errors as exc:
            raise SourceUnavailableError(
                self._uri, f"connection failed while reading: {type(exc).__name__}: {exc}",
                file=self._file, offset=self._pos, transient=True,
            ) from exc
        self._pos += n
        return n
