# SPDX-License-Identifier: GPL-2.0-or-later
"""NVLink domains as Slurm's topology/tree sees them: one leaf switch per domain, one spine.

``--switches=1`` then means "inside one NVLink domain". Domains come from the plan, or from the
GPUs' fabric clique (``nvmlDeviceGetGpuFabricInfoV``) on NVL72-style systems, where the fabric
manager already knows which trays share a domain.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import hostlist

from gpushare.admin.plan import MAX_SWITCH_NAME, Plan
from gpushare.gpu.inventory import Inventory

__all__ = ["Switch", "TopologyError", "build_switches", "domains_from_fabric", "node_domains"]


class TopologyError(ValueError):
    """The domains cannot be turned into a topology; the message says why and what to do."""


@dataclass(frozen=True)
class Switch:
    """One topology.conf line: a leaf (``nodes``) or the spine (``switches``)."""

    name: str
    nodes: str = ""  # hostlist expression
    switches: str = ""  # comma list of leaf names
    comment: str = ""


def domains_from_fabric(inventory_by_node: Mapping[str, Inventory]) -> dict[str, list[str]]:
    """Group nodes by the fabric clique their GPUs report (cluster UUID + clique id).

    A node whose GPUs report different cliques is an error: its fabric is not healthy.
    Nodes whose fabric is not ``completed`` belong to no domain.
    """
    domains: dict[tuple[str, int], list[str]] = {}
    for node in sorted(inventory_by_node):
        keys = set()
        for gpu in inventory_by_node[node].gpus:
            fabric = gpu.fabric
            if fabric is not None and fabric.state == "completed" and fabric.cluster_uuid:
                keys.add((fabric.cluster_uuid, fabric.clique_id))
        if len(keys) > 1:
            raise TopologyError(
                f"node {node}: its GPUs report {len(keys)} different NVLink cliques; check the "
                "fabric manager (nvidia-smi -q | grep -A4 Fabric) before rendering topology")
        if keys:
            domains.setdefault(keys.pop(), []).append(node)
    named: dict[str, list[str]] = {}
    for (cluster_uuid, clique), nodes in sorted(domains.items()):
        short = cluster_uuid.replace("-", "")[:8]
        named[f"nvl-{short}-{clique}"] = nodes
    return named


def node_domains(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None
                 ) -> dict[str, list[str]]:
    """Domain name → sorted node names, from the plan or from the fabric."""
    if plan.domains_from_fabric:
        if not inventory_by_node:
            raise TopologyError(f"{plan.path}: domains: fabric needs each node's inventory; "
                                "render topology with the nodes' inventories or name the "
                                "domains in the plan")
        return domains_from_fabric(inventory_by_node)
    return {domain.name: sorted(domain.nodes) for domain in plan.domains}


def build_switches(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None
                   ) -> list[Switch]:
    """Leaf switches for the domains, one more leaf per node group for nodes outside any
    domain (topology/tree cannot place a node that hangs off no switch), and a spine."""
    domains = node_domains(plan, inventory_by_node)
    leaves: list[Switch] = []
    placed: set[str] = set()
    for name, nodes in domains.items():
        leaves.append(Switch(name, nodes=hostlist.collect_hostlist(nodes),
                             comment=f"NVLink domain {name}: {len(nodes)} nodes"))
        placed.update(nodes)
    taken = set(domains)
    for group in plan.groups:
        rest = [node for node in group.nodes if node not in placed]
        if not rest:
            continue
        name = _free_name(f"{group.name}-nonvl", taken)
        leaves.append(Switch(name, nodes=hostlist.collect_hostlist(rest),
                             comment=f"node group {group.name}: nodes in no NVLink domain"))
    if not leaves:
        return []
    spine = _free_name("spine", taken)
    return [*leaves, Switch(spine, switches=",".join(leaf.name for leaf in leaves),
                            comment="joins the leaves; jobs may span them only without "
                            "--switches=1")]


def build_blocks(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None
                 ) -> tuple[list[Switch], list[int]]:
    """topology/block: one block per NVLink domain, and BlockSizes: the base size (the
    smallest domain: every block must hold at least that many nodes) and its power-of-two
    aggregates up to all the blocks' nodes."""
    domains = node_domains(plan, inventory_by_node)
    if not domains:
        raise TopologyError(f"{plan.path}: slurm.topology: block needs NVLink domains "
                            "(domains:) to make blocks of")
    placed = {node for nodes in domains.values() for node in nodes}
    outside = [node for node in plan.nodes if node not in placed]
    if outside:
        raise TopologyError(
            f"{plan.path}: slurm.topology: block: {hostlist.collect_hostlist(outside)} "
            "are in no NVLink domain, and topology/block places jobs only on nodes of a "
            "block: add them to a domain, or use slurm.topology: tree")
    blocks = [Switch(name, nodes=hostlist.collect_hostlist(nodes),
                     comment=f"NVLink domain {name}: {len(nodes)} nodes")
              for name, nodes in domains.items()]
    base = min(len(nodes) for nodes in domains.values())
    total = sum(len(nodes) for nodes in domains.values())
    sizes = [base]
    while sizes[-1] * 2 <= total:
        sizes.append(sizes[-1] * 2)
    return blocks, sizes


def _free_name(base: str, taken: set[str]) -> str:
    name, suffix = base[:MAX_SWITCH_NAME], 1
    while name in taken:
        tail = f"-{suffix}"
        name = base[:MAX_SWITCH_NAME - len(tail)] + tail
        suffix += 1
    taken.add(name)
    return name
