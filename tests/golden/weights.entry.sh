#!/bin/bash
# slurm-bt per-node entry for project 'qwen3-finetune', submission 20260101T000000Z-0123abcd.
# Runs on every node as the job user; loads the environment the prepare step wrote.
set -uo pipefail
if [ "${1:-}" != --in-container ]; then
  bt_env=/dev/shm/slurm-bt-1001/"${SLURM_JOB_ID}"/node-"${SLURM_NODEID}.env"
  if [ ! -f "$bt_env" ]; then
    echo "slurm-bt: $bt_env is missing: the prepare step did not finish on $(hostname)" >&2
    exit 1
  fi
  while IFS= read -r -d '' bt_kv; do export "$bt_kv"; done < "$bt_env"
  rm -f -- "$bt_env"
  unset bt_env bt_kv
fi
cd -- /b10/workspace || exit 1
set +u  # start commands run with ordinary shell semantics
bt_commands=(
  'python train.py'
)
for bt_cmd in "${bt_commands[@]}"; do
  eval "$bt_cmd" || exit $?
done
