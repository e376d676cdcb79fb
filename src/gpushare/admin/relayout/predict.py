# SPDX-License-Identifier: GPL-2.0-or-later
"""Whether a round's changes would help, predicted before any is made.

:func:`decide` weighs what could start on each layout now; it does not see how long a
drain keeps a node out of service, nor the waiting jobs of other kinds that the node then
cannot take. So each candidate (the changes decide chose on one node) is judged by running
Slurm forward from the live state, with and without it, under the rules of the simulator
(``sim``) that the benchmark replays traces with:

- the waiting jobs that can start (those decide counted), oldest first, each placed first
  fit on one node it may run on and run for its time limit (slurmctld knows no better);
- each busy GPU's held units come back when its jobs' time limits end;
- a changed node takes no new job, waits until its jobs end, is out of service for the
  change's steps (:func:`change_seconds`), and comes back with its new layout;
- the jobs submitted in the last ``LOOKBACK_S`` come again, each as many lookbacks later as
  the horizon holds: no future submission is known, so the recent past stands for it (a
  layout made for today's queue alone would starve the kinds that arrive next).

A candidate is made only when it lowers both the mean predicted wait of all jobs (MIG, MPS
and whole-GPU alike; a job not started by the horizon counts as still waiting, so a layout
that starves one kind cannot look better: a whole-GPU job with its wait until the horizon, a
MIG or MPS job with its wait on past it at the pace its kind started, see :func:`_waits`)
and the mean predicted completion time by
more than the change takes times ``SAFETY``, while neither class (MIG and MPS, whole-GPU)
waits longer on average, so one class's gain never pays for the other's loss. That must
hold under two futures, the recent submissions repeated and none at all (a change that pays
only if a burst goes on is not made), and against making no change and against draining
the node and bringing it back unchanged. The drained comparison holds back a change whose
forecast gain is the drain's alone: the model places jobs without reservations, so a drain
that frees a node's slices all at once lets a request of several slices start that kept
being passed by smaller ones; that gain is an artefact of when the drain ends, and did not
hold in the replays. Candidates are weighed in decide's order, each against the prediction
with those already made.
"""

from __future__ import annotations

import heapq
import itertools
import statistics
from dataclasses import dataclass, field, replace
from typing import Mapping, Optional, Sequence

from gpushare.admin.relayout import restore
from gpushare.admin.relayout.decide import Change, Decision, GpuState, Request, decide
from gpushare.admin.relayout.menu import Layout, Menu, give_back, take

__all__ = ["DEFAULT_LIMIT_S", "HORIZON_S", "LOOKBACK_S", "SAFETY", "Forecast", "Verdict",
           "change_seconds", "decide_guarded", "expected_arrivals", "forecast", "guard",
           "guard_back"]

# Each step of a change (docs/performance.md says where each figure comes from).
NVML_BASE_S = 10.0  # handles and the walk over MIG devices: "O(10 s)" (DRA driver, nvlib.go)
NVML_PER_GPU_S = 2.0  # destroy + create GIs/CIs: mig-manager ~9 s for 8 GPUs (mig-parted)
SLURMD_RESTART_S = 30.0  # RebootProgram ends, slurmd -b starts and re-registers (assumed)
RECONFIGURE_S = 10.0  # slurm.conf Gres= rewritten, scontrol reconfigure (assumed)

HORIZON_S = 4 * 3600.0  # how far ahead a round looks; a job not started by then waits this
LOOKBACK_S = 3600.0  # the recent past whose submissions stand for the next ones
DEFAULT_LIMIT_S = 3600.0  # a waiting job without a time limit (squeue's UNLIMITED) runs this
MAX_JOBS = 400  # the oldest waiting jobs a prediction places (the rest are left out of it)
# How many times its own duration a change must gain, on both means, to be made. The
# forecast runs each job for its time limit and sees no future submission, so a small
# forecast gain can be a loss: on held-out workloads, changes forecast to gain 1.0 to 1.55
# times their duration made MIG jobs wait 0.3 % longer. Twice is above that.
SAFETY = 2.0
# The most a MIG or MPS job not started by the horizon is told to wait past it.
TAIL_CAP_S = 24 * 3600.0


