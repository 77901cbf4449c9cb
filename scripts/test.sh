#!/usr/bin/env bash
# The whole test suite: installs what it needs (idempotent), brings up the dev cluster, then runs
# ruff, mypy, the import-layering contract (lint-imports) and pytest (unit, golden and integration tests
# on the real local Slurm).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SLURM_BT_VENV:-/opt/slurm-bt/venv}"
bash "$repo/scripts/install.sh"
cd "$repo"
echo "test: ruff"
"$venv/bin/ruff" check slurm_bt tests devcluster examples bench
echo "test: mypy --strict"
"$venv/bin/mypy" slurm_bt
echo "test: lint-imports (layers, no import cycles: [tool.importlinter] in pyproject.toml)"
"$venv/bin/lint-imports" --no-cache
echo "test: pytest"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
