# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare status --cluster``: the cluster's GPU sharing at a glance, from slurmctld."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from gpushare.cli import add_slurm_arguments, fail, text_table

if TYPE_CHECKING:
    from gpushare.admin.cluster_status import NodeSharing, TypeSharing

__all__ = ["format_status", "register"]



def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the cluster's GPU sharing at a glance (--cluster), from slurmctld's view",
        description="With --cluster, ask slurmctld for every node's GRES and what is in use "
        "(GresUsed, and the running jobs' GRES from squeue --json for MPS: 22.05's "
        "GresUsed miscounts it), and print per node and GPU type the whole GPUs free, the MPS "
        "shares used of the total and the MIG slices free by profile, then the drained nodes with "
        "their reasons (gpushare's own marked). A GPU serving MPS jobs is not counted free. "
        "For one node's MPS daemons use gpushare mps on it. Exit status: 0 shown, "
        "2 slurmctld could not be asked.",
        epilog="Examples:\n  gpushare status --cluster\n  gpushare status --cluster --json\n"
        "  gpushare status --cluster --backend scontrol   # without sinfo --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cluster", action="store_true",
                        help="the whole cluster from slurmctld's view (required: the only "
                        "view so far)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--demand", action="store_true",
                        help="also ask squeue what the jobs pending for resources wait "
                        "for (each job what it asks of one node, from --gres, --gpus or "
                        "--gpus-per-task), and show it beside what is free per type (MIG "
                        "profile, whole GPUs, MPS units)")
    parser.add_argument("--squeue", default="/usr/bin/squeue", metavar="PATH",
                        help="absolute path of squeue, which says what each running job holds "
                        "on each node (and with --demand what waits; default /usr/bin/squeue)")
    parser.add_argument("--plan", default="/etc/gpushare/plan.yaml", metavar="FILE",
                        help="the ownership plan, for the devices gpushare tidal has lent "
                        "(tidal-state.json beside it; default %(default)s; left out where "
                        "absent)")
    add_slurm_arguments(parser)
    parser.set_defaults(func=_run)


def _fraction(used: int, total: int) -> str:
    return f"{used}/{total}" if total else "-"


def format_status(nodes: list[NodeSharing], totals: dict[str, Any], backend: str) -> str:
    """One row per node and whole-GPU type, then the drained nodes, then the totals."""
    head = f"GPU sharing of {totals['nodes']} node(s), from slurmctld ({backend})"
    if not nodes:
        return head + ": no node has GPUs or MPS in its GRES"
    rows = [["NODE", "STATE", "GPU TYPE", "WHOLE FREE", "MPS USED", "MIG FREE"]]
    for node in nodes:
        whole: list[TypeSharing | None] = [t for t in node.types if not t.mig_profile] or [None]
        mig = " ".join(f"{t.mig_profile}:{t.free}/{t.total}"
                       for t in node.types if t.mig_profile) or "-"
        for i, item in enumerate(whole):
            rows.append([
                node.name if i == 0 else "", "+".join(node.states).lower() if i == 0 else "",
                item.gpu_type if item else "-",
                _fraction(item.free, item.total) if item else "-",
                _fraction(item.mps_used, item.mps_total) if item else "-",
                mig if i == 0 else "",
            ])
    lines = [head, "", *text_table(rows)]
    drained = [node for node in nodes if node.drained]
    if drained:
        lines += ["", f"Drained: {len(drained)} node(s), {totals['drained_by_gpushare']} by "
                  "gpushare (after fixing: scontrol update NodeName=N State=RESUME)"]
        lines += text_table([[f"  {node.name}", node.reason or "(no reason)"]
                             for node in drained])
    parts = [f"{name} {row['free']}/{row['total']} whole GPUs free"
             + (f", MPS {row['mps_used']}/{row['mps_total']} used" if row["mps_total"] else "")
             for name, row in sorted(totals["gpus"].items())]
    parts += [f"{profile} {row['free']}/{row['total']} slices free"
              for profile, row in sorted(totals["mig"].items())]
    lines += ["", "Total (drained nodes count as not free): " + "; ".join(parts)]
    return "\n".join(lines)


