# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --trial``: would relayout have helped on this site's own history?

The benchmark shows relayout no worse than leaving a layout alone on workloads that were
not this site's; this replays the site's own sacct the same way
(:mod:`gpushare.admin.relayout.trial`), so an administrator sees it before turning the
timer on, and again when the workload changes.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from gpushare.cli import fail
from gpushare.cli.relayout_suggest import counted, history_line, load_history, plan_layouts


def _side(result: Any) -> dict[str, Any]:
    return {"mig_wait_s": round(result.censored_wait("mig"), 1),
            "wait_s": round(result.censored_wait(), 1),
            "completion_s": round(result.censored_jct(), 1),
            "never_started": len(result.unstarted)}


def _start_dict(start: Any) -> dict[str, Any]:
    moved = start.moved
    return {"start": start.label,
            "left_alone": _side(start.still),
            "relayout": {**_side(moved), "changes": moved.changes,
                         "changes_per_gpu_hour": round(moved.changes / moved.gpu_hours, 4)
                         if moved.gpu_hours else 0.0,
                         "jobs_disturbed": moved.disturbed},
            "ratios": {name: None if math.isinf(value) else value
                       for name, value in start.ratios().items()},
            "no_worse": start.no_worse()}


def _start_lines(start: Any) -> list[str]:
    from gpushare.admin.relayout.trial import times  # the simulator: only for --trial

    still, moved, ratios = start.still, start.moved, start.ratios()
    per_hour = moved.changes / moved.gpu_hours if moved.gpu_hours else 0.0
    lines = [f"from {start.label}, left alone -> with relayout:",
             f"  MIG and MPS jobs wait {still.censored_wait('mig') / 60:.1f} -> "
             f"{moved.censored_wait('mig') / 60:.1f} min ({times(ratios['mig_wait'])}), "
             f"every job {still.censored_wait() / 60:.1f} -> "
             f"{moved.censored_wait() / 60:.1f} min ({times(ratios['wait'])}), jobs "
             f"complete in {still.censored_jct() / 60:.1f} -> {moved.censored_jct() / 60:.1f}"
             f" min ({times(ratios['completion'])})",
             f"  {counted(moved.changes, 'change')} ({per_hour:.3f} per GPU-hour), "
             f"{counted(moved.disturbed, 'running job')} disturbed"
             + (f"; never started: {len(still.unstarted)} -> {len(moved.unstarted)}"
                if still.unstarted or moved.unstarted else "")]
    return lines


def run(args: argparse.Namespace) -> int:
    """The trial, its settings already checked as the round's (``relayout._run``)."""
    from gpushare.admin.relayout.trial import trial

    loaded = load_history(args)
    if isinstance(loaded, int):
        return loaded
    plan, cluster, history = loaded
    group = next(g for g in plan.groups if g.name == cluster.name)
    try:
        result = trial(history.jobs, cluster, plan_layouts(group, cluster.nodes),
                       args.keep_hours * 3600.0, args.max_changes, args.hysteresis)
    except ValueError as err:
        return fail("relayout", str(err))
    if args.json:
        print(json.dumps({"group": cluster.name, "jobs": len(history.jobs),
                          "skipped": history.skipped, "learned_on": result.first,
                          "replayed": result.second, "replayed_hours": round(result.hours, 2),
                          "learned_layout": result.learned,
                          "starts": [_start_dict(start) for start in result.starts],
                          "no_harm": result.no_harm()}, indent=2))
        return 0
    print(history_line(history, cluster))
    print(f"trial: the second half ({result.second} jobs over {result.hours:.1f} h) replayed "
          f"in the simulator, relayout's rounds every 5 minutes with the first half "
          f"({result.first} jobs) as their past, each job run for its sacct run time and "
          "known to the forecast by its time limit")
    print("the first half's best static layout: " + ", ".join(
        f"{counted(n, 'GPU')} {name}" for name, n in result.learned.items()))
    for start in result.starts:
        print("\n".join(_start_lines(start)))
    worse = [start.label for start in result.starts if not start.no_worse()]
    if worse:
        print("relayout would have made this history worse than leaving "
              + " and ".join(worse) + " alone: keep the timer off for this group (or "
              "start it from the layout it did no harm from), and try again when the "
              "workload changes")
    else:
        print("relayout did no harm on this history: from each start, no mean above what "
              "leaving the layout alone gave and no more jobs left unstarted")
    print("nothing changed (a replay in the simulator, not a prediction of the next weeks)")
    return 0
