# Seed: 000_146bc0313d6ce10c.txt and 001_862c0cdba5993f87.txt (same snippet in both),
# "Reference the secrets in your job configuration".
# Partial in the seed (only the Runtime); completed minimally with an image, a TrainingJob and a
# TrainingProject.
from truss_train import definitions

runtime = definitions.Runtime(
    environment_variables={
        "AWS_ACCESS_KEY_ID": definitions.SecretReference(name="aws_access_key_id"),
        "AWS_SECRET_ACCESS_KEY": definitions.SecretReference(name="aws_secret_access_key"),
    },
)

training_project = definitions.TrainingProject(
    name="s3-data",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        runtime=runtime,
    ),
)
