"""``slurm-bt train init``: truss train's starter project (config.py + run.sh), made to run on this cluster.

Upstream's template (truss/templates/train in truss 0.18.25) asks for one H100 and a PyTorch image.
Here the accelerator is one the site maps to a partition (site file ``[accelerators]``; none: a CPU
job), so the starter is accepted and runs as written; everything else is upstream's template.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["render_config", "write_starter"]

RUN_SH = """#!/bin/bash

# Exit immediately if a command exits with a non-zero status
set -eux

echo "Initializing model training environment..."
echo "Running on $(hostname) as node rank ${BT_NODE_RANK:-0} of ${BT_GROUP_SIZE:-1}"
# TODO: Call your training logic below
echo "Placeholder: insert your model training logic below."
# e.g., python train_model.py --config config.yaml --epochs 10

echo "Training process completed (placeholder)."
"""

_CONFIG = '''# Import necessary classes from the Baseten Training SDK (slurm-bt provides them on this cluster)
from truss_train import definitions
from truss.base import truss_config

PROJECT_NAME = "My-Baseten-Training-Project"
NUM_NODES = 1
{gpu_line}
# 1. Define a base image for your training job. On this cluster the site's container runtime
# decides whether it is used (`slurm-bt admin doctor` says which runtime it runs).
BASE_IMAGE = "pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"

# 2. Define the Runtime Environment for the Training Job
# This includes start commands and environment variables.
# Secrets (`slurm-bt secrets set NAME`) are referenced using `SecretReference`.
training_runtime = definitions.Runtime(
    start_commands=[  # Example: list of commands to run your training script
        "/bin/sh -c 'chmod +x ./run.sh && ./run.sh'"
    ],
    environment_variables={{
        # "HF_TOKEN": definitions.SecretReference(name="hf_access_token"),
        "HELLO": "WORLD"
    }},
    cache_config=definitions.CacheConfig(
        enabled=False  # Set to True to enable caching between runs
    ),
    checkpointing_config=definitions.CheckpointingConfig(
        enabled=False  # Set to True to save checkpoints from $BT_CHECKPOINT_DIR
    ),
)

training_compute = definitions.Compute(
    node_count=NUM_NODES,{accelerator}
)

training_job = definitions.TrainingJob(
    image=definitions.Image(base_image=BASE_IMAGE),
    compute=training_compute,
    runtime=training_runtime,
)

training_project = definitions.TrainingProject(name=PROJECT_NAME, job=training_job)
'''


def render_config(accelerator: str | None) -> str:
    """The starter config.py: one GPU of ``accelerator`` (a truss ``Accelerator`` name), or CPU only."""
    if accelerator is None:
        return _CONFIG.format(gpu_line="", accelerator="")
    return _CONFIG.format(
        gpu_line="NUM_GPUS_PER_NODE = 1\n",
        accelerator=("\n    accelerator=truss_config.AcceleratorSpec(\n"
                     f"        accelerator=truss_config.Accelerator.{accelerator}, count=NUM_GPUS_PER_NODE\n"
                     "    ),"),
    )


def _site_accelerator() -> str | None:
    """The first accelerator the site maps (``H100`` on the dev cluster), or None."""
    from slurm_bt.compat.truss_config import Accelerator
    from slurm_bt.site.settings import load_site_settings

    names = {a.name: a.value for a in Accelerator}
    for value in load_site_settings().accelerators:
        member = next((n for n, v in names.items() if v == value), None)
        if member is not None:
            return member
    return None


def write_starter(target: Path) -> None:
    """Create ``target`` (must not exist, as upstream) with config.py and an executable run.sh.

    Raises:
        FileExistsError: ``target`` exists (nothing is written into it).
    """
    from slurm_bt.atomic import write_file_atomic

    config = render_config(_site_accelerator())
    os.makedirs(target)
    write_file_atomic(target / "config.py", config.encode(), mode=0o644)
    write_file_atomic(target / "run.sh", RUN_SH.encode(), mode=0o755)
