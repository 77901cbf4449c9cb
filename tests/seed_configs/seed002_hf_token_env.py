# Seed: 002_638620c8506bc45c.txt and 003_8ad9be3c29865024.txt (same snippet in both),
# "Securely Integrate with External Services with SecretReference".
# Partial in the seed (a Runtime with "# ... other runtime options"); completed minimally with an
# image, a TrainingJob and a TrainingProject.
from truss_train import definitions

runtime = definitions.Runtime(
    # ... other runtime options
    environment_variables={
        "HF_TOKEN": definitions.SecretReference(name="hf_access_token"),
    },
)

training_project = definitions.TrainingProject(
    name="secret-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        runtime=runtime,
    ),
)
