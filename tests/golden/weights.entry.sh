#!/bin/bash
# slurm-bt per-node entry for project 'qwen3-finetune', submission 20260101T000000Z-0123abcd.
# Runs on every node as the job user; loads the environment the prepare step wrote.
set -uo pipefail
if [ "${1:-}" != --in-container ]; then
  bt_env=/dev/shm/slurm-bt-1001/"${SLURM_JOB_ID}"/node-"${SLURM_NODEID}.env"
  if [ ! -s "$bt_env" ]; then
    echo "slurm-bt: $bt_env is missing: the prepare step did not finish on ${SLURMD_NODENAME:-$HOSTNAME}" >&2
    exit 1
  fi
  # Read it whole, then empty it by a redirection whatever the read did: the image may have no rm.
  mapfile -d '' -t bt_kvs < "$bt_env"; bt_rc=$?
  : > "$bt_env" && [ "$bt_rc" = 0 ] || exit 1
  # Unlinked too where the image has rm; an emptied file is left to the epilog otherwise.
  if command -v rm >/dev/null; then rm -f -- "$bt_env"; fi
  for bt_kv in "${bt_kvs[@]}"; do export "$bt_kv"; done
  unset bt_env bt_kv bt_kvs bt_rc
fi
cd -- /b10/workspace || exit 1
set +u +o pipefail  # start commands run with ordinary shell semantics
bt_commands=(
  'python train.py'
)
bt_stopping=0
trap 'bt_stopping=1' TERM
for bt_cmd in "${bt_commands[@]}"; do
  eval "$bt_cmd" || exit $?
  [ "$bt_stopping" = 0 ] || exit 0
done
