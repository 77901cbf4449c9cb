"""Checkpoints: ship ``BT_CHECKPOINT_DIR`` to the checkpoint store during training, load them back later.

Who runs what, where (docs/checkpoints.md has the full story):

======================  ==============================  ============================================
piece                   runs on / as                    does
======================  ==============================  ============================================
:mod:`slurm_bt.steps.checkpoint_agent`
                        every node, as the job user,    uploads each *completed* checkpoint while
                        a background ``srun`` step      training runs; a final flush when the start
                                                        commands are done
:func:`.flush.flush_job_checkpoints`
                        epilog (root), upload phase     uploads what is left within a time budget,
                        dropped to the job user         then hands the rest off (never drains)
:mod:`.handoff`         root / a sweeper                ``slurm-bt checkpoints resume-handoffs``
:mod:`.resolve`         login node, as the user         ``LoadCheckpointConfig`` → pinned manifest
:mod:`.download`        prepare step, as the user       pinned files → ``BT_LOAD_CHECKPOINT_DIR``
======================  ==============================  ============================================

Store layout (a ``file://``, ``s3://``, ``r2://`` or ``gs://`` URI from the site config), in the
namespace of the job's team (:mod:`.locations`; a project name belongs to a team)::

    <store>/_teams/<team>/<project_id>/<job_id>/index.json                      merged view (all ranks)
    <store>/_teams/<team>/<project_id>/<job_id>/ranks/rank-<n>.json             authoritative, one writer each
    <store>/_teams/<team>/<project_id>/<job_id>/rank-<n>/<checkpoint>/<files>   content

Stores written before team namespaces keep ``<store>/<project_id>/<job_id>/...``: read (loads, the
CLI, a restart's resume fall back to it), never written (docs/checkpoints.md, "Migrating a store").

Importing this package imports no storage client; object stores load theirs on first use (slurm_bt/storage).
"""

from __future__ import annotations

__all__: list[str] = []
