# SPDX-License-Identifier: GPL-2.0-or-later
"""The choice of layouts: pure, so that ``gpushare relayout`` and the trace simulator
(bench/bench_relayout.py) run the same code.

Each pending request is worth the GPU work it waits to do (its share of a GPU times its
count), weighted by how long it has waited (up to ``MAX_WAIT_S``), and counts only on the
nodes it may run on (its partitions'). No user and no account counts for more than
``MAX_SHARE`` of the round's demand (or ``MIN_SHARE_GPUS`` GPUs' worth, when more; an
account only beside other accounts), so that no one user steers root's hardware changes
with a flood of jobs. A round changes, one GPU at a time, the idle GPU
whose change lets the most of that weighted work start, as long as the gain beats
``hysteresis``, the GPU has not changed within the menu's ``min_interval_s``, the group's
bounds hold, and fewer than ``max_changes`` GPUs changed this round. A GPU with a job on it
never changes; a GPU on a node with other busy GPUs changes only for a gain of twice the
hysteresis, because Slurm takes the whole node out of service until it is idle, and only
when its jobs' time limits end within ``max_drain_s``. A GPU whose MIG mode changes only at a
reset (A100, A30) never changes to a layout of the other mode: that could not be applied.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from gpushare.admin.relayout import keep
from gpushare.admin.relayout.menu import Layout, Menu

__all__ = ["Change", "Decision", "GpuState", "Request", "decide", "request_values",
           "share_cap", "unit_work", "wait_weight", "with_change"]

WAIT_REFERENCE_S = 600.0  # a request waiting this long counts twice a fresh one
MAX_WAIT_S = 3600.0  # a longer wait weighs no more: at most 7 times a fresh request
MAX_SHARE = 0.25  # the most of a round's demand one user, or one account, counts for
MIN_SHARE_GPUS = 2.0  # ... unless that is less than this many GPUs' worth of work


@dataclass(frozen=True)
class Request:
    """One pending job's GPU request on one node: ``kind`` is a MIG profile ("1g.10gb"),
    "whole" or "mps"; ``count`` slices, GPUs or MPS units; ``nodes`` those it may run on
    (None: any); ``user`` and ``account`` whose share of the demand is capped ("": not
    capped, as a trace without them); ``limit_s`` its time limit (None: none known), which
    the prediction of a change's effect runs it for."""

    job: str
    kind: str
    count: int
    wait_s: float
    nodes: Optional[frozenset[str]] = None
    user: str = ""
    account: str = ""
    limit_s: Optional[float] = None


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
    ends_in_s: Optional[float] = None  # its jobs' time limits end within this; None: unknown
    mode_fixed: bool = False  # its MIG mode changes only at a GPU reset (A100, A30)

    def idle(self) -> dict[str, int]:
        """What of it no job holds (a busy MIG GPU may still have idle slices; a GPU with
        MPS units that a job holds whole has none)."""
        if self.layout.mps and self.used.get("whole"):
            return {}
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


MAX_JOBS_PER_KIND = 48  # the most valuable waiting jobs of each kind that a round weighs
MAX_NODES_PER_STEP = 32  # the nodes with the most changeable idle GPUs a step weighs


_Job = tuple[float, int, Optional[frozenset[str]]]  # value, units on one node, nodes


def wait_weight(wait_s: float) -> float:
    """How much more a request counts for having waited: 1 fresh, 2 after WAIT_REFERENCE_S,
    never more than after MAX_WAIT_S (a job that waits days must not outweigh all others)."""
    return 1.0 + min(max(wait_s, 0.0), MAX_WAIT_S) / WAIT_REFERENCE_S


def share_cap(sums: Sequence[float], share: float = MAX_SHARE,
              floor: float = MIN_SHARE_GPUS) -> float:
    """The most any one owner may count for: ``share`` of what all count for once capped
    (the largest c with c = share x sum(min(v, c))), never under ``floor``; inf when no
    owner's sum is over it."""
    values = sorted(sums, reverse=True)
    total = sum(values)
    if not values or values[0] <= max(share * total, floor):
        return float("inf")
    rest = total
    for k, value in enumerate(values, 1):
        rest -= value
        if share * k >= 1.0:
            break
        cap = share * rest / (1.0 - share * k)
        below = values[k] if k < len(values) else 0.0
        if below <= cap <= value:
            return max(cap, floor)
    return floor


