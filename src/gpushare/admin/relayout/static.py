# SPDX-License-Identifier: GPL-2.0-or-later
"""Static layouts of a :class:`~gpushare.admin.relayout.sim.Cluster`: a count of each menu
layout spread over the nodes, and the best one for a history, found by replaying it in the
simulator (``gpushare relayout --suggest``, and the benchmark's best-static columns). Where
Slurm takes one MIG profile per node (before 23.11), only layouts it can take are weighed."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Optional

from gpushare.admin.relayout.menu import Layout
from gpushare.admin.relayout.sim import Cluster, Job, Result, simulate

__all__ = ["best_static", "even_split", "score", "spread"]


def spread(counts: dict[str, int], cluster: Cluster) -> list[list[Layout]]:
    """Per node, its GPUs' layouts: each layout spread over the nodes as evenly as it goes;
    where a node takes one MIG profile, a node after another, one profile's layouts
    together (so that as few nodes as the counts allow mix two)."""
    by_name = {item.layout.name: item.layout for item in cluster.menu.items}
    flat = [by_name[name] for name in cluster.names for _ in range(counts.get(name, 0))]
    grid: list[list[Layout]] = [[] for _ in range(cluster.nodes)]
    if cluster.one_profile:
        _by_profile(flat, grid, cluster.gpus_per_node)
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


def best_static(jobs: list[Job], cluster: Cluster) -> tuple[dict[str, int], Result]:
    """The static layout that ``score`` ranks first (fewest jobs never run, then the lowest
    mean completion time) among those Slurm can take (``Cluster.fits``): a grid over the
    menu in steps of one GPU per node (of a node's GPUs where a node takes one MIG profile),
    then moves of one GPU (or of a node's GPUs) until none helps."""
    shared = {p for layout in cluster.fixed for p in layout.slices}
    if cluster.one_profile and len(shared) > 1:
        raise ValueError(f"the GPUs of {cluster.name} shared with Kubernetes give Slurm MIG "
                         f"slices of {len(shared)} profiles ({', '.join(sorted(shared))}) on "
                         "each node, which Slurm before 23.11 cannot index: give Slurm one "
                         "profile there, or upgrade Slurm")
    total = cluster.nodes * cluster.gpus_per_node
    names = cluster.names
    tried: dict[tuple[int, ...], Optional[Result]] = {}

    def run(counts: tuple[int, ...]) -> Optional[Result]:
        """The replay; None where a node would give Slurm two MIG profiles (22.05)."""
        if counts not in tried:
            grid = spread(dict(zip(names, counts)), cluster)
            tried[counts] = simulate(jobs, grid, False, cluster) if all(
                cluster.fits(row) for row in grid) else None
        return tried[counts]

    def rank(counts: tuple[int, ...]) -> tuple[float, float]:
        result = run(counts)
        return score(result) if result is not None else (math.inf, math.inf)

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
    return dict(zip(names, best)), found
