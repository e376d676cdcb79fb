#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0-or-later
"""Tidal GPUs: a day of inference load with a night trough beside a batch queue, replayed
minute by minute under three arms, with gpushare's own lending choice
(``gpushare.admin.tidal.decide``) and rules parsed from a plan:

* ``static``: the plan's split, nothing lent;
* ``window``: Kubernetes' GPUs lent to Slurm from 20:00 to 08:00, as many as are idle;
* ``window-sized``: the same, at most what inference leaves idle at the window's busiest
  minute (``max_lent``);
* ``demand-4h``, ``demand-1h``: lent while inference has used under 60 % of them for 30
  minutes, reclaimed as it needs them, within 4 h or 1 h.

Inference needs follow a daily curve (peak mid-afternoon, trough before dawn, the trough
under half the peak as Runway reports; ``../shared/research/field-2026.md`` §3) with seeded
noise. Batch jobs arrive all day (Poisson), want 1-8 GPUs for a lognormal time, and ask a
time limit of 1.5x it. Slurm places them first come, first served with backfill; a job may
start on a lent GPU only when its time limit ``fits`` the rule, so no reclaim ends a job.
A move takes relayout's step costs (``bench_relayout``: reconfigure and slurmd restart).

Measures: the batch queue's mean wait and completion, the GPU-hours lent, the share of
the trough's idle inference GPU-hours lent, reclaim latency (p95, max) and the inference
side's GPU-minutes without GPUs it was promised (needs above what it held, past the
reclaim deadline) and without GPUs it needed at all (a window's devices stay lent until
it ends, whatever inference needs meanwhile). Each arm runs on several seeds; the table
gives the mean.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import random
import statistics
import sys
from dataclasses import dataclass, field
from typing import Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpushare.admin.plan import parse_plan
from gpushare.admin.plan.lending import Device, LendingRule
from gpushare.admin.relayout.predict import RECONFIGURE_S, SLURMD_RESTART_S
from gpushare.admin.tidal.decide import HomeUse, RuleState, decide, fits

MOVE_S = RECONFIGURE_S + SLURMD_RESTART_S  # a move: Gres= rewritten, slurmd back
MOVE_MIN = math.ceil(MOVE_S / 60)  # the device is usable from the next whole minute
ROUND_MIN = 1  # how often gpushare tidal --apply looks (its timer)
PLAN = """version: 1
slurm: {{version: "24.11"}}
node_groups:
  - name: infer
    nodes: k[01-{k_nodes:02d}]
    gpu_model: h100-80gb
    gpus: 8
    layout:
      all: {{owner: kubernetes}}
  - name: batch
    nodes: s[01-{s_nodes:02d}]
    gpu_model: h100-80gb
    gpus: 8
    layout:
      all: {{owner: slurm}}
{lending}"""
WINDOW = """lending:
  - name: night
    home: kubernetes
    nodes: k[01-{k_nodes:02d}]
    gpus: all
    window: {{from: "20:00", to: "08:00"}}
    max_lent: {max_lent}
    reclaim_minutes: 30
    borrowers: [batch]
"""
DEMAND = """lending:
  - name: idle
    home: kubernetes
    nodes: k[01-{k_nodes:02d}]
    gpus: all
    demand: {{idle_below_percent: 60, for_minutes: 30}}
    reclaim_minutes: {reclaim}
    borrowers: [batch]