def expected_arrivals(recent: Sequence[tuple[float, Request]], horizon_s: float = HORIZON_S,
                      lookback_s: float = LOOKBACK_S) -> list[tuple[float, Request]]:
    """(seconds from now, request) of the submissions to expect: each of ``recent`` (seconds
    ago, request), submitted within ``lookback_s``, again every ``lookback_s``."""
    arrivals = []
    for ago, request in recent:
        if not 0.0 <= ago < lookback_s:
            continue
        at = lookback_s - ago
        while at < horizon_s:
            arrivals.append((at, replace(request, wait_s=0.0)))
            at += lookback_s
    arrivals.sort(key=lambda arrival: arrival[0])
    return arrivals


def change_seconds(gpus: int) -> float:
    """How long a node is out of service for changing ``gpus`` of its GPUs, once idle."""
    return NVML_BASE_S + NVML_PER_GPU_S * gpus + SLURMD_RESTART_S + RECONFIGURE_S


@dataclass(frozen=True)
class Forecast:
    """Predicted means over the waiting jobs, from now: wait of MIG and MPS jobs, completion
    (wait + time limit) of all; ``started`` of ``jobs`` start within the horizon; ``wait_s``
    the wait of all, whole-GPU jobs included, an unstarted one's as :func:`_waits` tells it."""

    mig_wait_s: float
    completion_s: float
    started: int
    jobs: int
    mig_jobs: int
    wait_s: float = 0.0
    whole_wait_s: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """One candidate: its changes, the predictions without and with it, and whether made."""

    node: str
    changes: tuple[Change, ...]
    without: Forecast
    with_it: Forecast
    cost_s: float
    made: bool
    need_s: float = 0.0  # what both means had to fall by: cost_s times the safety factor
    drain_only: Optional[Forecast] = None  # the node drained and back with its old layouts
    quiet_without: Optional[Forecast] = None  # the same two with no submission expected
    quiet_with: Optional[Forecast] = None
    refusal: str = ""  # what fell short, where refused
    back: bool = False  # a change back to the plan's layouts (``restore``)

    def line(self) -> str:
        gpus = ",".join(str(c.index) for c in self.changes)
        layouts = "/".join(sorted({c.old for c in self.changes}))
        return (f"{self.node} GPU {gpus}: {layouts} -> {self.changes[0].new}: predicted over "
                f"{HORIZON_S / 3600:.0f} h, wait {self.without.wait_s / 60:.1f} -> "
                f"{self.with_it.wait_s / 60:.1f} min (MIG {self.without.mig_wait_s / 60:.1f}"
                f" -> {self.with_it.mig_wait_s / 60:.1f}), completion "
                f"{self.without.completion_s / 60:.1f} -> {self.with_it.completion_s / 60:.1f}"
                " min" + (f" (drained alone: {self.drain_only.wait_s / 60:.1f} and "
                          f"{self.drain_only.completion_s / 60:.1f} min)"
                          if self.drain_only else "")
                + (f"; with no submission {self.quiet_without.wait_s / 60:.1f} -> "
                   f"{self.quiet_with.wait_s / 60:.1f} min"
                   if self.quiet_without and self.quiet_with else "")
                + ": " + ("made" if self.made else f"refused, {self.refusal}")
                + (f" (back to the plan's layouts: made only when no mean wait and not the "
                   f"completion grows by more than {self.need_s:.0f} s, "
                   f"{self.need_s / self.cost_s:g} x the change's {self.cost_s:.0f} s)"
                   if self.back else
                   f" (made only when both fall by more than {self.need_s:.0f} s, "
                   f"{self.need_s / self.cost_s:g} x the change's {self.cost_s:.0f} s)"))


@dataclass
class _Node:
    gpus: list[GpuState]
    free: list[dict[str, int]]
    layouts: list[Layout] = field(default_factory=list)  # each GPU's, the new one once back
    up: bool = True
    busy: int = 0  # GPUs whose jobs have not ended yet
    new: dict[int, Layout] = field(default_factory=dict)  # the changed GPUs' layouts


