# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --suggest``: the best static MIG layout for the site's own last N days,
found by replaying its sacct history on the plan's node group in the relayout simulator.

It is the start layout to give a group that relayout then follows, and the layout to keep
for a site that does not run relayout at all.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Optional, Union

from gpushare.cli import fail, plan_problems

MAX_DAYS = 366.0
DEFAULT_DAYS = 14.0


def counted(number: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``: the lines read as sentences."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def misplaced(args: argparse.Namespace) -> list[str]:
    """The --suggest and --trial options given without either (a dry run would ignore
    them)."""
    return [flag for flag, value in (("--days", args.days), ("--history", args.history),
                                     ("--group", args.group)) if value is not None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "learning from the site's history (gpushare relayout --suggest, --trial)")
    group.add_argument("--suggest", action="store_true",
                       help="propose the best static layout for the last --days of sacct "
                       "history, replayed on the plan's node group with a relayout menu")
    group.add_argument("--trial", action="store_true",
                       help="would relayout have helped? Replay the second half of the last "
                       "--days of sacct history from the plan's layouts and from the first "
                       "half's best static layout, each left alone and with relayout's rounds "
                       "(--max-changes, --hysteresis and --keep-hours as given), and compare "
                       "the waits and completion times; changes nothing")
    group.add_argument("--days", type=float, metavar="N",
                       help="with --suggest or --trial: how much history (default 14 days)")
    group.add_argument("--sacct", default="/usr/bin/sacct", metavar="PATH",
                       help="absolute path of sacct, for --suggest and for each round's "
                       "floors (--keep-hours; default /usr/bin/sacct)")
    group.add_argument("--history", metavar="FILE",
                       help="with --suggest or --trial: read this saved `sacct --allusers "
                       "--parsable2 "
                       "--allocations --format "
                       "JobID,Submit,Start,End,ReqTRES,User,State,Timelimit` output instead of "
                       "running sacct")
    group.add_argument("--group", metavar="NAME",
                       help="with --suggest or --trial: the node group (when several have a "
                       "menu)")


def plan_layouts(group: Any, nodes: int) -> Optional[list[list[Any]]]:
    """The group's Slurm-only GPUs laid out as the plan says, per node."""
    from gpushare.admin.relayout.menu import Layout, layout_name

    layouts = []
    for gpu in group.gpus:
        if not gpu.changeable:
            continue
        if gpu.mig:
            slices = tuple(s.profile for s in gpu.slices)
            layouts.append(Layout(layout_name(slices), tuple(sorted(slices))))
        elif gpu.mps:
            layouts.append(Layout(f"mps:{gpu.mps}", (), gpu.mps))
        else:
            layouts.append(Layout("whole"))
    return [list(layouts) for _ in range(nodes)] if layouts else None


def load_history(args: argparse.Namespace) -> Union[int, tuple[Any, Any, Any]]:
    """(plan, cluster, history) for --suggest and --trial: the plan's node group with a
    relayout menu as the simulator's cluster, and the sacct history (``--history`` or the
    last ``--days`` asked of sacct); else the exit status, the error printed."""
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.relayout.history import parse_sacct, read_sacct
    from gpushare.admin.relayout.sim import cluster_from_plan
    from gpushare.admin.slurm_client import SlurmClientError, installed_release
    from gpushare.admin.tres import recorded, untracked, untracked_line

    if args.days is None:
        args.days = DEFAULT_DAYS
    if not 0 < args.days <= MAX_DAYS:
        return fail("relayout", f"--days must be more than 0 and at most {MAX_DAYS:.0f}")
    try:
        plan = load_plan(args.plan)
        # As render and the controller: the installed release where the plan names none.
        release = None if plan.slurm.version_given else installed_release(args.sinfo,
                                                                           args.timeout)
        cluster = cluster_from_plan(plan, args.group, release=release)
    except PlanError as err:
        return fail("relayout", plan_problems(err))
    except ValueError as err:
        return fail("relayout", str(err))
    try:
        if args.history:
            with open(args.history, encoding="utf-8") as handle:
                history = parse_sacct(handle.read())
        else:
            history = read_sacct(args.sacct, args.days, max(args.timeout, 120.0))
            # sacct shows a job's GPUs only where slurmctld records their GRES: unseen, a
            # MIG job reads as a CPU job or a whole-GPU one, and the layout learnt is wrong.
            kinds = {kind for item in cluster.menu.items for kind in item.layout.offers()}
            kinds |= {kind for layout in cluster.fixed for kind in layout.offers()}
            unseen = untracked(kinds | {"whole"}, recorded(args.scontrol, args.timeout))
            if unseen:
                return fail("relayout", untracked_line(
                    unseen, "; the jobs that run after that are recorded, and --suggest "
                    "and --trial learn from them (or give a history that has them with "
                    "--history)"))
    except (OSError, UnicodeDecodeError) as err:
        return fail("relayout", f"{args.history}: cannot read the history: {err}")
    except (ValueError, SlurmClientError) as err:
        return fail("relayout", str(err))
    if not history.jobs:
        more = "a longer history in --history" if args.history else "a longer --days?"
        return fail("relayout", "no GPU job ran in that history; nothing to learn a layout "
                    f"from ({more})")
    return plan, cluster, history


def history_line(history: Any, cluster: Any) -> str:
    """What was read and where it is replayed, the first line of --suggest and --trial."""
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(history.skipped.items()))
    return (f"history: {len(history.jobs)} GPU jobs"
            + (f" ({skipped}: left out)" if skipped else "")
            + f"; replayed on node group {cluster.name}: {counted(cluster.nodes, 'node')} "
            f"with {counted(cluster.gpus_per_node, 'Slurm GPU')} each ({cluster.model.name})"
            + (f", beside Slurm's slices of {counted(len(cluster.fixed), 'GPU')} shared with "
               "Kubernetes" if cluster.fixed else "")
            + ("; one MIG profile per node (Slurm before 23.11)" if cluster.one_profile else ""))


