# SPDX-License-Identifier: GPL-2.0-or-later
"""The submit hooks' facts file (docs/cluster-facts.md) from the plan: which GPU types and
MIG profiles Slurm owns, where, in which NVLink domains, and the submit policy. Rendered
on the controller, read by job_submit.lua and the Python submit rules."""

from __future__ import annotations

import json
from typing import Any, Mapping, Optional

from gpushare.admin.plan import Plan
from gpushare.admin.render import WHOLE_GPU_FEATURE, whole_gpu_nodes
from gpushare.admin.topology import node_domains
from gpushare.gpu.inventory import Inventory
from gpushare.submit.facts import SUPPORTED_VERSION as FACTS_VERSION

__all__ = ["render_facts", "render_facts_json"]


def render_facts(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None
                 ) -> dict[str, Any]:
    """The submit hooks' facts file (docs/cluster-facts.md, version 2) as a dict.

    ``types`` gives, per GRES type Slurm owns (whole GPU model or MIG profile), how many
    nodes offer it, the most one node offers, and the node counts of the NVLink domains
    those nodes sit in: PCIe nodes outside every domain add none, so a job on them gets no
    ``--switches``.
    """
    gpu_types: set[str] = set()
    mig_types: dict[str, None] = {}
    gpus_per_node: dict[str, int] = {}
    per_node: dict[str, int] = {}
    nodes_of: dict[str, set[str]] = {}
    for group in plan.groups:
        offered: dict[str, int] = {}
        whole = sum(1 for gpu in group.gpus if not gpu.mig and gpu.owner == "slurm")
        if whole:
            gpu_types.add(group.model.gres_type)
            offered[group.model.gres_type] = whole
        for gpu in group.gpus:
            for mig_slice in gpu.slices_of("slurm"):
                mig_types.setdefault(mig_slice.profile, None)
                offered[mig_slice.profile] = offered.get(mig_slice.profile, 0) + 1
        for type_name, count in offered.items():
            per_node[type_name] = max(per_node.get(type_name, 0), count)
            nodes_of.setdefault(type_name, set()).update(group.nodes)
        for node in group.nodes:
            gpus_per_node[node] = whole
    domains = node_domains(plan, inventory_by_node)
    types = {}
    for type_name in sorted(nodes_of):
        sizes = [len(nodes_of[type_name].intersection(members)) for members in domains.values()]
        types[type_name] = {"nodes": len(nodes_of[type_name]), "per_node": per_node[type_name],
                            "domain_sizes": sorted((s for s in sizes if s), reverse=True)}
    facts: dict[str, Any] = {
        "version": FACTS_VERSION,
        "gres_syntax": plan.slurm.gres_syntax,
        "mps_units_per_gpu": plan.slurm.mps_units_per_gpu,
        "gpu_types": sorted(gpu_types),
        "mig_types": sorted(mig_types),
        "types": types,
        "domains": domains,
        "gpus_per_node": gpus_per_node,
        "policy": {
            "switch_wait_s": plan.policy.switch_wait_s,
            "max_switch_wait_s": plan.policy.max_switch_wait_s,
            "on_error": plan.policy.on_error,
            "untyped_gpu": plan.policy.untyped_gpu,
        },
    }
    if plan.slurm.topology != "tree":  # absent means tree: older hooks read the file too
        facts["topology"] = plan.slurm.topology
    if whole_gpu_nodes(plan):
        facts["whole_gpu_feature"] = WHOLE_GPU_FEATURE
    return facts


def render_facts_json(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None
                      ) -> str:
    return json.dumps(render_facts(plan, inventory_by_node), indent=2) + "\n"
