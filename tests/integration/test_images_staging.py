"""Images on the real dev cluster: pinned at submit, mirrored by the CPU staging job, run from the cache.

Real parts: the test registries (tests/servers/oci_registry.py: docker-registry over TLS, htpasswd for
the private one), skopeo/umoci/mksquashfs in the staging job as the user, charliecloud on the nodes.
The site file (readable by the test users) sets ``container_runtime = "charliecloud"`` and maps
``docker.io`` to the public test registry. Lean: tiny images (the host-files base + one small layer).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.hostile.harness import BIN, aftermath, as_user, submit, wait, write_job
from tests.integration.hostile.weights_jobs import readable_site
from tests.servers.oci_registry import OciRegistries

pytestmark = pytest.mark.slurm

TEAM_TIER = Path("/var/lib/slurm-bt-dev/shared/weights/teams")
CONFIG = """
from truss.base import truss_config
from truss_train import definitions
project = definitions.TrainingProject(name="img-{name}", job=definitions.TrainingJob(
    image=definitions.Image(base_image={image!r}{auth}),
    runtime=definitions.Runtime(start_commands=[{command!r}])))
"""
AUTH = (', docker_auth=definitions.DockerAuth(auth_method=truss_config.DockerAuthType.REGISTRY_SECRET, '
        'registry={registry!r}, registry_secret_docker_auth=definitions.RegistrySecretDockerAuth('
        'secret_ref=definitions.SecretReference(name="regcred")))')


@pytest.fixture(scope="module")
def tenants(dev_cluster: dict[str, object]) -> dict[str, object]:
    """btu1 (btteam1) and btu2 (btteam2) with Slurm associations (as tests/integration/hostile/conftest.py)."""
    import subprocess

    from tests.unit.test_hooks_env import ensure_test_users

    ensure_test_users()
    for user in ("btu1", "btu2"):
        subprocess.run(["sacctmgr", "-i", "add", "user", user, "account=default"], capture_output=True, check=False)
    return dev_cluster


@pytest.fixture(scope="module")
def site(tenants: dict[str, Any], oci_registries: OciRegistries) -> Iterator[Path]:
    with readable_site("bt-images-site-", 'container_runtime = "charliecloud"\n' + oci_registries.site_toml()) as p:
        yield p


def config(user: str, image: str, command: str, *, auth_registry: str | None = None) -> Path:
    auth = AUTH.format(registry=auth_registry) if auth_registry else ""
    return write_job(user, CONFIG.format(name=uuid.uuid4().hex[:8], image=image, auth=auth, command=command))


def bt_sbatch(user: str, cfg: Path) -> Any:
    return as_user(user, [str(BIN / "bt-sbatch"), "--parsable", str(cfg)], cwd=cfg.parent)


def test_public_image_is_pinned_mirrored_and_runs_the_pinned_digest(site: Path, oci_registries: OciRegistries) -> None:
    """The tag moves right after submit: the staged entry and the job's files are the pinned digest's."""
    tag = uuid.uuid4().hex[:8]
    repo = f"library/itest-{tag}"
    pinned = oci_registries.push(repo, "v1", {"etc/version": b"one\n"})
    cfg = config("btu1", f"itest-{tag}:v1", "cat /etc/version && python3 -c 'print(\"py-ok\")'")
    proc = bt_sbatch("btu1", cfg)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    moved = oci_registries.push(repo, "v1", {"etc/version": b"two\n"})  # the tag moves after submit
    assert moved != pinned
    record, logs = wait("btu1", job_id)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
    assert record["image"]["digest"] == pinned and record["image"]["in_cluster_cache"] is True
    assert "one" in logs and "two" not in logs and "py-ok" in logs
    ls = as_user("btu1", [str(BIN / "slurm-bt"), "cache", "ls"]).stdout
    assert f"image {oci_registries.public.host}/{repo}@{pinned}" in ls
    # looked at as a member of the team: root may be squashed on the shared storage (test-squashed.sh)
    assert as_user("btu1", ["test", "-f", str(TEAM_TIER / "btteam1" / "pins" / f"oci-{pinned.split(':')[1]}.json")]
                   ).returncode == 0
    aftermath(job_id, "btu1")


def test_submit_errors_exit_2_and_nothing_is_submitted(site: Path, oci_registries: OciRegistries) -> None:
    tag = uuid.uuid4().hex[:8]
    host = oci_registries.private.host
    oci_registries.push(f"team/itest-{tag}", "v1", {}, private=True)
    as_user("btu1", [str(BIN / "slurm-bt"), "secrets", "set", "regcred"], input="alice:wrong").check_returncode()
    configs = [config("btu1", f"{host}/team/itest-{tag}:v1", "true", auth_registry=host),
               config("btu1", f"itest-{tag}:no-such-tag", "true")]
    wrong = bt_sbatch("btu1", configs[0])
    assert wrong.returncode == 2, wrong.stderr
    assert "job.image.docker_auth.registry_secret_docker_auth" in wrong.stderr and "alice:wrong" not in wrong.stderr
    missing = bt_sbatch("btu1", configs[1])
    assert missing.returncode == 2 and "job.image.base_image" in missing.stderr, missing.stderr
    projects = [re.search(r'name="(img-[0-9a-f]+)"', c.read_text()).group(1) for c in configs]  # type: ignore[union-attr]
    assert _jobs_named("btu1", projects) == set()


def _jobs_named(user: str, projects: list[str]) -> set[str]:
    """``user``'s jobs (queued or ended) of these projects: other tests' jobs come and go meanwhile."""
    queued = as_user(user, ["squeue", "-h", "-u", user, "-o", "%i %j"]).stdout
    ended = as_user(user, ["sacct", "-n", "-X", "-P", "-S", "now-1hours", "-o", "JobID,JobName"]).stdout
    rows = [ln.split(None, 1) for ln in queued.splitlines()] + [ln.split("|", 1) for ln in ended.splitlines()]
    return {r[0] for r in rows if len(r) == 2 and any(r[1].startswith(p) for p in projects)}


def test_private_image_with_registry_secret_is_readable_by_the_team_only(site: Path,
                                                                         oci_registries: OciRegistries) -> None:
    tag = uuid.uuid4().hex[:8]
    host = oci_registries.private.host
    digest = oci_registries.push(f"team/itest-{tag}", "v1", {"etc/secret-marker": b"private-bytes\n"}, private=True)
    as_user("btu1", [str(BIN / "slurm-bt"), "secrets", "set", "regcred"], input="alice:alice-pw").check_returncode()
    job_id = submit("btu1", config("btu1", f"{host}/team/itest-{tag}:v1", "cat /etc/secret-marker",
                                   auth_registry=host))
    record, logs = wait("btu1", job_id)
    assert record["current_status"] == "TRAINING_JOB_COMPLETED", logs
    assert record["image"]["private"] is True and "private-bytes" in logs
    pin = TEAM_TIER / "btteam1" / "pins" / f"oci-{digest.split(':')[1]}.json"
    manifest = json.loads(as_user("btu1", ["cat", str(pin)]).stdout)  # as the team (root may be squashed)
    blob = TEAM_TIER / "btteam1" / "blobs" / manifest["files"][0]["sha256"]
    assert as_user("btu1", ["test", "-f", str(blob)]).returncode == 0
    other = as_user("btu2", ["cat", str(blob)])
    assert other.returncode != 0 and "Permission denied" in other.stderr
    listing = as_user("btu2", [str(BIN / "slurm-bt"), "cache", "ls", "--team", "btteam1"])
    assert digest not in listing.stdout
    aftermath(job_id, "btu1")


def test_stopped_registry_fails_staging_not_the_node(site: Path, oci_registries: OciRegistries,
                                                     tmp_path: Path) -> None:
    """The registry goes away between submit and staging: DEPLOY_FAILED, no node drained."""
    from tests.servers._proc import HOST, free_port
    from tests.servers.oci_images import oci_image

    # at the address the nodes reach the head: else a node's own loopback would refuse it for another reason
    reg = oci_image.Registry(oci_registries.root / f"gone-{uuid.uuid4().hex[:6]}", free_port(),
                             ca_dir=oci_registries.public.ca_dir, addr=HOST)
    reg.start()
    try:
        oci_registries_push = OciRegistries(oci_registries.root, reg, oci_registries.private)
        oci_registries_push.push("x/gone", "v1", {})
        proc = bt_sbatch("btu1", config("btu1", f"{reg.host}/x/gone:v1", "true"))
        assert proc.returncode == 0, proc.stderr
    finally:
        reg.stop()
    job_id = proc.stdout.strip().splitlines()[-1]
    record, logs = wait("btu1", job_id)
    assert record["current_status"] == "TRAINING_JOB_DEPLOY_FAILED", (record, logs)
    assert record["staging_state"] == "FAILED"
    aftermath(job_id, "btu1")

