# Seed: 000_146bc0313d6ce10c.txt, "Authentication" snippet.
# Partial in the seed (a bare WeightsSource); completed minimally with imports, an image, a
# TrainingJob and a TrainingProject around it.
from truss_train import Image, TrainingJob, TrainingProject, WeightsSource

weights = WeightsSource(
    source="hf://meta-llama/Llama-3.1-8B@main",
    mount_location="/app/models/llama",
    auth={"auth_method": "CUSTOM_SECRET", "auth_secret_name": "hf_access_token"},
)

training_project = TrainingProject(
    name="weights-auth",
    job=TrainingJob(image=Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"), weights=[weights]),
)
