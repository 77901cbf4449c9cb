# Seed: 004_77cc70f22c77e7fc.txt, "TrainingJob" example.
# Partial in the seed (no TrainingProject); completed minimally with one.
from truss.base import truss_config
from truss_train import definitions

training_job = definitions.TrainingJob(
    name="fine-tune-v1",
    image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
    compute=definitions.Compute(
        accelerator=truss_config.AcceleratorSpec(
            accelerator=truss_config.Accelerator.H100,
            count=4
        )
    ),
    runtime=definitions.Runtime(
        start_commands=["chmod +x ./run.sh && ./run.sh"],
        checkpointing_config=definitions.CheckpointingConfig(enabled=True),
        cache_config=definitions.CacheConfig(enabled=True),
    )
)

training_project = definitions.TrainingProject(name="fine-tune", job=training_job)
