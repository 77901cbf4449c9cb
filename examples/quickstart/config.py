"""Quick start: a tiny CPU training job, written exactly as for Baseten Training.

Submit it with `bt-sbatch examples/quickstart/config.py`. It trains a one-feature linear model with
plain Python (no GPU, no downloads) on both nodes of the dev cluster and writes a checkpoint.
"""

from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject, definitions

training_job = TrainingJob(
    name="linear-fit",
    image=Image(base_image="python:3.11-slim"),
    compute=Compute(node_count=2, cpu_count=1, memory="512Mi"),
    runtime=Runtime(
        start_commands=["python3 train.py --steps 200"],
        environment_variables={"LEARNING_RATE": "0.05"},
        checkpointing_config=definitions.CheckpointingConfig(enabled=True),
    ),
)

training_project = TrainingProject(name="quickstart", job=training_job)