"""
# Each arm's lending section, from the node counts: max_lent "all", or what inference leaves
# idle at the window's busiest minute (20:00, 68 % of the peak curve), as a site would size
# it from its own curve; a demand rule's promise of 4 h or 1 h (borrowed jobs' time limits).
ARMS = {
    "static": lambda k: "",
    "window": lambda k: WINDOW.format(k_nodes=k, max_lent=8 * k),
    "window-sized": lambda k: WINDOW.format(k_nodes=k, max_lent=8 * k - math.ceil(0.68 * 8 * k)),
    "demand-4h": lambda k: DEMAND.format(k_nodes=k, reclaim=240),
    "demand-1h": lambda k: DEMAND.format(k_nodes=k, reclaim=60),
}


@dataclass(order=True)
class Job:
    submit: int
    run: int = field(compare=False)
    limit: int = field(compare=False)
    gpus: int = field(compare=False)
    start: Optional[int] = field(default=None, compare=False)


def inference_needs(minute: int, total: int, rng: random.Random) -> int:
    """GPUs inference needs: 0.9 of all at 15:00, 0.3 at 03:00, +-5 % noise."""
    phase = math.cos(2 * math.pi * ((minute % 1440) / 1440 - 15 / 24))
    share = 0.6 + 0.3 * phase + rng.gauss(0, 0.05)
    return max(0, min(total, round(total * share)))


def batch_jobs(days: int, load: float, own: int, rng: random.Random) -> list[Job]:
    """Jobs offering ``load`` x Slurm's own GPU-minutes over the days."""
    sizes, weights = (1, 2, 4, 8), (0.4, 0.25, 0.2, 0.15)
    mean_gpu_min = sum(s * w for s, w in zip(sizes, weights)) * math.exp(math.log(90) + 0.5)
    rate = load * own / mean_gpu_min  # jobs per minute
    jobs, minute = [], 0.0
    while True:
        minute += rng.expovariate(rate)
        if minute >= days * 1440:
            return jobs
        run = max(5, min(16 * 60, round(rng.lognormvariate(math.log(90), 1.0))))
        jobs.append(Job(int(minute), run, math.ceil(run * 1.5), rng.choices(sizes, weights)[0]))


@dataclass
class Result:
    wait: float
    completion: float
    lent_gpu_h: float
    trough_share: float
    within_promise: float
    idle_reclaim_p95_s: float
    reclaim_max_s: float
    short_gpu_min: float
    starved_gpu_min: float


class Lending:
    """The lent devices' states: lent (Slurm's from ``ready``), reclaim asked, returning."""

    def __init__(self) -> None:
        self.ready: dict[Device, int] = {}
        self.busy_until: dict[Device, int] = {}
        self.asked: dict[Device, tuple[int, bool]] = {}  # minute asked, a job was on it
        self.returning: dict[Device, int] = {}
        self.reclaims: list[tuple[float, bool]] = []  # seconds, a job was on it

    def away(self) -> int:
        return len(self.ready) + len(self.returning)

    def usable(self, minute: int) -> list[Device]:
        return [d for d, ready in self.ready.items()
                if ready <= minute and d not in self.busy_until and d not in self.asked]

    def step(self, minute: int) -> None:
        for device, back in list(self.returning.items()):
            if back <= minute:
                del self.returning[device]
        for device, (since, had_job) in list(self.asked.items()):
            if device in self.busy_until:
                continue  # its borrowed work ends within the promise (``fits``)
            del self.asked[device]
            del self.ready[device]
            self.returning[device] = minute + MOVE_MIN
            self.reclaims.append(((minute - since) * 60 + MOVE_S, had_job))


