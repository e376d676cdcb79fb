# SPDX-License-Identifier: GPL-2.0-or-later
"""The plan with some devices lent, and the proof that no state gives a device to both.

``plan_with_lent`` is what is rendered while devices are lent: each lent device's owner is
its rule's borrower; nodes of a group whose lent devices differ become groups of their own.

``states_owned_once`` checks every state the lending rules can reach, not only the ones
a clock or a demand figure would pick: on each GPU, every subset of the devices any rule
may lend (a device's owner depends only on whether it is lent, and two devices can only
collide on one GPU). For each it renders Slurm's devices (the gres.conf lines) and
Kubernetes' (the MIG manager's), and finds any GPU or GPU instance both would use.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations
from typing import Iterable

import hostlist

from gpushare.admin.plan.lending import Device
from gpushare.admin.plan.model import GpuPlan, NodeGroup, Plan

__all__ = ["plan_with_lent", "states_owned_once"]

MAX_SUBSETS_PER_GPU = 1 << 8  # a GPU holds at most 7 MIG slices: 128 subsets


def _lent_gpu(gpu: GpuPlan, lent: dict[int, str]) -> GpuPlan:
    """``gpu`` with the devices in ``lent`` (slice position, -1 for the whole GPU, to the
    borrower) owned by their borrower."""
    if not gpu.mig:
        return replace(gpu, owner=lent[-1]) if -1 in lent else gpu
    slices = tuple(replace(s, owner=lent.get(pos, s.owner)) for pos, s in enumerate(gpu.slices))
    owners = {s.owner for s in slices}
    return replace(gpu, slices=slices, owner=owners.pop() if len(owners) == 1 else "mixed")


def _group_lent(group: NodeGroup, node_lent: dict[str, dict[int, dict[int, str]]]
                ) -> list[NodeGroup]:
    """The group split by what each node lends (nodes lending the same stay together)."""
    by_signature: dict[tuple, list[str]] = {}
    for node in group.nodes:
        lent = node_lent.get(node, {})
        signature = tuple(sorted((gpu, tuple(sorted(devices.items())))
                                 for gpu, devices in lent.items()))
        by_signature.setdefault(signature, []).append(node)
    groups = []
    number = 0
    for signature, nodes in sorted(by_signature.items()):
        lent = {gpu: dict(devices) for gpu, devices in signature}
        gpus = tuple(_lent_gpu(gpu, lent[gpu.index]) if gpu.index in lent else gpu
                     for gpu in group.gpus)
        name = group.name
        if signature:
            name, number = f"{group.name}.lent{number}", number + 1
        groups.append(replace(group, name=name, nodes=tuple(nodes),
                              nodes_expr=hostlist.collect_hostlist(nodes), gpus=gpus))
    return groups


def plan_with_lent(plan: Plan, lent: Iterable[tuple[Device, str]]) -> Plan:
    """The plan while each ``(device, borrower)`` is lent."""
    node_lent: dict[str, dict[int, dict[int, str]]] = {}
    for device, borrower in lent:
        node_lent.setdefault(device.node, {}).setdefault(device.gpu, {})[device.slice] = borrower
    groups: list[NodeGroup] = []
    for group in plan.groups:
        if any(node in node_lent for node in group.nodes):
            groups.extend(_group_lent(group, node_lent))
        else:
            groups.append(group)
    return replace(plan, groups=tuple(groups), _by_node={})


def _uses(plan: Plan, group: NodeGroup, owner: str) -> tuple[set[int], set[int], set[str]]:
    """What ``owner``'s rendered devices use on a node of ``group``: the GPUs it has whole,
    the GPUs it has anything of, and its GPU instances (by capability file)."""
    from gpushare.admin.render import expected_gres

    whole: set[int] = set()
    touched: set[int] = set()
    instances: set[str] = set()
    for device in expected_gres(plan, group, owner=owner):
        if device.name != "gpu":
            continue
        touched.add(device.gpu_index)
        if device.multiple_files:
            instances.add(device.files[1])
        else:
            whole.add(device.gpu_index)
    return whole, touched, instances


def _collisions(plan: Plan, group: NodeGroup) -> list[str]:
    s_whole, s_touched, s_instances = _uses(plan, group, "slurm")
    k_whole, k_touched, k_instances = _uses(plan, group, "kubernetes")
    found = [f"GPU {index} is Slurm's whole and Kubernetes uses it"
             for index in sorted(s_whole & k_touched)]
    found += [f"GPU {index} is Kubernetes' whole and Slurm uses it"
              for index in sorted(k_whole & s_touched)]
    found += [f"GPU instance {cap} is both schedulers'"
              for cap in sorted(s_instances & k_instances)]
    return found


def _renders(plan: Plan, group: NodeGroup) -> list[str]:
    """Whether Slurm's gres.conf can be rendered for the state (e.g. Slurm 22.05 takes one
    MIG profile per node: a lent slice of another profile cannot be given to it)."""
    from gpushare.admin.render import RenderError, render_gres_conf

    try:
        render_gres_conf(replace(plan, groups=(group,), _by_node={}))
    except RenderError as err:
        return [f"gres.conf cannot be rendered ({str(err).split(': ', 1)[-1]})"]
    return []


def states_owned_once(plan: Plan) -> list[str]:
    """Every state of the lending rules in which a GPU or GPU instance would be both
    schedulers', or Slurm's gres.conf could not be rendered (empty: none; the plan parser
    already refused overlapping rules)."""
    lendable: dict[tuple[str, int], list[tuple[Device, str, str]]] = {}
    for rule in plan.lending:
        for device in rule.devices:
            lendable.setdefault((device.node, device.gpu), []).append(
                (device, rule.borrower, rule.name))
    problems: list[str] = []
    seen: set[tuple[str, int, tuple]] = set()
    for (node, gpu), devices in sorted(lendable.items()):
        group = plan.group_of(node)
        assert group is not None  # the parser checked every node
        key = (group.name, gpu, tuple((d.slice, b) for d, b, _ in devices))
        if key in seen:
            continue  # the same GPU of another node of the group: the same states
        seen.add(key)
        single = replace(group, nodes=(node,), nodes_expr=node)
        count = 0
        for size in range(len(devices) + 1):
            for subset in combinations(devices, size):
                count += 1
                if count > MAX_SUBSETS_PER_GPU:
                    problems.append(f"{node} GPU {gpu}: more than {MAX_SUBSETS_PER_GPU} "
                                    "lending states; not all were checked")
                    return problems
                lent = {d.slice: b for d, b, _ in subset}
                gpus = tuple(_lent_gpu(g, lent) if g.index == gpu else g for g in single.gpus)
                state = replace(single, gpus=gpus)
                rules = ", ".join(sorted({name for _, _, name in subset})) or "none"
                problems += [f"{node}: {problem} when lent by {rules}"
                             for problem in _collisions(plan, state) + _renders(plan, state)]
    return problems
