# Seed: 004_77cc70f22c77e7fc.txt, "Compute" example.
# Partial in the seed (a bare Compute, `definitions` not imported); completed minimally with the
# import, an image, a TrainingJob and a TrainingProject.
from truss.base import truss_config
from truss_train import definitions

compute = definitions.Compute(
    node_count=2,
    cpu_count=8,
    memory="64Gi",
    accelerator=truss_config.AcceleratorSpec(
        accelerator=truss_config.Accelerator.H100,
        count=4
    )
)

training_project = definitions.TrainingProject(
    name="compute-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=compute,
    ),
)
