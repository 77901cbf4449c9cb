"""Images at submit and in the staging job, against real registries on 127.0.0.1 (no Slurm).

The registries (tests/servers/oci_registry.py) are Debian's docker-registry with TLS from a test CA;
``private`` needs htpasswd credentials. Pinning and mirroring run the real skopeo, umoci and mksquashfs.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from slurm_bt.errors import ConfigError, SourceError, SourceUnavailableError
from slurm_bt.images.entry import IMAGE_FILE, ImagePlan, image_pin_key, job_image_manifest_path
from slurm_bt.images.mirror import mirror_image
from slurm_bt.images.pin import cached_image, pin_image, select_platform
from slurm_bt.images.reference import parse_reference
from slurm_bt.job_spec import JobSpec
from slurm_bt.secrets_store import SecretStore
from slurm_bt.site.settings import SiteSettings
from tests.servers.oci_registry import OciRegistries

AUTH = ('docker_auth=definitions.DockerAuth(auth_method=truss_config.DockerAuthType.REGISTRY_SECRET, '
        'registry="{registry}", '
        'registry_secret_docker_auth=definitions.RegistrySecretDockerAuth('
        'secret_ref=definitions.SecretReference(name="regcred")))')


def _spec(tmp: Path, image: str, site: SiteSettings, *, auth_registry: str | None = None) -> JobSpec:
    from slurm_bt.compat.loader import load_training_project
    from slurm_bt.submit import prepare_submission

    auth = ", " + AUTH.format(registry=auth_registry) if auth_registry else ""
    folder = tmp / f"p-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "config.py").write_text(textwrap.dedent(f"""
        from truss.base import truss_config
        from truss_train import definitions
        project = definitions.TrainingProject(name="img", job=definitions.TrainingJob(
            image=definitions.Image(base_image={image!r}{auth}),
            runtime=definitions.Runtime(start_commands=["true"])))
        """))
    project = load_training_project(folder / "config.py")
    return prepare_submission(project, config_path=folder / "config.py", source="config.py", site=site)


def _site(regs: OciRegistries, tmp: Path) -> SiteSettings:
    return SiteSettings.model_validate({
        "container_runtime": "apptainer",  # with "none" the image and its DockerAuth are ignored
        "storage": {"cluster_cache": str(tmp / "cc"), "secrets": str(tmp / "secrets")},
        "containers": {"registry_mirrors": {"docker.io": regs.public.host}, "ca_bundle": str(regs.ca)}})


def _store(tmp: Path, value: str | None = None) -> SecretStore:
    store = SecretStore(tmp / "secrets")
    if value is not None:
        store.set("regcred", value)
    return store


def _team() -> str:
    import grp

    from slurm_bt.weights.plan import team_slug

    return team_slug(grp.getgrgid(os.getgid()).gr_name)


def _plan(site: SiteSettings) -> ImagePlan:
    return ImagePlan(team=_team(), cluster_cache=site.storage.cluster_cache, containers=site.containers)


# -- pure ------------------------------------------------------------------------------------------------


def test_docker_hub_names_and_mirrors() -> None:
    r = parse_reference("python:3.11-slim")
    assert str(r) == "docker.io/library/python:3.11-slim"
    assert str(r.mirrored({"docker.io": "127.0.0.1:5443"})) == "127.0.0.1:5443/library/python:3.11-slim"
    assert parse_reference("ghcr.io/org/x@sha256:" + "a" * 64).digest == "sha256:" + "a" * 64
    for bad in ("Python:3", "x y", "x:bad!tag", "x@sha256:00", "-x", "a//b"):
        with pytest.raises(ValueError):
            parse_reference(bad)


def test_index_picks_the_nodes_platform() -> None:
    index = {"manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "1" * 64,
         "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + "2" * 64,
         "platform": {"os": "linux", "architecture": "amd64"}}]}
    assert select_platform(index, "linux/amd64") == "sha256:" + "2" * 64
    assert select_platform(index, "linux/arm64") == "sha256:" + "1" * 64
    with pytest.raises(ValueError, match="linux/arm64/v8, linux/amd64"):
        select_platform(index, "linux/ppc64le")


# -- pin against the registries --------------------------------------------------------------------------


def test_public_image_pinned_through_the_mirror(oci_registries: OciRegistries, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-img", tag, {"etc/tag": tag.encode()})
    site = _site(oci_registries, tmp_path)
    pin = pin_image(_spec(tmp_path, f"pytest-img:{tag}", site), site, _store(tmp_path))
    assert pin.digest == digest
    assert pin.resolved == f"{oci_registries.public.host}/library/pytest-img@{digest}"
    assert pin.reference == f"pytest-img:{tag}" and not pin.private


def test_multi_platform_image_pins_the_nodes_platform(oci_registries: OciRegistries, tmp_path: Path) -> None:
    """Registries serve an index for multi-arch images (python:3.11-slim is one): the pin is the nodes'
    platform's manifest, and the mirror stages that platform's files."""
    tag = uuid.uuid4().hex[:8]
    got = oci_registries.push_index("library/pytest-multi", tag, {"linux/arm64": {"etc/arch": b"arm64\n"},
                                                                  "linux/amd64": {"etc/arch": b"amd64\n"}})
    site = _site(oci_registries, tmp_path)
    spec = _spec(tmp_path, f"pytest-multi:{tag}", site)
    pin = pin_image(spec, site, _store(tmp_path))
    assert pin.digest == got["linux/amd64"] != got["linux/arm64"]
    arm = site.model_copy(update={"containers": site.containers.model_copy(update={"platform": "linux/arm64"})})
    assert pin_image(spec, arm, _store(tmp_path)).digest == got["linux/arm64"]
    ppc = site.model_copy(update={"containers": site.containers.model_copy(update={"platform": "linux/ppc64le"})})
    with pytest.raises(ConfigError, match="linux/ppc64le"):
        pin_image(spec, ppc, _store(tmp_path))
    out = mirror_image(tmp_path, spec.model_copy(update={"image_pin": pin}), _plan(site), _store(tmp_path))
    from slurm_bt.weights.plan import cluster_tiers

    blob = cluster_tiers(site.storage.cluster_cache, _team())[0].layout.blob(out.manifest.files[0].sha256)
    assert subprocess.run(["unsquashfs", "-cat", str(blob), "etc/arch"], capture_output=True,
                          check=True).stdout == b"amd64\n"


def test_missing_tag_is_exit_2_at_base_image(oci_registries: OciRegistries, tmp_path: Path) -> None:
    site = _site(oci_registries, tmp_path)
    with pytest.raises(ConfigError) as err:
        pin_image(_spec(tmp_path, "pytest-img:no-such-tag", site), site, _store(tmp_path))
    assert err.value.exit_code == 2
    assert err.value.problems[0].loc == "job.image.base_image"
    assert "no such image or tag" in err.value.problems[0].message


def test_private_image_needs_the_docker_auth(oci_registries: OciRegistries, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    host = oci_registries.private.host
    digest = oci_registries.push("team/secret", tag, {"etc/tag": tag.encode()}, private=True)
    site = _site(oci_registries, tmp_path)
    ok = pin_image(_spec(tmp_path, f"{host}/team/secret:{tag}", site, auth_registry=host), site,
                   _store(tmp_path, "alice:alice-pw"))
    assert ok.digest == digest and ok.private
    with pytest.raises(ConfigError) as wrong:
        pin_image(_spec(tmp_path, f"{host}/team/secret:{tag}", site, auth_registry=host), site,
                  _store(tmp_path, "alice:not-the-password"))
    assert wrong.value.exit_code == 2
    assert wrong.value.problems[0].loc == "job.image.docker_auth.registry_secret_docker_auth"
    assert "not-the-password" not in str(wrong.value)
    with pytest.raises(ConfigError) as none:
        pin_image(_spec(tmp_path, f"{host}/team/secret:{tag}", site), site, _store(tmp_path))
    assert none.value.problems[0].loc == "job.image.base_image"


def test_unreachable_registry_is_exit_1(oci_registries: OciRegistries, tmp_path: Path) -> None:
    from tests.servers._proc import free_port

    site = _site(oci_registries, tmp_path)
    port = free_port()
    with pytest.raises(SourceUnavailableError) as err:
        pin_image(_spec(tmp_path, f"127.0.0.1:{port}/x/y:1", site), site, _store(tmp_path), timeout_s=60)
    assert err.value.exit_code == 1
    assert "could not be reached" in str(err.value)


# -- mirror ----------------------------------------------------------------------------------------------


def _listing(sqfs: Path) -> str:
    return subprocess.run(["unsquashfs", "-lls", "-d", "/x", str(sqfs)], capture_output=True, text=True,
                          check=True).stdout


def test_mirror_publishes_a_squashfs_with_whiteouts_applied(oci_registries: OciRegistries, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    oci_registries.push("library/pytest-mirror", tag, {"opt/app/hello.txt": b"hello\n"}, remove=("usr/bin/tail",))
    site = _site(oci_registries, tmp_path)
    spec = _spec(tmp_path, f"pytest-mirror:{tag}", site)
    spec = spec.model_copy(update={"image_pin": pin_image(spec, site, _store(tmp_path))})
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    out = mirror_image(job_dir, spec, _plan(site), _store(tmp_path))
    assert out.tier == "miss"
    m = out.manifest
    assert m.kind == "oci" and m.revision == spec.image_pin.digest  # type: ignore[union-attr]
    assert [f.path for f in m.files] == [IMAGE_FILE]
    assert job_image_manifest_path(job_dir).read_bytes() == m.canonical_json()
    assert os.stat(job_image_manifest_path(job_dir)).st_mode & 0o777 == 0o600
    from slurm_bt.weights.plan import cluster_tiers

    team_tier, _ = cluster_tiers(site.storage.cluster_cache, _team())
    assert team_tier.has(m)
    blob = team_tier.layout.blob(m.files[0].sha256)
    listing = _listing(blob)
    assert "/x/opt/app/hello.txt" in listing
    assert "/x/usr/bin/tail" not in listing and "/x/usr/bin/head" in listing  # the whiteout applied
    for d in ("dev", "proc", "sys", "tmp", "home", "etc/passwd", "etc/resolv.conf"):
        assert f"/x/{d}" in listing
    assert " root/root " in listing and "/.wh." not in listing
    assert (team_tier.root / "pins" / f"{image_pin_key(spec.image_pin.digest)}.json").is_file()  # type: ignore[union-attr]
    assert not any(team_tier.layout.tmp.iterdir())  # nothing left in the writer area
    # a second job of the same digest: a cluster hit, no pull
    gets = oci_registries.public.blob_gets()
    again = mirror_image(tmp_path, spec, _plan(site), _store(tmp_path))
    assert again.tier == "cluster-hit" and again.manifest == m
    assert oci_registries.public.blob_gets() == gets
    assert cached_image(spec.image_pin, site.storage.cluster_cache, _team()) is not None  # type: ignore[arg-type]


def test_moved_tag_mirrors_the_pinned_digest(oci_registries: OciRegistries, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    oci_registries.push("library/pytest-moving", tag, {"etc/version": b"one\n"})
    site = _site(oci_registries, tmp_path)
    spec = _spec(tmp_path, f"pytest-moving:{tag}", site)
    spec = spec.model_copy(update={"image_pin": pin_image(spec, site, _store(tmp_path))})
    oci_registries.push("library/pytest-moving", tag, {"etc/version": b"two\n"})  # the tag moves
    out = mirror_image(tmp_path, spec, _plan(site), _store(tmp_path))
    from slurm_bt.weights.plan import cluster_tiers

    blob = cluster_tiers(site.storage.cluster_cache, _team())[0].layout.blob(out.manifest.files[0].sha256)
    got = subprocess.run(["unsquashfs", "-cat", str(blob), "etc/version"], capture_output=True, check=True).stdout
    assert got == b"one\n"


def test_same_image_under_another_registry_name_is_recorded_without_pulling(oci_registries: OciRegistries,
                                                                            tmp_path: Path) -> None:
    """A site's mirror moved (the dev cluster's isolated layout serves the registry at the head's address):
    the digest's squashfs is already in the tier under the old name. The job's manifest must name the new
    pin (the prolog compares them), and the staging job records it without pulling again."""
    from slurm_bt.images.entry import image_source
    from slurm_bt.weights.plan import cluster_tiers

    tag = uuid.uuid4().hex[:8]
    oci_registries.push("library/pytest-renamed", tag, {"etc/version": b"one\n"})
    site = _site(oci_registries, tmp_path)
    spec = _spec(tmp_path, f"pytest-renamed:{tag}", site)
    pin = pin_image(spec, site, _store(tmp_path))
    first = mirror_image(tmp_path, spec.model_copy(update={"image_pin": pin}), _plan(site), _store(tmp_path))
    assert first.tier == "miss"
    # the same registry under another name its certificate carries; then it goes away: nothing can be pulled
    other = pin.model_copy(update={"resolved": "localhost:" + pin.resolved.split(":", 1)[1]})
    assert cached_image(other, site.storage.cluster_cache, _team()) is None  # the record names the old source
    oci_registries.public.stop()
    try:
        job = tmp_path / "job2"
        job.mkdir()
        out = mirror_image(job, spec.model_copy(update={"image_pin": other}), _plan(site), _store(tmp_path))
    finally:
        oci_registries.public.start()
    assert out.tier == "cluster-hit"
    assert out.manifest.source == image_source(other) and out.manifest.files == first.manifest.files
    written = job_image_manifest_path(job).read_text()
    assert image_source(other) in written
    team_tier = cluster_tiers(site.storage.cluster_cache, _team())[0]
    assert team_tier.has(out.manifest)
    hit = cached_image(other, site.storage.cluster_cache, _team())
    assert hit is not None and hit[0] == out.manifest


def test_corrupted_layer_is_refused_and_nothing_published(oci_registries: OciRegistries, tmp_path: Path) -> None:
    import json

    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-corrupt", tag, {"opt/data.bin": os.urandom(200_000)})
    site = _site(oci_registries, tmp_path)
    spec = _spec(tmp_path, f"pytest-corrupt:{tag}", site)
    spec = spec.model_copy(update={"image_pin": pin_image(spec, site, _store(tmp_path))})
    manifest = json.loads(oci_registries.public.blob_path(digest.split(":")[1]).read_bytes())
    layer = oci_registries.public.blob_path(manifest["layers"][-1]["digest"].split(":")[1])
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    layer.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"pull failed|refused"):
        mirror_image(tmp_path, spec, _plan(site), _store(tmp_path))
    from slurm_bt.weights.plan import cluster_tiers

    team_tier = cluster_tiers(site.storage.cluster_cache, _team())[0]
    assert team_tier.entries() == []
    assert not (team_tier.root / "pins").exists() or not any((team_tier.root / "pins").iterdir())
    assert not any(team_tier.layout.blobs.iterdir()) and not any(team_tier.layout.tmp.iterdir())


def test_two_concurrent_stagers_pull_once(oci_registries: OciRegistries, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    digest = oci_registries.push("library/pytest-twice", tag, {"opt/big.bin": os.urandom(3 << 20)})
    site = _site(oci_registries, tmp_path)
    spec = _spec(tmp_path, f"pytest-twice:{tag}", site)
    spec = spec.model_copy(update={"image_pin": pin_image(spec, site, _store(tmp_path))})
    import json

    manifest = json.loads(oci_registries.public.blob_path(digest.split(":")[1]).read_bytes())
    big = manifest["layers"][-1]["digest"].split(":")[1]
    before = oci_registries.public.blob_gets(big)
    results: list[str] = []

    def one(i: int) -> None:
        d = tmp_path / f"job{i}"
        d.mkdir()
        results.append(mirror_image(d, spec, _plan(site), _store(tmp_path)).tier)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == ["cluster-hit", "miss"]
    assert oci_registries.public.blob_gets(big) - before == 1


def test_credentials_reach_skopeo_only_through_a_memfd(oci_registries: OciRegistries, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in argv, not in the environment, not in any file while skopeo runs; gone afterwards."""
    import subprocess as sp

    tag = uuid.uuid4().hex[:8]
    host = oci_registries.private.host
    oci_registries.push("team/memfd", tag, {}, private=True)
    site = _site(oci_registries, tmp_path)
    seen: list[str] = []
    real_popen = sp.Popen

    def spy(argv: list[str], **kw: object) -> sp.Popen[bytes]:
        seen.append(" ".join(argv) + repr(kw.get("env")))
        env = kw.get("env")
        assert isinstance(env, dict)
        for root, _, names in os.walk(env["TMPDIR"]):
            for n in names:
                seen.append(Path(root, n).read_text(errors="replace"))
        return real_popen(argv, **kw)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr("slurm_bt.images.skopeo.subprocess.Popen", spy)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "t"))
    (tmp_path / "t").mkdir()
    pin = pin_image(_spec(tmp_path, f"{host}/team/memfd:{tag}", site, auth_registry=host), site,
                    _store(tmp_path, "alice:alice-pw"))
    assert pin.private and seen
    import base64

    token = base64.b64encode(b"alice:alice-pw").decode()
    assert not any("alice-pw" in s or token in s for s in seen)
    assert list((tmp_path / "t").iterdir()) == []


def test_decompression_bomb_is_refused_before_unpacking(oci_registries: OciRegistries, tmp_path: Path) -> None:
    """A layer that is small compressed and huge unpacked: refused from its tar headers, nothing written."""
    from slurm_bt.errors import StorageError

    tag = uuid.uuid4().hex[:8]
    oci_registries.push("library/pytest-bomb", tag, {"opt/zeros.bin": bytes(80 << 20)})
    site = _site(oci_registries, tmp_path)
    site = site.model_copy(update={"containers": site.containers.model_copy(update={"max_image_bytes": 64 << 20})})
    spec = _spec(tmp_path, f"pytest-bomb:{tag}", site)
    spec = spec.model_copy(update={"image_pin": pin_image(spec, site, _store(tmp_path))})
    with pytest.raises(StorageError, match="unpacks to more than"):
        mirror_image(tmp_path, spec, _plan(site), _store(tmp_path))
    from slurm_bt.weights.plan import cluster_tiers

    team_tier = cluster_tiers(site.storage.cluster_cache, _team())[0]
    assert team_tier.entries() == [] and not any(team_tier.layout.tmp.iterdir())
