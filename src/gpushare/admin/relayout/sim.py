# SPDX-License-Identifier: GPL-2.0-or-later
"""A simulated Slurm cluster that replays a GPU job history, with and without relayout.

It is shared by the benchmark (bench/bench_relayout.py), ``gpushare relayout --suggest``
(whose static layouts are :mod:`~gpushare.admin.relayout.static`'s) and ``--trial``
(:mod:`~gpushare.admin.relayout.trial`),
so a site's own history replays on its own cluster: the GPU model, the menu and the node
shape come from a :class:`Cluster`, built from the plan (:func:`cluster_from_plan`) or the
benchmark's default (:func:`default_cluster`, 4 nodes of 8 H100-80GB).

The model of Slurm: jobs start in submit order wherever their request fits (first fit on
one node; a later job may pass one that does not fit); a node chosen for a change is
drained, so no new job lands on it, and waits until its last job ends (a job scheduled in
the ``drain_latency`` before the drain took hold counts as landed during the change); then
it is out of service for the change's steps and comes back with the new layout. No running
job is ever stopped.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import statistics
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from gpushare.admin.mig_profiles import GpuModel, find_model
from gpushare.admin.relayout.decide import GpuState, Request
from gpushare.admin.relayout.keep import DEFAULT_KEEP_H, Span, capacity, floors, reaches, unknown
from gpushare.admin.relayout.menu import Layout, Menu, MenuItem, give_back, parse_layout, take
from gpushare.admin.relayout.predict import LOOKBACK_S, SAFETY, change_seconds, decide_guarded
from gpushare.admin.relayout.restore import Back

if TYPE_CHECKING:
    from gpushare.admin.plan import Plan

__all__ = ["Cluster", "Job", "Result", "cluster_from_plan", "default_cluster", "simulate"]

DEFAULT_MENU = ("7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "2x3g.40gb", "whole")
TIME_LIMIT_FACTOR = 2.0  # a job's time limit, as a multiple of its run time (assumed)


@dataclass(frozen=True)
class Cluster:
    """What the history replays on: ``nodes`` nodes of ``gpus_per_node`` GPUs of ``model``,
    each taking a layout of ``menu``; beside them on each node, ``fixed``: Slurm's part of
    the GPUs no relayout changes (a GPU shared with Kubernetes), which serves jobs too.
    ``one_profile``: each node may give Slurm one MIG profile only (Slurm 22.05)."""

    model: GpuModel
    menu: Menu
    nodes: int
    gpus_per_node: int
    name: str = "default"
    fixed: tuple[Layout, ...] = ()
    one_profile: bool = False

    @property
    def names(self) -> list[str]:
        return [item.layout.name for item in self.menu.items]

    def resized(self, nodes: int) -> Cluster:
        return Cluster(self.model, self.menu, nodes, self.gpus_per_node, self.name,
                       self.fixed, self.one_profile)

    def fits(self, layouts: Sequence[Layout]) -> bool:
        """Whether one node's layouts (with its fixed GPUs) keep Slurm's one MIG profile
        per node, where that rule holds."""
        profiles = {p for layout in (*layouts, *self.fixed) for p in layout.slices}
        return not self.one_profile or len(profiles) <= 1

    def share(self, kind: str) -> float:
        """One unit's share of a GPU: a 3g slice 3/7 (3/4 on an A30), an MPS unit 1/units."""
        if kind == "whole":
            return 1.0
        if kind == "mps":
            units = max((item.layout.mps for item in self.menu.items), default=0)
            return 1.0 / (units or 100)
        profile = self.model.profile(kind)
        if profile is None or not self.model.compute_slices:
            return 1.0
        return profile.compute_slices / self.model.compute_slices


def _menu(model: GpuModel, texts: Sequence[str], min_interval_s: int = 3600) -> Menu:
    items = []
    for text in texts:
        layout, why = parse_layout(text, model)
        if layout is None:
            raise ValueError(why)
        items.append(MenuItem(layout, 0, 10**6, 0))
    return Menu(tuple(items), min_interval_s, 0)


def default_cluster(nodes: int = 4, gpus_per_node: int = 8,
                    menu: Sequence[str] = DEFAULT_MENU) -> Cluster:
    """The benchmark's cluster: H100-80GB, the four-layout menu, a GPU changes once an hour."""
    model = find_model("h100-80gb")
    assert model is not None
    return Cluster(model, _menu(model, menu), nodes, gpus_per_node)


