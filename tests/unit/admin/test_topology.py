# SPDX-License-Identifier: GPL-2.0-or-later
"""NVLink domains → topology/tree switches, from the plan or from the fabric clique."""

from __future__ import annotations

import pytest

from gpushare.admin.plan import parse_plan
from gpushare.admin.render import render_topology
from gpushare.admin.render_facts import render_facts
from gpushare.admin.topology import TopologyError, build_switches, domains_from_fabric
from gpushare.gpu.inventory import FabricInfo, Gpu, Inventory

PLAN = """\
version: 1
domains: {DOMAINS}
node_groups:
  - {name: gb, nodes: 'gb[01-04]', gpu_model: gb200, gpus: 4, layout: {all: {owner: slurm}}}
  - {name: spine, nodes: 'x1', gpu_model: l40s, gpus: 1, layout: {all: {owner: slurm}}}
"""


def tray(host: str, cliques: list[int], state: str = "completed") -> Inventory:
    gpus = [Gpu(i, i, f"GPU-{host}-{i}", "NVIDIA GB200", 186 << 30, f"0:{i}", "default",
                False, False, fabric=FabricInfo(state, "2f6a1c3e-0000-4000-8000-00000000abcd",
                                                clique))
            for i, clique in enumerate(cliques)]
    return Inventory(host, "570", "12.8", "test", gpus)


def test_domains_from_fabric_cliques():
    inventories = {"gb01": tray("gb01", [7] * 4), "gb02": tray("gb02", [7] * 4),
                   "gb03": tray("gb03", [9] * 4), "gb04": tray("gb04", [9] * 4, "in_progress")}
    assert domains_from_fabric(inventories) == {"nvl-2f6a1c3e-7": ["gb01", "gb02"],
                                                "nvl-2f6a1c3e-9": ["gb03"]}
    with pytest.raises(TopologyError, match="2 different NVLink cliques"):
        domains_from_fabric({"gb01": tray("gb01", [7, 7, 8, 8])})


def test_fabric_plan_renders_with_inventories_only():
    plan = parse_plan(PLAN.replace("{DOMAINS}", "fabric"))
    with pytest.raises(TopologyError, match="needs each node's inventory"):
        render_topology(plan)
    inventories = {n: tray(n, [1] * 4) for n in ("gb01", "gb02", "gb03", "gb04")}
    text = render_topology(plan, inventories)
    assert "SwitchName=nvl-2f6a1c3e-1 Nodes=gb[01-04]" in text
    assert render_facts(plan, inventories)["domains"] == {
        "nvl-2f6a1c3e-1": ["gb01", "gb02", "gb03", "gb04"]}


def test_switch_names_never_collide():
    plan = parse_plan(PLAN.replace("{DOMAINS}", "{spine: 'gb[01-02]', spine-nonvl: 'gb03'}"))
    names = [s.name for s in build_switches(plan)]
    assert len(names) == len(set(names))
    assert names[-1] not in ("spine", "spine-nonvl")
    spine = build_switches(plan)[-1]
    assert spine.switches.split(",") == names[:-1]
