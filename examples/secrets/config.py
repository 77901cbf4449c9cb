"""A secret from your slurm-bt secret store, exported only to the start commands.

    printf %s "$HF_TOKEN" | slurm-bt secrets set hf_access_token
    bt-sbatch examples/secrets/config.py
"""

from truss_train import definitions

project = definitions.TrainingProject(
    name="secrets-demo",
    job=definitions.TrainingJob(
        image=definitions.Image(base_image="python:3.11-slim"),
        compute=definitions.Compute(cpu_count=1, memory="256Mi"),
        runtime=definitions.Runtime(
            start_commands=['python3 -c "import os; print(\'token length\', len(os.environ[\'HF_TOKEN\']))"'],
            environment_variables={"HF_TOKEN": definitions.SecretReference(name="hf_access_token")},
        ),
    ),
)