def forecast(requests: Sequence[Request], gpus: Sequence[GpuState],
             new_layouts: Optional[dict[tuple[str, int], Layout]] = None,
             horizon_s: float = HORIZON_S,
             arrivals: Sequence[tuple[float, Request]] = ()) -> Forecast:
    """The next ``horizon_s`` seconds, the GPUs in ``new_layouts`` changed and ``arrivals``
    (seconds from now, request) submitted (see the module's docstring for the model)."""
    new_layouts = new_layouts or {}
    nodes: dict[str, _Node] = {}
    for gpu in gpus:
        node = nodes.setdefault(gpu.node, _Node([], []))
        node.gpus.append(gpu)
        node.layouts.append(gpu.layout)
        # An idle GPU gives what its layout serves (one with MPS units also whole).
        node.free.append(gpu.idle() if gpu.used else gpu.layout.serves())
    events: list[tuple[float, int, str, str, int]] = []  # time, seq, what, node, gpu or job
    seq = itertools.count()
    for name, node in nodes.items():
        for position, gpu in enumerate(node.gpus):
            if (name, gpu.index) in new_layouts:
                node.new[position] = new_layouts[(name, gpu.index)]
            if not gpu.used:
                continue
            node.busy += 1
            if gpu.ends_in_s is not None and gpu.ends_in_s <= horizon_s:
                heapq.heappush(events, (max(gpu.ends_in_s, 0.0), next(seq), "free", name,
                                        position))
        if node.new:
            node.up = False
            if not node.busy:
                heapq.heappush(events, (change_seconds(len(node.new)), next(seq), "back",
                                        name, 0))
    order = sorted(range(len(requests)), key=lambda i: -requests[i].wait_s)[:MAX_JOBS]
    jobs = [requests[i] for i in order]
    submitted = [0.0] * len(jobs)
    queues: dict[str, list[int]] = {}
    for number, job in enumerate(jobs):
        queues.setdefault(job.kind, []).append(number)
    for at, request in arrivals:
        if at <= horizon_s:
            heapq.heappush(events, (at, next(seq), "submit", "", len(jobs)))
            jobs.append(request)
            submitted.append(at)
    limits = [r.limit_s if r.limit_s is not None else DEFAULT_LIMIT_S for r in jobs]
    starts: list[Optional[float]] = [None] * len(jobs)
    held: dict[int, list[tuple[int, int]]] = {}  # job → (GPU position, units)

    def room(node: _Node, kind: str) -> int:
        return sum(free.get(kind, 0) for free in node.free) if node.up else 0

    def schedule(now: float) -> None:
        for kind, queue in queues.items():
            best = max((room(node, kind) for node in nodes.values()), default=0)
            if not best:
                continue
            left = []
            for number in queue:
                job = jobs[number]
                if best and job.count <= best and _place(number, job, now):
                    best = max((room(node, kind) for node in nodes.values()), default=0)
                    continue
                left.append(number)
            queues[kind] = left

    def _place(number: int, job: Request, now: float) -> bool:
        for name, node in nodes.items():
            if job.nodes is not None and name not in job.nodes:
                continue
            if room(node, job.kind) < job.count:
                continue
            frees = list(enumerate(node.free))
            if job.kind == "mps":  # one GPU per node, as the replay (sim.simulate)
                frees = [(p, f) for p, f in frees if f.get("mps", 0) >= job.count][:1]
                if not frees:
                    continue
            need, taken = job.count, []
            for position, free in frees:
                units = min(need, free.get(job.kind, 0))
                if units:
                    take(node.layouts[position], free, job.kind, units)
                    taken.append((position, units))
                    need -= units
                if not need:
                    break
            starts[number], held[number] = now, taken
            if now + limits[number] <= horizon_s:
                heapq.heappush(events, (now + limits[number], next(seq), "end", name, number))
            return True
        return False

    schedule(0.0)
    while events:
        now, _, what, name, ident = heapq.heappop(events)
        if now > horizon_s:
            break
        if what == "submit":
            queues.setdefault(jobs[ident].kind, []).append(ident)
            schedule(now)
            continue
        node = nodes[name]
        if what == "end":
            for position, units in held.pop(ident):
                give_back(node.layouts[position], node.free[position], jobs[ident].kind, units)
        elif what == "free":
            node.busy -= 1
            gpu = node.gpus[ident]
            for kind, units in gpu.used.items():
                give_back(node.layouts[ident], node.free[ident], kind, units)
            if node.new and not node.busy:
                heapq.heappush(events, (now + change_seconds(len(node.new)), next(seq),
                                        "back", name, 0))
        elif what == "back":
            for position, layout in node.new.items():
                node.free[position] = dict(layout.serves())
                node.layouts[position] = layout
            node.up = True
        schedule(now)
    waits = _waits(starts, submitted, jobs, horizon_s)
    mig = [w for w, job in zip(waits, jobs) if job.kind != "whole"]
    whole = [w for w, job in zip(waits, jobs) if job.kind == "whole"]
    return Forecast(statistics.fmean(mig) if mig else 0.0,
                    statistics.fmean(w + lim for w, lim in zip(waits, limits)) if jobs else 0.0,
                    sum(1 for s in starts if s is not None), len(jobs), len(mig),
                    statistics.fmean(waits) if waits else 0.0,
                    statistics.fmean(whole) if whole else 0.0)


