# SPDX-License-Identifier: GPL-2.0-or-later
"""What is lent now: the tidal state file beside the plan.

``gpushare tidal --apply`` records each device it has given to its rule's borrower (since
when), each demand rule's timer (since when its home side has been under the threshold),
and the counters the metrics show. Render, check and the next round read the plan with these
devices lent (``plan_with_lent``), so they compare against what the schedulers hold now.

Format (version 1)::

    {"version": 1,
     "lent": [{"node": "k1", "gpu": 0, "slice": -1, "rule": "night", "since": 1767225600.0}],
     "idle_since": {"night": 1767222000.0},
     "counters": {"lent_seconds": {"kubernetes": 0.0, "slurm": 7200.0}, "reclaims": 1,
                  "reclaim_seconds": 95.0, "reclaim_seconds_max": 95.0,
                  "refused": {"window": 0, "demand": 2, "max_lent": 0, "busy": 1,
                              "failed": 0}}}

Every lent device must still be named by its rule in the plan, or the file is refused with
what is wrong (a plan edited under a lent device is the administrator's to settle).
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from typing import Any

from gpushare.admin.plan import Plan
from gpushare.admin.plan.lending import Device, LendingRule
from gpushare.admin.relayout.state import StateError as RelayoutStateError
from gpushare.admin.relayout.state import read_text
from gpushare.admin.tidal.metrics import REFUSALS, TidalCounters
from gpushare.admin.tidal.moves import K8S, SLURM
from gpushare.common.versioned import versioned_json

__all__ = ["Lent", "StateError", "TidalState", "default_path", "dump_state", "lent_report",
           "load_state",
           "parse_state", "save_state"]

STATE_VERSION = 1
STATE_NAME = "tidal-state.json"


class StateError(RelayoutStateError):
    """The state file cannot be read or does not fit the plan (a relayout StateError, so
    render and check report both files' faults alike)."""


@dataclass(frozen=True)
class Lent:
    rule: str
    since: float  # seconds since the epoch


@dataclass
class TidalState:
    path: str
    lent: dict[Device, Lent] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    counters: TidalCounters = field(default_factory=TidalCounters)

    def lent_to(self, plan: Plan) -> list[tuple[Device, str]]:
        """(device, borrower) for ``plan_with_lent``."""
        rules = {rule.name: rule for rule in plan.lending}
        return [(device, rules[entry.rule].borrower) for device, entry in
                sorted(self.lent.items()) if entry.rule in rules]

    def check(self, plan: Plan) -> None:
        """Every lent device is still its rule's in ``plan`` (StateError otherwise)."""
        rules: dict[str, LendingRule] = {rule.name: rule for rule in plan.lending}
        for device, entry in sorted(self.lent.items()):
            rule = rules.get(entry.rule)
            if rule is None or device not in rule.devices:
                raise StateError(
                    f"{self.path}: {device.describe()} is lent by rule {entry.rule!r}, which "
                    "the plan no longer has or no longer names it; give it back by hand "
                    "(docs/admin.md: lending) and remove its entry")


def lent_report(plan: Plan, state: TidalState, when: datetime.datetime
                ) -> list[dict[str, Any]]:
    """Who holds each lent device now and until when (``gpushare status --cluster``)."""
    from gpushare.admin.tidal.decide import lend_until

    rules = {rule.name: rule for rule in plan.lending}
    rows = []
    for device, entry in sorted(state.lent.items()):
        rule = rules.get(entry.rule)
        left = None if rule is None else lend_until(rule, when.hour * 60 + when.minute)
        until = "until its home side asks" if left is None else \
            f"{when + datetime.timedelta(minutes=left):%Y-%m-%d %H:%M}"
        rows.append({"device": device.describe(), "rule": entry.rule,
                     "holder": rule.borrower if rule else "?",
                     "home": rule.home if rule else "?",
                     "since": f"{datetime.datetime.fromtimestamp(entry.since):%Y-%m-%d %H:%M}",
                     "until": until})
    return rows


def default_path(plan_path: str) -> str:
    """``tidal-state.json`` in the plan's directory (/etc/gpushare/ for the default plan)."""
    return os.path.join(os.path.dirname(os.path.abspath(plan_path)), STATE_NAME)


def _number(raw: dict[str, Any], key: str, where: str) -> float:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise StateError(f"{where}: {key} must be a number of seconds, not {value!r}")
    return float(value)


def _counters(raw: Any, where: str) -> TidalCounters:
    counters = TidalCounters()
    if not isinstance(raw, dict):
        return counters
    lent = raw.get("lent_seconds", {})
    for to in (K8S, SLURM):
        counters.lent_seconds[to] = _number(lent if isinstance(lent, dict) else {}, to, where)
    counters.reclaims = int(_number(raw, "reclaims", where))
    counters.reclaim_seconds = _number(raw, "reclaim_seconds", where)
    counters.reclaim_seconds_max = _number(raw, "reclaim_seconds_max", where)
    refused = raw.get("refused", {})
    for reason in REFUSALS:
        counters.refused[reason] = int(_number(refused if isinstance(refused, dict) else {},
                                               reason, where))
    return counters


def parse_state(text: str, path: str) -> TidalState:
    raw = versioned_json(text, path, "tidal state file", STATE_VERSION, StateError)
    state = TidalState(path)
    entries = raw.get("lent", [])
    if not isinstance(entries, list):
        raise StateError(f"{path}: lent must be a list")
    for number, item in enumerate(entries, 1):
        where = f"{path}: lent entry {number}"
        if not isinstance(item, dict) or not isinstance(item.get("node"), str) \
                or not isinstance(item.get("rule"), str) \
                or any(isinstance(item.get(k), bool) or not isinstance(item.get(k), int)
                       for k in ("gpu", "slice")):
            raise StateError(f"{where}: needs node and rule (text), gpu and slice (numbers)")
        device = Device(item["node"], item["gpu"], item["slice"])
        if device in state.lent:
            raise StateError(f"{where}: {device.describe()} is listed twice")
        state.lent[device] = Lent(item["rule"], _number(item, "since", where))
    idle = raw.get("idle_since", {})
    if isinstance(idle, dict):
        state.idle_since = {str(rule): _number(idle, rule, f"{path}: idle_since")
                            for rule in idle}
    state.counters = _counters(raw.get("counters"), f"{path}: counters")
    return state


def load_state(path: str) -> TidalState:
    """The state file; an absent one is an empty state (nothing lent)."""
    text = read_text(path)
    return TidalState(path) if text is None else parse_state(text, path)


def dump_state(state: TidalState) -> str:
    counters = state.counters
    return json.dumps({
        "version": STATE_VERSION,
        "lent": [{"node": d.node, "gpu": d.gpu, "slice": d.slice, "rule": e.rule,
                  "since": e.since} for d, e in sorted(state.lent.items())],
        "idle_since": dict(sorted(state.idle_since.items())),
        "counters": {"lent_seconds": counters.lent_seconds, "reclaims": counters.reclaims,
                     "reclaim_seconds": counters.reclaim_seconds,
                     "reclaim_seconds_max": counters.reclaim_seconds_max,
                     "refused": counters.refused},
    }, indent=1) + "\n"


def save_state(state: TidalState) -> None:
    """Replace the file in one rename: a reader sees the old state or the new one."""
    from gpushare.admin.relayout.apply import write_atomically

    write_atomically(state.path, dump_state(state))
