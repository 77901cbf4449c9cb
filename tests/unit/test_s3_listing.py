"""S3 listing without botocore's parser (slurm_bt/storage/s3.py ``_list_pages``) against real loopback servers.

The same scripted ``ListObjectsV2`` pages are served to botocore (``s3_data_plane=boto3``, which
lists through botocore as before) and to the presigned plane's own parser: the listings must be
equal, odd keys included. Errors map as botocore's did; hostile pages (a DTD, another encoding,
a truncated page without a token) are refused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote_plus, urlsplit

import pytest

from slurm_bt.errors import SourceAccessError, SourceError, SourceNotFoundError
from slurm_bt.storage.base import TransportOptions
from slurm_bt.storage.credentials import Credentials
from tests.unit.test_http_small import Reply, ok, serve  # noqa: F401 - the fixture

NS = ' xmlns="http://s3.amazonaws.com/doc/2006-03-01/"'
KEYS = ["pre/a b+c=d&e.txt", "pre/ü/日本.bin", "pre/%2F~x", "pre/<lt>&amp;", "pre/big.safetensors", "pre/z"]


def _contents(key: str, i: int, *, encode: bool) -> str:
    shown = quote_plus(key, safe="/") if encode else key.replace("&", "&amp;").replace("<", "&lt;")
    algo = "<ChecksumAlgorithm>CRC32</ChecksumAlgorithm>" if i % 2 else ""
    return (f"<Contents><Key>{shown}</Key><LastModified>2026-11-26T04:00:00.000Z</LastModified>"
            f"<ETag>&quot;{i:032x}&quot;</ETag>{algo}<Size>{100 + i}</Size><StorageClass>STANDARD</StorageClass>"
            "</Contents>")


def _page(keys: list[str], offset: int, token: str | None, *, encode: bool, ns: str = NS) -> bytes:
    items = "".join(_contents(k, offset + i, encode=encode) for i, k in enumerate(keys))
    more = f"<IsTruncated>true</IsTruncated><NextContinuationToken>{token}</NextContinuationToken>" if token else (
        "<IsTruncated>false</IsTruncated>")
    enc = "<EncodingType>url</EncodingType>" if encode else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult{ns}><Name>bkt</Name><Prefix>pre/</Prefix>'
            f"<KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys>{enc}{more}{items}</ListBucketResult>").encode()


def _lister(*, encode: bool = True, ns: str = NS) -> Reply:
    """Two pages of KEYS; the second asked for with continuation-token=tok/2 (an odd token, quoted)."""
    def reply(req: bytes, n: int) -> tuple[bytes, bool]:
        target = req.split(b" ")[1].decode()
        query = parse_qs(urlsplit(target).query)
        assert query["list-type"] == ["2"] and query["prefix"] == ["pre/"]
        if query.get("continuation-token") == ["tok/2+="]:
            return ok(_page(KEYS[3:], 3, None, encode=encode, ns=ns)), False
        return ok(_page(KEYS[:3], 0, "tok/2+=", encode=encode, ns=ns)), False
    return reply


def _backend(url: str, plane: str) -> Any:
    from slurm_bt.storage.endpoints import StorageEndpoints
    from slurm_bt.storage.s3 import S3Backend
    from slurm_bt.storage.url import parse_source_uri

    ep = StorageEndpoints(s3_endpoint_url=url, s3_region="us-east-1", s3_addressing_style="path", s3_data_plane=plane)
    return S3Backend(parse_source_uri("s3://bkt/pre"), credentials=Credentials(aws_access_key_id="AK",
                                                                               aws_secret_access_key="SK"),
                     endpoints=ep, options=TransportOptions(connect_timeout_s=5, read_timeout_s=5, list_retries=3))


@pytest.mark.parametrize("encode", [True, False])
def test_the_listing_equals_botocores_for_the_same_pages(serve: Any, encode: bool) -> None:  # noqa: F811
    server = serve(_lister(encode=encode))
    listings = {}
    for plane in ("boto3", "presigned"):
        backend = _backend(server.url, plane)
        listings[plane] = backend.list_files()
        backend.close()
    assert listings["presigned"] == listings["boto3"]
    backend = _backend(server.url, "presigned")
    assert backend.list_files_streaming(lambda _f: None) == listings["presigned"]  # the same listing
    backend.close()
    files = {f.path: f for f in listings["presigned"].files}
    assert sorted(files) == sorted(k[len("pre/"):] for k in KEYS)
    assert files["a b+c=d&e.txt"].size == 100 and files["a b+c=d&e.txt"].etag == f'"{0:032x}"'
    assert b"X-Amz-Signature=" in server.requests[-1]  # the presigned plane's page requests are signed


@pytest.mark.parametrize("plane", ["boto3", "presigned"])
def test_streaming_hands_out_each_page_before_the_next_is_asked(serve: Any, plane: str) -> None:  # noqa: F811
    """``list_files_streaming`` (what the staging job lists with, stage_job.py): a page's files reach
    ``on_file`` before the next page is requested, so their downloads overlap the rest of the listing."""
    server = serve(_lister())
    backend = _backend(server.url, plane)
    seen: list[tuple[str, int]] = []
    listing = backend.list_files_streaming(lambda f: seen.append((f.path, len(server.requests))))
    backend.close()
    assert [p for p, _ in seen] == [k[len("pre/"):] for k in KEYS]
    assert {n for _, n in seen[:3]} == {1} and {n for _, n in seen[3:]} == {2}  # page 1's files before page 2
    streamed = {f.path: f for f in listing.files}
    assert all(streamed[p].checksums and streamed[p].etag for p, _ in seen)  # final: the listing's own values


def test_a_page_without_the_s3_namespace_is_read_too(serve: Any) -> None:  # noqa: F811
    server = serve(_lister(ns=""))
    backend = _backend(server.url, "presigned")
    assert len(backend.list_files().files) == len(KEYS)
    backend.close()


@pytest.mark.parametrize(("status", "code", "error", "text"), [
    ("403 Forbidden", "AccessDenied", SourceAccessError, "not authorized for s3://bkt/pre"),
    ("403 Forbidden", "SignatureDoesNotMatch", SourceAccessError, "not authorized"),
    ("404 Not Found", "NoSuchBucket", SourceNotFoundError, "NoSuchBucket: bucket or object not found"),
    ("400 Bad Request", "InvalidArgument", SourceError, "InvalidArgument (400)"),
])
def test_errors_map_as_botocores_did(serve: Any, status: str, code: str, error: type[Exception],  # noqa: F811
                                     text: str) -> None:
    body = f"<Error><Code>{code}</Code><Message>m</Message></Error>".encode()
    server = serve(lambda req, n: (ok(body, status=status), False))
    for plane in ("boto3", "presigned"):
        backend = _backend(server.url, plane)
        with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
            backend.list_files()
        backend.close()


def test_a_5xx_page_is_retried(serve: Any) -> None:  # noqa: F811
    good = _lister()

    def reply(req: bytes, n: int) -> tuple[bytes, bool]:
        if n == 2:
            return ok(b"<Error><Code>SlowDown</Code></Error>", status="503 Slow Down"), False
        return good(req, n)

    server = serve(reply)
    backend = _backend(server.url, "presigned")
    assert len(backend.list_files().files) == len(KEYS)
    assert len(server.requests) == 3
    backend.close()


LAUGHS = (b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]>'
          b"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&b;</Key><Size>1</Size></Contents>"
          b"</ListBucketResult>")


@pytest.mark.parametrize(("page", "text"), [
    (LAUGHS, "DTD"),
    (_page(KEYS, 0, None, encode=True).decode().replace("UTF-8", "UTF-16").encode("utf-16"), "not UTF-8"),
    (_page(KEYS, 0, None, encode=True).replace(b"<IsTruncated>false", b"<IsTruncated>true"), "no continuation"),
    (b"<Other/>", "unexpected listing answer"),
    (_page(KEYS, 0, None, encode=True).replace(b"<Size>101</Size>", b"<Size>-1</Size>"), "lacking a key or size"),
])
def test_hostile_pages_are_refused(serve: Any, page: bytes, text: str) -> None:  # noqa: F811
    server = serve(lambda req, n: (ok(page), False))
    backend = _backend(server.url, "presigned")
    with pytest.raises(SourceError, match=text):
        backend.list_files()
    backend.close()