def _waits(starts: Sequence[Optional[float]], submitted: Sequence[float],
           jobs: Sequence[Request], horizon_s: float) -> list[float]:
    """Each job's predicted wait from its submission. A MIG or MPS job not started by the
    horizon waits on past it at the pace its kind started within it: the n-th of a kind left
    waiting, of which k started, n x horizon / k longer (at most ``TAIL_CAP_S``; that long
    where none started). Counted only until the horizon, a backlog of hours looks the same
    with and without a change that serves it, and such changes were refused (gen-load80-12h:
    the forecast gain of 4 GPUs for a queue of 300 2g.20gb jobs read 61 s). A whole-GPU job
    not started counts its wait until the horizon only: told past it too, changes were made
    that took MIG slices for whole-GPU jobs, and MIG jobs paid for them (docs/performance.md).
    """
    pace: dict[str, int] = {}
    for start, job in zip(starts, jobs):
        if start is not None:
            pace[job.kind] = pace.get(job.kind, 0) + 1
    behind: dict[str, int] = {}
    waits = []
    for start, at, job in zip(starts, submitted, jobs):
        if start is not None:
            waits.append(start - at)
            continue
        past = 0.0
        if job.kind != "whole":
            behind[job.kind] = behind.get(job.kind, 0) + 1
            started = pace.get(job.kind, 0)
            past = min(behind[job.kind] * horizon_s / started, TAIL_CAP_S) if started \
                else TAIL_CAP_S
        waits.append(horizon_s + past - at)
    return waits


def _shortfall(without: Forecast, with_it: Forecast, need_s: float) -> str:
    """"" when both the mean wait of all jobs and the mean completion fall by more than
    ``need_s`` and neither class waits longer, MIG and MPS jobs nor whole-GPU ones; else what
    falls short. A change that gives GPUs back to starving whole-GPU jobs can be made, one
    that starves either class cannot, and one class's gain never pays for the other's loss."""
    if with_it.whole_wait_s > without.whole_wait_s:
        return (f"whole-GPU jobs would wait longer ({without.whole_wait_s / 60:.1f} -> "
                f"{with_it.whole_wait_s / 60:.1f} min)")
    if with_it.mig_wait_s > without.mig_wait_s:
        return (f"MIG and MPS jobs would wait longer ({without.mig_wait_s / 60:.1f} -> "
                f"{with_it.mig_wait_s / 60:.1f} min)")
    if without.wait_s - with_it.wait_s <= need_s:
        return f"the wait falls by {max(without.wait_s - with_it.wait_s, 0.0):.0f} s"
    if without.completion_s - with_it.completion_s <= need_s:
        return ("the completion time falls by "
                f"{max(without.completion_s - with_it.completion_s, 0.0):.0f} s")
    return ""


