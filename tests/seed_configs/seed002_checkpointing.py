# Seed: 002_638620c8506bc45c.txt, "Manage checkpoints" snippet.
# Partial in the seed (a Runtime with "# ... other configuration options"); completed minimally
# with an image, a TrainingJob and a TrainingProject.
from truss_train import definitions

training_runtime = definitions.Runtime(
    # ... other configuration options
    checkpointing_config=definitions.CheckpointingConfig(enabled=True)
)

training_project = definitions.TrainingProject(
    name="checkpointing-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        runtime=training_runtime,
    ),
)