def cluster_from_plan(plan: Plan, group: Optional[str] = None,
                      nodes: Optional[int] = None, release: Optional[str] = None) -> Cluster:
    """The plan's node group with a relayout menu (``group``: which one, when several):
    its GPU model, its menu, its node count (or ``nodes``), its Slurm-only GPUs per node
    and Slurm's slices of the others; one MIG profile per node where the Slurm release
    (the plan's, else ``release``, e.g. the installed one) needs it. ValueError says what
    is missing."""
    with_menu = [g for g in plan.groups if g.relayout is not None]
    if group is not None:
        with_menu = [g for g in with_menu if g.name == group]
        if not with_menu:
            names = ", ".join(g.name for g in plan.groups if g.relayout is not None) or "none"
            raise ValueError(f"{plan.path}: no node group {group!r} with a relayout menu "
                             f"(groups with one: {names})")
    if not with_menu:
        raise ValueError(f"{plan.path}: no node group has a relayout menu; add one (docs/"
                         "admin.md, MIG layouts that follow the queue)")
    if len(with_menu) > 1:
        raise ValueError(f"{plan.path}: node groups {', '.join(g.name for g in with_menu)} "
                         "have relayout menus; name one with --group")
    chosen = with_menu[0]
    menu = chosen.relayout
    assert menu is not None
    from gpushare.admin.relayout.menu import layout_name, one_profile_per_node

    per_node = sum(1 for gpu in chosen.gpus if gpu.changeable)
    fixed = tuple(Layout(layout_name(slices), slices) for slices in (
        tuple(sorted(s.profile for s in gpu.slices_of("slurm")))
        for gpu in chosen.gpus if not gpu.changeable) if slices)
    version = plan.slurm.version if plan.slurm.version_given else release
    return Cluster(chosen.model, menu, nodes or len(chosen.nodes), per_node, chosen.name,
                   fixed, bool(version) and one_profile_per_node(str(version)))


@dataclass
class Job:
    id: int
    submit: float
    run: float
    kind: str
    count: int
    user: str
    start: Optional[float] = None
    node: int = -1
    held: list[tuple[int, str, int]] = field(default_factory=list)  # (gpu, kind, units)
    limit: Optional[float] = None  # its time limit where the history has one (sacct)


def _started(job: Job, now: float) -> float:
    """When ``job`` started (``now`` if it has not): 0.0 is a start like any other."""
    return now if job.start is None else job.start


def twice_the_run(job: Job) -> float:
    """The time limit slurmctld knows a replayed job by: ``TIME_LIMIT_FACTOR`` times its run
    (a replay may give another, ``simulate``'s ``limit``)."""
    return TIME_LIMIT_FACTOR * job.run


@dataclass
class _Gpu:
    layout: Layout
    free: dict[str, int]
    jobs: set[int] = field(default_factory=set)
    last_change: Optional[float] = None
    target: Optional[Layout] = None


@dataclass(eq=False)  # by identity: two nodes alike are still two nodes (``nodes.index``)
class _Node:
    gpus: list[_Gpu]
    state: str = "up"  # up | draining | changing
    drain_at: float = 0.0
    running: set[int] = field(default_factory=set)
    free: dict[str, int] = field(default_factory=dict)  # its GPUs' free units, summed
    # Its idle GPUs with MPS units, in ``free`` both whole and as units: counted once idle.
    whole_mps: int = 0

    def count_free(self) -> None:
        self.free = {}
        self.whole_mps = 0
        for gpu in self.gpus:
            for kind, units in gpu.free.items():
                self.free[kind] = self.free.get(kind, 0) + units
            if gpu.layout.mps and gpu.free.get("whole"):
                self.whole_mps += 1


