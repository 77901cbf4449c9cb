#!/usr/bin/env bash
# The test suite, in two loops (README "Development"):
#   scripts/test.sh           the whole suite: installs what it needs (idempotent), brings up the dev cluster,
#                             runs ruff, mypy, the import-layering contract (lint-imports), then pytest: the
#                             tests that need no cluster (tests/unit, tests/golden) spread over worker
#                             processes, then the integration tests on the real local Slurm (in parallel,
#                             then those that need the whole cluster).
#   scripts/test.sh --fast    the fast tier: the same checks and every test that needs no cluster, with no
#                             install step when the venv exists (it runs scripts/install.sh once when not).
# Arguments after the optional --fast pick tests as on pytest's command line (paths, node ids, -k, -x) and
# run in one pytest process instead of the default selection.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SLURM_BT_VENV:-/opt/slurm-bt/venv}"
fast=0
if [ "${1:-}" = "--fast" ]; then
  fast=1
  shift
fi
# The fast tier installs only when the venv is missing or predates a dev tool it runs (pytest-xdist).
if [ "$fast" = 0 ] || ! "$venv/bin/python" -c 'import xdist' 2>/dev/null; then
  bash "$repo/scripts/install.sh"
fi
cd "$repo"
echo "test: ruff"
"$venv/bin/ruff" check slurm_bt tests devcluster examples bench
echo "test: mypy --strict"
"$venv/bin/mypy" slurm_bt
echo "test: lint-imports (layers, no import cycles: [tool.importlinter] in pyproject.toml)"
"$venv/bin/lint-imports" --no-cache
pytest=("$venv/bin/python" -m pytest -q -p no:cacheprovider)
if [ "$#" -gt 0 ]; then
  echo "test: pytest $*"
  exec "${pytest[@]}" "$@"
fi
# Four workers on two cores: a third of these tests' wall time is waiting (subprocesses, sockets, bounded
# children), which other workers fill. Each worker starts its own object servers on free ports.
echo "test: pytest, no cluster (tests/unit tests/golden, 4 workers)"
"${pytest[@]}" -n 4 tests/unit tests/golden
[ "$fast" = 1 ] && exit 0
echo "test: pytest, on the dev cluster (tests/integration: in parallel, then the whole_cluster tests)"
exec bash "$repo/scripts/integration.sh" tests/integration