def _capped(values: list[float], order: list[int], owners: Sequence[str],
            alone_too: bool) -> list[float]:
    """``values`` with each owner's jobs counted, most valuable first (``order``), up to
    share_cap; an owner "" is not capped, nor, unless ``alone_too``, the only owner."""
    sums: dict[str, float] = {}
    for value, owner in zip(values, owners):
        if owner:
            sums[owner] = sums.get(owner, 0.0) + value
    if len(sums) < 2 and not alone_too:
        return values
    cap = share_cap(list(sums.values()))
    left = dict.fromkeys(sums, cap)
    counted = list(values)
    for position in order:
        owner = owners[position]
        if owner:
            counted[position] = min(values[position], left[owner])
            left[owner] -= counted[position]
    return counted


def request_values(requests: Sequence[Request], slice_sizes: dict[str, int]) -> list[float]:
    """Each request's wait-weighted work, each user's and each account's share capped (the
    rest of their jobs count for nothing): a user alone in the queue too (one user moves
    at most a few GPUs a round), an account only beside others (a site with one account is
    not held back as a whole)."""
    values = [unit_work(r.kind, slice_sizes) * wait_weight(r.wait_s) * r.count
              for r in requests]
    order = sorted(range(len(requests)), key=lambda i: -values[i] / max(requests[i].count, 1))
    values = _capped(values, order, [r.user for r in requests], alone_too=True)
    return _capped(values, order, [r.account for r in requests], alone_too=False)


def _jobs(requests: Sequence[Request], slice_sizes: dict[str, int]) -> dict[str, list[_Job]]:
    """Per kind, the waiting jobs as (value, units on one node, nodes), most valuable first."""
    jobs: dict[str, list[_Job]] = {}
    for request, value in zip(requests, request_values(requests, slice_sizes)):
        if value <= 0.0:
            continue  # past its owner's share: it must not take room from others' jobs
        jobs.setdefault(request.kind, []).append((value, request.count, request.nodes))
    for listed in jobs.values():
        listed.sort(key=lambda job: -job[0] / job[1])
        del listed[MAX_JOBS_PER_KIND:]
    return jobs


def _served(jobs: dict[str, list[_Job]], free: dict[str, dict[str, int]]) -> float:
    """The weighted work that can start when ``free[node][kind]`` units are idle: each job
    needs its units on one node it may run on (best fit, most valuable jobs first)."""
    total = 0.0
    for kind, listed in jobs.items():
        room = sorted((units.get(kind, 0), node) for node, units in free.items()
                      if units.get(kind, 0) > 0)
        for value, count, nodes in listed:
            if not room:
                break
            position = bisect.bisect_left(room, (count, ""))
            while position < len(room) and nodes is not None \
                    and room[position][1] not in nodes:
                position += 1
            if position < len(room):
                total += value
                units, node = room.pop(position)
                if units > count:
                    bisect.insort(room, (units - count, node))
    return total