def _futures(recent: Sequence[tuple[float, Request]], lookback_s: float
             ) -> list[list[tuple[float, Request]]]:
    """The futures a change is weighed in: the recent submissions recurring (burst on), and
    none at all, where there were any."""
    arrivals = expected_arrivals(recent, lookback_s=lookback_s) if lookback_s > 0 else []
    return [arrivals] + ([[]] if arrivals else [])


def _new_layouts(changes: Sequence[Change], gpus: Sequence[GpuState],
                 menus: dict[str, Menu]) -> dict[tuple[str, int], Layout]:
    """Each changed GPU's new layout, from its group's menu (decide and restore choose from
    it)."""
    group_of = {(gpu.node, gpu.index): gpu.group for gpu in gpus}
    layouts = {}
    for change in changes:
        item = menus[group_of[(change.node, change.index)]].item(change.new)
        assert item is not None  # chosen from this menu
        layouts[(change.node, change.index)] = item.layout
    return layouts


def guard(decision: Decision, requests: Sequence[Request], gpus: Sequence[GpuState],
          menus: dict[str, Menu], safety: float = SAFETY,
          recent: Sequence[tuple[float, Request]] = (), lookback_s: float = LOOKBACK_S
          ) -> tuple[Decision, list[Verdict]]:
    """``decision`` with only the candidates the prediction says gain, and each verdict;
    ``recent``: (seconds ago, request) of the last ``lookback_s``'s submissions, which
    recur every ``lookback_s`` in one of the futures weighed."""
    if not decision.changes:
        return decision, []
    layout_of = {(gpu.node, gpu.index): gpu.layout for gpu in gpus}
    by_node: dict[str, list[Change]] = {}
    for change in decision.changes:
        by_node.setdefault(change.node, []).append(change)
    made: dict[tuple[str, int], Layout] = {}
    kept: list[Change] = []
    verdicts: list[Verdict] = []
    futures = _futures(recent, lookback_s)
    bases = [forecast(requests, gpus, arrivals=future) for future in futures]
    for node, changes in by_node.items():
        trial = {**made, **_new_layouts(changes, gpus, menus)}
        same = {**made, **{(c.node, c.index): layout_of[(c.node, c.index)] for c in changes}}
        cost = change_seconds(len(changes))
        predicted = [forecast(requests, gpus, trial, arrivals=future) for future in futures]
        drained: list[Forecast] = []
        refusal = ""
        for number, (future, base, with_it) in enumerate(zip(futures, bases, predicted)):
            when = " with no submission" if number else ""
            refusal = _shortfall(base, with_it, safety * cost)
            if refusal:
                refusal += when
                break
            drained.append(forecast(requests, gpus, same, arrivals=future))
            refusal = _shortfall(drained[-1], with_it, safety * cost)
            if refusal:
                refusal += f" against draining the node alone{when}"
                break
        ok = not refusal
        verdicts.append(Verdict(node, tuple(changes), bases[0], predicted[0], cost, ok,
                                safety * cost, drained[0] if drained else None,
                                bases[1] if len(bases) > 1 else None,
                                predicted[1] if len(predicted) > 1 else None, refusal))
        if ok:
            made, bases = trial, predicted
            kept.extend(changes)
    why = [line for line in decision.why if not any(
        line.startswith(f"{v.node} GPU ") and "wait-weighted" in line
        for v in verdicts if not v.made)]
    why += [verdict.line() for verdict in verdicts]
    if not kept:
        why.append("no change: none is predicted to shorten the waits by more than it costs")
    return replace(decision, changes=kept, why=why), verdicts


def _worse(without: Forecast, with_it: Forecast, allow_s: float = 0.0) -> str:
    """"" when no mean grows by more than ``allow_s``, MIG and MPS jobs', whole-GPU jobs',
    all jobs' wait and the completion time; else the first that does."""
    for what, before, after in (
            ("whole-GPU jobs would wait longer", without.whole_wait_s, with_it.whole_wait_s),
            ("MIG and MPS jobs would wait longer", without.mig_wait_s, with_it.mig_wait_s),
            ("jobs would wait longer", without.wait_s, with_it.wait_s),
            ("jobs would complete later", without.completion_s, with_it.completion_s)):
        if after > before + allow_s:
            return f"{what} ({before / 60:.1f} -> {after / 60:.1f} min)"
    return ""