def simulate(arm: str, seed: int, days: int, k_nodes: int, s_nodes: int,
             load: float) -> Result:
    fmt = {"k_nodes": k_nodes, "s_nodes": s_nodes}
    plan = parse_plan(PLAN.format(lending=ARMS[arm](k_nodes), **fmt))
    rule: Optional[LendingRule] = plan.lending[0] if plan.lending else None
    state = RuleState()
    noise = random.Random(seed)
    home_total, free_own = 8 * k_nodes, 8 * s_nodes
    jobs = batch_jobs(days, load, free_own, random.Random(seed * 7919 + 1))
    arrivals = iter(sorted(jobs))
    upcoming = next(arrivals, None)
    pending: list[Job] = []
    running: list[tuple[int, int, Job, tuple[Device, ...]]] = []  # end, seq, job, lent used
    lending = Lending()
    lent_min = short_min = starved_min = trough_idle = trough_lent = 0.0
    minute = seq = 0
    while upcoming is not None or pending or running:
        day_minute = minute % 1440
        needs = inference_needs(minute, home_total, noise)
        while upcoming is not None and upcoming.submit <= minute:
            pending.append(upcoming)
            upcoming = next(arrivals, None)
        while running and running[0][0] <= minute:
            _end, _seq, job, used = heapq.heappop(running)
            free_own += job.gpus - len(used)
            for device in used:
                lending.busy_until.pop(device, None)
        if rule is not None and minute % ROUND_MIN == 0:
            held = frozenset(lending.ready)
            for move in decide(rule, day_minute, float(minute), HomeUse(needs=needs), held,
                               state):
                if move.to == rule.borrower and move.device not in lending.returning:
                    lending.ready[move.device] = minute + MOVE_MIN
                elif move.to == rule.home and move.device not in lending.asked:
                    lending.asked[move.device] = (minute, move.device in lending.busy_until)
        lending.step(minute)
        usable = lending.usable(minute)
        for job in sorted(pending):
            take: list[Device] = []
            if job.gpus > free_own and rule is not None and fits(rule, day_minute, job.limit):
                take = usable[:job.gpus - free_own]
            if free_own + len(take) < job.gpus:
                continue
            free_own -= job.gpus - len(take)
            usable = usable[len(take):]
            for device in take:
                lending.busy_until[device] = minute + job.run
            job.start, seq = minute, seq + 1
            heapq.heappush(running, (minute + job.run, seq, job, tuple(take)))
        pending = [job for job in pending if job.start is None]
        lent_min += len(lending.ready)
        starved_min += max(0, needs - (home_total - lending.away()))
        if rule is not None:  # past the promise: asked longer ago than reclaim_minutes
            late = sum(1 for since, _job in lending.asked.values()
                       if minute - since > rule.reclaim_minutes)
            short_min += min(late, max(0, needs - (home_total - lending.away())))
        if minute < days * 1440 and (day_minute < 8 * 60 or day_minute >= 20 * 60):
            trough_idle += max(0, home_total - needs)
            trough_lent += min(len(lending.ready), max(0, home_total - needs))
        minute += 1
    waits = [job.start - job.submit for job in jobs if job.start is not None]
    promise = 60 * (rule.reclaim_minutes if rule is not None else 0)
    idle = [seconds for seconds, had_job in lending.reclaims if not had_job]
    return Result(statistics.fmean(waits),
                  statistics.fmean(w + job.run for w, job in zip(waits, jobs)),
                  lent_min / 60, trough_lent / trough_idle if trough_idle else 0.0,
                  (sum(1 for seconds, _ in lending.reclaims if seconds <= promise)
                   / len(lending.reclaims)) if lending.reclaims else 1.0,
                  _p95(idle), max((seconds for seconds, _ in lending.reclaims), default=0.0),
                  short_min, starved_min)


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)])


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--k-nodes", type=int, default=4, help="Kubernetes' 8-GPU nodes")
    parser.add_argument("--s-nodes", type=int, default=4, help="Slurm's 8-GPU nodes")
    parser.add_argument("--load", type=float, default=1.3,
                        help="batch GPU-minutes offered per Slurm-owned GPU-minute")
    args = parser.parse_args(argv)
    print(f"tidal: {args.k_nodes}x8 Kubernetes GPUs, {args.s_nodes}x8 Slurm GPUs, batch load "
          f"{args.load:.2f}, {args.days} days, {args.seeds} seeds; a move {MOVE_MIN} min")
    print(f"{'arm':12} {'wait min':>9} {'vs static':>9} {'complete':>9} {'lent GPU-h':>10} "
          f"{'trough lent':>11} {'in promise':>10} {'idle p95':>8} {'max':>7} "
          f"{'past promise':>12} {'infer short':>11}")
    base: Optional[float] = None
    for arm in ARMS:
        runs = [simulate(arm, seed, args.days, args.k_nodes, args.s_nodes, args.load)
                for seed in range(1, args.seeds + 1)]
        mean = {name: statistics.fmean(getattr(r, name) for r in runs)
                for name in Result.__dataclass_fields__}
        base = mean["wait"] if base is None else base
        ratio = mean["wait"] / base if base else float("nan")
        print(f"{arm:12} {mean['wait']:9.1f} {ratio:8.2f}x {mean['completion']:9.1f} "
              f"{mean['lent_gpu_h']:10.0f} {mean['trough_share']:10.0%} "
              f"{min(r.within_promise for r in runs):10.0%} "
              f"{mean['idle_reclaim_p95_s']:7.0f}s {max(r.reclaim_max_s for r in runs):6.0f}s "
              f"{mean['short_gpu_min']:12.0f} {mean['starved_gpu_min']:11.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
