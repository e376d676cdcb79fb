# SPDX-License-Identifier: GPL-2.0-or-later
"""The choice of layouts: pure, so that ``gpushare relayout`` and the trace simulator
(bench/bench_relayout.py) run the same code.

Each pending request is worth the GPU work it waits to do (its share of a GPU times its
count), weighted by how long it has waited. A round changes, one GPU at a time, the idle GPU
whose change lets the most of that weighted work start, as long as the gain beats
``hysteresis``, the GPU has not changed within the menu's ``min_interval_s``, the group's
bounds hold, and fewer than ``max_changes`` GPUs changed this round. A GPU with a job on it
never changes; a GPU on a node with other busy GPUs changes only for a gain of twice the
hysteresis, because Slurm takes the whole node out of service until it is idle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from gpushare.admin.relayout.menu import Layout, Menu

__all__ = ["Change", "Decision", "GpuState", "Request", "decide", "unit_work"]

WAIT_REFERENCE_S = 600.0  # a request waiting this long counts twice a fresh one


@dataclass(frozen=True)
class Request:
    """One pending job's GPU request on one node: ``kind`` is a MIG profile ("1g.10gb"),
    "whole" or "mps"; ``count`` slices, GPUs or MPS units."""

    job: str
    kind: str
    count: int
    wait_s: float


@dataclass(frozen=True)
class GpuState:
    node: str
    index: int
    group: str
    layout: Layout
    busy: bool  # a job holds some of it
    changeable: bool  # every slice is Slurm's
    last_change_s: Optional[float] = None  # seconds ago; None: never
    used: dict[str, int] = field(default_factory=dict, compare=False)  # held units by kind

    def idle(self) -> dict[str, int]:
        """What of it no job holds (a busy MIG GPU may still have idle slices)."""
        return {kind: count - self.used.get(kind, 0)
                for kind, count in self.layout.offers().items()
                if count > self.used.get(kind, 0)}


@dataclass(frozen=True)
class Change:
    node: str
    index: int
    old: str
    new: str
    gain: float
    node_busy: bool


@dataclass
class Decision:
    changes: list[Change] = field(default_factory=list)
    why: list[str] = field(default_factory=list)
    demand: dict[str, int] = field(default_factory=dict)  # units waiting per kind
    supply: dict[str, int] = field(default_factory=dict)  # idle units per kind

    @property
    def drain(self) -> list[str]:
        return sorted({change.node for change in self.changes})


def unit_work(kind: str, slice_sizes: dict[str, int]) -> float:
    """One unit's share of a GPU: a 3g slice is 3/7, a whole GPU 1, an MPS unit 1/100."""
    if kind == "whole":
        return 1.0
    if kind == "mps":
        return 0.01
    return slice_sizes.get(kind, 1) / 7.0


def _values(requests: Sequence[Request], slice_sizes: dict[str, int]) -> dict[str, list[float]]:
    """Per kind, every waiting unit's value, highest first."""
    values: dict[str, list[float]] = {}
    for request in requests:
        weight = unit_work(request.kind, slice_sizes) * (1.0 + request.wait_s / WAIT_REFERENCE_S)
        values.setdefault(request.kind, []).extend([weight] * request.count)
    for units in values.values():
        units.sort(reverse=True)
    return values


def _served(values: dict[str, list[float]], free: dict[str, int]) -> float:
    """The weighted work that can start when ``free`` units of each kind are idle."""
    return sum(sum(units[:max(free.get(kind, 0), 0)]) for kind, units in values.items())


