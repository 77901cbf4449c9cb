# Seed: 002_638620c8506bc45c.txt, "Multinode Training" snippet.
# Partial in the seed (a Compute with "# ... other compute configuration options"); completed
# minimally with an image, a TrainingJob and a TrainingProject.
from truss_train import definitions

compute = definitions.Compute(
    node_count=2,  # Use 2 nodes for multinode training
    # ... other compute configuration options
)

training_project = definitions.TrainingProject(
    name="multinode-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=compute,
    ),
)
