#!/usr/bin/env bash
# CI's root-squash phase (issue 30; docs/admin.md "Root-squashed shared filesystems"): the dev cluster's
# shared storage moves to a GlusterFS volume with root squash on (`devcluster.py up --shared gluster`: the
# service account slurmbt named as shared_fs_identity, the layout made once with the squash off), the tests
# that must hold on such a site run there (every feature as a user, the doctor, the hostile suite), and the
# cluster goes back to its local shared directory whatever happened. Run after scripts/test.sh (which
# installs everything); arguments replace the default test selection.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
tests=("$@")
if [ "${#tests[@]}" -eq 0 ]; then
  # test_squashed_site.py and test_root_squash.py run in scripts/test.sh already (the first switches the
  # cluster to gluster itself, the second mounts its own volume): not again here.
  tests=(
    tests/integration/test_hooks_jobs.py
    tests/integration/test_checkpoints_resume.py
    tests/integration/test_images_staging.py
    tests/integration/hostile
  )
fi
back() { /usr/bin/python3 devcluster/devcluster.py up --shared local >/dev/null || echo "test-squashed: could not go back to --shared local" >&2; }
trap back EXIT
/usr/bin/python3 devcluster/devcluster.py up --shared gluster || exit 1
# One at a time, not scripts/integration.sh's parallel pass: on the squashed volume, tests whose jobs
# share the team tiers and hand-off areas (hostile/test_weights_tiers.py, test_handoff.py) are not yet
# independent of one another's (README "Development").
"${SLURM_BT_VENV:-/opt/slurm-bt/venv}/bin/python" -m pytest -q -p no:cacheprovider -rfE "${tests[@]}"
