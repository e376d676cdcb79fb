# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal``: what the plan's lending rules would move, at a time, and why.

A dry run: it reads the plan, takes the time (now, or ``--at``) and what the home side
needs of each rule's devices (``--needs RULE=N``; a rule with a demand is not judged
without it), and prints per rule whether its window is open, when it next opens, stops
lending and reclaims, and which devices would be lent or reclaimed now. It changes
nothing.
"""

from __future__ import annotations

import argparse
import datetime
from typing import TYPE_CHECKING, Optional, Sequence

from gpushare.cli import StepHelp, fail, step_word, text_table

if TYPE_CHECKING:
    from gpushare.admin.plan.lending import LendingRule

__all__ = ["register"]


HOLDERS_STEP = (
    "`gpushare tidal holders --gpu N` runs on a node: which pods the kubelet's "
    "PodResources API lists holding the device; exit 0 none, 1 held, 2 unknown.")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tidal",
        help="what the plan's lending rules would move between Kubernetes and Slurm now",
        description="A dry run of the plan's lending rules (`lending:`): at a time (now, or "
        "--at), given what the home side needs of each rule's devices (--needs), print "
        "whether each rule lends or reclaims, which devices, and why; and when its window "
        "next opens, stops lending and reclaims. Changes nothing. Exit status: 0 printed, "
        "2 bad arguments or plan.\n\n"
        "With --apply (on the controller, as root) the moves are made, each journalled step "
        "by step: the holder is fenced (a DeviceTaintRule or node taint in Kubernetes; "
        "Slurm's drain), the home side lets go (the node's kubelet lists no pod holding the "
        "device; the Slurm node is idle), the device is given (the state file, Gres= and "
        "the shared gres.conf, `scontrol reconfigure`), the other side is unfenced. A run "
        "first finishes or undoes what a killed run left. Exit status: 0 every move made, "
        "1 one was undone or left for the next run, 2 nothing could start.\n\n"
        + HOLDERS_STEP,
        epilog="examples:\n  gpushare tidal --plan /etc/gpushare/plan.yaml\n"
        "  gpushare tidal --at 23:30 --needs night-batch=0                       # a lend\n"
        "  gpushare tidal --at 23:30 --lent night-batch=6 --needs night-batch=8  # a reclaim\n"
        "  gpushare tidal --apply --cluster-gres-conf /etc/slurm/gres.conf\n"
        "  gpushare tidal holders --gpu 0\n"
        "  gpushare tidal --metrics > /var/lib/node_exporter/textfile/gpushare_tidal.prom",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    from gpushare.cli.tidal_apply import HOLDERS_GROUP

    parser.add_argument("-h", "--help", action=StepHelp, steps={"holders": (
        HOLDERS_STEP, "examples:\n  gpushare tidal holders --gpu 0\n"
        "  gpushare tidal holders --devices 0:-1:-:-,1:2:1g.5gb:-", (HOLDERS_GROUP,), ())},
        help="show this help and exit (after holders: the node's holders query's)")
    parser.add_argument("action", nargs="?", choices=["holders"], metavar="holders",
                        type=step_word("tidal", "holders", "on a node: which pods hold a "
                                       "device"),
                        help="the word holders: on a node, which pods hold a device "
                        "(gpushare tidal holders --help)")
    parser.add_argument("--plan", default="/etc/gpushare/plan.yaml", metavar="FILE",
                        help="the ownership plan (default: %(default)s)")
    parser.add_argument("--at", metavar="TIME",
                        help="the controller's local time to judge, HH:MM or "
                        "'YYYY-MM-DD HH:MM' (default: now); with --apply the rules are "
                        "judged as at TIME, e.g. to open a window early")
    parser.add_argument("--needs", action="append", default=[], metavar="RULE=N",
                        help="devices of RULE its home side needs now (running and waiting "
                        "work), taken as having held for the rule's demand.for_minutes; "
                        "repeatable. Without it a rule with a demand is not judged")
    parser.add_argument("--lent", action="append", default=[], metavar="RULE=N",
                        help="how many of RULE's devices are lent now, the first N in the "
                        "rule's order, at most its max_lent (default 0; with --apply the "
                        "state file says); repeatable")
    from gpushare.cli.tidal_apply import register_options

    register_options(parser)
    parser.set_defaults(func=_run)


def _when(text: Optional[str]) -> datetime.datetime:
    if text is None:
        return datetime.datetime.now()
    for form in ("%H:%M", "%Y-%m-%d %H:%M"):
        try:
            parsed = datetime.datetime.strptime(text, form)
        except ValueError:
            continue
        if form == "%H:%M":
            return datetime.datetime.combine(datetime.date.today(), parsed.time())
        return parsed
    raise ValueError(f"--at {text!r} is not HH:MM or 'YYYY-MM-DD HH:MM'")


def _counts(option: str, values: list[str], names: set[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not number.isdigit():
            raise ValueError(f"{option} {value!r} must be RULE=N, N a whole number")
        if name not in names:
            raise ValueError(f"{option} {value!r}: the plan has no lending rule {name!r}; it "
                             f"has {', '.join(sorted(names)) or 'none'}")
        found[name] = int(number)
    return found


def _within_max_lent(rules: Sequence[LendingRule], lent: dict[str, int]) -> None:
    """A rule never has more lent than its max_lent: a larger --lent is a state that
    cannot be, and the dry run would reclaim devices that were never lent."""
    for rule in rules:
        if lent.get(rule.name, 0) > rule.max_lent:
            raise ValueError(f"--lent {rule.name}={lent[rule.name]}: rule {rule.name} lends "
                             f"at most {rule.max_lent} of its {len(rule.devices)} devices "
                             "(max_lent)")


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _schedule(rule: LendingRule) -> str:
    if rule.window is None:
        return "demand only"
    stop = (rule.window.end - rule.reclaim_minutes) % (24 * 60)
    return (f"opens {_clock(rule.window.start)}, stops lending {_clock(stop)}, reclaims "
            f"{_clock(rule.window.end)}")


def _run(args: argparse.Namespace) -> int:
    from gpushare.admin.plan import PlanError, load_plan
    from gpushare.admin.tidal.decide import HomeUse, RuleState, decide_why

    if args.action == "holders":
        from gpushare.cli.tidal_node import holders

        return holders(args)
    try:
        plan = load_plan(args.plan)
    except PlanError as err:
        return fail("tidal", str(err))
    names = {rule.name for rule in plan.lending}
    try:
        when = _when(args.at)
        needs = _counts("--needs", args.needs, names)
        lent_counts = _counts("--lent", args.lent, names)
        _within_max_lent(plan.lending, lent_counts)
    except ValueError as err:
        return fail("tidal", str(err))
    if not plan.lending:
        print(f"{plan.path}: no lending rules; every device stays with its owner "
              "(docs/admin.md: lending)")
        return 0
    if args.metrics:
        from gpushare.cli.tidal_apply import metrics

        return metrics(args, plan)
    if args.apply:
        from gpushare.cli.tidal_apply import apply

        if args.lent:
            return fail("tidal", "--apply acts on what the state file says is lent: drop "
                        "--lent")
        return apply(args, plan, when, needs)
    minute = when.hour * 60 + when.minute
    print(f"at {when:%Y-%m-%d %H:%M} (dry run: nothing moves)")
    rows = [["RULE", "HOME → BORROWER", "DEVICES", "LENT", "WINDOW", "NOW"]]
    details: list[str] = []
    for rule in plan.lending:
        lent = frozenset(rule.devices[:min(lent_counts.get(rule.name, 0), len(rule.devices))])
        if rule.demand is not None and rule.name not in needs:
            verdict = f"not judged: give --needs {rule.name}=N (its demand needs the home " \
                      "side's use)"
        else:
            state = RuleState()
            if rule.demand is not None:  # --needs says now; assume it held for the time asked
                state.idle_since = -float(rule.demand.for_minutes)
            use = HomeUse(needs=needs.get(rule.name, 0))
            moves, why = decide_why(rule, minute, 0.0, use, lent, state)
            lend = [m for m in moves if m.to == rule.borrower]
            back = [m for m in moves if m.to == rule.home]
            verdict = (f"lend {len(lend)}" if lend else f"reclaim {len(back)}" if back
                       else "no change: " + why)
            details += [f"  {rule.name}: {m.device.describe()} → {m.to}: {m.why}"
                        for m in moves]
        window = "—" if rule.window is None else (
            "open" if rule.window.active(minute) else "closed")
        rows.append([rule.name, f"{rule.home} → {rule.borrower}", str(len(rule.devices)),
                     f"{len(lent)}/{rule.max_lent}", f"{window} ({_schedule(rule)})", verdict])
    for line in text_table(rows):
        print(line)
    if details:
        print("moves:")
        print("\n".join(details))
    return 0