@dataclass
class Result:
    waits: dict[str, list[float]]
    jct: list[float]
    used_gpu_h: float
    idle_waiting_gpu_h: float
    changes: int
    gpu_hours: float
    landed_during_change: int
    disturbed: int
    unfinished: int
    change_times: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    # (job id, kind, wait, completion time) of every finished job, to compare two runs on
    # the jobs both ran
    finished: list[tuple[int, str, float, float]] = field(default_factory=list)
    # (job id, kind, wait until the replay's cut, two days after the last submission, that
    # wait + run) of every job not started by then: left out, starving a kind would look
    # better
    unstarted: list[tuple[int, str, float, float]] = field(default_factory=list)
    # the finished jobs that started after the cut (also in ``unstarted``)
    late: frozenset[int] = frozenset()

    def most_changes_in_an_hour(self) -> int:
        """The most changes of one GPU within any hour (a window of 3600 s)."""
        most = 0
        for times in self.change_times.values():
            for position, start in enumerate(times):
                most = max(most, sum(1 for t in times[position:] if t < start + 3600))
        return most

    def ran(self) -> set[int]:
        return {job for job, _, _, _ in self.finished}

    def mig_wait(self, among: Optional[set[int]] = None) -> float:
        """Mean wait of the MIG and MPS jobs that ran (of ``among``, when given)."""
        values = [w for job, kind, w, _ in self.finished
                  if kind != "whole" and (among is None or job in among)]
        return statistics.fmean(values) if values else 0.0

    def censored_waits(self, kind: Optional[str] = None) -> list[float]:
        """The wait of every job (of ``kind``: "mig" for MIG and MPS, "slices" for MIG
        alone, or a kind), a job not started by the replay's cut with its wait until then."""
        return [w for _, k, w, _ in self._censored()
                if kind is None or k == kind or (kind == "mig" and k != "whole")
                or (kind == "slices" and k not in ("mps", "whole"))]

    def _censored(self) -> list[tuple[int, str, float, float]]:
        return [entry for entry in self.finished if entry[0] not in self.late] \
            + self.unstarted

    def censored_wait(self, kind: Optional[str] = None) -> float:
        """Mean of :meth:`censored_waits` (0 where none)."""
        values = self.censored_waits(kind)
        return statistics.fmean(values) if values else 0.0

    def censored_jct(self) -> float:
        """Mean completion time of every job, a job not started by the replay's cut counted
        as its wait until then plus its run."""
        values = [c for _, _, _, c in self._censored()]
        return statistics.fmean(values) if values else 0.0

    def mean_jct(self, among: Optional[set[int]] = None) -> float:
        """Mean completion time (wait + run) of the jobs that ran (of ``among``)."""
        values = [c for job, _, _, c in self.finished if among is None or job in among]
        return statistics.fmean(values) if values else 0.0


