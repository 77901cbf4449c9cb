"""azure://, cw:// and https:// weights sources end to end on the dev cluster (one job per scheme).

Each job declares one source on a real loopback server (Azurite; SeaweedFS behind the site's
``cw_endpoint_template``; the local HTTPS server whose CA the site trusts through
``https_ca_bundle``), and must start with the files read-only at the mount location, byte for byte.
Before slurm_bt/storage these schemes were refused at submit ("not supported by slurm-bt yet").
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from slurm_bt.secrets_store import SecretStore
from tests.servers.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from tests.servers.fixtures import azurite, https_files  # noqa: F401  (session fixtures)
from tests.servers.https_server import TOKEN, HttpsFiles
from tests.servers.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
MiB = 1 << 20

PROBE = r'''
import hashlib, json, os
loc = "/app/w"
files = {}
for root, _, names in os.walk(loc):
    for n in names:
        p = os.path.join(root, n)
        files[os.path.relpath(p, loc)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
try:
    open(os.path.join(loc, "written-by-job"), "w").write("x")
    writable = True
except OSError as exc:
    writable = exc.strerror
print("PROBE " + json.dumps({"files": files, "writable": writable}), flush=True)
'''


def _run(argv: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedS3, azurite: Azurite,  # noqa: F811
         https_files: HttpsFiles) -> dict[str, str]:  # noqa: F811
    tmp = tmp_path_factory.mktemp("schemes-site")
    secrets = tmp / "secrets"
    os.chmod(https_files.ca_bundle, 0o644)
    path = tmp / "site.toml"
    path.write_text(textwrap.dedent(f"""
        [storage]
        secrets = "{secrets}"
        [weights.endpoints]
        cw_endpoint_template = "{seaweed.endpoint}"
        cw_addressing_style = "path"
        azure_endpoint_template = "{azurite.endpoint_template}"
        https_ca_bundle = "{https_files.ca_bundle}"
        """))
    store = SecretStore(secrets)
    store.set("cw_creds", json.dumps({"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}))
    store.set("azure_creds", json.dumps({"account_key": ACCOUNT_KEY}))
    store.set("https_token", TOKEN)
    return {**os.environ, "SLURM_BT_SITE_CONFIG": str(path)}


def _job(tmp: Path, source: str, secret: str, env: dict[str, str], node: str) -> tuple[dict[str, object], str]:
    folder = tmp / "proj"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe.py").write_text(PROBE)
    (folder / "config.py").write_text("from truss_train import WeightsSource, definitions\n" + textwrap.dedent(f"""
        project = definitions.TrainingProject(name="schemes-e2e", job=definitions.TrainingJob(
            image=definitions.Image(base_image="python:3.11"),
            compute=definitions.Compute(cpu_count=1, memory="512Mi"),
            runtime=definitions.Runtime(start_commands=["python3 probe.py"]),
            weights=[WeightsSource(source="{source}", mount_location="/app/w", auth_secret_name="{secret}")],
        ))
        """))
    r = _run([str(BIN / "bt-sbatch"), "--json", str(folder / "config.py"), "--", f"--nodelist={node}"], env)
    assert r.returncode == 0, r.stderr
    job_id = str(json.loads(r.stdout)["job_id"])
    r = _run([str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "240", "--json"], env, timeout=300)
    assert r.stdout, r.stderr
    [status] = json.loads(r.stdout)
    logs = _run([str(BIN / "slurm-bt"), "logs", job_id], env).stdout
    return status, logs


def _check(status: dict[str, object], logs: str, want: dict[str, bytes]) -> None:
    assert status["current_status"] == "TRAINING_JOB_COMPLETED", (status, logs)
    [probe] = [json.loads(m) for m in re.findall(r"PROBE (\{.*\})", logs)]
    assert probe["files"] == {p: hashlib.sha256(b).hexdigest() for p, b in want.items()}
    assert probe["writable"] in ("Read-only file system", "Permission denied"), probe


def test_azure_weights(dev_cluster: dict[str, object], site: dict[str, str], azurite: Azurite,  # noqa: F811
                       tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    rnd = random.Random(tag)
    want = {"config.json": b'{"a": 1}', "model.safetensors": rnd.randbytes(3 * MiB + 5)}
    container = azurite.service().get_container_client("weights")
    for name, data in want.items():
        container.upload_blob(f"az-{tag}/{name}", data, overwrite=True)
    node = sorted(dev_cluster["nodes"])[0]  # type: ignore[call-overload]
    _check(*_job(tmp_path, f"azure://{ACCOUNT}/weights/az-{tag}", "azure_creds", site, node), want)


def test_cw_weights(dev_cluster: dict[str, object], site: dict[str, str], seaweed: SeaweedS3,
                    tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    rnd = random.Random(tag)
    want = {"tokenizer.json": b"{}", "shards/part-0.bin": rnd.randbytes(2 * MiB + 9)}
    for name, data in want.items():
        seaweed.client().put_object(Bucket="weights", Key=f"cw-{tag}/{name}", Body=data)
    node = sorted(dev_cluster["nodes"])[0]  # type: ignore[call-overload]
    _check(*_job(tmp_path, f"cw://weights/cw-{tag}", "cw_creds", site, node), want)


def test_https_weights(dev_cluster: dict[str, object], site: dict[str, str], https_files: HttpsFiles,  # noqa: F811
                       tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    data = random.Random(tag).randbytes(MiB + 11)
    https_files.put(f"private/{tag}/model.bin", data)
    node = sorted(dev_cluster["nodes"])[0]  # type: ignore[call-overload]
    _check(*_job(tmp_path, https_files.url(f"private/{tag}/model.bin"), "https_token", site, node),
           {"model.bin": data})
