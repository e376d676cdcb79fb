# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare simulate``: write simulated NVML node profiles from the ownership plan, so that a
site can run its plan through gpushare (check, render, the plugin, a test Slurm) without
the hardware."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gpushare.cli import fail, plan_problems, write_atomically


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="write simulated NVML node profiles laid out as the ownership plan says",
        description="Write the simulated NVML profile of a node exactly as the ownership plan "
        "lays it out: every GPU of its group with the model's NVML name, memory, NVLinks and "
        "fabric state, every MIG slice the plan describes (Slurm's and Kubernetes') at its "
        "placement. The profiles are what inventory=sim:PATH (plugstack) and --source "
        "sim:PATH (inventory, render, check) read.",
        epilog="examples:\n"
        "  gpushare simulate --plan plan.yaml --node a100-01 > a100-01.json\n"
        "  gpushare check --plan plan.yaml --node a100-01 --source sim:$PWD/a100-01.json\n"
        "  gpushare simulate --plan plan.yaml --output-dir /tmp/nodes   # one <node>.json "
        "each\n"
        "  plugstack.conf (a test cluster): inventory=sim:/tmp/nodes/%n.json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--plan", required=True, metavar="FILE", help="the ownership plan")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--node", metavar="NAME",
                       help="the node to simulate; its profile goes to standard output or "
                       "--output")
    where.add_argument("--output-dir", metavar="DIR",
                       help="write <node>.json for every node of the plan into DIR (existing)")
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="with --node: write here (atomically) instead of standard output")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.gpu.nvml_sim import ProfileError
    from gpushare.gpu.nvml_sim_plan import profile_from_plan

    if args.output and not args.node:
        return fail("simulate", "--output goes with --node (--output-dir writes every node)")
    try:
        plan = load_plan(args.plan)
        nodes = [args.node] if args.node else plan.nodes
        profiles = {node: profile_from_plan(plan, node) for node in nodes}
    except PlanError as err:
        return fail("simulate", plan_problems(err))
    except ProfileError as err:
        return fail("simulate", str(err))
    if args.node and not args.output:
        sys.stdout.write(json.dumps(profiles[args.node], indent=1) + "\n")
        return 0
    if args.output_dir:
        try:
            os.makedirs(args.output_dir, mode=0o755, exist_ok=True)
        except OSError as err:
            return fail("simulate", f"--output-dir {args.output_dir}: cannot make the "
                        f"directory ({err.strerror}); give a directory")
    for node, profile in profiles.items():
        path = args.output or os.path.join(args.output_dir, f"{node}.json")
        if write_atomically(path, json.dumps(profile, indent=1) + "\n", "simulate") != 0:
            return 2
    return 0
