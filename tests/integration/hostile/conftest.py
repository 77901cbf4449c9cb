"""The hostile-user suite's fixtures. Its one summary line (attacks run, contained, breached: harness.tally)
is printed by tests/conftest.py, which also gathers it from pytest-xdist workers."""

from __future__ import annotations

import subprocess

import pytest

from tests.unit.test_hooks_env import ensure_test_users


@pytest.fixture(scope="module")
def tenants(dev_cluster: dict[str, object]) -> dict[str, object]:
    """btu1 (btteam1) and btu2 (btteam2) exist and have a Slurm association."""
    ensure_test_users()
    for user in ("btu1", "btu2"):
        subprocess.run(["sacctmgr", "-i", "add", "user", user, "account=default"], capture_output=True,
                       check=False)
    return dev_cluster
