# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout``: which idle GPUs should take which MIG layout of their group's menu,
so that what the queue waits for can start; prints the decision and why."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpushare.cli import add_slurm_arguments, fail, plan_problems, text_table


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "relayout",
        help="choose MIG layouts for idle GPUs from what the Slurm queue waits for (dry run)",
        description="Read the pending jobs' GPU requests (squeue) and what slurmctld's nodes "
        "hold, and choose, within each node group's relayout menu and bounds in the plan, "
        "which idle Slurm-only GPUs should change layout so that the most waiting GPU work "
        "can start, weighted by how long it has waited. Prints demand beside supply per "
        "type, each change and why, and the nodes that would be drained. Nothing is changed.",
        epilog="example:\n  gpushare relayout --plan /etc/gpushare/plan.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--plan", default="/etc/gpushare/plan.yaml", metavar="FILE",
                        help="the ownership plan (default /etc/gpushare/plan.yaml)")
    parser.add_argument("--max-changes", type=int, default=4, metavar="N",
                        help="at most N GPUs change per round (default 4)")
    parser.add_argument("--hysteresis", type=float, default=0.5, metavar="GPUS",
                        help="a change must let more than this many GPUs' worth of waiting "
                        "work start, twice that on a node with jobs (default 0.5)")
    parser.add_argument("--max-drain", type=float, default=5400.0, metavar="SECONDS",
                        help="change GPUs of a node with jobs only if their time limits end "
                        "within this many seconds (default 5400): Slurm keeps the node out "
                        "of service until they end")
    parser.add_argument("--squeue", default="/usr/bin/squeue", metavar="PATH",
                        help="absolute path of squeue (default /usr/bin/squeue)")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    add_slurm_arguments(parser)
    parser.set_defaults(func=_run)


def format_decision(decision: Any) -> str:
    kinds = sorted(set(decision.demand) | set(decision.supply))
    lines = ["demand and idle supply per type:"]
    rows = [["type", "waiting", "idle"]]
    rows += [[k, str(decision.demand.get(k, 0)), str(decision.supply.get(k, 0))] for k in kinds]
    lines += ["  " + row for row in text_table(rows)]
    if decision.changes:
        lines.append("changes:")
        rows = [["node", "gpu", "from", "to", "gain"]]
        rows += [[c.node, str(c.index), c.old, c.new, f"{c.gain:.2f}"] for c in decision.changes]
        lines += ["  " + row for row in text_table(rows)]
        lines.append("would drain: " + ", ".join(decision.drain))
    lines.append("why:")
    lines += [f"  {why}" for why in decision.why]
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.relayout.decide import decide
    from gpushare.admin.relayout.demand import pending, running_ends, supply
    from gpushare.admin.relayout.menu import one_profile_per_node
    from gpushare.admin.slurm_client import SlurmClientError, installed_release, open_client

    if not 0 <= args.max_changes <= 1000:
        return fail("relayout", "--max-changes must be between 0 and 1000")
    if not 0.1 <= args.timeout <= 600:
        return fail("relayout", "--timeout must be between 0.1 and 600 seconds")
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        return fail("relayout", plan_problems(err))
    menus = {group.name: group.relayout for group in plan.groups if group.relayout is not None}
    if not menus:
        return fail("relayout", f"no node group of {args.plan} has a relayout menu; see "
                    "docs/admin.md, MIG layouts that follow the queue")
    try:
        client = open_client(args.backend, args.sinfo, args.scontrol, args.timeout)
        gpus = supply(plan, client.nodes(), ends=running_ends(args.squeue, args.timeout))
        requests = pending(args.squeue, args.timeout)
    except SlurmClientError as err:
        return fail("relayout", str(err))
    version = plan.slurm.version if plan.slurm.version_given else \
        (installed_release() or plan.slurm.version)
    decision = decide(requests, gpus, menus, args.max_changes, args.hysteresis,
                      max_drain_s=args.max_drain,
                      one_profile_per_node=one_profile_per_node(version))
    if args.json:
        print(json.dumps({
            "demand": decision.demand, "supply": decision.supply,
            "changes": [{"node": c.node, "gpu": c.index, "from": c.old, "to": c.new,
                         "gain": round(c.gain, 3), "node_busy": c.node_busy}
                        for c in decision.changes],
            "drain": decision.drain, "why": decision.why}, indent=2))
        return 0
    print(format_decision(decision))
    return 0
