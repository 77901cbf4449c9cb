"""What root does on a compute host around a job, called by the prolog and epilog: the hook context,
per-user runtime directories, leftover processes, stale scratch and runtime sweeps.
"""
