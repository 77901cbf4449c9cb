"""The hostile-user suite prints one summary line: how many attacks ran, were contained, breached."""

from __future__ import annotations

import subprocess

import pytest

from tests.integration.hostile.harness import tally
from tests.unit.test_hooks_env import ensure_test_users


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if tally.attacks:
        terminalreporter.write_line(
            f"hostile suite: {len(tally.attacks)} attacks, {len(tally.contained)} contained, "
            f"{len(tally.breached)} breached" + (f" ({', '.join(tally.breached)})" if tally.breached else ""))


@pytest.fixture(scope="module")
def tenants(dev_cluster: dict[str, object]) -> dict[str, object]:
    """btu1 (btteam1) and btu2 (btteam2) exist and have a Slurm association."""
    ensure_test_users()
    for user in ("btu1", "btu2"):
        subprocess.run(["sacctmgr", "-i", "add", "user", user, "account=default"], capture_output=True,
                       check=False)
    return dev_cluster
