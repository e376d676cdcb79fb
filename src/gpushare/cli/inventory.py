# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare inventory``: what NVML (or a simulated node) says this node's GPUs are."""

from __future__ import annotations

import argparse
import json
import sys

from gpushare.cli import text_table
from gpushare.gpu.inventory import MIG_MINORS_PATH, Inventory, InventoryError, open_inventory

GIB = 1 << 30


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inventory",
        help="show this node's GPUs, MIG slices, NVLink, fabric and GPU processes",
        description="Read the node's GPUs through NVML and print them: GPUs (index, minor, "
        "UUID, memory, PCI bus id, compute mode, MIG mode), MIG slices with their "
        "/dev/nvidia-caps files, NVLink state, NVLink fabric (cluster UUID, clique) and the "
        "processes using each device. Exit status 1 with a message when NVML cannot be read.",
        epilog="Examples:\n  gpushare inventory\n  gpushare inventory --json\n"
        "  gpushare inventory --source sim:/tmp/nodes/a100-01.json   "
        "# from gpushare simulate --output-dir /tmp/nodes",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true",
                        help="print the inventory as JSON (the data model other tools read)")
    parser.add_argument("--source", default="nvml", metavar="nvml|sim:PATH",
                        help="nvml (default: the node's NVIDIA driver) or sim:<absolute path "
                        "of a simulated node profile> for tests and demos")
    parser.add_argument("--mig-minors", default=MIG_MINORS_PATH, metavar="PATH",
                        help=f"the driver's MIG capability table (default {MIG_MINORS_PATH})")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        inventory = open_inventory(args.source, args.mig_minors)
    except InventoryError as err:
        print(f"gpushare: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(inventory.to_dict(), indent=2))
    else:
        print(format_inventory(inventory))
    return 0


def format_inventory(inv: Inventory) -> str:
    """A readable table of the inventory."""
    lines = [f"{inv.hostname}: driver {inv.driver_version}, CUDA {inv.cuda_driver_version}, "
             f"{len(inv.gpus)} GPU(s), source {inv.source}", ""]
    if not inv.gpus:
        return "\n".join([*lines, "no GPUs"])
    rows = [["GPU", "MINOR", "NAME", "MEMORY", "PCI BUS ID", "COMPUTE MODE", "MIG", "NVLINK",
             "FABRIC", "UUID"]]
    for g in inv.gpus:
        mig = "n/a" if "mig" in g.unsupported else ("on" if g.mig_current else "off")
        if g.mig_pending != g.mig_current and "mig" not in g.unsupported:
            mig += " (pending " + ("on" if g.mig_pending else "off") + ")"
        if "nvlink" in g.unsupported:
            nvlink = "n/a"
        else:
            nvlink = f"{sum(link.active for link in g.nvlinks)}/{len(g.nvlinks)} active"
        if g.fabric is None:
            fabric = "n/a"
        elif g.fabric.state == "completed" and g.fabric.cluster_uuid:
            fabric = f"{g.fabric.cluster_uuid[:8]}/clique {g.fabric.clique_id}"
        else:
            fabric = g.fabric.state
        rows.append([str(g.nvml_index), str(g.minor), g.name, f"{g.memory_total / GIB:.1f} GiB",
                     g.pci_bus_id, g.compute_mode, mig, nvlink, fabric, g.uuid])
    lines += text_table(rows)
    migs = [(g, m) for g in inv.gpus for m in g.mig_devices]
    if migs:
        rows = [["GPU", "GI", "CI", "PROFILE", "MEMORY", "CAPS FILES", "UUID"]]
        rows += [[str(g.nvml_index), str(m.gi_id), str(m.ci_id), m.profile,
                  f"{m.memory_total / GIB:.1f} GiB", ",".join(m.caps_files) or "-", m.uuid]
                 for g, m in migs]
        lines += ["", "MIG slices:", *text_table(rows)]
    procs = [(g.nvml_index, "", p) for g in inv.gpus for p in g.processes if p.gi_id is None]
    procs += [(g.nvml_index, f"{m.gi_id}/{m.ci_id}", p) for g, m in migs for p in m.processes]
    if procs:
        rows = [["GPU", "GI/CI", "PID", "KIND", "MEMORY"]]
        rows += [[str(i), s or "-", str(p.pid), p.kind, f"{p.used_memory >> 20} MiB"]
                 for i, s, p in procs]
        lines += ["", "Processes:", *text_table(rows)]
    else:
        lines += ["", "Processes: none"]
    return "\n".join(lines)
