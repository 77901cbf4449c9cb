"""A weights origin that serves bytes other than those its listing vouches for (issue #8 item 3).

Real jobs of an ordinary user (btu1) on the dev cluster, sources served by the loopback servers:

* ``hf://``: a non-LFS ``config.json`` whose body is flipped in transit (the fake Hub's fault knob);
  its tree ``oid`` (git blob sha1) no longer matches;
* ``s3://``: a single-part object served through a corrupting proxy in front of SeaweedFS, so its
  ETag is still the MD5 of the original.

Each time the staging job must fail with the file and both checksums in its log, the training job
ends DEPLOY_FAILED, nothing of the corrupted content is in the team's cluster tier (no blob, no
manifest, no pin record, no temp file), no node drains; and once the origin serves the right bytes
again, the same source stages and the job reads the original content (nothing poisoned was cached).
On main before this change the corrupted ``config.json`` was published and the job completed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_bt.storage.checksums import git_blob_sha1
from tests.integration.hostile.harness import (
    BIN,
    admin_path,
    aftermath,
    as_user,
    attack,
    cluster,
    submit,
    wait,
    write_job,
)
from tests.integration.hostile.weights_jobs import PROBE, readable_site, weights_job
from tests.servers.corrupt_proxy import CorruptingProxy
from tests.servers.hf_hub import FakeHub, Faults
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slurm

MiB = 1 << 20
USER = "btu1"

@pytest.fixture(scope="module")
def proxy(seaweed: SeaweedS3) -> Iterator[CorruptingProxy]:
    p = CorruptingProxy(seaweed.endpoint).start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def site_env(tenants: dict[str, Any], fake_hub: FakeHub, proxy: CorruptingProxy) -> Iterator[None]:
    """A site file the user can read, naming the loopback origins (jobs reach them: nodes are this host)."""
    with readable_site("bt-verify-site-", f"""
            [weights.endpoints]
            hf_endpoint = "{fake_hub.endpoint}"
            s3_endpoint_url = "{proxy.endpoint}"
            s3_addressing_style = "path"
            """):
        yield


def _team_tiers() -> Path:
    from slurm_bt.site.settings import SiteSettings

    return admin_path(SiteSettings().storage.cluster_cache) / "teams"  # as an admin: root may be squashed


def _staging_log(record: dict[str, Any]) -> str:
    import pwd

    home = Path(pwd.getpwnam(USER).pw_dir)
    logs = sorted(home.glob(f".slurm-bt/projects/*/jobs/*/logs/staging-{record['staging_job_id']}.out"))
    assert logs, f"no staging log for {record}"
    return "\n".join(p.read_text(errors="replace") for p in logs)


def _assert_not_in_cluster_cache(bad: bytes, marker: str) -> None:
    """No blob of ``bad``, no temp file, and no manifest or pin record naming ``marker`` in any team tier."""
    bad_sha = hashlib.sha256(bad).hexdigest()
    for team in _team_tiers().iterdir():
        blobs = team / "blobs"
        names = os.listdir(blobs) if blobs.is_dir() else []
        assert bad_sha not in names, f"corrupted content published in {blobs}"
        assert not [n for n in names if ".tmp-" in n and os.stat(blobs / n).st_uid == _uid()], names
        for sub in ("manifests", "pins"):
            for p in (team / sub).rglob("*") if (team / sub).is_dir() else ():
                if p.is_file() and p.stat().st_size < 4 * MiB:
                    assert marker not in p.read_text(errors="replace"), f"{p} names the refused source"


def _uid() -> int:
    import pwd

    return pwd.getpwnam(USER).pw_uid


def _run(source: str, auth: str = "") -> tuple[str, dict[str, Any], str]:
    config = write_job(USER, weights_job("hostile-verify", source, auth), {"probe.py": PROBE})
    node = sorted(cluster()["nodes"])[0]
    job_id = submit(USER, config, f"--nodelist={node}")
    record, logs = wait(USER, job_id, timeout_s=240)
    return job_id, record, logs


def _assert_refused(job_id: str, record: dict[str, Any], logs: str, file: str, expected: str, where: str) -> str:
    # The training job never ran its start command. (Its status is TRAINING_JOB_DEPLOY_FAILED, or
    # TRAINING_JOB_STOPPED when sacct no longer shows the "Dependency" reason of the cancellation.)
    assert record["staging_state"] == "FAILED", record
    assert str(record["current_status"]) in ("TRAINING_JOB_DEPLOY_FAILED", "TRAINING_JOB_STOPPED"), record
    assert "PROBE" not in logs, logs
    text = _staging_log(record)
    line = next((ln for ln in text.splitlines() if "slurm-bt staging failed" in ln), "")
    assert f"file '{file}'" in line and expected in line and where in line and "not published" in line, text
    got = re.search(r"got ([0-9a-f]+)\)", line)
    assert got and got.group(1) != expected, line
    aftermath(job_id, USER)
    return line


def test_hf_non_lfs_file_corrupted_in_transit_is_never_cached(site_env: None, fake_hub: FakeHub) -> None:
    with attack("hf:// non-LFS body corrupted in transit"):
        tag = uuid.uuid4().hex[:8]
        # Unique content per run: blobs are content-addressed, so the assertion below is about this run.
        config = json.dumps({"hidden": 16, "run": tag, "pad": "p" * 500}).encode()
        model = random.Random(tag).randbytes(MiB + 3)
        repo = f"Org/Verify-{tag}"
        fake_hub.add_repo(repo, {"config.json": config, "model.safetensors": model})
        with fake_hub.faults(Faults(paths={"config.json"}, corrupt_offset=100, times=-1)):
            job_id, record, logs = _run(f"hf://{repo}")
        line = _assert_refused(job_id, record, logs, "config.json", git_blob_sha1(config), "git blob id")
        print(f"\nrefused: {line}")
        bad = config[:100] + bytes([config[100] ^ 0xFF]) + config[101:]
        _assert_not_in_cluster_cache(bad, repo)
        # The origin is healthy again: the same source stages, and the job reads the original bytes.
        job_id, record, logs = _run(f"hf://{repo}")
        assert record["current_status"] == "TRAINING_JOB_COMPLETED", (record, logs)
        [probe] = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs)]
        assert probe == {"config.json": hashlib.sha256(config).hexdigest(),
                         "model.safetensors": hashlib.sha256(model).hexdigest()}, probe
        aftermath(job_id, USER)


def test_s3_object_not_matching_its_etag_is_never_cached(site_env: None, seaweed: SeaweedS3,
                                                          proxy: CorruptingProxy) -> None:
    with attack("s3:// single-part object not matching its ETag"):
        tag = uuid.uuid4().hex[:8]
        body = random.Random(tag).randbytes(3 * MiB + 5)
        prefix = f"verify-{tag}"
        seaweed.client().put_object(Bucket="weights", Key=f"{prefix}/model.bin", Body=body)
        secret = json.dumps({"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY})
        r = as_user(USER, [str(BIN / "slurm-bt"), "secrets", "set", "verify_s3"], input=secret)
        assert r.returncode == 0, r.stderr
        proxy.corrupt[f"/weights/{prefix}/model.bin"] = 2 * MiB + 1
        try:
            job_id, record, logs = _run(f"s3://weights/{prefix}", auth=', auth_secret_name="verify_s3"')
        finally:
            proxy.corrupt.clear()
        assert f"/weights/{prefix}/model.bin" in proxy.flipped, "the proxy corrupted nothing: the test proves nothing"
        md5 = hashlib.md5(body, usedforsecurity=False).hexdigest()
        line = _assert_refused(job_id, record, logs, "model.bin", md5, "ETag")
        print(f"\nrefused: {line}")
        bad = body[: 2 * MiB + 1] + bytes([body[2 * MiB + 1] ^ 0xFF]) + body[2 * MiB + 2 :]
        _assert_not_in_cluster_cache(bad, prefix)
