# SPDX-License-Identifier: GPL-2.0-or-later
"""Render and check a 10 000-node plan; prints a table of times (goal: 2 s in all).

Run from the repository root: python3 bench/bench_plan.py
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpushare.admin.check import check_cluster, check_gres_all_nodes, check_node
from gpushare.admin.plan import parse_plan
from gpushare.admin.render import (
    render_gres_conf,
    render_topology,
    slurm_node_gres,
)
from gpushare.admin.render_facts import render_facts_json
from gpushare.admin.slurm_client import SlurmNode
from gpushare.gpu.gresconf import parse_gres_conf

GOAL_S = 2.0


def build_plan_text(nodes: int = 10000) -> str:
    """Training H100 nodes in NVLink domains of 32, A100 MIG nodes, L40S MPS nodes."""
    train, mig = nodes * 6 // 10, nodes * 3 // 10
    shared = nodes - train - mig
    # Slurm 23.11: the MIG nodes give Slurm two profiles each (22.05 indexes only one).
    lines = ["version: 1", "slurm: {version: '23.11'}", "domains:"]
    for domain in range(train // 32):
        first = domain * 32 + 1
        lines.append(f"  nvl{domain}: 'h[{first:05d}-{first + 31:05d}]'")
    lines += [
        "node_groups:",
        f"  - {{name: train, nodes: 'h[00001-{train:05d}]', gpu_model: h100, gpus: 8,",
        "     layout: {all: {owner: slurm}}}",
        f"  - {{name: infer, nodes: 'a[00001-{mig:05d}]', gpu_model: a100-40gb, gpus: 8,",
        "     layout: {0-3: {owner: kubernetes, mig: [{profile: 1g.5gb, count: 7}]},",
        "              4-5: {mig: [{profile: 3g.20gb, owner: slurm},",
        "                          {profile: 2g.10gb, count: 2, owner: kubernetes}]},",
        "              6-7: {owner: slurm, mig: [{profile: 1g.5gb, count: 7}]}}}",
        f"  - {{name: shared, nodes: 'l[00001-{shared:05d}]', gpu_model: l40s, gpus: 4,",
        "     layout: {all: {owner: slurm, mps: 100}}}",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    rows: list[tuple[str, float]] = []

    def timed(name, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        rows.append((name, time.perf_counter() - start))
        return result

    text = build_plan_text()
    plan = timed("parse + validate plan", parse_plan, text, "bench.yaml")
    gres_text = timed("render gres.conf", render_gres_conf, plan)
    timed("render topology.conf", render_topology, plan)
    timed("render facts", render_facts_json, plan)
    gres = timed("parse rendered gres.conf", parse_gres_conf, gres_text, "gres.conf")

    problems = len(timed("plan-vs-gres check, one node", check_node, plan, "a00001", gres))
    problems += len(timed("plan-vs-gres check, every node", check_gres_all_nodes, plan, gres))
    slurm_nodes = [SlurmNode(n, ("IDLE",), "", slurm_node_gres(plan.group_of(n)))
                   for n in plan.nodes]
    problems += len(timed("cluster check (10 000 nodes)", check_cluster, plan, slurm_nodes))
    total = sum(seconds for _, seconds in rows)
    width = max(len(name) for name, _ in rows)
    print(f"{len(plan.nodes)} nodes, {len(plan.groups)} groups, {len(plan.domains)} domains, "
          f"gres.conf {len(gres_text.splitlines())} lines")
    print(f"{'step':<{width}}  {'seconds':>8}  {'share':>6}")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds:8.3f}  {seconds / total:6.1%}")
    print(f"{'total':<{width}}  {total:8.3f}  {total / GOAL_S:6.1%} of the {GOAL_S:g} s goal")
    if problems:
        print(f"unexpected findings: {problems}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