def run(args: argparse.Namespace) -> int:
    from gpushare.admin.relayout.sim import simulate
    from gpushare.admin.relayout.static import best_static, spread

    loaded = load_history(args)
    if isinstance(loaded, int):
        return loaded
    plan, cluster, history = loaded
    try:
        counts, best = best_static(history.jobs, cluster)
    except ValueError as err:
        return fail("relayout", str(err))
    group = next(g for g in plan.groups if g.name == cluster.name)
    now_layouts = plan_layouts(group, cluster.nodes)
    today = simulate(history.jobs, now_layouts, False, cluster) if now_layouts else None
    per_node = spread(counts, cluster)
    # The plan's own indices of the GPUs a relayout may change (a row holds those only).
    indices = [gpu.index for gpu in group.gpus if gpu.changeable]
    if args.json:
        print(json.dumps({
            "group": cluster.name, "jobs": len(history.jobs), "skipped": history.skipped,
            "layout": {name: n for name, n in counts.items() if n},
            "nodes": {node: {str(index): layout.name for index, layout in zip(indices, row)}
                      for node, row in zip(group.nodes, per_node)},
            "mig_wait_s": round(best.mig_wait(), 1), "mean_completion_s": round(best.mean_jct(), 1),
            "unfinished": best.unfinished,
            "plan_layout": None if today is None else {
                "mig_wait_s": round(today.mig_wait(), 1),
                "mean_completion_s": round(today.mean_jct(), 1),
                "unfinished": today.unfinished}}, indent=2))
        return 0
    print(history_line(history, cluster))
    print("best static layout: " + ", ".join(f"{counted(n, 'GPU')} {name}"
                                              for name, n in counts.items() if n))
    for node, row in zip(group.nodes, per_node):
        print(f"  {node}: " + " ".join(f"GPU {index} {layout.name}"
                                        for index, layout in zip(indices, row)))
    print(f"replayed with it: MIG jobs wait {best.mig_wait() / 60:.1f} min on average, jobs "
          f"complete in {best.mean_jct() / 60:.1f} min"
          + (f", {best.unfinished} never ran" if best.unfinished else ""))
    if today is not None:
        print(f"replayed with the plan's layout: {today.mig_wait() / 60:.1f} min, "
              f"{today.mean_jct() / 60:.1f} min"
              + (f", {today.unfinished} never ran (a profile it lacks)" if today.unfinished
                 else ""))
    print("nothing changed; to lay the GPUs out so, run the node's step for each GPU shown "
          "(`gpushare relayout node --gpu N --layout L --apply` on the drained node, which "
          "records it for render and relayout), or let relayout start from it")
    return 0
