"""Every example, and the README's own "Using it" config, run on the dev cluster exactly as documented.

Each example is submitted the way examples/README.md tells a user to (``bt-sbatch --dry-run``, then
``bt-sbatch``, ``slurm-bt status --wait``, ``slurm-bt logs``), as root like the quick start, on the dev
cluster's own site file (``/etc/slurm-bt/site.toml``: Charliecloud), so each job runs inside the image
its config names: ``python:3.11-slim`` and the torch stand-in for
``pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime`` that ``devcluster.py up`` serves. A new example
directory without a check here, or missing from examples/README.md, fails this module: examples never
rot unnoticed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from tests.integration.cluster_nodes import registry_host

# long_jobs(minutes): its jobs run for minutes by design; the parallel pass starts the longest first
# (tests/conftest.py).
pytestmark = [pytest.mark.slurm, pytest.mark.long_jobs(3)]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SITE_FILE = Path("/etc/slurm-bt/site.toml")
SECRET = "hf_access_token"
SECRET_VALUE = "hf_example_" + "x" * 21  # 32 characters: the secrets example prints the length


def _env() -> dict[str, str]:
    """The user's environment: no test site file, so the dev cluster's /etc/slurm-bt/site.toml applies."""
    env = dict(os.environ)
    env.pop("SLURM_BT_SITE_CONFIG", None)
    return env


def _run(argv: list[str], *, cwd: Path = REPO, stdin: str | None = None, timeout: float = 900
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=_env(), input=stdin, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def default_site(dev_cluster: dict[str, object]) -> Path:
    """The dev cluster's site file, which must run jobs in their images (else this module proves less)."""
    if os.geteuid() != 0:
        pytest.skip("the examples run as root, like the quick start")
    site = tomllib.loads(SITE_FILE.read_text())
    assert site.get("container_runtime") == "charliecloud", (
        f"{SITE_FILE} must say container_runtime = \"charliecloud\" (devcluster.py up writes it): {site}")
    return SITE_FILE


@pytest.fixture(scope="module")
def secret(default_site: Path) -> Iterator[str]:
    """``hf_access_token`` in root's secret store, as the secrets example's docstring has the user set it;
    root's own value (if any) is put back afterwards."""
    store = Path.home() / ".config/slurm-bt/secrets"
    saved = (store / SECRET).read_bytes() if (store / SECRET).is_file() else None
    proc = _run([str(BIN / "slurm-bt"), "secrets", "set", SECRET], stdin=SECRET_VALUE)
    assert proc.returncode == 0, proc.stderr
    yield SECRET_VALUE
    if saved is None:
        _run([str(BIN / "slurm-bt"), "secrets", "rm", SECRET])
    else:
        (store / SECRET).write_bytes(saved)


def submit_as_documented(config: Path, *, cwd: Path = REPO) -> tuple[str, str, str]:
    """``bt-sbatch --dry-run CONFIG``, ``bt-sbatch CONFIG``, ``slurm-bt status ID --wait``,
    ``slurm-bt logs ID``; returns (job id, what both bt-sbatch runs printed on stderr, the logs). The
    job must complete. (``--parsable`` prints only the id: the warnings and the pin line come from the
    dry run, which makes every check a submit makes.)"""
    dry = _run([str(BIN / "bt-sbatch"), "--dry-run", str(config)], cwd=cwd)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH" in dry.stdout and "submitted" not in dry.stderr.lower(), dry.stderr
    sub = _run([str(BIN / "bt-sbatch"), "--parsable", str(config)], cwd=cwd)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    assert job_id.isdigit(), sub.stdout
    st = _run([str(BIN / "slurm-bt"), "status", job_id, "--wait", "--timeout", "600", "--json"])
    logs = _run([str(BIN / "slurm-bt"), "logs", job_id]).stdout
    assert st.returncode == 0, st.stderr
    state = json.loads(st.stdout)[0]
    assert state["current_status"] == "TRAINING_JOB_COMPLETED", (state, logs[-6000:])
    # In its image: the prolog placed the pinned image on every node and the job ran in it.
    assert re.search(r"slurm-bt image: \S+@sha256:[0-9a-f]{12} ", logs), logs[-6000:]
    return job_id, dry.stderr + sub.stderr, logs


