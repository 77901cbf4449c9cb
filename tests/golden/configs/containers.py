from truss.base import truss_config
from truss_train import definitions

project = definitions.TrainingProject(
    name="private-image",
    job=definitions.TrainingJob(
        image=definitions.Image(
            base_image="ghcr.io/acme/trainer:1.2",
            docker_auth=definitions.DockerAuth(
                auth_method=truss_config.DockerAuthType.REGISTRY_SECRET,
                registry="ghcr.io",
                registry_secret_docker_auth=definitions.RegistrySecretDockerAuth(
                    secret_ref=definitions.SecretReference(name="ghcr_creds")
                ),
            ),
        ),
        compute=definitions.Compute(accelerator="H100:2"),
        runtime=definitions.Runtime(
            start_commands=["python train.py"],
            checkpointing_config=definitions.CheckpointingConfig(enabled=True, checkpoint_path="/mnt/ckpts"),
            load_checkpoint_config=definitions.LoadCheckpointConfig(
                enabled=True,
                checkpoints=[definitions.BasetenCheckpoint.from_latest_checkpoint(project_name="private-image")],
            ),
            cache_config=definitions.CacheConfig(enabled=True, enable_legacy_hf_mount=True),
        ),
        weights=[truss_config.WeightsSource(source="hf://Qwen/Qwen3-0.6B@main", mount_location="/app/models/qwen")],
    ),
)
