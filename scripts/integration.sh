#!/usr/bin/env bash
# The integration tests on the running dev cluster, in two passes (README "Development"; called by
# scripts/test.sh and scripts/test-squashed.sh with the tests to run, e.g. tests/integration):
#   1. every test not marked whole_cluster, on 4 pytest-xdist workers side by side on the cluster's
#      nodes. Each worker takes whole modules (--dist loadfile): a module's tests share its fixtures,
#      users and servers, and their jobs are independent of other modules' jobs.
#   2. the tests marked whole_cluster, one at a time on a quiet cluster: they change or read what every
#      job sees (the cluster's layout or shared storage, slurmdbd, hooks.toml, every node's hook state).
# Both passes always run; the exit status is the first failing pass's ("no test selected" is not a
# failure). The last line gives each pass's wall time.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SLURM_BT_VENV:-/opt/slurm-bt/venv}"
cd "$repo"
pytest=("$venv/bin/python" -m pytest -q -p no:cacheprovider -rfE)
rc=0
t0=$SECONDS
echo "integration: $* on 4 workers (not whole_cluster)"
"${pytest[@]}" -n 4 --dist loadfile -m "not whole_cluster" "$@"
s=$?
[ "$s" = 0 ] || [ "$s" = 5 ] || rc=$s
t1=$SECONDS
echo "integration: $* marked whole_cluster, one at a time"
"${pytest[@]}" -m whole_cluster "$@"
s=$?
[ "$s" = 0 ] || [ "$s" = 5 ] || [ "$rc" != 0 ] || rc=$s
echo "integration: $((SECONDS - t0)) s (parallel pass $((t1 - t0)) s, whole_cluster pass $((SECONDS - t1)) s)"
exit "$rc"
