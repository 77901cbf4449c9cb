"""Two nodes with four H100s each, trained with torchrun and DDP exactly as on Baseten.

The start command is the README's torchrun line, unchanged. On the dev cluster the GPUs are
placeholders and `pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime` is served as a CPU stand-in (python3
with torch's CPU wheel, built by `devcluster.py up`): `train.py` then uses gloo instead of NCCL, and
the 8 ranks (4 per node, one per GPU) train a small model with DistributedDataParallel.

Rank 0 saves a checkpoint at the end of each run; `LoadCheckpointConfig(enabled=True)` makes the next
run of this project start from the newest one (the first run starts from scratch, with a warning at
submit), so submitting the config twice trains twice as many steps.
"""

from truss.base.truss_config import AcceleratorSpec
from truss_train import definitions

project = definitions.TrainingProject(
    name="multinode-demo",
    job=definitions.TrainingJob(
        name="ddp",
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=definitions.Compute(node_count=2, cpu_count=2, memory="4Gi",
                                    accelerator=AcceleratorSpec(accelerator="H100", count=4)),
        runtime=definitions.Runtime(
            start_commands=["torchrun --nnodes=$BT_GROUP_SIZE --node-rank=$BT_NODE_RANK "
                            "--nproc-per-node=$BT_NUM_GPUS --master-addr=$BT_LEADER_ADDR "
                            "--master-port=$MASTER_PORT train.py"],
            checkpointing_config=definitions.CheckpointingConfig(enabled=True),
            load_checkpoint_config=definitions.LoadCheckpointConfig(enabled=True),
        ),
    ),
)
