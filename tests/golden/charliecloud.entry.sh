#!/bin/bash
# slurm-bt per-node entry for project 'private-image', submission 20260101T000000Z-0123abcd.
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
if [ "${1:-}" != --in-container ]; then
  bt_img=/local/"${SLURMD_NODENAME}"/weights/jobs/"${SLURM_JOB_ID}"/img/image.sqfs
  if [ ! -f "$bt_img" ]; then
    echo "slurm-bt: the job's image $bt_img is not on $(hostname): the slurm-bt prolog did not stage it" >&2
    exit 1
  fi
  bt_root=/local/"${SLURMD_NODENAME}"/scratch/"${SLURM_JOB_ID}"/.bt-image
  if ch-run --feature=overlayfs >/dev/null 2>&1; then bt_ch=(ch-run --private-tmp --write-fake)
  else
    bt_ch=(ch-run --private-tmp -w)
    if [ ! -d "$bt_root" ]; then
      bt_tmp="$bt_root.$$"
      unsquashfs -no-progress -quiet -no-xattrs -d "$bt_tmp" "$bt_img" >/dev/null \
        || { rm -rf -- "$bt_tmp"; echo "slurm-bt: cannot unpack $bt_img on $(hostname)" >&2; exit 1; }
      mv -T -- "$bt_tmp" "$bt_root" 2>/dev/null || rm -rf -- "$bt_tmp"  # a session unpacked it first
    fi
    bt_img=$bt_root
  fi
  if [ -n "${HOME:-}" ] && [ "$HOME" != / ] && [ -d "$HOME" ]; then bt_ch+=(-b "$HOME:$HOME"); fi
  bt_ch+=(-b /home/alice/.slurm-bt/projects/p/jobs/20260101T000000Z-0123abcd:/home/alice/.slurm-bt/projects/p/jobs/20260101T000000Z-0123abcd -b /home/alice/.slurm-bt/projects/p/jobs/20260101T000000Z-0123abcd/src:/b10/workspace -b /dev/shm/slurm-bt-1001:/dev/shm/slurm-bt-1001 -b /local/"${SLURMD_NODENAME}"/scratch:/local/"${SLURMD_NODENAME}"/scratch -b /local/"${SLURMD_NODENAME}"/scratch/"${SLURM_JOB_ID}"/mnt/checkpoints:/mnt/ckpts -b /local/"${SLURMD_NODENAME}"/scratch/"${SLURM_JOB_ID}"/mnt/loaded_checkpoints:/tmp/loaded_checkpoints -b /var/lib/slurm-bt-dev/shared/cache:/var/lib/slurm-bt-dev/shared/cache -b /local/"${SLURMD_NODENAME}"/scratch/"${SLURM_JOB_ID}"/mnt/cache:/root/.cache -b /local/"${SLURMD_NODENAME}"/weights/jobs/"${SLURM_JOB_ID}"/w0:/app/models/qwen -c /b10/workspace "$bt_img")
  exec "${bt_ch[@]}" -- /bin/bash /home/alice/.slurm-bt/projects/p/jobs/20260101T000000Z-0123abcd/node_entry.sh --in-container
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