def guard_back(decision: Decision, requests: Sequence[Request], gpus: Sequence[GpuState],
               menus: dict[str, Menu], back: restore.Back, max_changes: int = 4,
               one_profile_per_node: bool = False, floors: Optional[Mapping[str, int]] = None,
               recent: Sequence[tuple[float, Request]] = (), lookback_s: float = LOOKBACK_S,
               max_drain_s: Optional[float] = 5400.0, safety: float = SAFETY
               ) -> tuple[Decision, list[Verdict]]:
    """``decision`` with the changes back to the plan's layouts (``restore``) that the
    prediction finds harm no job, in both futures, after the decision's own changes."""
    budget = max_changes - len(decision.changes)
    made = _new_layouts(decision.changes, gpus, menus)
    skip = {change.node for change in decision.changes}
    futures: list[list[tuple[float, Request]]] = []
    bases: list[Forecast] = []
    kept = list(decision.changes)
    verdicts = []
    while budget > 0:
        # Weighed again after each verdict: a refused node's changes must not count as
        # made for the nodes after it (they would look less short than they are).
        layout_of = {(gpu.node, gpu.index): made.get((gpu.node, gpu.index), gpu.layout)
                     for gpu in gpus}
        changes = next(restore.each_node(gpus, layout_of, menus, back, floors,
                                         one_profile_per_node, frozenset(skip), budget,
                                         max_drain_s), None)
        if changes is None:
            break
        skip.add(changes[0].node)
        if not bases:
            futures = _futures(recent, lookback_s)
            bases = [forecast(requests, gpus, made, arrivals=future) for future in futures]
        trial = {**made, **_new_layouts(changes, gpus, menus)}
        predicted = [forecast(requests, gpus, trial, arrivals=future) for future in futures]
        refusal = ""
        cost = change_seconds(len(changes))
        for number, (base, with_it) in enumerate(zip(bases, predicted)):
            refusal = _worse(base, with_it, safety * cost)
            if refusal:
                refusal += " with no submission" if number else ""
                break
        verdicts.append(Verdict(changes[0].node, tuple(changes), bases[0], predicted[0], cost,
                                not refusal, safety * cost, None,
                                bases[1] if len(bases) > 1 else None,
                                predicted[1] if len(predicted) > 1 else None, refusal,
                                back=True))
        if not refusal:
            made, bases = trial, predicted
            kept.extend(changes)
            budget -= len(changes)
    if not verdicts:
        return decision, []
    why = [line for line in decision.why if not line.startswith("no change")] \
        if len(kept) > len(decision.changes) else list(decision.why)
    why += [verdict.line() for verdict in verdicts]
    return replace(decision, changes=kept, why=why), verdicts


def decide_guarded(requests: Sequence[Request], gpus: Sequence[GpuState],
                   menus: dict[str, Menu], max_changes: int = 4, hysteresis: float = 0.5,
                   max_drain_s: Optional[float] = 5400.0, one_profile_per_node: bool = False,
                   safety: float = SAFETY, recent: Sequence[tuple[float, Request]] = (),
                   lookback_s: float = LOOKBACK_S, floors: Optional[Mapping[str, int]] = None,
                   back: Optional[restore.Back] = None) -> tuple[Decision, list[Verdict]]:
    """A round's decision: decide's candidates (none under a kind's floor in ``floors``,
    ``keep``), each kept only where predicted to gain; then, with ``back``, the changes
    back to the plan's layouts that harm no job (``restore``).
    ``gpushare relayout`` and the simulator's relayout both call this."""
    decision = decide(requests, gpus, menus, max_changes, hysteresis,
                      max_drain_s=max_drain_s, one_profile_per_node=one_profile_per_node,
                      floors=floors)
    decision, verdicts = guard(decision, requests, gpus, menus, safety, recent, lookback_s)
    if back is None:
        return decision, verdicts
    decision, returned = guard_back(decision, requests, gpus, menus, back, max_changes,
                                    one_profile_per_node, floors, recent, lookback_s,
                                    max_drain_s, safety)
    return decision, verdicts + returned