def simulate(jobs: list[Job], layouts: list[list[Layout]], relayout: bool,
             cluster: Optional[Cluster] = None, interval: float = 300.0, max_changes: int = 4,
             hysteresis: float = 0.5, drain_latency: float = 5.0,
             safety: float = SAFETY, keep_s: float = DEFAULT_KEEP_H * 3600.0,
             history: Sequence[Span] = (), earlier: Sequence[Job] = (),
             limit: Callable[[Job], float] = twice_the_run) -> Result:
    """Replay ``jobs`` on nodes laid out as ``layouts`` (per node, its GPUs' layouts);
    with ``relayout``, every ``interval`` seconds a round of :func:`decide_guarded`, the
    decision ``gpushare relayout`` makes (a change only where predicted to gain, none under
    a kind's floor: what its jobs held at once in the last ``keep_s``, ``history``'s spans,
    before time 0, counted with the replay's own; 0: no floor). ``earlier``: jobs submitted
    before time 0, which the first rounds' forecast repeats with the replay's own (what
    ``gpushare relayout`` reads from sacct); a replay without them starts a new site.
    ``limit``: each job's time limit, all relayout's forecast knows of its run."""
    cluster = cluster or default_cluster(len(layouts), len(layouts[0]) if layouts else 0)
    jobs = [replace(j, start=None, node=-1, held=[]) for j in jobs]
    # Each node's fixed GPUs come after those a relayout may change (never changed here).
    nodes = [_Node([_Gpu(lay, dict(lay.serves())) for lay in (*node, *cluster.fixed)])
             for node in layouts]
    changeable = [len(node) for node in layouts]
    planned = {(str(number), index): layout for number, node in enumerate(layouts)
               for index, layout in enumerate(node)}
    baseline = capacity(lay for node in layouts for lay in (*node, *cluster.fixed))
    the_menu = cluster.menu
    kinds = {kind for item in the_menu.items for kind in item.layout.serves()}
    kinds |= {kind for node in layouts for lay in (*node, *cluster.fixed)
              for kind in lay.serves()}
    # "whole" too: the idle count weighs MPS GPUs taken whole even where no layout is whole.
    share_of = {kind: cluster.share(kind) for kind in kinds | {j.kind for j in jobs} | {"whole"}}
    share = share_of.__getitem__
    events: list[tuple[float, int, str, int]] = []  # (time, seq, what, id)
    seq = itertools.count()
    for job in jobs:
        heapq.heappush(events, (job.submit, next(seq), "submit", job.id))
    by_id = {job.id: job for job in jobs}
    by_submit = sorted([*(j for j in earlier if j.submit < 0), *jobs],
                       key=lambda job: job.submit)
    submits = [job.submit for job in by_submit]
    horizon = max((j.submit for j in jobs), default=0.0)
    if relayout:
        t = interval
        while t <= horizon + 2 * 86400:
            heapq.heappush(events, (t, next(seq), "round", 0))
            t += interval
    pending: dict[str, list[int]] = {}
    holds: list[Span] = []  # each started job's, for the floors
    result = Result({}, [], 0.0, 0.0, 0, 0.0, 0, 0, 0)
    total_gpus = sum(len(n.gpus) for n in nodes)
    now = 0.0
    done = 0

    for node in nodes:
        node.count_free()

    def idle_share() -> float:
        idle = 0.0
        for node in nodes:
            if node.state == "changing":
                idle += len(node.gpus)
                continue
            idle += sum(share_of[k] * n for k, n in node.free.items())
            idle -= share_of["whole"] * node.whole_mps
        return idle

    def try_start(job: Job) -> bool:
        for number, node in enumerate(nodes):
            if node.state != "up" and not (node.state == "draining" and now < node.drain_at):
                continue
            if node.free.get(job.kind, 0) < job.count:
                continue
            gpus = list(enumerate(node.gpus))
            if job.kind == "mps":  # one GPU per node (Slurm's MPS without MULTIPLE_SHARING_GRES_PJ)
                gpus = [(i, g) for i, g in gpus if g.free.get("mps", 0) >= job.count][:1]
                if not gpus:
                    continue
            need = job.count
            for index, gpu in gpus:
                units = min(need, gpu.free.get(job.kind, 0))
                if units:
                    take(gpu.layout, gpu.free, job.kind, units)
                    gpu.jobs.add(job.id)
                    job.held.append((index, job.kind, units))
                    need -= units
                if not need:
                    break
            node.count_free()
            if node.state == "draining":
                result.landed_during_change += 1
            job.start, job.node = now, number
            holds.append(Span(now, now + job.run, job.kind, job.count))
            node.running.add(job.id)
            heapq.heappush(events, (now + job.run, next(seq), "end", job.id))
            return True
        return False

    def schedule() -> None:
        for kind, queue in pending.items():
            if not queue:
                continue
            best = max((n.free.get(kind, 0) for n in nodes
                        if n.state == "up" or (n.state == "draining" and now < n.drain_at)),
                       default=0)
            if best == 0:
                continue
            left = []
            for job_id in queue:
                job = by_id[job_id]
                if job.count <= best and try_start(job):
                    best = max((n.free.get(kind, 0) for n in nodes if n.state == "up"),
                               default=0)
                    continue
                left.append(job_id)
            pending[kind] = left

    def maybe_change(node: _Node) -> None:
        if node.state == "draining" and not node.running and now >= node.drain_at:
            count = sum(1 for gpu in node.gpus if gpu.target is not None)
            steps = change_seconds(count)
            node.state = "changing"
            heapq.heappush(events, (now + steps, next(seq), "changed", nodes.index(node)))

    last = 0.0
    while events and done < len(jobs):
        time_, _, what, ident = heapq.heappop(events)
        waiting = any(pending.values())
        if waiting:
            result.idle_waiting_gpu_h += idle_share() * (time_ - last) / 3600.0
        last = now = time_
        if what == "submit":
            pending.setdefault(by_id[ident].kind, []).append(ident)
        elif what == "end":
            job = by_id[ident]
            node = nodes[job.node]
            for index, kind, units in job.held:
                give_back(node.gpus[index].layout, node.gpus[index].free, kind, units)
                node.gpus[index].jobs.discard(job.id)
            node.count_free()
            node.running.discard(job.id)
            done += 1
            started = _started(job, now)
            result.waits.setdefault(job.kind, []).append(started - job.submit)
            result.jct.append(started - job.submit + job.run)
            result.finished.append((job.id, job.kind, started - job.submit,
                                    started - job.submit + job.run))
            result.used_gpu_h += share(job.kind) * job.count * job.run / 3600.0
            maybe_change(node)
        elif what == "drain":
            maybe_change(nodes[ident])
        elif what == "changed":
            node = nodes[ident]
            for index, gpu in enumerate(node.gpus):
                if gpu.target is not None:
                    if gpu.jobs:
                        result.disturbed += 1
                    gpu.layout, gpu.free = gpu.target, dict(gpu.target.serves())
                    gpu.target, gpu.last_change = None, now
                    result.changes += 1
                    result.change_times.setdefault((ident, index), []).append(now)
            node.count_free()
            node.state = "up"
        elif what == "round":
            # slurmctld knows a job's run only from its time limit.
            requests = [Request(str(j), by_id[j].kind, by_id[j].count, now - by_id[j].submit,
                                limit_s=limit(by_id[j]))
                        for queue in pending.values() for j in queue]
            states = []
            for number, node in enumerate(nodes):
                if node.state != "up":
                    continue
                for index, gpu in enumerate(node.gpus):
                    used = {k: n - gpu.free.get(k, 0) for k, n in gpu.layout.offers().items()
                            if n > gpu.free.get(k, 0)}
                    # slurmctld knows a job's end only from its time limit.
                    ends = max((_started(by_id[j], now) + limit(by_id[j]) - now
                                for j in gpu.jobs), default=0.0)
                    states.append(GpuState(str(number), index, "g", gpu.layout, bool(gpu.jobs),
                                           index < changeable[number], None
                                           if gpu.last_change is None
                                           else now - gpu.last_change, used, ends))
            first = bisect.bisect_right(submits, now - LOOKBACK_S)
            recent = [(now - job.submit, Request(str(job.id), job.kind, job.count, 0.0,
                                                 limit_s=limit(job)))
                      for job in by_submit[first:bisect.bisect_right(submits, now)]]
            held = [span for span in holds if (span.end or now) > now - keep_s] \
                if keep_s else []
            spans = [*history, *held]
            decision, _ = decide_guarded(requests, states, {"g": the_menu}, max_changes,
                                         hysteresis, safety=safety, recent=recent,
                                         one_profile_per_node=cluster.one_profile,
                                         floors=_floors(spans, now, keep_s, baseline)
                                         if keep_s else None,
                                         back=Back(planned, _floors(spans, now, keep_s,
                                                                    baseline, True))
                                         if keep_s else None)
            for change in decision.changes:
                node = nodes[int(change.node)]
                target = the_menu.item(change.new)
                assert target is not None
                node.gpus[change.index].target = target.layout
                if node.state == "up":
                    node.state, node.drain_at = "draining", now + drain_latency
                    heapq.heappush(events, (node.drain_at, next(seq), "drain", int(change.node)))
        schedule()
    result.unfinished = len(jobs) - done
    # Every replay is cut two days after the last submission, where relayout's rounds stop:
    # a job not started by then counts as waiting until then, in every replay alike, whether
    # it starts later or never (each replay's own end would favour the one ending first, and
    # a job started after the cut would count a longer wait than one that never starts).
    cut = horizon + 2 * 86400
    queued = [(j, kind) for kind, queue in pending.items() for j in queue]
    late = [(j, kind) for j, kind, wait, _ in result.finished if by_id[j].submit + wait > cut]
    result.late = frozenset(j for j, _ in late)
    result.unstarted = [(j, kind, cut - by_id[j].submit, cut - by_id[j].submit + by_id[j].run)
                        for j, kind in queued + late]
    result.gpu_hours = total_gpus * now / 3600.0
    return result


def _floors(spans: list[Span], now: float, keep_s: float, baseline: dict[str, int],
            whole: bool = False) -> dict[str, int]:
    """The round's floors as ``gpushare relayout`` reads them: what the window's spans
    held, or the plan's own where the history does not reach back to the window's start
    (``whole``: whole GPUs' too, what a change back to the plan aims at)."""
    if not reaches(spans, now - keep_s):
        return dict(baseline) if whole else unknown(baseline)
    return floors(spans, now, keep_s, baseline, whole)
