# Seed: 004_77cc70f22c77e7fc.txt, "GCPServiceAccountJSONDockerAuth" example.
# Partial in the seed (an Image only, `definitions` not imported); completed minimally with the
# import, a TrainingJob and a TrainingProject.
from truss.base import truss_config
from truss_train import definitions

image = definitions.Image(
    base_image="gcr.io/my-project/my-image:latest",
    docker_auth=definitions.DockerAuth(
        auth_method=truss_config.DockerAuthType.GCP_SERVICE_ACCOUNT_JSON,
        registry="gcr.io",
        gcp_service_account_json_docker_auth=definitions.GCPServiceAccountJSONDockerAuth(
            service_account_json_secret_ref=definitions.SecretReference(name="gcp_service_account_json")
        )
    )
)

training_project = definitions.TrainingProject(name="gcr-image", job=definitions.TrainingJob(image=image))
