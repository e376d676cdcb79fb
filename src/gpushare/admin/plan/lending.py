# SPDX-License-Identifier: GPL-2.0-or-later
"""The plan's ``lending`` section: devices one scheduler owns (their home) and may lend to
the other, by a time window, by the home side's demand, or both.

A device is a whole GPU or one MIG slice. Each rule names its devices by nodes, GPU
indices and, for slices, a MIG profile; the plan must give every one of them to the rule's
``home``. No device is named by two rules, so at any time and in any state of demand a
device is either at home or lent by exactly one rule: never owned by both schedulers.
``states_owned_once`` proves that on the rendered views of every state the rules allow.

Written as (times are the controller's local time; a window may wrap midnight)::

    lending:
      - name: night-batch
        home: kubernetes
        nodes: a100-[01-04]
        gpus: 0-1                 # whole GPUs; with profile: the slices of that profile
        window: {from: "20:00", to: "08:00"}
        demand: {idle_below_percent: 10, for_minutes: 30}
        max_lent: 6               # most of the rule's devices lent at once
        reclaim_minutes: 30       # the home side has them back this long after asking
        borrowers: [batch]        # Slurm partitions (or Kubernetes namespaces) that borrow
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from gpushare.admin.plan.lines import Checker, YamlMap, YamlSeq, line_of
from gpushare.admin.plan.model import OWNERS, NodeGroup

__all__ = ["Demand", "Device", "LendingRule", "Window", "lending_section"]

_RULE_KEYS = ("name", "home", "nodes", "gpus", "profile", "window", "demand", "max_lent",
              "reclaim_minutes", "borrowers")
_REQUIRED = ("name", "home", "nodes", "gpus", "reclaim_minutes", "borrowers")
_CLOCK = re.compile(r"([01][0-9]|2[0-3]):([0-5][0-9])\Z")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
MAX_RULES = 64


@dataclass(frozen=True, order=True)
class Device:
    """One lendable device: a whole GPU (``slice`` -1) or the ``slice``-th MIG slice of the
    GPU as the plan lists them."""

    node: str
    gpu: int
    slice: int = -1

    def describe(self) -> str:
        where = f"{self.node} GPU {self.gpu}"
        return where if self.slice < 0 else f"{where} slice {self.slice + 1}"


@dataclass(frozen=True)
class Window:
    """Lent from ``start`` to ``end``, minutes after local midnight; wraps when end < start."""

    start: int
    end: int

    def active(self, minute_of_day: int) -> bool:
        if self.start < self.end:
            return self.start <= minute_of_day < self.end
        return minute_of_day >= self.start or minute_of_day < self.end

    def text(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:" \
               f"{self.end % 60:02d}"


@dataclass(frozen=True)
class Demand:
    """Lent while the home side has used under ``idle_below_percent`` of the rule's devices
    for ``for_minutes``."""

    idle_below_percent: int
    for_minutes: int


@dataclass(frozen=True)
class LendingRule:
    name: str
    home: str
    borrower: str
    devices: tuple[Device, ...]
    window: Optional[Window]
    demand: Optional[Demand]
    max_lent: int
    reclaim_minutes: int
    borrowers: tuple[str, ...]
    profile: str
    line: int


def _clock(c: Checker, value: Any, line: int, what: str) -> Optional[int]:
    match = _CLOCK.match(value) if isinstance(value, str) else None
    if match is None:
        c.error(line, f"{what} must be a time of day as \"HH:MM\" (quoted), not {value!r}")
        return None
    return int(match.group(1)) * 60 + int(match.group(2))


def _window(c: Checker, raw: Any, line: int, where: str) -> Optional[Window]:
    section = c.mapping(raw, line, f"{where}: window", ("from", "to"), ("from", "to"))
    if section is None or "from" not in section or "to" not in section:
        return None
    start = _clock(c, section["from"], line_of(section, "from"), f"{where}: window.from")
    end = _clock(c, section["to"], line_of(section, "to"), f"{where}: window.to")
    if start is None or end is None:
        return None
    if start == end:
        c.error(line, f"{where}: window from and to are both {section['from']}; a window "
                "needs a length (leave the device at home, or drop the window for demand only)")
        return None
    return Window(start, end)


def _demand(c: Checker, raw: Any, line: int, where: str) -> Optional[Demand]:
    keys = ("idle_below_percent", "for_minutes")
    section = c.mapping(raw, line, f"{where}: demand", keys, keys)
    if section is None or any(key not in section for key in keys):
        return None
    below = c.integer(section["idle_below_percent"], line_of(section, "idle_below_percent"),
                      f"{where}: demand.idle_below_percent", 1, 100)
    minutes = c.integer(section["for_minutes"], line_of(section, "for_minutes"),
                        f"{where}: demand.for_minutes", 1, 24 * 60)
    return None if below is None or minutes is None else Demand(below, minutes)


def _indices(c: Checker, raw: Any, line: int, where: str, count: int) -> Optional[list[int]]:
    text = str(raw).strip() if isinstance(raw, (int, str)) and not isinstance(raw, bool) else ""
    if text == "all":
        return list(range(count))
    found: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            c.error(line, f"{where}: gpus {raw!r} must be all, a GPU index, or a range like 0-3")
            return None
        first, last = int(low), int(high) if sep else int(low)
        if first > last or last >= count:
            c.error(line, f"{where}: GPUs {part.strip()} are not within 0-{count - 1} (the "
                    f"nodes have {count} GPUs)")
            return None
        found.extend(range(first, last + 1))
    return found


def _devices(c: Checker, rule: YamlMap, where: str, home: str, profile: str,
             by_node: dict[str, NodeGroup]) -> list[Device]:
    nodes = c.hostlist(rule["nodes"], line_of(rule, "nodes"), f"{where}: nodes") or ()
    devices: list[Device] = []
    line = line_of(rule, "gpus")
    for node in nodes:
        group = by_node.get(node)
        if group is None:
            c.error(line_of(rule, "nodes"), f"{where}: node {node} is in no node group")
            return []
        indices = _indices(c, rule["gpus"], line, where, len(group.gpus))
        if indices is None:
            return []
        for index in indices:
            gpu = group.gpus[index]
            if not profile:
                if gpu.owner != home:
                    c.error(line, f"{where}: {node} GPU {index} is {gpu.owner}'s in the plan "
                            f"(group {group.name}), not {home}'s: a rule lends only what its "
                            "home owns; fix home, gpus, or give a profile to lend slices")
                    return []
                if home == "slurm" and group.relayout is not None:
                    c.error(line, f"{where}: {node} GPU {index} may be relaid out (group "
                            f"{group.name} has relayout:); a GPU is lent or relaid out, not "
                            "both")
                    return []
                devices.append(Device(node, index))
                continue
            slices = [pos for pos, s in enumerate(gpu.slices)
                      if s.profile == profile and s.owner == home]
            if not slices:
                c.error(line, f"{where}: {node} GPU {index} has no {profile} slice of "
                        f"{home}'s in the plan (group {group.name})")
                return []
            devices.extend(Device(node, index, pos) for pos in slices)
    return devices


def _rule(c: Checker, raw: Any, line: int, position: int,
          by_node: dict[str, NodeGroup]) -> Optional[LendingRule]:
    where = f"lending rule {position + 1}"
    rule = c.mapping(raw, line, where, _RULE_KEYS, _REQUIRED)
    if rule is None or any(key not in rule for key in _REQUIRED):
        return None
    name = c.string(rule["name"], line_of(rule, "name"), f"{where}: name")
    if name is not None and not _NAME.match(name):
        c.error(line_of(rule, "name"), f"{where}: name {name!r} must be letters, digits, "
                "'.', '_' or '-' (it names metrics and journal entries)")
        name = None
    where = f"lending rule {name or position + 1}"
    home = c.choice(rule["home"], line_of(rule, "home"), f"{where}: home", OWNERS)
    profile = ""
    if "profile" in rule:
        profile = c.string(rule["profile"], line_of(rule, "profile"), f"{where}: profile") or ""
    window = _window(c, rule["window"], line_of(rule, "window"), where) \
        if "window" in rule else None
    demand = _demand(c, rule["demand"], line_of(rule, "demand"), where) \
        if "demand" in rule else None
    if "window" not in rule and "demand" not in rule:
        c.error(line, f"{where}: say when it lends: a window (from, to), a demand "
                "(idle_below_percent, for_minutes), or both")
    reclaim = c.integer(rule["reclaim_minutes"], line_of(rule, "reclaim_minutes"),
                        f"{where}: reclaim_minutes", 1, 24 * 60)
    raw_borrowers = rule["borrowers"]
    borrowers: tuple[str, ...] = ()
    if isinstance(raw_borrowers, YamlSeq) and raw_borrowers and all(
            isinstance(b, str) and b.strip() for b in raw_borrowers):
        borrowers = tuple(b.strip() for b in raw_borrowers)
    else:
        c.error(line_of(rule, "borrowers"), f"{where}: borrowers must be a non-empty list of "
                "the Slurm partitions (or Kubernetes namespaces) that may use what is lent")
    if home is None or name is None:
        return None
    devices = _devices(c, rule, where, home, profile, by_node)
    max_lent = len(devices)
    if "max_lent" in rule and devices:
        max_lent = c.integer(rule["max_lent"], line_of(rule, "max_lent"), f"{where}: max_lent",
                             1, len(devices)) or max_lent
    if not devices or reclaim is None or not borrowers:
        return None
    if (window is None and "window" in rule) or (demand is None and "demand" in rule):
        return None
    borrower = next(owner for owner in OWNERS if owner != home)
    return LendingRule(name, home, borrower, tuple(devices), window, demand, max_lent, reclaim,
                       borrowers, profile, line)


def lending_section(c: Checker, raw: Any, line: int,
                    groups: tuple[NodeGroup, ...]) -> tuple[LendingRule, ...]:
    """The rules, each device named by one rule only (else a problem naming both lines)."""
    if raw is None:
        return ()
    if not isinstance(raw, YamlSeq) or not raw or len(raw) > MAX_RULES:
        c.error(line, f"lending must be a list of 1 to {MAX_RULES} rules (name, home, nodes, "
                "gpus, window and/or demand, reclaim_minutes, borrowers)")
        return ()
    by_node = {node: group for group in groups for node in group.nodes}
    rules: list[LendingRule] = []
    for position, item in enumerate(raw):
        rule = _rule(c, item, line_of(raw, position), position, by_node)
        if rule is not None:
            rules.append(rule)
    claimed: dict[tuple[str, int], list[tuple[LendingRule, Device]]] = {}
    names: dict[str, LendingRule] = {}
    reported: set[tuple[str, str]] = set()
    for rule in rules:
        if rule.name in names:
            c.error(rule.line, f"lending rule name {rule.name!r} used twice (line "
                    f"{names[rule.name].line} and line {rule.line})")
        names.setdefault(rule.name, rule)
        for device in rule.devices:
            on_gpu = claimed.setdefault((device.node, device.gpu), [])
            for other_rule, other in on_gpu:
                pair = (other_rule.name, rule.name)
                if other_rule is rule or pair in reported:
                    continue
                if other == device or other.slice < 0 or device.slice < 0:
                    reported.add(pair)
                    c.error(rule.line, f"{device.describe()} is lent by two rules "
                            f"({other_rule.name} at line {other_rule.line}, {rule.name} at "
                            f"line {rule.line}); a device has one lending rule, or it could "
                            "be owned by both schedulers")
            on_gpu.append((rule, device))
    return tuple(rules)
