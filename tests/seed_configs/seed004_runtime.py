# Seed: 004_77cc70f22c77e7fc.txt, "Runtime" example (and the SecretReference, CheckpointingConfig
# and CacheConfig examples of the same page, which are one-line objects).
# Partial in the seed (bare objects, `definitions` not imported); completed minimally with the
# import, an image, a TrainingJob and a TrainingProject.
from truss_train import definitions

runtime = definitions.Runtime(
    start_commands=["chmod +x ./run.sh && ./run.sh"],
    environment_variables={
        "BATCH_SIZE": "32",
        "WANDB_API_KEY": definitions.SecretReference(name="wandb_api_key"),
        "HF_TOKEN": definitions.SecretReference(name="hf_access_token"),
    },
    checkpointing_config=definitions.CheckpointingConfig(enabled=True),
    cache_config=definitions.CacheConfig(enabled=True),
)

secret_ref = definitions.SecretReference(name="wandb_api_key")

checkpointing = definitions.CheckpointingConfig(
    enabled=True,
    volume_size_gib=500  # 500 GiB checkpoint storage
)

cache = definitions.CacheConfig(
    enabled=True,
    require_cache_affinity=True
)

training_project = definitions.TrainingProject(
    name="runtime-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="pytorch/pytorch:2.7.0-cuda12.8-cudnn9-runtime"),
        runtime=runtime,
    ),
)
