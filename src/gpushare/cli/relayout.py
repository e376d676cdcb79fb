# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout``: which idle GPUs should take which MIG layout of their group's menu,
so that what the queue waits for can start; prints the decision and why. ``gpushare relayout
node`` is the node's step: lay one GPU of this node out anew through NVML (dry run unless
``--apply``)."""

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
        "type, each change and why, and the nodes that would be drained; the decision changes "
        "nothing.\n\n"
        "`gpushare relayout node --gpu N --layout L` is the node's step, run as root on a "
        "drained node: it checks that the plan gives GPU N wholly to Slurm and lists L on "
        "its group's menu and that no process uses the GPU, then (with --apply) destroys its "
        "MIG instances and creates L's through NVML, verifies them, restores the old layout "
        "on any failure or after --step-timeout, and rewrites this node's gres.conf. "
        "Draining the node, restarting slurmd and `scontrol reconfigure` are left to the "
        "administrator.",
        epilog="examples:\n  gpushare relayout --plan /etc/gpushare/plan.yaml\n"
        "  gpushare relayout node --gpu 2 --layout 2x3g.40gb\n"
        "  gpushare relayout node --gpu 2 --layout 2x3g.40gb --apply",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("step", nargs="?", choices=["node"], metavar="node",
                        help="lay one GPU of this node out anew (the node's step)")
    parser.add_argument("--plan", default="/etc/gpushare/plan.yaml", metavar="FILE",
                        help="the ownership plan (default /etc/gpushare/plan.yaml)")
    node = parser.add_argument_group("the node's step (gpushare relayout node)")
    node.add_argument("--gpu", type=int, metavar="N", help="NVML index of the GPU to change")
    node.add_argument("--layout", metavar="L",
                      help="the new layout, one of the group's menu (e.g. 2x3g.40gb, whole)")
    node.add_argument("--apply", action="store_true",
                      help="change the GPU (default: say what would change)")
    node.add_argument("--node", metavar="NAME",
                      help="Slurm node name (default $SLURMD_NODENAME, else the short host "
                      "name)")
    node.add_argument("--source", default="nvml", metavar="nvml|sim:PATH",
                      help="where NVML is (default nvml, the node's driver)")
    node.add_argument("--gres-conf", default="/etc/slurm/gres.conf", metavar="FILE",
                      help="the node's gres.conf, rewritten after a change (default "
                      "/etc/slurm/gres.conf; 'none' leaves it)")
    node.add_argument("--step-timeout", type=float, default=120.0, metavar="SECONDS",
                      help="time limit of the change; past it the old layout is restored "
                      "(default 120)")
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


def _run_node(args: argparse.Namespace) -> int:
    """The node's step: one GPU of this node to one layout of its group's menu."""
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.relayout.apply import (
        ApplyError,
        apply_layout,
        render_node_gres,
        write_atomically,
    )
    from gpushare.cli import nodeconf
    from gpushare.gpu.inventory import MIG_MINORS_PATH, collect, load_nvml
    from gpushare.gpu.nvml import SIM_PREFIX, InventoryError

    if args.gpu is None or args.layout is None:
        return fail("relayout node", "give --gpu N and --layout L")
    if not 1 <= args.step_timeout <= 3600:
        return fail("relayout node", "--step-timeout must be between 1 and 3600 seconds")
    if args.gres_conf != "none" and not args.gres_conf.startswith("/"):
        return fail("relayout node", "--gres-conf must be an absolute path or none")
    node = args.node or nodeconf.this_node()
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        return fail("relayout node", plan_problems(err))
    try:
        nvml = load_nvml(args.source)
        result = apply_layout(nvml, plan, node, args.gpu, args.layout,
                              timeout_s=args.step_timeout, dry_run=not args.apply)
    except (ApplyError, InventoryError) as err:
        return fail("relayout node", str(err))
    if not result.changed:
        print(f"GPU {result.gpu} of node {node} already has layout {result.new}")
    elif not args.apply:
        print(f"GPU {result.gpu} of node {node}: {result.old} -> {result.new} (dry run; "
              "--apply changes it)")
    else:
        print(f"GPU {result.gpu} of node {node}: {result.old} -> {result.new}")
    for step in result.steps:
        print(f"  {step}")
    if not args.apply or args.gres_conf == "none":
        return 0
    try:
        if args.source.startswith(SIM_PREFIX):
            minors, device_dir, host = nvml.mig_minors_text, nvml.device_dir, nvml.hostname
        else:
            with open(MIG_MINORS_PATH, encoding="ascii", errors="replace") as f:
                minors, device_dir, host = f.read(), "/dev", node
        inventory = collect(nvml, args.source, minors, device_dir, host or node,
                            topology=False)
        write_atomically(args.gres_conf,
                         render_node_gres(plan, node, args.gpu, args.layout, inventory))
    except (ApplyError, InventoryError, OSError, ValueError) as err:
        return fail("relayout node", f"the GPU changed, but {args.gres_conf} was not "
                    f"rewritten: {err}")
    print(f"rewrote {args.gres_conf}; restart slurmd and run `scontrol reconfigure` so "
          "Slurm sees it")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.step == "node":
        return _run_node(args)
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
