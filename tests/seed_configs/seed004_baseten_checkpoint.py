# Seed: 004_77cc70f22c77e7fc.txt, "BasetenCheckpoint" example.
# Partial in the seed (no image, job or project, `definitions` not imported); completed
# minimally with the import, an image, a TrainingJob and a TrainingProject.
from truss_train import definitions

# Load most recent checkpoint from a project
latest = definitions.BasetenCheckpoint.from_latest_checkpoint(
    project_name="my-fine-tuning-project"
)

# Load specific checkpoint
specific = definitions.BasetenCheckpoint.from_named_checkpoint(
    checkpoint_name="checkpoint-100",
    job_id="abc123"
)

# Use in LoadCheckpointConfig
runtime = definitions.Runtime(
    start_commands=["python train.py"],
    load_checkpoint_config=definitions.LoadCheckpointConfig(
        enabled=True,
        checkpoints=[latest, specific]
    )
)

training_project = definitions.TrainingProject(
    name="checkpoint-refs",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        runtime=runtime,
    ),
)
