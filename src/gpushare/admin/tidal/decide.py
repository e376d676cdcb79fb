# SPDX-License-Identifier: GPL-2.0-or-later
"""What a lending rule does now: the pure choice ``gpushare tidal`` and its benchmark share.

Given the clock, what the home side needs of the rule's devices, and what is lent, a rule
either lends more (up to ``max_lent``, never a device the home side needs) or reclaims
(all at the end of its window, or the home side's shortfall when its demand rises). It
touches nothing: the caller moves devices, journalled, through the drain path.

No reclaim ends borrowed work. A lent device takes only work that will be gone in time
(``fits``): by the end of its window, and for a rule with a demand within
``reclaim_minutes``, so that a reclaim on demand waits for it instead of ending it. A
window stops lending ``reclaim_minutes`` before its end. A rule with a window alone lends
for the window: it lends only what the home side does not need when it lends, and takes
it back at the window's end, not before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gpushare.admin.plan.lending import Device, LendingRule

__all__ = ["HomeUse", "Move", "RuleState", "decide", "decide_why", "fits", "lend_until"]

MINUTES_PER_DAY = 24 * 60


@dataclass(frozen=True)
class HomeUse:
    """The home side's use of the rule's devices now: ``needs`` devices (running and
    waiting work; a Kubernetes deployment's requested GPUs, Slurm's allocated and pending
    ones), of which ``busy`` are the ones it holds work on."""

    needs: int
    busy: frozenset[Device] = frozenset()


@dataclass
class RuleState:
    """What one rule remembers between rounds: since when the home side has been under
    the demand threshold (None: not under it now)."""

    idle_since: Optional[float] = None  # minutes, on the caller's clock


@dataclass(frozen=True)
class Move:
    device: Device
    rule: str
    to: str  # the scheduler that gets it: the borrower (lend) or the home (reclaim)
    why: str


def lend_until(rule: LendingRule, minute_of_day: int) -> Optional[int]:
    """Minutes from now until a borrower must have given the rule's devices back: the end
    of the window (None for a demand-only rule, whose borrowed work is ended on reclaim)."""
    if rule.window is None:
        return None
    return (rule.window.end - minute_of_day) % MINUTES_PER_DAY


def fits(rule: LendingRule, minute_of_day: int, time_limit_minutes: float) -> bool:
    """Whether work with this time limit, starting now, may run on a device the rule lent:
    it ends by the window's end, and (with a demand) within the reclaim promise."""
    left = lend_until(rule, minute_of_day)
    if left is not None and time_limit_minutes > left:
        return False
    return rule.demand is None or time_limit_minutes <= rule.reclaim_minutes


def _may_lend(rule: LendingRule, minute_of_day: int, now: float, use: HomeUse,
              state: RuleState) -> tuple[bool, str]:
    if rule.window is not None:
        if not rule.window.active(minute_of_day):
            return False, f"outside its window {rule.window.text()}"
        left = lend_until(rule, minute_of_day)
        if left is not None and left <= rule.reclaim_minutes:
            return False, (f"its window {rule.window.text()} ends in {left} min, within the "
                           f"{rule.reclaim_minutes} min promised to {rule.home}")
    if rule.demand is not None:
        share = 100.0 * use.needs / len(rule.devices)
        if share >= rule.demand.idle_below_percent:
            return False, (f"{rule.home} needs {use.needs} of its {len(rule.devices)} "
                           f"({share:.0f} %, not under {rule.demand.idle_below_percent} %)")
        idle = now - state.idle_since if state.idle_since is not None else 0.0
        if idle < rule.demand.for_minutes:
            return False, (f"{rule.home} under {rule.demand.idle_below_percent} % for "
                           f"{idle:.0f} of {rule.demand.for_minutes} min")
    when = f"in its window {rule.window.text()}" if rule.window is not None else ""
    idle_text = (f"{rule.home} under {rule.demand.idle_below_percent} % for "
                 f"{rule.demand.for_minutes}+ min") if rule.demand is not None else ""
    return True, " and ".join(text for text in (when, idle_text) if text)


def decide(rule: LendingRule, minute_of_day: int, now: float, use: HomeUse,
           lent: frozenset[Device], state: RuleState) -> list[Move]:
    """The moves for ``rule`` this round (``now`` in minutes on any steady clock); updates
    ``state``'s demand timer."""
    return decide_why(rule, minute_of_day, now, use, lent, state)[0]


def decide_why(rule: LendingRule, minute_of_day: int, now: float, use: HomeUse,
               lent: frozenset[Device], state: RuleState) -> tuple[list[Move], str]:
    """``decide``'s moves, and when there are none, why in words (the dry run and the
    round's log say it): one choice, so the words cannot disagree with it."""
    if rule.demand is not None:
        under = 100.0 * use.needs / len(rule.devices) < rule.demand.idle_below_percent
        if not under:
            state.idle_since = None
        elif state.idle_since is None:
            state.idle_since = now
    lent = frozenset(d for d in lent if d in rule.devices)
    ok, why = _may_lend(rule, minute_of_day, now, use, state)
    at_home = [d for d in rule.devices if d not in lent]
    if not ok and rule.window is not None and not rule.window.active(minute_of_day):
        return [Move(d, rule.name, rule.home, f"reclaimed: {why}") for d in sorted(lent)], why
    short = use.needs - len(at_home)
    if short > 0 and rule.demand is not None:
        # The home side needs more than it holds: its shortfall comes back, within the
        # promise (a window's devices are the borrower's until the window ends).
        return [Move(d, rule.name, rule.home, f"reclaimed: {rule.home} needs {use.needs} "
                     f"and holds {len(at_home)}") for d in sorted(lent)[:short]], why
    if not ok:
        return [], why
    if len(lent) >= rule.max_lent:
        return [], f"{len(lent)} lent, its max_lent"
    room = min(rule.max_lent - len(lent), len(at_home) - use.needs)
    if room <= 0:
        return [], f"{rule.home} needs {use.needs} of the {len(at_home)} at home: none to spare"
    free = [d for d in at_home if d not in use.busy][:room]
    if not free:
        return [], f"the {len(at_home) - use.needs} {rule.home} could spare hold its work"
    return [Move(d, rule.name, rule.borrower, f"lent: {why}") for d in free], ""
