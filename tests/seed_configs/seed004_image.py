# Seed: 004_77cc70f22c77e7fc.txt, "Image" example.
# Partial in the seed (a bare Image); completed minimally with imports, a TrainingJob and a
# TrainingProject.
from truss_train import definitions

image = definitions.Image(
    base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"
)

training_project = definitions.TrainingProject(name="image-demo", job=definitions.TrainingJob(image=image))
