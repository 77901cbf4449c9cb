# Seed: 004_77cc70f22c77e7fc.txt, "DeployCheckpointsConfig" example. Complete as shown.
# It is a `truss train deploy_checkpoints --config` file: it defines a DeployCheckpointsConfig and
# no TrainingProject, so load_training_project() must refuse it (tested).
from truss.base import truss_config
from truss_train import definitions

deploy_config = definitions.DeployCheckpointsConfig(
    model_name="fine-tuned-llm",
    checkpoint_details=definitions.CheckpointList(
        base_model_id="meta-llama/Llama-3.1-8B-Instruct",
        checkpoints=[
            definitions.LoRACheckpoint(
                training_job_id="gvpql31",
                checkpoint_name="checkpoint-100",
                lora_details=definitions.LoRADetails(rank=16)
            )
        ]
    ),
    compute=definitions.Compute(
        accelerator=truss_config.AcceleratorSpec(
            accelerator=truss_config.Accelerator.H100,
            count=1
        )
    )
)
