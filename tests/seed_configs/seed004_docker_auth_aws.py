# Seed: 004_77cc70f22c77e7fc.txt, "AWSIAMDockerAuth" example.
# Partial in the seed (an Image only, `definitions` not imported); completed minimally with the
# import, a TrainingJob and a TrainingProject.
from truss.base import truss_config
from truss_train import definitions

image = definitions.Image(
    base_image="123456789.dkr.ecr.us-east-1.amazonaws.com/my-image:latest",
    docker_auth=definitions.DockerAuth(
        auth_method=truss_config.DockerAuthType.AWS_IAM,
        registry="123456789.dkr.ecr.us-east-1.amazonaws.com",
        aws_iam_docker_auth=definitions.AWSIAMDockerAuth(
            access_key_secret_ref=definitions.SecretReference(name="aws_access_key"),
            secret_access_key_secret_ref=definitions.SecretReference(name="aws_secret_key")
        )
    )
)

training_project = definitions.TrainingProject(name="ecr-image", job=definitions.TrainingJob(image=image))
