# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare render``: write gres.conf, topology.conf, the mig-parted config, the plugstack
line or the submit hooks' facts from the ownership plan."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from gpushare.cli import fail, plan_problems, write_atomically
from gpushare.gpu.inventory import Inventory

TARGETS = ("gres", "topology", "mig-parted", "plugstack", "facts", "slurm-conf")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "render",
        help="render gres.conf, topology.conf, mig-parted config, plugstack line, facts or "
        "slurm.conf lines",
        description="Render configuration from the ownership plan. Only what the plan gives "
        "Slurm goes into gres.conf; the mig-parted config is the Kubernetes side's MIG layout; "
        "topology.conf makes each NVLink domain a leaf switch (slurm.topology: tree) or a block "
        "(block); facts is the JSON the submit hooks read; slurm-conf is the TopologyPlugin= "
        "and SwitchType= lines the plan implies, each group's Gres=, the "
        "AccountingStorageTRES that lets sacct show every GPU kind, and the nodes whose "
        "NodeName lines take Features=gpushare_whole (Slurm GPUs all whole, MIG slices on "
        "other nodes). "
        "Everything is rendered for the plan's "
        "slurm.version, whatever Slurm runs here (none is needed); a plan without one is "
        "rendered for the installed Slurm. gpushare check compares the plan's release with "
        "the running one.",
        epilog="examples:\n"
        "  gpushare render gres --plan /etc/gpushare/plan.yaml --output /etc/slurm/gres.conf\n"
        "  gpushare render gres --plan plan.yaml --node a100-01 --source nvml\n"
        "  gpushare render mig-parted --plan plan.yaml > mig-config.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", choices=TARGETS, help="what to render")
    parser.add_argument("--plan", required=True, metavar="FILE", help="the ownership plan")
    parser.add_argument("--node", metavar="NAME",
                        help="gres: render only this node's lines (topology and facts: the "
                        "node whose --source this is; refused for the other targets)")
    parser.add_argument("--source", metavar="nvml|sim:PATH",
                        help="gres/topology/facts for --node: take device files (or the fabric "
                        "clique) from this node's inventory instead of the standard numbering")
    parser.add_argument("--device-root", metavar="DIR",
                        help="gres: directory of the device files (default: the plan's "
                        "slurm.device_root, normally /dev)")
    parser.add_argument("--state", metavar="FILE",
                        help="the layouts `gpushare relayout` applied (default "
                        "relayout-state.json beside the plan, when it exists; 'none': the "
                        "plan's alone). mig-parted is always the plan's")
    parser.add_argument("--output", "-o", metavar="FILE",
                        help="write here (atomically) instead of standard output")
    parser.set_defaults(func=_run)


def _inventory(args: argparse.Namespace) -> Optional[dict[str, Inventory]]:
    if not args.source:
        return None
    from gpushare.gpu.inventory import open_inventory

    inventory = open_inventory(args.source)
    return {args.node or inventory.hostname: inventory}


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin import render
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.relayout.state import StateError, as_applied
    from gpushare.admin.slurm_client import installed_release
    from gpushare.admin.topology import TopologyError
    from gpushare.gpu.nvml import InventoryError

    if args.node and args.target != "gres" and not (
            args.source and args.target in ("topology", "facts")):
        return fail("render", f"--node renders one node's lines of gres only (with --source "
                    f"it also names the inventory's node for topology and facts); "
                    f"{args.target} is rendered for the whole plan: drop --node")
    if args.device_root is not None and not args.device_root.startswith("/"):
        return fail("render", "--device-root must be an absolute directory, not "
                    f"{args.device_root!r}")
    try:
        plan = load_plan(args.plan)
        # The plan's own slurm.version when it names one: no Slurm needed here.
        plan, note = render.for_installed_slurm(
            plan, None if plan.slurm.version_given else installed_release())
        if note:
            print(f"gpushare render: {note}", file=sys.stderr)
        plain = plan
        if args.target != "mig-parted":  # Kubernetes' side never follows a relayout
            plan = as_applied(plan, args.state)
        inventories = _inventory(args)
        if args.target == "gres":
            text = render.render_gres_conf(plan, inventories, args.device_root, args.node)
        elif args.target == "topology":
            text = render.render_topology(plan, inventories)
        elif args.target == "mig-parted":
            text = render.render_mig_parted(plain)
        elif args.target == "plugstack":
            text = render.render_plugstack(plan)
        elif args.target == "slurm-conf":
            text = render.render_slurm_conf(plan)
        else:
            from gpushare.admin.render_facts import render_facts_json

            text = render_facts_json(plan, inventories)
    except PlanError as err:
        return fail("render", plan_problems(err))
    except (render.RenderError, TopologyError, InventoryError, StateError) as err:
        return fail("render", str(err))
    if not args.output:
        sys.stdout.write(text)
        return 0
    return write_atomically(args.output, text, "render")
