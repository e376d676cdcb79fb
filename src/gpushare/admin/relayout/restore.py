# SPDX-License-Identifier: GPL-2.0-or-later
"""Changes back to the plan's layouts: what a change took from a kind comes back.

A change is made for the jobs waiting now (``decide``, ``predict``). Once they are served,
nothing asks for the change to be undone: no job waits for what the node lacks until the
next jobs of that kind come, and by then the node is busy again, often with jobs that run
past ``--max-drain``. Whole GPUs have no floor (``keep``), so a GPU turned into slices for a
burst of slices stayed so all day, and the whole-GPU jobs that came later waited for it
(bursts.csv from the best static layout, docs/performance.md).

So each round, on a node no job holds, GPUs whose layouts differ from the plan's change back
to the plan's where a kind has fewer units than it ``wanted``: what its jobs held at once in
the window, up to the plan's (the floors, whole GPUs counted too). The node ends with the
plan's mix of layouts, as with no relayout, by the fewest changes (GPUs of one node are
alike to Slurm). Each candidate keeps the floors, the menus' bounds and ``min_interval_s``;
``predict`` makes it only where the forecast finds that no job waits longer for it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Optional, Sequence

from gpushare.admin.relayout import keep
from gpushare.admin.relayout.decide import Change, GpuState, with_change
from gpushare.admin.relayout.menu import Layout, Menu

__all__ = ["Back", "each_node"]


@dataclass(frozen=True)
class Back:
    """What a change back aims at: ``planned``, each GPU's layout in the plan (by node and
    index); ``wanted``, each kind's units (whole GPUs too) below which it is short."""

    planned: Mapping[tuple[str, int], Layout]
    wanted: Mapping[str, int]


def _short_kinds(cap: Mapping[str, int], wanted: Mapping[str, int]) -> set[str]:
    return {kind for kind, n in wanted.items() if cap.get(kind, 0) < n}


@dataclass
class _Round:
    """What the changes weighed so far leave: units per kind, GPUs per (group, layout)."""

    cap: dict[str, int]
    counts: Counter[tuple[str, str]]
    back: Back
    menus: Mapping[str, Menu]
    floors: Optional[Mapping[str, int]]
    one_profile_per_node: bool

    def allows(self, gpu: GpuState, now: Mapping[int, Layout], new: Layout,
               for_short: bool = True) -> bool:
        """Whether ``gpu`` (on a node laid out as ``now``) may change to ``new``: a short
        kind gains (unless not ``for_short``), and the menu's bounds, its MIG mode and the
        floors allow it. Slurm's one MIG profile per node is the node's to check, once all
        its changes are known (:func:`_node`)."""
        old = now[gpu.index]
        menu = self.menus[gpu.group]
        item, old_item = menu.item(new.name), menu.item(old.name)
        if item is None or (for_short and not _short_kinds(self.cap, self.back.wanted)
                            & set(new.offers())):
            return False
        if (gpu.mode_fixed and new.mig != old.mig) \
                or self.counts[(gpu.group, new.name)] >= item.high \
                or (old_item is not None and self.counts[(gpu.group, old.name)] <= old_item.low):
            return False
        if not self.floors:
            return True
        others = [layout for index, layout in now.items() if index != gpu.index]
        return not (keep.exposes_mps(self.floors, new, others)
                    or keep.short(self.cap, with_change(self.cap, old, new), self.floors))

    def make(self, gpu: GpuState, old: Layout, new: Layout) -> None:
        self.cap = with_change(self.cap, old, new)
        self.counts[(gpu.group, old.name)] -= 1
        self.counts[(gpu.group, new.name)] += 1


def each_node(gpus: Sequence[GpuState], layout_of: Mapping[tuple[str, int], Layout],
              menus: Mapping[str, Menu], back: Back,
              floors: Optional[Mapping[str, int]] = None,
              one_profile_per_node: bool = False, skip: frozenset[str] = frozenset(),
              budget: int = 4, max_drain_s: Optional[float] = 5400.0
              ) -> Iterator[list[Change]]:
    """Per node, the changes back to the plan of idle GPUs that give a short kind units, at
    most ``budget`` in all; ``layout_of``: each GPU's layout once this round's other changes
    are made; nodes in ``skip`` (changed this round) are left alone, and so are nodes whose
    jobs' time limits may run past ``max_drain_s`` (Slurm keeps a drained node out of
    service until they end). Each node's are weighed as if the nodes before were made, and
    only when asked for: a caller that judges the first before the others need not weigh
    them."""
    state = _Round(keep.capacity(layout_of.values()), Counter(
        (gpu.group, layout_of[(gpu.node, gpu.index)].name) for gpu in gpus
        if gpu.changeable and gpu.group in menus), back, menus, floors, one_profile_per_node)
    by_node: dict[str, list[GpuState]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    for node in sorted(by_node):
        if budget <= 0 or not _short_kinds(state.cap, back.wanted):
            return
        node_gpus = by_node[node]
        busy = [gpu for gpu in node_gpus if gpu.busy]
        if node in skip or (max_drain_s is not None and any(
                gpu.ends_in_s is None or gpu.ends_in_s > max_drain_s for gpu in busy)):
            continue
        changes = _node(state, node, node_gpus, layout_of, budget)
        if changes:
            yield changes
            budget -= len(changes)


def _node(state: _Round, node: str, node_gpus: Sequence[GpuState],
          layout_of: Mapping[tuple[str, int], Layout], budget: int) -> list[Change]:
    """One node's changes back: its idle GPUs of a layout it has more of than the plan gives
    it, to a layout it has fewer of, until its mix is the plan's or nothing is short. Where
    Slurm keeps one MIG profile per node, a node left with two after them goes on to the
    plan's whole mix, or keeps its layouts."""
    planned = state.back.planned
    now = {gpu.index: layout_of[(node, gpu.index)] for gpu in node_gpus}
    # Those whose own plan layout differs first: the node then reads as planned.
    mine = sorted((gpu for gpu in node_gpus if gpu.changeable and gpu.group in state.menus
                   and (node, gpu.index) in planned),
                  key=lambda g: (planned[(node, g.index)] == now[g.index], g.index))
    extra = Counter(now[g.index].name for g in mine) - \
        Counter(planned[(node, g.index)].name for g in mine)
    missing = Counter(planned[(node, g.index)].name for g in mine) - \
        Counter(now[g.index].name for g in mine)
    layouts = {planned[(node, g.index)].name: planned[(node, g.index)] for g in mine}
    busy = any(gpu.busy for gpu in node_gpus)
    before = (dict(state.cap), Counter(state.counts))
    changes: list[Change] = []
    for for_short in (True, False):
        for gpu in mine:
            old = now[gpu.index]
            interval = state.menus[gpu.group].min_interval_s
            if gpu.busy or not extra[old.name] or len(changes) >= budget or (
                    gpu.last_change_s is not None and gpu.last_change_s < interval):
                continue
            for name in sorted(missing, key=lambda n: -missing[n]):
                if missing[name] and state.allows(gpu, now, layouts[name], for_short):
                    state.make(gpu, old, layouts[name])
                    now[gpu.index] = layouts[name]
                    extra[old.name] -= 1
                    missing[name] -= 1
                    changes.append(Change(node, gpu.index, old.name, name, 0.0, busy))
                    break
        if not (changes and state.one_profile_per_node) or _profiles(now.values()) <= 1:
            return changes
    state.cap, state.counts = before  # two MIG profiles on one node: Slurm cannot
    return []


def _profiles(layouts: Iterable[Layout]) -> int:
    return len({profile for layout in layouts for profile in layout.slices})
