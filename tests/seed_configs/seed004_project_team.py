# Seed: 004_77cc70f22c77e7fc.txt, "TrainingProject" example.
# Partial in the seed (uses an undefined training_job); completed minimally with a TrainingJob.
from truss_train import definitions

training_job = definitions.TrainingJob(
    image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
)

project = definitions.TrainingProject(
    name="llm-fine-tuning",
    job=training_job,
    team_name="my-team"  # Optional
)
