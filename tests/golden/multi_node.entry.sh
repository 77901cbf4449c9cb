#!/bin/bash
# slurm-bt per-node entry for project 'Qwen3 8B / multi node', submission 20260101T000000Z-0123abcd.
# Runs on every node as the job user; loads the environment the prepare step wrote.
set -uo pipefail
if [ "${1:-}" != --in-container ]; then
  bt_env=/dev/shm/slurm-bt-1001/"${SLURM_JOB_ID}"/node-"${SLURM_NODEID}.env"
  if [ ! -f "$bt_env" ]; then
    echo "slurm-bt: $bt_env is missing: the prepare step did not finish on $(hostname)" >&2
    exit 1
  fi
  # Unlink first, then read from the open descriptor: the file is gone whatever it holds.
  exec 3< "$bt_env" && rm -f -- "$bt_env" || exit 1
  while IFS= read -r -d '' bt_kv <&3; do export "$bt_kv"; done
  exec 3<&-
  unset bt_env bt_kv
fi
cd -- /b10/workspace || exit 1
set +u +o pipefail  # start commands run with ordinary shell semantics
bt_commands=(
  'pip install -r requirements.txt'
  'torchrun --nnodes=$BT_GROUP_SIZE --node-rank=$BT_NODE_RANK --nproc-per-node=$BT_NUM_GPUS --master-addr=$BT_LEADER_ADDR --master-port=$MASTER_PORT train.py'
)
bt_stopping=0
trap 'bt_stopping=1' TERM
for bt_cmd in "${bt_commands[@]}"; do
  eval "$bt_cmd" || exit $?
  [ "$bt_stopping" = 0 ] || exit 0
done
