"""Shared fixtures. Integration tests (marker ``slurm``) use the real dev cluster.

The ``dev_cluster`` fixture makes sure the embedded cluster is up (``devcluster/devcluster.py up``,
idempotent and fast when already up) when running as root, and skips with a reason otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers.fixtures import fake_gcs, fake_hub, seaweed  # noqa: F401  (session fixtures)
from tests.servers.oci_registry import oci_registries  # noqa: F401  (session fixture: image tests)

REPO = Path(__file__).resolve().parent.parent
DEVCLUSTER = REPO / "devcluster" / "devcluster.py"
STATE = Path(os.environ.get("BT_DEVCLUSTER_DIR", "/var/lib/slurm-bt-dev"))


def _isolated_cluster() -> bool:
    try:
        return bool(json.loads((STATE / "cluster.json").read_text()).get("layout") == "isolated")
    except (OSError, ValueError, AttributeError):
        return False


_BASETEMP = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Temp dirs where the nodes see them: on the isolated dev cluster each node has its own /tmp (as real
    nodes do), so pytest's tmp_path (under /tmp) would not reach the jobs that run from it. /var/tmp is the
    host's on every node there. xdist workers get a folder inside the controller's."""
    if config.option.basetemp is None and not hasattr(config, "workerinput") and _isolated_cluster():
        import tempfile

        base = Path(tempfile.mkdtemp(prefix="bt-pytest-", dir="/var/tmp"))
        config.option.basetemp = str(base)
        config.stash[_BASETEMP] = base


def pytest_unconfigure(config: pytest.Config) -> None:
    base = config.stash.get(_BASETEMP, None)
    if base is not None:
        shutil.rmtree(base, ignore_errors=True)


def _expected_minutes(item: pytest.Item) -> float:
    marker = item.get_closest_marker("long_jobs")
    return 0.0 if marker is None else float(marker.args[0]) if marker.args else 1.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules marked long_jobs(minutes) first, longest first (a stable sort: each module keeps its order).
    pytest-xdist hands modules to its workers in this order (scripts/integration.sh), so the runs that
    take minutes start at once and the short ones fill the other workers meanwhile, instead of one
    worker starting a 4-minute module when the others are done."""
    items.sort(key=lambda item: -_expected_minutes(item))


# The hostile suite's tally (tests/integration/hostile/harness.py): each xdist worker hands its own to
# the controller (workeroutput), which prints the sum; a run without workers prints its own.
_TALLY = "hostile_tally"
_worker_tallies: list[dict[str, list[str]]] = []


def _own_tally() -> dict[str, list[str]]:
    harness = sys.modules.get("tests.integration.hostile.harness")
    t = getattr(harness, "tally", None)
    if t is None:
        return {}
    return {"attacks": list(t.attacks), "contained": list(t.contained), "breached": list(t.breached)}


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out[_TALLY] = _own_tally()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    got = getattr(node, "workeroutput", {}).get(_TALLY)
    if got:
        _worker_tallies.append(got)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    total: dict[str, list[str]] = {"attacks": [], "contained": [], "breached": []}
    for part in [_own_tally(), *_worker_tallies]:
        for key, names in part.items():
            total[key] += names
    if total["attacks"]:
        breached = total["breached"]
        terminalreporter.write_line(
            f"hostile suite: {len(total['attacks'])} attacks, {len(total['contained'])} contained, "
            f"{len(breached)} breached" + (f" ({', '.join(breached)})" if breached else ""))


@pytest.fixture(scope="session", autouse=True)
def host_runtime_site() -> Iterator[Path | None]:
    """The suite's jobs run on the host unless a test names a container runtime in its own site file.

    The dev cluster's /etc/slurm-bt/site.toml says ``container_runtime = "charliecloud"`` (the quick
    start runs in its image); the container tests (test_images_*.py) write their own site files, so
    every other test states the host runtime here instead of inheriting the cluster's. The file must
    be readable by the test users (their bt-sbatch reads it through ``runuser``, which keeps the
    environment). A site file already named by the caller is left alone.
    """
    if os.environ.get("SLURM_BT_SITE_CONFIG"):
        yield None
        return
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="bt-test-site-", dir="/var/tmp"))  # pytest's tmp is 0700: users need it
    folder.chmod(0o755)
    path = folder / "site.toml"
    path.write_text('# tests/conftest.py: the suite runs jobs on the host unless a test says otherwise\n'
                    'container_runtime = "none"\n')
    path.chmod(0o644)
    os.environ["SLURM_BT_SITE_CONFIG"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("SLURM_BT_SITE_CONFIG", None)
        shutil.rmtree(folder, ignore_errors=True)


def _sinfo_ok() -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.fixture(scope="session")
def dev_cluster() -> dict[str, object]:
    """The running dev cluster's facts (cluster.json); brings it up when possible."""
    if not _sinfo_ok():
        if os.geteuid() != 0 or shutil.which("slurmctld") is None:
            pytest.skip("dev cluster not running (run `bash scripts/install.sh` as root)")
        proc = subprocess.run(["/usr/bin/python3", str(DEVCLUSTER), "up"], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.fail(f"devcluster up failed:\n{proc.stdout}\n{proc.stderr}")
    info = json.loads((STATE / "cluster.json").read_text())
    assert isinstance(info, dict)
    return info


@pytest.fixture()
def bt_python() -> str:
    """The interpreter jobs use on the nodes (must be readable by every user)."""
    return sys.executable


@pytest.fixture()
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point the site workspace and secret store at tmp dirs for unit tests of submission."""
    site = tmp_path / "site.toml"
    site.write_text(f'[storage]\nworkspace = "{tmp_path}/ws"\nruntime = "{tmp_path}/run"\n')
    monkeypatch.setenv("SLURM_BT_SITE_CONFIG", str(site))
    yield tmp_path
