"""The compat package's public names are complete, sorted and importable (house style)."""

from __future__ import annotations

import importlib

import pytest

import slurm_bt.compat

MODULES = [
    "slurm_bt.compat",
    "slurm_bt.compat.definitions",
    "slurm_bt.compat.truss_config",
    "slurm_bt.compat.loader",
    "slurm_bt.compat.shim",
    "slurm_bt.compat.stricter",
    "slurm_bt.compat.problems",
    "slurm_bt.compat.public_api",
    "slurm_bt.compat.truss_constants",
    "slurm_bt.compat.overrides",
    "slurm_bt.compat._truss_train_loader",
    "slurm_bt.compat._truss_train_deployment",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=lambda n: (not n.isupper(), n)), "__all__ must be sorted"
    for symbol in exported:
        assert hasattr(module, symbol), symbol


def test_package_exports() -> None:
    assert slurm_bt.compat.__all__ == [
        "SHIMMED_MODULES",
        "load_training_project",
        "memory_to_bytes",
        "memory_to_mib",
        "mount_location_problem",
        "truss_modules",
    ]


def test_importing_compat_pulls_no_heavy_dependencies() -> None:
    """In a fresh interpreter: other tests in this process may already have imported boto3."""
    import subprocess
    import sys

    code = ("import sys, slurm_bt, slurm_bt.compat, slurm_bt.cli.main; "
            "print(sorted({'boto3', 'paramiko', 'huggingface_hub', 'urllib3', 'google.auth'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
