from truss.base import truss_config
from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject, WeightsSource

project = TrainingProject(
    name="qwen3-finetune",
    job=TrainingJob(
        image=Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=Compute(accelerator=truss_config.AcceleratorSpec(accelerator="H100", count=1)),
        runtime=Runtime(start_commands=["python train.py"]),
        weights=[
            WeightsSource(source="hf://Qwen/Qwen3-0.6B", mount_location="/app/models/Qwen/Qwen3-0.6B"),
            WeightsSource(
                source="s3://my-bucket/training-data",
                mount_location="/app/data/training-data",
                auth_secret_name="aws_creds",
                allow_patterns=["*.parquet"],
            ),
        ],
    ),
)
