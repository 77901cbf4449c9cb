#!/usr/bin/env bash
# Quick start: install everything, bring up the embedded dev cluster and run examples/quickstart
# (a 2-node CPU training job that writes a checkpoint) end to end, printing its final status.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/install.sh"

echo "quickstart: bt-sbatch examples/quickstart/config.py"
job_id="$(bt-sbatch --parsable "$repo/examples/quickstart/config.py")"
echo "quickstart: submitted job $job_id; waiting for it to finish"
slurm-bt status "$job_id" --wait --timeout 300
echo "quickstart: output of every node:"
slurm-bt logs "$job_id"
slurm-bt status "$job_id" --wait --timeout 1 --check
