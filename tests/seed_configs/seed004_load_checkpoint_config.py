# Seed: 004_77cc70f22c77e7fc.txt, "LoadCheckpointConfig" example.
# Partial in the seed (a bare LoadCheckpointConfig, `definitions` not imported); completed
# minimally with the import, a Runtime, an image, a TrainingJob and a TrainingProject.
from truss_train import definitions

load_config = definitions.LoadCheckpointConfig(
    enabled=True,
    download_folder="/tmp/loaded_checkpoints",
    checkpoints=[
        definitions.BasetenCheckpoint.from_latest_checkpoint(project_name="my-project"),
        definitions.BasetenCheckpoint.from_named_checkpoint(
            checkpoint_name="checkpoint-24",
            job_id="abc123"
        )
    ]
)

training_project = definitions.TrainingProject(
    name="resume-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        runtime=definitions.Runtime(load_checkpoint_config=load_config),
    ),
)