def format_demand(waiting: dict[str, int], free: dict[str, int]) -> list[str]:
    """Per request type, what the queue waits for (each job what it asks of one node) beside
    what is free."""
    rows = [["TYPE", "WAITING", "FREE"]]
    for kind in sorted(set(waiting) | set(free)):
        rows.append([kind, str(waiting.get(kind, 0)), str(free.get(kind, 0))])
    return ["", "Pending jobs' GPU requests beside what is free (whole: GPUs, mps: units, "
            "MIG: slices; a job counts what it asks of one node, a multi-node job once):",
            *text_table(rows)]


def _free_by_kind(sums: dict[str, Any]) -> dict[str, int]:
    free: dict[str, int] = {}
    for row in sums["gpus"].values():
        free["whole"] = free.get("whole", 0) + row["free"]
        if row["mps_total"]:
            free["mps"] = free.get("mps", 0) + row["mps_total"] - row["mps_used"]
    for profile, row in sums["mig"].items():
        free[profile] = free.get(profile, 0) + row["free"]
    return free


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin.cluster_status import summary, totals
    from gpushare.admin.slurm_client import SlurmClientError, job_gres, open_client

    if not args.cluster:
        return fail("status", "say --cluster (the cluster from slurmctld's view); for this node's "
                     "MPS daemons use gpushare mps, for its metrics gpushare metrics")
    if not 0.1 <= args.timeout <= 600:
        return fail("status", "--timeout must be between 0.1 and 600 seconds")
    try:
        client = open_client(args.backend, args.sinfo, args.scontrol, args.timeout)
        nodes = summary(client.nodes(), job_gres(args.squeue, args.timeout))
    except SlurmClientError as err:
        return fail("status", str(err))
    sums = totals(nodes)
    waiting: dict[str, int] = {}
    if args.demand:
        from gpushare.admin.relayout.demand import pending

        try:
            for request in pending(args.squeue, args.timeout).requests:
                waiting[request.kind] = waiting.get(request.kind, 0) + request.count
        except SlurmClientError as err:
            return fail("status", str(err))
    lent, lent_note = _lent(args.plan)
    if args.json:
        report: dict[str, Any] = {"backend": client.backend,
                                  "nodes": [n.to_dict() for n in nodes], "totals": sums,
                                  "lent": lent}
        if args.demand:
            report["demand"] = {"waiting": waiting, "free": _free_by_kind(sums)}
        print(json.dumps(report, indent=2))
        return 0
    text = format_status(nodes, sums, client.backend)
    if args.demand:
        text += "\n" + "\n".join(format_demand(waiting, _free_by_kind(sums)))
    if lent:
        from gpushare.cli import text_table

        rows = [["LENT DEVICE", "RULE", "HOME", "HELD BY", "SINCE", "UNTIL"]]
        rows += [[r["device"], r["rule"], r["home"], r["holder"], r["since"], r["until"]]
                 for r in lent]
        text += "\n\n" + "\n".join(text_table(rows))
    elif lent_note:
        text += "\n\n" + lent_note
    print(text)
    return 0


def _lent(plan_path: str) -> tuple[list[dict[str, Any]], str]:
    """The devices gpushare tidal has lent, or why they could not be read ("" when the
    site lends nothing)."""
    import datetime
    import os

    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.tidal.state import STATE_NAME, StateError, lent_report, load_state

    state_path = os.path.join(os.path.dirname(os.path.abspath(plan_path)), STATE_NAME)
    if not os.path.exists(state_path):
        return [], ""
    try:
        plan = load_plan(plan_path)
        return lent_report(plan, load_state(state_path), datetime.datetime.now()), ""
    except (PlanError, StateError) as err:
        return [], f"lent devices not shown: {err}"
