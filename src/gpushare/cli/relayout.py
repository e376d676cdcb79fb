# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout``: which idle GPUs should take which MIG layout of their group's menu,
so that what the queue waits for can start; prints the decision and why. ``gpushare relayout
node`` is the node's step: lay one GPU of this node out anew through NVML (dry run unless
``--apply``)."""

from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from gpushare.admin.relayout import DEFAULT_KEEP_H, DEFAULT_NODE_COMMAND
from gpushare.cli import (
    StepHelp,
    add_slurm_arguments,
    fail,
    plan_problems,
    relayout_node,
    relayout_suggest,
    relayout_trial,
    step_word,
    text_table,
)

NODE_GROUP = "the node's step (gpushare relayout node)"
# The options of the controller's round, refused after the word node (the step ignores them).
CONTROLLER_ONLY = ("node_command", "slurmd_restart", "slurmctld_restart", "slurm_conf",
                   "cluster_gres_conf", "drain_timeout", "parallel", "settle_timeout",
                   "max_changes", "hysteresis", "max_drain", "keep_hours", "lookback", "squeue",
                   "explain", "suggest", "trial", "days", "sacct", "history", "group", "json",
                   "backend")
# The node's step's own options, refused without the word node (the round ignores them).
STEP_ONLY = ("gpu", "layout", "node", "round", "decision", "source", "gres_conf", "lock_dir",
             "unchecked")
NODE_STEP = (
    "`gpushare relayout node --gpu N --layout L` is the node's step, run as root on a "
    "drained node: it checks that the plan gives GPU N wholly to Slurm and lists L on "
    "its group's menu, that no process uses the GPU and (with --apply) that slurmctld "
    "shows the node drained or down with no job on it (scontrol), then destroys its "
    "MIG instances and creates L's through NVML, verifies them, restores the old layout "
    "on any failure or after --step-timeout, rewrites this node's gres.conf and records "
    "the layout in the state file beside the plan. Exit status 0: changed (or nothing "
    "to change), 2: refused, or failed with the old layout laid back, 3: failed and the "
    "old layout could not be laid back, gres.conf was not rewritten, or another step "
    "holds the node (keep the node drained).")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "relayout",
        help="choose MIG layouts for idle GPUs from what the Slurm queue waits for (dry run; "
        "--apply carries it out)",
        description="Read the pending jobs' GPU requests (squeue) and what slurmctld's nodes "
        "hold, and choose, within each node group's relayout menu and bounds in the plan, "
        "which idle Slurm-only GPUs should change layout so that the most waiting GPU work "
        "can start, weighted by how long it has waited. Each node's candidate is then made "
        "only where a 4-hour forecast from the live queue (each job for its time limit, the "
        "last --lookback's submissions recurring, and none; a MIG or MPS job still waiting "
        "at its end counted on at its kind's pace) says the wait of all jobs and the "
        "completion time both fall by more than twice the change's duration and neither "
        "MIG and MPS nor whole-GPU jobs wait longer (--explain shows it). Then, where a "
        "kind has fewer units than its jobs held at once in the last --keep-hours (whole "
        "GPUs too, up to what the plan gives it), idle GPUs of a node that can drain go "
        "back to the plan's layouts, made only where the forecast finds no mean growing by "
        "more than twice the change's duration. Prints demand "
        "beside supply per type, each change and why, and the nodes that would be drained; "
        "without --apply nothing changes.\n\n"
        "With --apply, on the controller: each node of the decision is drained (its jobs "
        "run to their end: Slurm has no per-GPU drain), and once idle the node's step runs "
        "for each changed GPU through --node-command (e.g. ssh); each applied layout is "
        "recorded in the state file (--state, default relayout-state.json beside the plan), "
        "the node's Gres= is set on its slurm.conf line (--slurm-conf), `scontrol "
        "reconfigure` makes slurmctld and slurmd see it (before Slurm 23.11 slurmctld is "
        "then restarted, --slurmctld-restart), and the node is resumed once "
        "slurmctld shows the new GRES. A step that fails and lays the old layout back "
        "resumes the node unchanged; a step whose result is unknown, or a Slurm step that "
        "fails, leaves the node drained with the cause as its reason. render, check and "
        "status read the same state file. One run at a time (a lock beside the state file); "
        "slurm.conf is checked writable for every node (no Include'd NodeName line, no "
        "configless copy, a symlink only to root's file) before anything is drained; a "
        "journal beside the state file records each step first, and the next run finishes "
        "or rolls back a run that was killed; nodes change --parallel at once.\n\n"
        + NODE_STEP,
        epilog="examples:\n  gpushare relayout --plan /etc/gpushare/plan.yaml\n"
        "  gpushare relayout --trial --days 14     # would relayout have helped here?\n"
        "  gpushare relayout --apply --node-command 'ssh {node} gpushare relayout node "
        "--node {node} --gpu {gpu} --layout {layout} --round={round} --decision {decision} "
        "--step-timeout {timeout} --apply'\n"
        "  gpushare relayout node --gpu 2 --layout 2x3g.40gb\n"
        "  gpushare relayout node --gpu 2 --layout 2x3g.40gb --apply",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument("-h", "--help", action=StepHelp, steps={"node": (
        NODE_STEP, "examples:\n  gpushare relayout node --gpu 2 --layout 2x3g.40gb\n"
        "  gpushare relayout node --gpu 2 --layout 2x3g.40gb --apply",
        (NODE_GROUP,), ("--plan", "--apply", "--state", "--scontrol"))},
        help="show this help and exit (after node: the node's step's)")
    parser.add_argument("step", nargs="?", choices=["node"], metavar="node",
                        type=step_word("relayout", "node", "the node's step, run on the node; "
                                       "its node is --node NAME"),
                        help="the word node: lay one GPU of this node out anew (the node's "
                        "step; gpushare relayout node --help)")
    parser.add_argument("--plan", default="/etc/gpushare/plan.yaml", metavar="FILE",
                        help="the ownership plan (default /etc/gpushare/plan.yaml)")
    node = parser.add_argument_group(NODE_GROUP)
    node.add_argument("--gpu", type=int, metavar="N", help="NVML index of the GPU to change")
    node.add_argument("--layout", metavar="L",
                      help="the new layout, one of the group's menu (e.g. 2x3g.40gb, whole)")
    parser.add_argument("--apply", action="store_true",
                        help="carry the decision out (the node's step: change the GPU); "
                        "default: say what would change")
    parser.add_argument("--state", metavar="FILE",
                        help="the applied layouts (default relayout-state.json beside the "
                        "plan; 'none': neither read nor written)")
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
                      "(default 120); with --apply on the controller, {timeout} of "
                      "--node-command")
    node.add_argument("--round", default="", metavar="N=L,...",
                      help="the other GPUs of this node that the same round changes, and to "
                      "what (Slurm 22.05's one MIG profile per node counts them so)")
    node.add_argument("--decision", default="", metavar="ID",
                      help="the controller's decision, recorded in the state file")
    node.add_argument("--unchecked", action="store_true",
                      help="with --apply, change the GPU even where slurmctld cannot be asked "
                      "whether the node is drained with no job on it (slurmctld down: the "
                      "node must be out of service all the same)")
    node.add_argument("--lock-dir", default="/run/gpushare", metavar="DIR",
                      help="with --apply, where the step takes its node's lock (one step "
                      "per node at a time: a step a killed run left behind is waited for "
                      f"{relayout_node.LOCK_WAIT_S:g} s, then refused, exit 3; default "
                      "/run/gpushare)")
    ctl = parser.add_argument_group("carrying a decision out (gpushare relayout --apply)")
    ctl.add_argument("--node-command", default=DEFAULT_NODE_COMMAND, metavar="CMD",
                     help="runs the node's step as root on the node; {node}, {gpu}, "
                     "{layout}, {round}, {decision} and {timeout} are filled in (default: "
                     f"{DEFAULT_NODE_COMMAND.replace('%', '%%')})")
    ctl.add_argument("--slurmd-restart", default="", metavar="CMD",
                     help="also run this after `scontrol reconfigure` (e.g. 'ssh {node} "
                     "systemctl restart slurmd'; default: none, reconfigure is enough)")
    ctl.add_argument("--slurmctld-restart", metavar="CMD",
                     help="restarts slurmctld after a node's Gres= changed, for Slurm before "
                     "23.11, whose `scontrol reconfigure` keeps a node's GPU count (running "
                     "jobs live on); default there: 'systemctl restart slurmctld' (run "
                     "relayout on the controller host), 'none' to never restart (the node "
                     "then stays drained); not needed from 23.11, whose reconfigure restarts it")
    ctl.add_argument("--slurm-conf", metavar="FILE",
                     help="the slurm.conf holding the nodes' NodeName lines, whose Gres= is "
                     "set (default $SLURM_CONF, else /etc/slurm/slurm.conf)")
    ctl.add_argument("--cluster-gres-conf", default="", metavar="FILE",
                     help="a gres.conf that every node shares, rendered again from the plan "
                     "and the applied layouts before `scontrol reconfigure` (then give the "
                     "node's step --gres-conf none); default: none, each node's step "
                     "rewrites its own")
    ctl.add_argument("--drain-timeout", type=float, metavar="SECONDS",
                     help="how long to wait for a drained node's jobs to end; past it the "
                     "node is resumed unchanged (default: --max-drain)")
    ctl.add_argument("--parallel", type=int, default=4, metavar="N",
                     help="change at most N drained nodes at once (default 4); each node's "
                     "failure is its own")
    ctl.add_argument("--settle-timeout", type=float, default=120.0, metavar="SECONDS",
                     help="how long slurmctld may take to show the new GRES, a restarted "
                     "slurmctld to hear from the node's slurmd, and a node resumed after a "
                     "killed run to answer (default 120)")
    parser.add_argument("--max-changes", type=int, default=4, metavar="N",
                        help="at most N GPUs change per round (default 4)")
    parser.add_argument("--hysteresis", type=float, default=0.5, metavar="GPUS",
                        help="a change must let more than this many GPUs' worth of waiting "
                        "work start, twice that on a node with jobs (default 0.5)")
    parser.add_argument("--max-drain", type=float, default=5400.0, metavar="SECONDS",
                        help="change GPUs of a node with jobs only if their time limits end "
                        "within this many seconds (default 5400): Slurm keeps the node out "
                        "of service until they end")
    parser.add_argument("--lookback", type=float, default=3600.0, metavar="SECONDS",
                        help="the jobs submitted within this many seconds stand for those "
                        "of each such span to come in the forecast that guards each change "
                        "(default 3600; 0: weigh the waiting jobs alone): the waiting ones "
                        "from squeue, the started ones from the --keep-hours sacct output "
                        "(squeue shows an ended job only for MinJobAge)")
    parser.add_argument("--keep-hours", type=float, default=DEFAULT_KEEP_H, metavar="H",
                        help="no change leaves a MIG profile or MPS fewer slices than its jobs "
                        "held at once in the last H hours (read with sacct), up to what the "
                        "plan's own layouts give it, and while MPS jobs held units no node "
                        "with MPS GPUs gains a whole GPU; where sacct fails, shows no job "
                        "from before the window (accounting younger than H), or cannot show "
                        "a kind (slurm.conf's AccountingStorageTRES does not list it: `gpushare "
                        "render slurm-conf`), each keeps what the plan gives it (default "
                        f"{DEFAULT_KEEP_H:g}; 0: no floors)")
    parser.add_argument("--squeue", default="/usr/bin/squeue", metavar="PATH",
                        help="absolute path of squeue (default /usr/bin/squeue)")
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    parser.add_argument("--explain", action="store_true",
                        help="also print each candidate change's predicted waits (all jobs, "
                        "MIG and MPS, whole-GPU) and completion time with and without it, "
                        "and the verdict")
    relayout_suggest.add_arguments(parser)
    add_slurm_arguments(parser)
    parser.set_defaults(func=_run, defaults={
        dest: parser.get_default(dest) for dest in CONTROLLER_ONLY + STEP_ONLY})


def format_decision(decision: Any, verdicts: Sequence[Any] = (), explain: bool = False,
                    lookback_s: float = 3600.0) -> str:
    """The decision in words; each candidate's prediction with and without it (``explain``:
    its figures too)."""
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
    if explain and verdicts:
        from gpushare.admin.relayout.predict import HORIZON_S, SAFETY

        future = (f"the last {lookback_s / 3600:g} h's submissions repeated" if lookback_s
                  else "no submission")
        lines.append(f"predictions (the next {HORIZON_S / 3600:g} h from the live queue, each "
                     f"job run for its time limit, {future}, a MIG or MPS job not started "
                     "counted on past them at its kind's pace; a change is made when both the "
                     f"wait and completion fall by more than {SAFETY:g} x its duration and "
                     "neither class waits longer):")
        rows = [["node", "gpus", "to", "", "wait", "MIG wait", "whole wait", "completion",
                 "jobs", "started", "verdict"]]
        for v in verdicts:
            for label, f in (("without", v.without), ("with", v.with_it)):
                first = label == "without"
                rows.append([v.node if first else "",
                             ",".join(str(c.index) for c in v.changes) if first else "",
                             v.changes[0].new if first else "", label,
                             f"{f.wait_s / 60:.1f} min", f"{f.mig_wait_s / 60:.1f} min",
                             f"{f.whole_wait_s / 60:.1f} min", f"{f.completion_s / 60:.1f} min",
                             str(f.jobs), str(f.started),
                             f"change {v.cost_s:.0f} s" if first else
                             "made" if v.made else "refused"])
        lines += ["  " + row for row in text_table(rows)]
    elif explain:
        lines.append("predictions: none, as no change was a candidate this round (see why)")
    return "\n".join(lines)


def _given(args: argparse.Namespace, dests: tuple[str, ...]) -> list[str]:
    """Which of ``dests`` the command line set (each as its flag, in ``dests``' order)."""
    return ["--" + dest.replace("_", "-") for dest in dests
            if getattr(args, dest) != args.defaults[dest]]


def _run(args: argparse.Namespace) -> int:
    if args.step == "node":
        given = _given(args, CONTROLLER_ONLY)
        if given:
            return fail("relayout node", f"{', '.join(given)}: the controller's (`gpushare "
                        "relayout [--apply]`), which the node's step would ignore")
        return relayout_node.run(args)
    step_only = _given(args, STEP_ONLY)
    if step_only:
        return fail("relayout", f"{', '.join(step_only)}: the node's step's, e.g. `gpushare "
                    "relayout node --gpu N --layout L`; without the word node, relayout "
                    "decides for the whole cluster (and with --apply drains and changes it)")
    if args.suggest and args.trial:
        return fail("relayout", "--suggest and --trial each replay the history: give one")
    if (args.suggest or args.trial) and args.apply:
        return fail("relayout", f"--{'suggest' if args.suggest else 'trial'} replays the "
                    "history and changes nothing: give it without --apply")
    if args.suggest:
        return relayout_suggest.run(args)
    misplaced = [] if args.trial else relayout_suggest.misplaced(args)
    if misplaced:
        return fail("relayout", f"{', '.join(misplaced)} only with --suggest or --trial")
    from gpushare.admin.plan import PlanError, load_plan

    # The round's settings, --trial's rounds' too.
    if not 0 <= args.max_changes <= 1000:
        return fail("relayout", "--max-changes must be between 0 and 1000")
    if not 0.1 <= args.timeout <= 600:
        return fail("relayout", "--timeout must be between 0.1 and 600 seconds")
    if not 0 <= args.keep_hours <= 24 * 366:
        return fail("relayout", "--keep-hours must be between 0 and 8784 (a year)")
    if not 0 <= args.lookback <= 7 * 86400:
        return fail("relayout", "--lookback must be between 0 and 604800 seconds (a week)")
    if args.trial:
        return relayout_trial.run(args)
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        return fail("relayout", plan_problems(err))
    menus = {group.name: group.relayout for group in plan.groups if group.relayout is not None}
    if not menus:
        return fail("relayout", f"no node group of {args.plan} has a relayout menu; see "
                    "docs/admin.md, MIG layouts that follow the queue")
    state_path = relayout_node.state_path(args)
    if args.apply:
        if not state_path:
            return fail("relayout", "--apply records what it changes: give --state FILE")
        from gpushare.cli.relayout_apply import locked_round

        return locked_round(args, plan, menus, state_path, _round)
    return _round(args, plan, menus, state_path)


def _round(args: argparse.Namespace, plan: Any, menus: Any, state_path: str) -> int:
    import time

    from gpushare.admin.plan.model import with_slurm_version
    from gpushare.admin.relayout.demand import (
        merge_recent,
        partitions,
        pending,
        planned,
        recent,
        running_ends,
        supply,
    )
    from gpushare.admin.relayout.keep import capacity
    from gpushare.admin.relayout.menu import one_profile_per_node
    from gpushare.admin.relayout.predict import decide_guarded
    from gpushare.admin.relayout.restore import Back
    from gpushare.admin.relayout.state import (
        AppliedState,
        StateError,
        last_changes,
        layouts_of,
        load_state,
    )
    from gpushare.admin.slurm_client import SlurmClientError, installed_release, open_client

    try:
        state = load_state(state_path) if state_path else AppliedState("")
        layouts = layouts_of(plan, state)
    except StateError as err:
        return fail("relayout", str(err))
    try:
        client = open_client(args.backend, args.sinfo, args.scontrol, args.timeout)
        known = client.nodes()
        gpus = supply(plan, known, layouts=layouts,
                      last_change_s=last_changes(state, time.time()),
                      ends=running_ends(args.squeue, args.timeout))
        queue = pending(args.squeue, args.timeout,
                        nodes_of=partitions(args.sinfo, args.timeout), lookback_s=args.lookback)
        ended = recent(args.squeue, args.timeout, lookback_s=args.lookback)
    except SlurmClientError as err:
        return fail("relayout", str(err))
    version = plan.slurm.version if plan.slurm.version_given else \
        (installed_release() or plan.slurm.version)
    plan = with_slurm_version(plan, version)  # what it renders (gres.conf) is for that release
    own = planned(plan, gpus)
    kept, accounted = _floors(args, capacity(own))
    submitted = queue.recent + merge_recent(ended, accounted)
    back = Back({(gpu.node, gpu.index): layout for gpu, layout in zip(gpus, own)},
                kept.wanted) if kept and kept.wanted is not None else None
    decision, verdicts = decide_guarded(
        queue.requests, gpus, menus, args.max_changes, args.hysteresis,
        max_drain_s=args.max_drain, one_profile_per_node=one_profile_per_node(version),
        recent=submitted, lookback_s=args.lookback, floors=kept.by_kind if kept else None,
        back=back)
    if kept:
        decision.why.append(kept.line())
    if args.lookback:
        decision.why.append(_recent_line(args, queue.recent, submitted, accounted))
    unknown = _unknown_nodes(plan, known)
    if unknown:
        decision.why.append(f"left out: {unknown}, the plan's nodes with a relayout menu that "
                            "slurmctld does not know (check their names against slurm.conf's "
                            "NodeName lines)")
    if queue.skipped:
        decision.why.append("not counted (they could not start on any layout): " + ", ".join(
            f"{n} {why}" for why, n in sorted(queue.skipped.items())))
    if args.apply:
        from gpushare.cli.relayout_apply import apply

        return apply(args, plan, decision, state_path, version,
                     format_decision(decision, verdicts, args.explain, args.lookback),
                     _decision_json(decision, verdicts, kept))
    if args.json:
        print(json.dumps(_decision_json(decision, verdicts, kept), indent=2))
        return 0
    print(format_decision(decision, verdicts, args.explain, args.lookback))
    return 0


def _unknown_nodes(plan: Any, known: Sequence[Any]) -> str:
    """The nodes of groups with a menu that slurmctld does not list, as a hostlist."""
    import hostlist

    names = {node.name for node in known}
    return hostlist.collect_hostlist([node for group in plan.groups if group.relayout
                                      for node in group.nodes if node not in names])


def _recent_line(args: argparse.Namespace, waiting: Sequence[Any], submitted: Sequence[Any],
                 accounted: Sequence[Any]) -> str:
    """Where the forecast's recurring submissions came from, in words."""
    listed = len(submitted) - len(waiting) - len(accounted)
    line = (f"forecast: the last {args.lookback / 3600:g} h's {len(submitted)} GPU "
            f"requests recur ({len(waiting)} still waiting, {len(accounted)} started per "
            f"sacct, {listed} per squeue)")
    if not accounted and not args.keep_hours:
        line += ("; squeue shows an ended job only for MinJobAge after it ends, so short "
                 "jobs are missing: --keep-hours reads sacct")
    return line


def _floors(args: argparse.Namespace, baseline: dict[str, int]) -> tuple[Any, list[Any]]:
    """The floors of this round (``keep``), None with ``--keep-hours 0``: what MIG and MPS
    jobs held at once in the last ``--keep-hours``, up to what ``baseline`` (the plan's own
    layouts) gives each; where sacct fails or does not reach back to the window's start,
    what the plan gives each, and so for a kind whose jobs slurmctld does not record in
    accounting (sacct would show none). With them, the started GPU jobs of the last
    ``--lookback`` that the same sacct output shows (none where it was not read)."""
    from functools import partial

    from gpushare.admin.relayout.history import read_window
    from gpushare.admin.relayout.keep import Floors, floors, unknown
    from gpushare.admin.slurm_client import SlurmClientError
    from gpushare.admin.tres import recorded, untracked, untracked_line

    if not args.keep_hours:
        return None, []
    window = f"the last {args.keep_hours:g} h of sacct"
    plans = unknown(baseline)
    way_out = "give --keep-hours 0 to decide without it"
    unknown_floors = partial(Floors, plans, known=False, wanted=baseline)
    try:
        unseen = untracked(plans, recorded(args.scontrol, args.timeout))
    except SlurmClientError as err:
        return unknown_floors(f"slurmctld's AccountingStorageTRES could not be read ({err}), "
                              f"so whether sacct shows each kind's jobs is unknown; fix it, or "
                              f"{way_out}"), []
    try:
        read = read_window(args.sacct, args.keep_hours, args.timeout, lookback_s=args.lookback)
    except SlurmClientError as err:
        return unknown_floors(f"{window} could not be read ({err}); fix sacct (slurmdbd), "
                              f"or {way_out}"), []
    why = untracked_line(unseen, f", or {way_out}")
    if unseen and len(unseen) == len(plans):
        return unknown_floors(why, unseen=tuple(unseen)), read.recent
    if not read.reaches:
        return unknown_floors(f"sacct shows no job that started before the last "
                              f"{args.keep_hours:g} h: accounting may be younger than that, "
                              "and a kind whose jobs come once a day may not have shown them "
                              "yet; this holds until sacct shows a job from before the window "
                              f"({way_out}, or a shorter window)"), read.recent
    wanted = floors(read.spans, 0.0, args.keep_hours * 3600, baseline, whole=True)
    wanted.update({kind: baseline[kind] for kind in unseen})
    held = {kind: n for kind, n in wanted.items() if kind in plans}
    return Floors(held, window, unseen=tuple(unseen), unseen_why=why if unseen else "",
                  wanted=wanted), read.recent


def _forecast_json(forecast: Any) -> dict[str, Any]:
    return {"wait_s": round(forecast.wait_s, 1), "mig_wait_s": round(forecast.mig_wait_s, 1),
            "whole_wait_s": round(forecast.whole_wait_s, 1),
            "completion_s": round(forecast.completion_s, 1), "jobs": forecast.jobs,
            "mig_jobs": forecast.mig_jobs, "started": forecast.started}


def _decision_json(decision: Any, verdicts: Sequence[Any] = (), kept: Any = None
                   ) -> dict[str, Any]:
    return {"demand": decision.demand, "supply": decision.supply,
            "floors": None if kept is None else {"by_kind": dict(kept.by_kind),
                                                 "from_history": kept.known,
                                                 "source": kept.source,
                                                 "unseen": list(kept.unseen),
                                                 "wanted": None if kept.wanted is None
                                                 else dict(kept.wanted)},
            "changes": [{"node": c.node, "gpu": c.index, "from": c.old, "to": c.new,
                         "gain": round(c.gain, 3), "node_busy": c.node_busy}
                        for c in decision.changes],
            "predictions": [{"node": v.node, "gpus": [c.index for c in v.changes],
                             "to": v.changes[0].new, "without": _forecast_json(v.without),
                             "with": _forecast_json(v.with_it), "cost_s": v.cost_s,
                             "made": v.made, "refusal": v.refusal, "back": v.back}
                            for v in verdicts],
            "drain": decision.drain, "why": decision.why}