def _check_quickstart(job_id: str, logs: str) -> None:
    assert "rank 0/2 step 200" in logs and "rank 1/2 step 200" in logs, logs
    m = re.search(r"rank 0/2 done: w (\S+) b (\S+)", logs)
    assert m and abs(float(m.group(1)) - 3.0) < 0.05 and abs(float(m.group(2)) - 2.0) < 0.05, logs
    listed = _run([str(BIN / "slurm-bt"), "checkpoints", "list", job_id, "-o", "json"])
    assert listed.returncode == 0, listed.stderr
    names = [c["name"] for c in json.loads(listed.stdout)["checkpoints"] if c["complete"]]
    assert "checkpoint-200" in names, listed.stdout


def _check_secrets(job_id: str, logs: str) -> None:
    assert f"token length {len(SECRET_VALUE)}" in logs, logs


def ddp_result(logs: str) -> tuple[int, int]:
    """(world size, final step) of a multinode_gpu run; asserts every rank met every other and ended with
    the same parameters."""
    reduced = re.findall(r"rank (\d+)/(\d+) all_reduce (\S+) expected (\S+)", logs)
    assert reduced, logs[-6000:]
    world = int(reduced[0][1])
    assert sorted(int(r[0]) for r in reduced) == list(range(world)), reduced
    assert all(r[2] == r[3] == f"{world * (world + 1) // 2}" for r in reduced), reduced
    done = re.findall(r"rank (\d+)/\d+ done at step (\d+): params ([0-9a-f]+)", logs)
    assert sorted(int(d[0]) for d in done) == list(range(world)), done
    assert len({d[2] for d in done}) == 1, f"ranks ended with different parameters: {done}"
    assert len({d[1] for d in done}) == 1, done
    return world, int(done[0][1])


def _check_multinode_gpu(job_id: str, logs: str) -> None:
    world, step = ddp_result(logs)
    assert world == 8, "2 nodes x 4 GPUs: one torchrun worker per GPU"
    assert re.search(rf"rank 0 wrote checkpoint \S+/checkpoint-{step}/model\.pt", logs), logs[-6000:]


CHECKS = {"quickstart": _check_quickstart, "secrets": _check_secrets, "multinode_gpu": _check_multinode_gpu}


def test_every_example_is_documented_and_checked() -> None:
    found = sorted(p.parent.name for p in EXAMPLES.glob("*/config.py"))
    assert found == sorted(CHECKS), f"examples without a check in this module (or checks without one): {found}"
    table = (EXAMPLES / "README.md").read_text()
    for name in found:
        assert f"`{name}/`" in table, f"examples/README.md does not list {name}/"


@pytest.mark.parametrize("name", sorted(set(CHECKS) - {"multinode_gpu"}))
def test_example_runs_as_documented(name: str, default_site: Path, secret: str) -> None:
    job_id, _, logs = submit_as_documented(EXAMPLES / name / "config.py")
    CHECKS[name](job_id, logs)


def test_multinode_gpu_trains_and_the_second_run_resumes_from_the_first(default_site: Path) -> None:
    """The torchrun example, submitted twice as examples/README.md says: each run's 8 ranks meet and
    end with the same parameters, and the second run trains on from the newest checkpoint of the
    project (``LoadCheckpointConfig(enabled=True)``): the first ended at step S and saved checkpoint-S;
    the second starts from it and saves checkpoint-(S + 30)."""
    config = EXAMPLES / "multinode_gpu" / "config.py"
    first, _, logs1 = submit_as_documented(config)
    _check_multinode_gpu(first, logs1)
    _, step1 = ddp_result(logs1)
    second, err, logs2 = submit_as_documented(config)
    _check_multinode_gpu(second, logs2)
    assert "starts without one" not in err, err
    m = re.search(r"resumed from (\S+) at step (\d+)", logs2)
    assert m, logs2[-6000:]
    assert m.group(1).endswith(f"/checkpoint-{step1}/model.pt") and int(m.group(2)) == step1, (m.group(0), step1)
    _, step2 = ddp_result(logs2)
    assert step2 == step1 + 30


