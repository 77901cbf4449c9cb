"""Favour the nodes whose node cache already holds a job's weights (``sbatch --prefer``).

A job placed on a node whose node cache holds every one of its weights entries starts from
``node-hit`` (a lease and a link, docs/weights-cache.md); anywhere else the prolog first copies the
entry from the cluster tier. ``bt-sbatch`` therefore asks Slurm to *prefer* such nodes
(:func:`prefer_args`): a soft wish, so a busy cached node never delays the job, Slurm just places
it elsewhere.

Kept cheap, because it runs on every submission with weights:

* only entries known at submit count (:attr:`SourcePin.manifest`, set when a cluster tier already
  holds the complete entry); a source that is in no cluster tier is in no node cache either, so
  then no node is favoured and nothing is read;
* a node cache is asked by reading one small ``COMPLETE`` marker per entry and node
  (:meth:`CacheLayout.is_complete`, ``O_NOFOLLOW``, size-capped), in the public layout and in the
  team's private subtree. That works where the submit host sees each node's cache root, i.e. the
  site's ``node_cache`` root names the node (``%n``) and those roots are visible here (the dev
  cluster; sites that export node-local roots). A root that is one path on every node, or that
  is absent here, says nothing about the compute nodes, and no node is favoured;
* the release (``--prefer`` needs Slurm >= 22.05) comes from the probe cached per client, and the
  node features from one ``scontrol show node``.

A job that already has ``--constraint`` or ``--prefer`` among its sbatch options gets no
preference: Slurm tries ``--prefer`` *instead of* the constraint first, so adding one could place
the job on nodes its constraint excludes.

The user's own node choice after ``--`` always wins and is passed to sbatch as given:

* ``--nodelist``/``-w`` (or ``--nodefile``/``-F``) names the nodes the job must have: no preference
  is added. Required nodes without the preferred feature can make slurmctld refuse the job ("Requested
  node configuration is not available") instead of falling back, and the job's placement is the
  user's anyway;
* ``--exclude``/``-x`` keeps the preference, computed among the nodes not excluded (the list expanded by
  ``scontrol show hostnames``), so it never names a feature only excluded nodes carry. When the list
  cannot be expanded, no preference.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from slurm_bt.errors import SlurmCommandError
from slurm_bt.render.sbatch_args import sbatch_excluded_nodes, sbatch_names_nodes, sbatch_partition
from slurm_bt.site.site_file import expand_path
from slurm_bt.slurm.prefer import prefer_expression
from slurm_bt.slurm.release import features_in_use, slurm_release
from slurm_bt.weights.cache_layout import CacheLayout
from slurm_bt.weights.node_cache import PRIVATE

if TYPE_CHECKING:
    from slurm_bt.site.settings import SiteSettings
    from slurm_bt.slurm.client import SlurmClient
    from slurm_bt.weights.plan import WeightsPlan

__all__ = ["has_placement_option", "nodes_holding", "prefer_args"]

#: The node placeholder of storage roots (slurm_bt/site/site_file.py: expand_path).
_NODE_PLACEHOLDER = "%n"


def has_placement_option(sbatch_args: Sequence[str]) -> bool:
    """Does the user already constrain placement by feature (``-C``, ``--constraint``, ``--prefer``)?

    sbatch accepts unambiguous prefixes of long options (``--const``, ``--pref``), so those count.
    """
    for arg in sbatch_args:
        name = arg.split("=", 1)[0]
        if name.startswith("-C") and not name.startswith("--"):
            return True
        if (len(name) >= len("--cons") and "--constraint".startswith(name)) or (
                len(name) >= len("--pref") and "--prefer".startswith(name)):
            return True
    return False


def nodes_holding(plan: WeightsPlan, node_cache: str, node_names: Iterable[str]) -> list[str]:
    """Names of the nodes whose node cache holds every source of ``plan`` complete, as seen from here.

    Args:
        plan: the submission's weights plan.
        node_cache: the site's ``storage.node_cache`` template.
        node_names: candidate nodes.
    """
    manifests = [s.manifest for s in plan.sources]
    if not manifests or any(m is None for m in manifests) or _NODE_PLACEHOLDER not in node_cache:
        return []
    pw = pwd.getpwuid(os.getuid())
    out: list[str] = []
    for node in node_names:
        root = Path(expand_path(node_cache, user=pw.pw_name, uid=pw.pw_uid, home=pw.pw_dir, node=node))
        layouts = (CacheLayout(root), CacheLayout(root / PRIVATE / plan.team))
        if all(any(layout.is_complete(m) for layout in layouts) for m in manifests if m is not None):
            out.append(node)
    return out


def prefer_args(client: SlurmClient, plan: WeightsPlan, site: SiteSettings, partition: str | None,
                sbatch_args: Sequence[str] = ()) -> list[str]:
    """``["--prefer=<features>"]`` favouring the nodes that hold the job's weights, or ``[]``.

    Args:
        partition: the job's partition as rendered (a ``-p``/``--partition`` among ``sbatch_args``
            wins, as in sbatch).

    Never raises for a Slurm query that fails: the preference is an optimisation, the submission
    goes on without it.
    """
    partition = sbatch_partition(sbatch_args) or partition or None
    if has_placement_option(sbatch_args) or sbatch_names_nodes(sbatch_args):
        return []
    if not any(s.manifest is not None for s in plan.sources):
        return []
    if _NODE_PLACEHOLDER not in site.storage.node_cache:
        return []
    if not features_in_use(slurm_release(client))["prefer"]:
        return []
    try:
        nodes = client.nodes()
        excluded_expr = sbatch_excluded_nodes(sbatch_args)
        excluded = set(client.hostnames(excluded_expr)) if excluded_expr else set()
    except (SlurmCommandError, ValueError):  # ValueError: an exclude list that is not a hostlist
        return []
    nodes = [n for n in nodes if n.get("NodeName") not in excluded]
    names = [n["NodeName"] for n in nodes
             if n.get("NodeName") and (partition is None or partition in n.get("Partitions", "").split(","))]
    holders = nodes_holding(plan, site.storage.node_cache, names)
    expr = prefer_expression(nodes, holders, partition) if holders else None
    return [f"--prefer={expr}"] if expr else []