def _profile_sizes(layouts: Sequence[Layout]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for layout in layouts:
        for profile in layout.slices:
            head = profile.split("g.", 1)[0]
            sizes[profile] = int(head) if head.isdigit() else 1
    return sizes


def _profiles_on(node: str, layout_of: dict[tuple[str, int], Layout],
                 moved: Sequence[GpuState], new: Layout) -> int:
    """How many MIG profiles Slurm would have on ``node`` after ``moved`` take ``new``."""
    moving = {gpu.index for gpu in moved}
    profiles = set(new.slices)
    for (name, index), layout in layout_of.items():
        if name == node and index not in moving:
            profiles.update(layout.slices)
    return len(profiles)


def with_change(cap: Mapping[str, int], old: Layout, new: Layout) -> dict[str, int]:
    """``cap`` (units by kind: a node's idle ones, or all a layout offers) with one GPU
    changed from ``old`` to ``new``."""
    after = dict(cap)
    for kind, count in old.offers().items():
        after[kind] = after.get(kind, 0) - count
    for kind, count in new.offers().items():
        after[kind] = after.get(kind, 0) + count
    return after


def decide(requests: Sequence[Request], gpus: Sequence[GpuState], menus: dict[str, Menu],
           max_changes: int = 4, hysteresis: float = 0.5,
           busy_node_factor: float = 2.0, max_drain_s: Optional[float] = 5400.0,
           one_profile_per_node: bool = False,
           floors: Optional[Mapping[str, int]] = None) -> Decision:
    """Which idle GPUs change to which menu layout this round, and why; no change takes a
    kind under its floor in ``floors`` (``keep``)."""
    all_layouts = [gpu.layout for gpu in gpus] + [item.layout for menu in menus.values()
                                                 for item in menu.items]
    sizes = _profile_sizes(all_layouts)
    jobs = _jobs(requests, sizes)
    decision = Decision()
    for request in requests:
        decision.demand[request.kind] = decision.demand.get(request.kind, 0) + request.count
    free: dict[str, dict[str, int]] = {}
    for gpu in gpus:
        node_free = free.setdefault(gpu.node, {})
        for kind, count in gpu.idle().items():
            node_free[kind] = node_free.get(kind, 0) + count
            decision.supply[kind] = decision.supply.get(kind, 0) + count
    offered = {kind for menu in menus.values() for item in menu.items
               for kind in item.layout.offers()} | set(decision.supply)
    for kind in sorted(decision.demand):
        if kind not in offered:
            decision.why.append(f"{kind}: {decision.demand[kind]} waiting, but no menu offers "
                                "it and no GPU has it; add a layout with it to a menu")
    busy_nodes = {gpu.node for gpu in gpus if gpu.busy}
    drain_s: dict[str, float] = {}
    for gpu in gpus:
        if gpu.busy:
            ends = float("inf") if gpu.ends_in_s is None else gpu.ends_in_s
            drain_s[gpu.node] = max(drain_s.get(gpu.node, 0.0), ends)
    counts: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        if gpu.changeable and gpu.group in menus:
            in_layout = (gpu.group, gpu.layout.name)
            counts[in_layout] = counts.get(in_layout, 0) + 1
    layout_of = {(gpu.node, gpu.index): gpu.layout for gpu in gpus}
    cap = keep.capacity(layout_of.values())
    changed: set[tuple[str, int]] = set()
    chosen_nodes: set[str] = set()
    held_back: dict[str, str] = {}
    bounded: set[str] = set()  # the menus' bounds that stopped a change towards a short kind
    short = {kind for kind, n in decision.demand.items() if n > decision.supply.get(kind, 0)}
    candidates: dict[str, list[GpuState]] = {}
    for gpu in gpus:
        menu = menus.get(gpu.group)
        if menu is None or not gpu.changeable or gpu.busy:
            continue
        if max_drain_s is not None and drain_s.get(gpu.node, 0.0) > max_drain_s:
            held_back.setdefault(f"{gpu.node} GPU {gpu.index}", (
                "its node's jobs may run longer than --max-drain "
                f"{max_drain_s:.0f} s, and Slurm keeps the node out of service until they end"))
            continue
        if gpu.last_change_s is not None and gpu.last_change_s < menu.min_interval_s:
            held_back[f"{gpu.node} GPU {gpu.index}"] = (
                f"changed {gpu.last_change_s:.0f} s ago, under the menu's "
                f"min_interval_s {menu.min_interval_s}")
            continue
        candidates.setdefault(gpu.node, []).append(gpu)
    while len(decision.changes) < max_changes:
        base = _served(jobs, free)
        best: Optional[tuple[float, float, list[GpuState], Layout]] = None
        weighed = list(candidates)
        if len(weighed) > MAX_NODES_PER_STEP:
            # Idle nodes first (no drain wait), then those with the most GPUs to change.
            weighed.sort(key=lambda n: (n in busy_nodes and n not in chosen_nodes,
                                        -len(candidates[n])))
            del weighed[MAX_NODES_PER_STEP:]
        for node in weighed:
            node_gpus = candidates[node]
            # A node with jobs stays out of service until they end: a change there must
            # gain more; one already chosen this round costs no second drain.
            need_per_gpu = hysteresis * (busy_node_factor if node in busy_nodes else 1.0)
            if node in chosen_nodes:
                need_per_gpu = hysteresis * 0.5
            layouts = {item.layout.name: item for gpu in node_gpus
                       for item in menus[gpu.group].items}
            for name, item in layouts.items():
                if floors and keep.exposes_mps(floors, item.layout, [
                        layout_of[key] for key in layout_of if key[0] == node]):
                    if short & set(item.layout.offers()):
                        bounded.add(f"kept: no whole GPU beside {node}'s MPS GPUs")
                    continue
                movable = [gpu for gpu in node_gpus if (gpu.node, gpu.index) not in changed
                           and gpu.layout.name != name and item in menus[gpu.group].items
                           and not (gpu.mode_fixed and gpu.layout.mig != item.layout.mig)]
                trial = {n: dict(units) for n, units in free.items()}
                moved: list[GpuState] = []
                left_in = dict(counts)
                trial_cap = dict(cap)
                for gpu in movable:
                    if len(decision.changes) + len(moved) >= max_changes:
                        break
                    old_item = menus[gpu.group].item(gpu.layout.name)
                    serves_short = bool(short & set(item.layout.offers()))
                    if left_in.get((gpu.group, name), 0) >= item.high:
                        if serves_short:
                            bounded.add(f"{name} at its max {item.high}")
                        break
                    if old_item is not None and \
                            left_in.get((gpu.group, gpu.layout.name), 0) <= old_item.low:
                        if serves_short:
                            bounded.add(f"{gpu.layout.name} at its min {old_item.low}")
                        continue
                    next_cap = with_change(trial_cap, gpu.layout, item.layout)
                    crossed = floors and keep.short(cap, next_cap, floors)
                    if crossed:
                        if serves_short:
                            bounded.update(f"kept: {why}" for why in crossed)
                        continue
                    trial_cap = next_cap
                    left_in[(gpu.group, gpu.layout.name)] = \
                        left_in.get((gpu.group, gpu.layout.name), 0) - 1
                    left_in[(gpu.group, name)] = left_in.get((gpu.group, name), 0) + 1
                    trial[node] = with_change(trial[node], gpu.layout, item.layout)
                    moved.append(gpu)
                    if one_profile_per_node and _profiles_on(node, layout_of, moved,
                                                             item.layout) > 1:
                        continue
                    gain = _served(jobs, trial) - base
                    net = gain - need_per_gpu * len(moved)
                    if gain >= need_per_gpu * len(moved) and (best is None or net > best[0]):
                        best = (net, gain, list(moved), item.layout)
        if best is None:
            break
        _net, gain, moved_gpus, new = best
        for gpu in moved_gpus:
            key = (gpu.node, gpu.index)
            free[gpu.node] = with_change(free[gpu.node], gpu.layout, new)
            counts[(gpu.group, gpu.layout.name)] = counts.get((gpu.group, gpu.layout.name), 0) - 1
            counts[(gpu.group, new.name)] = counts.get((gpu.group, new.name), 0) + 1
            changed.add(key)
            cap = with_change(cap, gpu.layout, new)
            layout_of[key] = new
            node_busy = gpu.node in busy_nodes
            decision.changes.append(Change(gpu.node, gpu.index, gpu.layout.name, new.name,
                                           gain / len(moved_gpus), node_busy))
        chosen_nodes.add(moved_gpus[0].node)
        node = moved_gpus[0].node
        decision.why.append(
            f"{node} GPU {','.join(str(g.index) for g in moved_gpus)}: "
            f"{'/'.join(sorted({g.layout.name for g in moved_gpus}))} -> {new.name}: lets "
            f"{gain:.2f} GPUs' worth of wait-weighted queued work start"
            + (" (the node drains until its other jobs end)" if node in busy_nodes else ""))
    if len(decision.changes) >= max_changes:
        decision.why.append(f"stopped at {max_changes} changes this round (--max-changes)")
    elif not decision.changes:
        unmet = {kind: n - decision.supply.get(kind, 0) for kind, n in decision.demand.items()
                 if n > decision.supply.get(kind, 0)}
        if not unmet:
            decision.why.append("no change: every waiting request fits what is idle")
        else:
            decision.why.append("no change: no idle GPU's change gains more than the "
                                f"hysteresis ({hysteresis}) within the menus' bounds; short: "
                                + ", ".join(f"{k} {v}" for k, v in sorted(unmet.items()))
                                + ("; bounds in the way: " + ", ".join(sorted(bounded))
                                   if bounded else ""))
    for gpu_name, reason in sorted(held_back.items()):
        decision.why.append(f"{gpu_name} held: {reason}")
    return decision
