"""Two nodes with four H100s each, launched like a torchrun job on Baseten.

On the dev cluster the GPUs are placeholders: `show_rank.py` prints the distributed environment each
node receives instead of training, and checks that every node can reach the leader.
"""

from truss.base.truss_config import AcceleratorSpec
from truss_train import definitions

project = definitions.TrainingProject(
    name="multinode-demo",
    job=definitions.TrainingJob(
        name="ranks",
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=definitions.Compute(node_count=2, cpu_count=1, memory="1Gi",
                                    accelerator=AcceleratorSpec(accelerator="H100", count=4)),
        runtime=definitions.Runtime(
            # With torch installed this would be:
            # torchrun --nnodes=$BT_GROUP_SIZE --node-rank=$BT_NODE_RANK --nproc-per-node=$BT_NUM_GPUS
            #          --master-addr=$BT_LEADER_ADDR --master-port=$MASTER_PORT train.py
            start_commands=["python3 show_rank.py"],
            checkpointing_config=definitions.CheckpointingConfig(enabled=True),
        ),
    ),
)
