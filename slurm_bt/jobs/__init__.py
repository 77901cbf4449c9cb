"""Following and controlling running jobs from the login node: polling discipline, logs, metrics.

Everything here runs as the calling user and asks Slurm through
:class:`~slurm_bt.slurm.client.SlurmClient` (one batched query per poll).
"""
