# SPDX-License-Identifier: GPL-2.0-or-later
"""Static layouts of a :class:`~gpushare.admin.relayout.sim.Cluster`: a count of each menu
layout placed over the nodes, and the best one for a history, found by replaying it in the
simulator (``gpushare relayout --suggest``, and the benchmark's best-static columns). Where
Slurm takes one MIG profile per node (before 23.11), only layouts it can take are weighed.

Where each layout goes matters as much as how many: a request of several whole GPUs starts
only on a node that has them, so a layout that puts a MIG GPU on every node never starts a
job of a whole node. So a count is weighed placed two ways, each layout spread evenly over
the nodes and the MIG layouts packed together, and the search keeps the better."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Optional

from gpushare.admin.relayout.menu import Layout
from gpushare.admin.relayout.sim import Cluster, Job, Result, simulate

__all__ = ["Static", "best_static", "even_split", "score", "spread"]


def spread(counts: dict[str, int], cluster: Cluster, packed: bool = False
           ) -> list[list[Layout]]:
    """Per node, its GPUs' layouts: each layout spread over the nodes as evenly as it goes;
    ``packed``: the MIG layouts on the fewest nodes (each layout's GPUs together), the whole
    and MPS GPUs spread over the slots left, so that the nodes without MIG keep all their
    GPUs for requests of a whole node (MPS GPUs stay spread: Slurm gives an idle one whole
    to a whole-GPU job, and one node of them would be taken so). Where a node takes one MIG
    profile, a node after another, one profile's layouts together (so that as few nodes as
    the counts allow mix two), either way."""
    by_name = {item.layout.name: item.layout for item in cluster.menu.items}
    flat = [by_name[name] for name in cluster.names for _ in range(counts.get(name, 0))]
    grid: list[list[Layout]] = [[] for _ in range(cluster.nodes)]
    if cluster.one_profile:
        _by_profile(flat, grid, cluster.gpus_per_node)
    elif packed:
        mig = [layout for layout in flat if layout.slices]
        for position, layout in enumerate(mig):
            grid[min(position // cluster.gpus_per_node, cluster.nodes - 1)].append(layout)
        node = 0
        # MPS GPUs first, round the nodes; the whole GPUs fill what is left.
        rest = sorted((layout for layout in flat if not layout.slices),
                      key=lambda layout: layout.name == "whole")
        for layout in rest:
            for _ in range(cluster.nodes):  # the next node with room, round the nodes
                if len(grid[node % cluster.nodes]) < cluster.gpus_per_node:
                    break
                node += 1
            grid[node % cluster.nodes].append(layout)
            node += 1
    else:
        for position, layout in enumerate(flat):
            grid[position % cluster.nodes].append(layout)
    if not all(len(row) == cluster.gpus_per_node for row in grid):
        raise ValueError(f"{sum(counts.values())} GPUs do not fill {cluster.nodes} nodes of "
                         f"{cluster.gpus_per_node} GPUs evenly")
    return grid


def _by_profile(flat: list[Layout], grid: list[list[Layout]], per_node: int) -> None:
    """Fill ``grid`` so that as few nodes as the layouts allow hold two MIG profiles: each
    profile's layouts on nodes of their own (the last one partly), then the layouts without
    MIG in the slots left; past the nodes, whatever is left goes where there is room."""
    profiles: dict[str, list[Layout]] = {}
    rest = []
    for layout in flat:
        if layout.slices:
            profiles.setdefault(layout.slices[0], []).append(layout)
        else:
            rest.append(layout)
    node = 0
    for group in profiles.values():
        for start in range(0, len(group), per_node):
            if node < len(grid):
                grid[node].extend(group[start:start + per_node])
                node += 1
            else:
                rest.extend(group[start:start + per_node])
    for row in grid:
        while len(row) < per_node and rest:
            row.append(rest.pop(0))
    for row in grid:  # the counts do not fill the nodes evenly: spread's check says so
        row.extend(rest[:max(per_node - len(row), 0)])
        del rest[:max(per_node - len(row), 0)]


def even_split(cluster: Cluster) -> dict[str, int]:
    """The menu's layouts in equal numbers (the first ones take what does not divide)."""
    total, names = cluster.nodes * cluster.gpus_per_node, cluster.names
    return {name: total // len(names) + (i < total % len(names)) for i, name in enumerate(names)}


def score(result: Result) -> tuple[int, float]:
    """A static layout's rank, lower better: the jobs it never starts, then the mean
    completion time of those it runs (a history with requests no layout can hold still
    ranks its layouts, instead of tying them all)."""
    return result.unfinished, statistics.fmean(result.jct) if result.jct else 0.0


@dataclass(frozen=True)
class Static:
    """A static layout: how many GPUs of each menu layout, and where (``spread``'s
    ``packed``), with the replay that ranked it."""

    counts: dict[str, int]
    packed: bool
    result: Result

    def layouts(self, cluster: Cluster) -> list[list[Layout]]:
        return spread(self.counts, cluster, self.packed)


def best_static(jobs: list[Job], cluster: Cluster) -> Static:
    """The static layout that ``score`` ranks first (fewest jobs never run, then the lowest
    mean completion time) among those Slurm can take (``Cluster.fits``): a grid over the
    menu in steps of one GPU per node (of a node's GPUs where a node takes one MIG profile),
    then moves of one GPU (or of a node's GPUs) until none helps; each count placed both
    ways (``spread``), the MIG layouts packed where the two rank alike (a request of a whole
    node that the history lacks can still start)."""
    shared = {p for layout in cluster.fixed for p in layout.slices}
    if cluster.one_profile and len(shared) > 1:
        raise ValueError(f"the GPUs of {cluster.name} shared with Kubernetes give Slurm MIG "
                         f"slices of {len(shared)} profiles ({', '.join(sorted(shared))}) on "
                         "each node, which Slurm before 23.11 cannot index: give Slurm one "
                         "profile there, or upgrade Slurm")
    total = cluster.nodes * cluster.gpus_per_node
    names = cluster.names
    tried: dict[tuple[int, ...], Optional[tuple[Result, bool]]] = {}
    # One placement where a node takes one MIG profile (spread keeps each profile together).
    placements = (False,) if cluster.one_profile else (True, False)

    def run(counts: tuple[int, ...]) -> Optional[tuple[Result, bool]]:
        """The better placement's replay; None where a node would give Slurm two MIG
        profiles (22.05)."""
        if counts not in tried:
            found: list[tuple[tuple[int, float], int, Result, bool]] = []
            for order, packed in enumerate(placements):
                grid = spread(dict(zip(names, counts)), cluster, packed)
                if all(cluster.fits(row) for row in grid):
                    replay = simulate(jobs, grid, False, cluster)
                    unfinished, mean = score(replay)  # alike: within a millisecond
                    found.append(((unfinished, round(mean, 3)), order, replay, packed))
            tried[counts] = min(found, key=lambda f: f[:2])[2:] if found else None
        return tried[counts]

    def rank(counts: tuple[int, ...]) -> tuple[float, float]:
        replayed = run(counts)
        return score(replayed[0]) if replayed is not None else (math.inf, math.inf)

    # Under one MIG profile per node a MIG layout fills whole nodes, so the grid and the moves
    # go in a node's worth of GPUs too.
    step = cluster.gpus_per_node if cluster.one_profile else cluster.nodes
    moves = (1, cluster.gpus_per_node) if cluster.one_profile else (1,)
    grid = [c for c in itertools.product(range(0, total + 1, step), repeat=len(names) - 1)
            if sum(c) <= total]
    best = min(((*c, total - sum(c)) for c in grid), key=rank)
    if run(best) is None:
        raise ValueError(f"no static layout of the menu gives each node of {cluster.name} one "
                         "Slurm MIG profile (with its GPUs shared with Kubernetes), as Slurm "
                         "before 23.11 needs: add a layout of their profile to the menu")
    improved = True
    while improved:
        improved = False
        for (src, dst), size in itertools.product(
                itertools.permutations(range(len(names)), 2), moves):
            if best[src] < size:
                continue
            trial = list(best)
            trial[src] -= size
            trial[dst] += size
            if rank(tuple(trial)) < rank(best):
                best, improved = tuple(trial), True
    found = run(best)
    assert found is not None  # rank puts a replayed layout before any refused one
    return Static(dict(zip(names, best)), found[1], found[0])
