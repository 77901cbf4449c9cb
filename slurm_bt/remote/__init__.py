"""Remote use over SSH: ``bt-sbatch --host HOST`` and ``slurm-bt <verb> --host HOST`` from a laptop.

:mod:`slurm_bt.remote.ssh` opens the connection (ssh config, agent, keys, known_hosts);
:mod:`slurm_bt.remote.commands` uploads snapshots and runs the same commands on the login node.
paramiko is imported lazily: it is the optional ``ssh`` extra.
"""
