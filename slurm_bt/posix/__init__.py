"""POSIX primitives every layer may use: privilege drop, fd-relative safe filesystem, mountinfo,
the trusted hook environment, the per-job notes under /run/slurm-bt, squat records, team groups.

Nothing here imports anything of slurm_bt above the base layer (docs/architecture.md, "Layers").
"""
