"""The storage contract, run against every backend of slurm_bt/storage on real servers on 127.0.0.1.

Each backend must: list a prefix with sizes, version pins and the checksums its listing gives;
stat one object with a checksum; read a byte range; write and read back (writable schemes);
report a missing object as SourceNotFoundError and bad credentials as SourceAccessError. Servers:
SeaweedFS (s3, r2 and cw through their endpoint templates), fake-gcs-server (gs), Azurite (azure),
a local HTTPS server with its own CA (https), the fake Hub (hf), a directory (file). Nothing here
skips: a missing server is a failed test (scripts/install.sh installs them all).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurm_bt.errors import MissingExtraError, SourceAccessError, SourceError, SourceNotFoundError
from slurm_bt.storage import Credentials, StorageEndpoints, open_backend, parse_url
from slurm_bt.storage.base import Backend, read_all
from slurm_bt.storage.checksums import new_hasher
from slurm_bt.storage.registry import backend_class
from tests.servers.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from tests.servers.fixtures import azurite, https_files  # noqa: F401  (session fixtures)
from tests.servers.gcs import FakeGcs
from tests.servers.hf_hub import FakeHub
from tests.servers.https_server import TOKEN, HttpsFiles
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

BIG = os.urandom(3 * 1024 * 1024 + 17)
SMALL = b'{"hello": "storage"}\n'
SCHEMES = ["s3", "r2", "cw", "gs", "azure", "https", "hf", "file"]
R2_ACCOUNT = "0123456789abcdef0123456789abcdef"


@dataclass
class Case:
    """One backend with seeded objects ``big.bin`` and ``sub/small.json`` under its URL."""

    url: str
    endpoints: StorageEndpoints
    credentials: Credentials | None
    bad_credentials: Credentials
    writable: bool = True
    files: dict[str, bytes] = field(default_factory=lambda: {"big.bin": BIG, "sub/small.json": SMALL})

    def open(self, *, bad: bool = False, url: str | None = None) -> Backend:
        return open_backend(parse_url(url or self.url), credentials=self.bad_credentials if bad else self.credentials,
                            endpoints=self.endpoints)


def _aws(key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> Credentials:
    return Credentials(aws_access_key_id=key, aws_secret_access_key=secret)


def _s3_case(scheme: str, seaweed: SeaweedS3, prefix: str) -> Case:
    client = seaweed.client()
    for name, data in {"big.bin": BIG, "sub/small.json": SMALL}.items():
        client.put_object(Bucket="weights", Key=f"{prefix}/{name}", Body=data)
    # r2 and cw reach SeaweedFS through their endpoint templates, as a site file would set them.
    endpoints = StorageEndpoints(s3_endpoint_url=seaweed.endpoint, s3_addressing_style="path",
                                 r2_endpoint_template=seaweed.endpoint,
                                 cw_endpoint_template=seaweed.endpoint, cw_addressing_style="path")
    host = f"{R2_ACCOUNT}.weights" if scheme == "r2" else "weights"
    return Case(f"{scheme}://{host}/{prefix}", endpoints, _aws(), _aws(SECRET_KEY[:8] + "x", "wrong-secret"))


@pytest.fixture(params=SCHEMES)
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Case]:
    scheme: str = request.param
    tag = f"contract-{scheme}-{os.urandom(4).hex()}"
    if scheme in ("s3", "r2", "cw"):
        yield _s3_case(scheme, request.getfixturevalue("seaweed"), tag)
    elif scheme == "gs":
        gcs: FakeGcs = request.getfixturevalue("fake_gcs")
        for name, data in {"big.bin": BIG, "sub/small.json": SMALL}.items():
            gcs.upload("gweights", f"{tag}/{name}", data)
        # fake-gcs-server accepts any token; a malformed service account is what it can refuse.
        bad = Credentials(gcs_service_account={"type": "service_account", "client_email": "x@y",
                                               "private_key": "not a key", "token_uri": gcs.endpoint + "/token"})
        yield Case(f"gs://gweights/{tag}", StorageEndpoints(gcs_endpoint=gcs.endpoint), None, bad)
    elif scheme == "azure":
        az: Azurite = request.getfixturevalue("azurite")
        container = az.service().get_container_client("weights")
        for name, data in {"big.bin": BIG, "sub/small.json": SMALL}.items():
            container.upload_blob(f"{tag}/{name}", data, overwrite=True)
        bad_key = "A" * 86 + "=="
        yield Case(f"azure://{ACCOUNT}/weights/{tag}", StorageEndpoints(azure_endpoint_template=az.endpoint_template),
                   Credentials(azure_account_key=ACCOUNT_KEY), Credentials(azure_account_key=bad_key))
    elif scheme == "https":
        srv: HttpsFiles = request.getfixturevalue("https_files")
        srv.put(f"private/{tag}/big.bin", BIG)
        yield Case(srv.url(f"private/{tag}/big.bin"), StorageEndpoints(https_ca_bundle=str(srv.ca_bundle)),
                   Credentials(token=TOKEN), Credentials(token="wrong"), writable=False, files={"big.bin": BIG})
    elif scheme == "hf":
        hub: FakeHub = request.getfixturevalue("fake_hub")
        repo = f"bt/{tag}"
        hub.add_repo(repo, {"big.bin": BIG, "sub/small.json": SMALL}, private=True, readers={"hf_reader"})
        yield Case(f"hf://{repo}", StorageEndpoints(hf_endpoint=hub.endpoint), Credentials(token="hf_reader"),
                   Credentials(token="hf_wrong"), writable=False)
    else:
        root = tmp_path / "store"
        (root / "sub").mkdir(parents=True)
        (root / "big.bin").write_bytes(BIG)
        (root / "sub" / "small.json").write_bytes(SMALL)
        # The filesystem is the credential: a root-owned 0700 directory is what an outsider meets.
        yield Case(f"file://{root}", StorageEndpoints(), None, Credentials())


def _verified(backend: Backend, info_path: str, data: bytes) -> None:
    """The listed checksums (or sha256) of ``info_path`` hold for ``data``: the origin vouches for it."""
    info = backend.stat(info_path)
    assert info.size == len(data)
    if info.sha256 is not None:
        assert info.sha256 == hashlib.sha256(data).hexdigest()
    for check in info.checksums:
        hasher = new_hasher(check, len(data))
        if hasher is not None:
            hasher.update(data)
            assert hasher.hexdigest() == check.value, check


def test_list_gives_sizes_pins_and_checksums(case: Case) -> None:
    backend = case.open()
    try:
        listing = backend.list_files()
        got = {f.path: f for f in listing.files}
        assert set(got) == set(case.files)
        for path, data in case.files.items():
            assert got[path].size == len(data)
            assert got[path].etag, f"{path} has no version pin"
        # At least one checksum the origin vouches for comes with the listing or the stat
        # (file:// has no origin: its bytes are hashed where they lie).
        big = backend.stat("big.bin")
        assert big.sha256 is not None or big.checksums or case.url.startswith("file://")
        _verified(backend, "big.bin", BIG)
    finally:
        backend.close()


def test_ranged_read_is_pinned(case: Case) -> None:
    backend = case.open()
    try:
        big = {f.path: f for f in backend.list_files().files}["big.bin"]
        assert read_all(backend.open_range(big, 1000, 1000 + 4096)) == BIG[1000:5096]
        assert read_all(backend.open_range(big, len(BIG) - 10, None)) == BIG[-10:]
    finally:
        backend.close()


def test_write_then_read_back(case: Case) -> None:
    if not case.writable:
        # Read-only schemes refuse writes with a clear error (that is their contract).
        backend = case.open()
        with pytest.raises(SourceError, match="read-only"):
            backend.write_bytes("new.json", b"{}")
        return
    backend = case.open()
    try:
        backend.write_bytes("runs/job-1/index.json", b'{"v": 1}')
        backend.write_bytes("runs/job-1/index.json", b'{"v": 2}')
        backend.write_bytes("runs/job-2/index.json", b"{}")
        assert backend.read_bytes("runs/job-1/index.json") == b'{"v": 2}'
        assert backend.read_bytes("runs/nope.json") is None
        assert backend.list_dirs("runs") == ["job-1", "job-2"]
    finally:
        backend.close()


def test_missing_object_is_not_found(case: Case) -> None:
    backend = case.open()
    try:
        with pytest.raises(SourceNotFoundError):
            backend.stat("does/not/exist.bin")
    finally:
        backend.close()


def test_bad_credentials_are_refused(case: Case) -> None:
    if case.url.startswith("file://"):
        return  # file:// has no credentials: the filesystem's permissions apply (tests run as root)
    with pytest.raises(SourceAccessError):
        backend = case.open(bad=True)
        try:
            backend.list_files()
        finally:
            backend.close()


def test_https_refuses_a_server_its_ca_bundle_does_not_vouch_for(https_files: HttpsFiles) -> None:  # noqa: F811
    https_files.put("public/x.bin", b"x" * 10)
    backend = open_backend(parse_url(https_files.url("public/x.bin")), endpoints=StorageEndpoints())
    with pytest.raises(SourceError, match=r"TLS verification failed"):
        backend.list_files()


def test_https_pin_fails_when_the_file_changes(https_files: HttpsFiles) -> None:  # noqa: F811
    https_files.put("public/pin.bin", b"one" * 100)
    backend = open_backend(parse_url(https_files.url("public/pin.bin")),
                           endpoints=StorageEndpoints(https_ca_bundle=str(https_files.ca_bundle)))
    info = backend.list_files().files[0]
    https_files.put("public/pin.bin", b"two" * 100)
    with pytest.raises(SourceError, match="changed since it was resolved"):
        backend.open_range(info, 0, None)


def test_missing_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_adlfs(name: str, *args: object, **kwargs: object) -> object:
        if name == "adlfs" or name.startswith("adlfs."):
            raise ImportError("No module named 'adlfs'", name="adlfs")
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    import sys

    monkeypatch.delitem(sys.modules, "slurm_bt.storage.azure", raising=False)
    monkeypatch.delitem(sys.modules, "adlfs", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_adlfs)
    with pytest.raises(MissingExtraError, match=r"pip install 'slurm-bt\[azure\]'"):
        open_backend(parse_url("azure://acct/container/p"))
    assert backend_class is not None