README_TRAIN = '''
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print(f"README rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g} "
      f"hf_token {len(os.environ['HF_TOKEN'])} nnodes {os.environ['NNODES']}", flush=True)
dist.barrier()
dist.destroy_process_group()
'''


def readme_config() -> str:
    """The first python block of the README's "Using it" section, as a user would copy it."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it"):]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "README.md: no python block under '## Using it'"
    return m.group(1)


def test_readme_using_it_config_runs_as_written(default_site: Path, secret: str, tmp_path: Path) -> None:
    """The README's config, unchanged, beside a stub train.py: torchrun starts 4 workers on each of the 2
    nodes in the pytorch image, they meet, and the secret reaches them."""
    folder = Path(tmp_path) / "readme"
    folder.mkdir()
    (folder / "config.py").write_text(readme_config())
    (folder / "train.py").write_text(README_TRAIN)
    shutil.copymode(EXAMPLES / "multinode_gpu" / "train.py", folder / "train.py")
    _, _, logs = submit_as_documented(folder / "config.py", cwd=folder)
    lines = re.findall(r"README rank (\d+)/(\d+) sum (\S+) hf_token (\d+) nnodes (\d+)", logs)
    assert sorted(int(r[0]) for r in lines) == list(range(8)), logs[-6000:]
    assert {r[1:] for r in lines} == {("8", "8", str(len(secret)), "2")}, lines


OWN_APP = '''
import tqdm
print(f"OWN IMAGE app with tqdm {tqdm.__version__}", flush=True)
'''


def test_own_image_from_devcluster_image_build_runs_a_job(default_site: Path, tmp_path: Path) -> None:
    """devcluster/README.md's recipe: ``devcluster.py image build NAME --pip PKG --from DIR``, then a config
    naming NAME runs in it (the package importable, the tree at its place in the root)."""
    extra = Path(tmp_path) / "extra"
    (extra / "opt" / "app").mkdir(parents=True)
    (extra / "opt" / "app" / "main.py").write_text(OWN_APP)
    name = f"bttest/own-image:{uuid.uuid4().hex[:8]}"
    built = _run(["/usr/bin/python3", str(REPO / "devcluster" / "devcluster.py"), "image", "build", name,
                  "--pip", "tqdm", "--from", str(extra)])
    assert built.returncode == 0, built.stderr
    registry = registry_host()  # 127.0.0.1:5443, or the head's address where the nodes are isolated
    assert f"{registry}/{name}" in built.stdout, built.stdout
    listed = _run(["/usr/bin/python3", str(REPO / "devcluster" / "devcluster.py"), "image", "list"])
    assert f"{name}\t{registry}/{name}" in listed.stdout.splitlines(), listed.stdout
    folder = Path(tmp_path) / "job"
    folder.mkdir()
    (folder / "config.py").write_text(f'''
from truss_train import definitions
project = definitions.TrainingProject(name="own-image", job=definitions.TrainingJob(
    image=definitions.Image(base_image={name!r}),
    compute=definitions.Compute(cpu_count=1, memory="512Mi"),
    runtime=definitions.Runtime(start_commands=["python3 /opt/app/main.py"])))
''')
    _, err, logs = submit_as_documented(folder / "config.py", cwd=folder)
    assert f"image {name} pinned to {registry}/{name.split(':')[0]}@sha256:" in err, err
    assert "OWN IMAGE app with tqdm " in logs, logs[-6000:]
