from truss_train import definitions

project = definitions.TrainingProject(
    name="Qwen3 8B / multi node",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="nvcr.io/nvidia/pytorch:24.01-py3"),
        compute=definitions.Compute(node_count=2, accelerator="H100:4", cpu_count=16, memory="200G"),
        runtime=definitions.Runtime(
            start_commands=[
                "pip install -r requirements.txt",
                "torchrun --nnodes=$BT_GROUP_SIZE --node-rank=$BT_NODE_RANK --nproc-per-node=$BT_NUM_GPUS "
                "--master-addr=$BT_LEADER_ADDR --master-port=$MASTER_PORT train.py",
            ],
            environment_variables={"NCCL_DEBUG": "INFO", "WANDB_PROJECT": "qwen3 it's \"quoted\""},
            checkpointing_config=definitions.CheckpointingConfig(enabled=True),
            cache_config=definitions.CacheConfig(enabled=True),
        ),
    ),
)
