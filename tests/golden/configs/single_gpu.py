from truss.base.truss_config import AcceleratorSpec
from truss_train import Compute, Image, Runtime, TrainingJob, TrainingProject

project = TrainingProject(
    name="llama-sft",
    job=TrainingJob(
        name="run-1",
        image=Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        compute=Compute(accelerator=AcceleratorSpec(accelerator="H100", count=1), cpu_count=8, memory="64Gi"),
        runtime=Runtime(start_commands=["python train.py --epochs 1"]),
    ),
)
