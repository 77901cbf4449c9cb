from truss_train import definitions

project = definitions.TrainingProject(
    name="secret-job",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11"),
        runtime=definitions.Runtime(
            start_commands=["python train.py"],
            environment_variables={
                "HF_TOKEN": definitions.SecretReference(name="hf_access_token"),
                "WANDB_API_KEY": definitions.SecretReference(name="wandb_api_key"),
                "PLAIN": "visible",
            },
        ),
    ),
)
