"""Session-scoped OCI registries on 127.0.0.1 for the image tests (Debian's docker-registry).

Two registries share one CA made with openssl (TLS only, as real registries): ``public`` serves
anonymous pulls; ``private`` needs htpasswd basic auth (user ``alice``/``alice-pw``), so a private
image is pulled only with the config's DockerAuth. Their state lives under /var/tmp (the CA must be
readable by the test users' staging jobs, which a pytest tmp dir under /tmp/pytest-of-root is not),
removed at the end of the session. ``push`` builds a test image (tests/servers/oci_images.py) and
pushes it; ``blob_gets`` counts blob downloads in a registry's access log (one-pull assertions).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.servers._proc import HOST, free_port
from tests.servers.oci_images import base_layout, derive, oci_image

__all__ = ["OciRegistries", "oci_registries"]

PRIVATE_USER, PRIVATE_PASSWORD = "alice", "alice-pw"


@dataclass
class OciRegistries:
    root: Path
    public: oci_image.Registry
    private: oci_image.Registry

    @property
    def ca(self) -> Path:
        return Path(self.public.ca)

    def push(self, repo: str, tag: str, files: dict[str, bytes] | None = None, *, private: bool = False,
             remove: tuple[str, ...] = (), big_random_bytes: int = 0) -> str:
        """Build base + a layer with ``files`` and push it as ``repo:tag``; returns the manifest digest."""
        layout = derive(base_layout(), Path(tempfile.mkdtemp(dir=self.root, prefix="layout-")) / "l", "t",
                        files or {}, remove=remove, big_random_bytes=big_random_bytes)
        try:
            reg = self.private if private else self.public
            creds = (PRIVATE_USER, PRIVATE_PASSWORD) if private else (None, None)
            return str(oci_image.push(layout, "t", reg, repo, tag, user=creds[0], password=creds[1]))
        finally:
            shutil.rmtree(layout.parent, ignore_errors=True)

    def push_index(self, repo: str, tag: str, files_by_platform: dict[str, dict[str, bytes]]) -> dict[str, str]:
        """A multi-platform image: one image per platform ("linux/amd64", ...), each base + ``files``,
        under one image index; returns {platform: manifest digest, "index": index digest}."""
        root = Path(tempfile.mkdtemp(dir=self.root, prefix="layout-"))
        try:
            platforms = list(files_by_platform)
            layout = derive(base_layout(), root / "l", "p0", files_by_platform[platforms[0]])
            for i, p in enumerate(platforms[1:], 1):
                oci_image.add_tag(layout, "base", f"p{i}", files_by_platform[p])
            oci_image.make_index(layout, {p: f"p{i}" for i, p in enumerate(platforms)}, "idx")
            index = json.loads((layout / "index.json").read_text())
            names = {m["annotations"]["org.opencontainers.image.ref.name"]: m["digest"] for m in index["manifests"]}
            out = {p: names[f"p{i}"] for i, p in enumerate(platforms)}
            out["index"] = str(oci_image.push(layout, "idx", self.public, repo, tag))
            return out
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def site_toml(self, *, mirror_docker_io: bool = True) -> str:
        """The ``[containers]`` table pointing docker.io at the public registry and trusting the CA."""
        mirrors = f'registry_mirrors = {{"docker.io" = "{self.public.host}"}}\n' if mirror_docker_io else ""
        return f'[containers]\n{mirrors}ca_bundle = "{self.ca}"\n'


@pytest.fixture(scope="session")
def oci_registries() -> Iterator[OciRegistries]:
    for tool in ("docker-registry", "skopeo", "umoci", "htpasswd", "mksquashfs"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/install.sh installs it)")
    Path("/var/tmp").mkdir(exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="slurm-bt-registries-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    tls = root / "tls"
    pub = oci_image.Registry(root / "public", free_port(), ca_dir=tls, addr=HOST)
    priv = oci_image.Registry(root / "private", free_port(), users={PRIVATE_USER: PRIVATE_PASSWORD}, ca_dir=tls,
                              addr=HOST)
    try:
        pub.start()
        priv.start()
        os.chmod(tls, 0o755)
        yield OciRegistries(root, pub, priv)
    finally:
        pub.stop()
        priv.stop()
        shutil.rmtree(root, ignore_errors=True)