def _profile_sizes(layouts: Sequence[Layout]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for layout in layouts:
        for profile in layout.slices:
            head = profile.split("g.", 1)[0]
            sizes[profile] = int(head) if head.isdigit() else 1
    return sizes


def decide(requests: Sequence[Request], gpus: Sequence[GpuState], menus: dict[str, Menu],
           max_changes: int = 4, hysteresis: float = 0.5) -> Decision:
    """Which idle GPUs change to which menu layout this round, and why."""
    all_layouts = [gpu.layout for gpu in gpus] + [item.layout for menu in menus.values()
                                                 for item in menu.items]
    sizes = _profile_sizes(all_layouts)
    values = _values(requests, sizes)
    decision = Decision()
    for request in requests:
        decision.demand[request.kind] = decision.demand.get(request.kind, 0) + request.count
    free: dict[str, int] = {}
    for gpu in gpus:
        for kind, count in gpu.idle().items():
            free[kind] = free.get(kind, 0) + count
    decision.supply = dict(free)
    offered = {kind for menu in menus.values() for item in menu.items
               for kind in item.layout.offers()} | set(free)
    for kind in sorted(decision.demand):
        if kind not in offered:
            decision.why.append(f"{kind}: {decision.demand[kind]} waiting, but no menu offers "
                                "it and no GPU has it; add a layout with it to a menu")
    busy_nodes = {gpu.node for gpu in gpus if gpu.busy}
    counts: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        if gpu.changeable and gpu.group in menus:
            in_layout = (gpu.group, gpu.layout.name)
            counts[in_layout] = counts.get(in_layout, 0) + 1
    current = {(gpu.node, gpu.index): gpu.layout for gpu in gpus}
    changed: set[tuple[str, int]] = set()
    held_back: dict[str, str] = {}
    while len(decision.changes) < max_changes:
        base = _served(values, free)
        best: Optional[tuple[float, GpuState, Layout]] = None
        for gpu in gpus:
            key = (gpu.node, gpu.index)
            menu = menus.get(gpu.group)
            if menu is None or not gpu.changeable or gpu.busy or key in changed:
                continue
            if gpu.last_change_s is not None and gpu.last_change_s < menu.min_interval_s:
                held_back[f"{gpu.node} GPU {gpu.index}"] = (
                    f"changed {gpu.last_change_s:.0f} s ago, under the menu's "
                    f"min_interval_s {menu.min_interval_s}")
                continue
            old = current[key]
            old_item = menu.item(old.name)
            if old_item is not None and counts.get((gpu.group, old.name), 0) <= old_item.low:
                continue
            need = hysteresis * (2.0 if gpu.node in busy_nodes else 1.0)
            for item in menu.items:
                new = item.layout
                if new.name == old.name or counts.get((gpu.group, new.name), 0) >= item.high:
                    continue
                trial = dict(free)
                for kind, count in old.offers().items():
                    trial[kind] = trial.get(kind, 0) - count
                for kind, count in new.offers().items():
                    trial[kind] = trial.get(kind, 0) + count
                gain = _served(values, trial) - base
                if gain < need:
                    continue
                if best is None or gain > best[0]:
                    best = (gain, gpu, new)
        if best is None:
            break
        gain, gpu, new = best
        key = (gpu.node, gpu.index)
        old = current[key]
        for kind, count in old.offers().items():
            free[kind] = free.get(kind, 0) - count
        for kind, count in new.offers().items():
            free[kind] = free.get(kind, 0) + count
        counts[(gpu.group, old.name)] = counts.get((gpu.group, old.name), 0) - 1
        counts[(gpu.group, new.name)] = counts.get((gpu.group, new.name), 0) + 1
        current[key] = new
        changed.add(key)
        node_busy = gpu.node in busy_nodes
        decision.changes.append(Change(gpu.node, gpu.index, old.name, new.name, gain,
                                       node_busy))
        decision.why.append(
            f"{gpu.node} GPU {gpu.index}: {old.name} -> {new.name}: lets {gain:.2f} weighted "
            "GPU-work of the queue start" + (" (the node drains until its other jobs end)"
                                             if node_busy else ""))
    if len(decision.changes) >= max_changes:
        decision.why.append(f"stopped at {max_changes} changes this round (--max-changes)")
    elif not decision.changes:
        unmet = {kind: n - free.get(kind, 0) for kind, n in decision.demand.items()
                 if n > free.get(kind, 0)}
        if not unmet:
            decision.why.append("no change: every waiting request fits what is idle")
        else:
            decision.why.append("no change: no idle GPU's change gains more than the "
                                f"hysteresis ({hysteresis}) within the menus' bounds; short: "
                                + ", ".join(f"{k} {v}" for k, v in sorted(unmet.items())))
    for gpu_name, reason in sorted(held_back.items()):
        decision.why.append(f"{gpu_name} held: {reason}")
    return decision
