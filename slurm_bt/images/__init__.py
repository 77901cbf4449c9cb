"""Container images: pinned at submit, mirrored into the weights cache tiers by the staging job.

An image is delivered like a weights source (docs/containers.md): a one-file weights Manifest whose
file is ``image.sqfs`` and whose source is the pinned ``oci://registry/repo@sha256:<hex>``.
"""
