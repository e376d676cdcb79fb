# SPDX-License-Identifier: GPL-2.0-or-later
"""Replay a GPU job trace on a simulated Slurm cluster: the best static MIG layout for the
trace against layouts that follow the queue, chosen by the same code as `gpushare relayout`.

Run from the repository root:
    python3 bench/bench_relayout.py --trace bench/traces/shift.csv
    python3 bench/bench_relayout.py --sacct sacct.txt --write-trace mine.csv   # convert

The trace is CSV with a header: submit_s, run_s, gpu_flags, user (docs/performance.md).
The model of Slurm: jobs start in submit order wherever their request fits (first fit on
one node; a later job may pass one that does not fit); a node chosen for a change is
drained, so no new job lands on it, and waits until its last job ends (a job that was
scheduled in the `--drain-latency` before the drain took hold counts as landed during the
change); then it is out of service for the change's steps and comes back with the new
layout. No running job is ever stopped.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import itertools
import os
import shlex
import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpushare.admin.mig_profiles import find_model
from gpushare.admin.relayout.decide import GpuState, Request, decide
from gpushare.admin.relayout.demand import parse_request
from gpushare.admin.relayout.menu import Layout, Menu, MenuItem, parse_layout

_MODEL = find_model("h100-80gb")
assert _MODEL is not None
MODEL = _MODEL
MENU_TEXT = ("7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "2x3g.40gb", "whole")
# Each step of a change (docs/performance.md says where each figure comes from).
NVML_BASE_S = 10.0  # handles and the walk over MIG devices: "O(10 s)" (DRA driver, nvlib.go)
NVML_PER_GPU_S = 2.0  # destroy + create GIs/CIs: mig-manager ~9 s for 8 GPUs (mig-parted)
SLURMD_RESTART_S = 30.0  # RebootProgram ends, slurmd -b starts and re-registers (assumed)
RECONFIGURE_S = 10.0  # slurm.conf Gres= rewritten, scontrol reconfigure (assumed)
TIME_LIMIT_FACTOR = 2.0  # a job's time limit, as a multiple of its run time (assumed)


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


@dataclass
class Gpu:
    layout: Layout
    free: dict[str, int]
    jobs: set[int] = field(default_factory=set)
    last_change: Optional[float] = None
    target: Optional[Layout] = None


@dataclass
class Node:
    gpus: list[Gpu]
    state: str = "up"  # up | draining | changing
    drain_at: float = 0.0
    running: set[int] = field(default_factory=set)


def read_trace(path: str) -> list[Job]:
    jobs: list[Job] = []
    with open(path, newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.DictReader(handle)):
            requests = _flags(row["gpu_flags"])
            if len(requests) != 1:
                continue  # no GPU, or several kinds at once: outside this model
            req = requests[0]
            jobs.append(Job(number, float(row["submit_s"]), float(row["run_s"]), req.kind,
                            req.count, row.get("user", "")))
    jobs.sort(key=lambda job: (job.submit, job.id))
    return jobs


def _flags(flags: str) -> list[Request]:
    gres = []
    for word in shlex.split(flags):
        for option in ("--gres=", "--gpus-per-node="):
            if word.startswith(option):
                value = word[len(option):]
                gres.append(value if option == "--gres=" else f"gpu:{value}")
    return parse_request("", ",".join(gres), 0.0)


def sacct_to_trace(path: str, out: str) -> int:
    """``sacct --parsable2 -X -o Submit,Start,End,ReqTRES,User`` (or AllocTRES) → a trace."""
    import datetime

    rows = []
    with open(path, encoding="utf-8") as handle:
        header = handle.readline().strip().split("|")
        for line in handle:
            fields = dict(zip(header, line.rstrip("\n").split("|")))
            tres = fields.get("ReqTRES") or fields.get("AllocTRES") or ""
            gres = [t for t in tres.split(",") if t.startswith("gres/gpu")]
            try:
                submit = datetime.datetime.fromisoformat(fields["Submit"])
                run = (datetime.datetime.fromisoformat(fields["End"])
                       - datetime.datetime.fromisoformat(fields["Start"])).total_seconds()
            except (KeyError, ValueError):
                continue
            flags = []
            for item in gres:  # gres/gpu:3g.40gb=2 → --gres=gpu:3g.40gb:2
                name, _, count = item.partition("=")
                parts = name.split(":")
                if len(parts) == 2:
                    flags.append(f"--gres=gpu:{parts[1]}:{count}")
            if flags:
                rows.append((submit, int(run), flags[-1], fields.get("User", "")))
    if not rows:
        return 0
    first = min(row[0] for row in rows)
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submit_s", "run_s", "gpu_flags", "user"])
        for submit, run, flag, user in sorted(rows):
            writer.writerow([int((submit - first).total_seconds()), run, flag, user])
    return len(rows)


def menu() -> Menu:
    items = []
    for text in MENU_TEXT:
        layout, why = parse_layout(text, MODEL)
        assert layout is not None, why
        items.append(MenuItem(layout, 0, 10**6, 0))
    return Menu(tuple(items), 3600, 0)


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

    def most_changes_in_an_hour(self) -> int:
        """The most changes of one GPU within any hour (a window of 3600 s)."""
        most = 0
        for times in self.change_times.values():
            for position, start in enumerate(times):
                most = max(most, sum(1 for t in times[position:] if t < start + 3600))
        return most


def share(kind: str) -> float:
    return {"whole": 1.0}.get(kind, int(kind.split("g.")[0]) / 7.0 if "g." in kind else 1.0)


def simulate(jobs: list[Job], layouts: list[list[Layout]], relayout: bool,
             interval: float = 300.0, max_changes: int = 4, hysteresis: float = 0.5,
             drain_latency: float = 5.0) -> Result:
    jobs = [Job(j.id, j.submit, j.run, j.kind, j.count, j.user) for j in jobs]
    nodes = [Node([Gpu(lay, dict(lay.offers())) for lay in node]) for node in layouts]
    the_menu = menu()
    events: list[tuple[float, int, str, int]] = []  # (time, seq, what, id)
    seq = itertools.count()
    for job in jobs:
        heapq.heappush(events, (job.submit, next(seq), "submit", job.id))
    by_id = {job.id: job for job in jobs}
    horizon = max((j.submit for j in jobs), default=0.0)
    if relayout:
        t = interval
        while t <= horizon + 2 * 86400:
            heapq.heappush(events, (t, next(seq), "round", 0))
            t += interval
    pending: dict[str, list[int]] = {}
    result = Result({}, [], 0.0, 0.0, 0, 0.0, 0, 0, 0)
    total_gpus = sum(len(n.gpus) for n in nodes)
    now = 0.0
    done = 0

    def idle_share() -> float:
        idle = 0.0
        for node in nodes:
            if node.state == "changing":
                idle += len(node.gpus)
                continue
            for gpu in node.gpus:
                idle += sum(share(k) * n for k, n in gpu.free.items())
        return idle

    def try_start(job: Job) -> bool:
        for number, node in enumerate(nodes):
            if node.state != "up" and not (node.state == "draining" and now < node.drain_at):
                continue
            if sum(g.free.get(job.kind, 0) for g in node.gpus) < job.count:
                continue
            need = job.count
            for index, gpu in enumerate(node.gpus):
                take = min(need, gpu.free.get(job.kind, 0))
                if take:
                    gpu.free[job.kind] -= take
                    gpu.jobs.add(job.id)
                    job.held.append((index, job.kind, take))
                    need -= take
                if not need:
                    break
            if node.state == "draining":
                result.landed_during_change += 1
            job.start, job.node = now, number
            node.running.add(job.id)
            heapq.heappush(events, (now + job.run, next(seq), "end", job.id))
            return True
        return False

    def schedule() -> None:
        for kind, queue in pending.items():
            if not queue:
                continue
            best = max((sum(g.free.get(kind, 0) for g in n.gpus) for n in nodes
                        if n.state == "up" or (n.state == "draining" and now < n.drain_at)),
                       default=0)
            if best == 0:
                continue
            left = []
            for job_id in queue:
                job = by_id[job_id]
                if job.count <= best and try_start(job):
                    best = max((sum(g.free.get(kind, 0) for g in n.gpus) for n in nodes
                                if n.state == "up"), default=0)
                    continue
                left.append(job_id)
            pending[kind] = left

    def maybe_change(node: Node) -> None:
        if node.state == "draining" and not node.running and now >= node.drain_at:
            count = sum(1 for gpu in node.gpus if gpu.target is not None)
            steps = NVML_BASE_S + NVML_PER_GPU_S * count + SLURMD_RESTART_S + RECONFIGURE_S
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
                node.gpus[index].free[kind] += units
                node.gpus[index].jobs.discard(job.id)
            node.running.discard(job.id)
            done += 1
            started = now if job.start is None else job.start
            result.waits.setdefault(job.kind, []).append(started - job.submit)
            result.jct.append(started - job.submit + job.run)
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
                    gpu.layout, gpu.free = gpu.target, dict(gpu.target.offers())
                    gpu.target, gpu.last_change = None, now
                    result.changes += 1
                    result.change_times.setdefault((ident, index), []).append(now)
            node.state = "up"
        elif what == "round":
            requests = [Request(str(j), by_id[j].kind, by_id[j].count, now - by_id[j].submit)
                        for queue in pending.values() for j in queue]
            states = []
            for number, node in enumerate(nodes):
                if node.state != "up":
                    continue
                for index, gpu in enumerate(node.gpus):
                    used = {k: n - gpu.free.get(k, 0) for k, n in gpu.layout.offers().items()
                            if n > gpu.free.get(k, 0)}
                    # slurmctld knows a job's end only from its time limit: twice its run.
                    ends = max(((by_id[j].start or now) + TIME_LIMIT_FACTOR * by_id[j].run - now
                                for j in gpu.jobs), default=0.0)
                    states.append(GpuState(str(number), index, "g", gpu.layout, bool(gpu.jobs),
                                           True, None if gpu.last_change is None
                                           else now - gpu.last_change, used, ends))
            decision = decide(requests, states, {"g": the_menu}, max_changes, hysteresis)
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
    result.gpu_hours = total_gpus * now / 3600.0
    return result


def spread(counts: dict[str, int], nodes: int, per_node: int) -> list[list[Layout]]:
    """Per node, its GPUs' layouts: each layout spread over the nodes as evenly as it goes."""
    by_name = {item.layout.name: item.layout for item in menu().items}
    flat = [by_name[name] for name in MENU_TEXT for _ in range(counts.get(name, 0))]
    grid: list[list[Layout]] = [[] for _ in range(nodes)]
    for position, layout in enumerate(flat):
        grid[position % nodes].append(layout)
    assert all(len(row) == per_node for row in grid)
    return grid


def score(result: Result) -> float:
    return statistics.fmean(result.jct) if result.jct and not result.unfinished else 1e18


def best_static(jobs: list[Job], nodes: int, per_node: int) -> tuple[dict[str, int], Result]:
    """The static layout with the lowest mean completion time: a grid over the menu in steps
    of one GPU per node, then single-GPU moves until none helps."""
    total = nodes * per_node
    names = list(MENU_TEXT)
    tried: dict[tuple[int, ...], Result] = {}

    def run(counts: tuple[int, ...]) -> Result:
        if counts not in tried:
            tried[counts] = simulate(jobs, spread(dict(zip(names, counts)), nodes, per_node),
                                     False)
        return tried[counts]

    step = nodes
    grid = [c for c in itertools.product(range(0, total + 1, step), repeat=len(names) - 1)
            if sum(c) <= total]
    best = min(((*c, total - sum(c)) for c in grid), key=lambda c: score(run(c)))
    improved = True
    while improved:
        improved = False
        for src, dst in itertools.permutations(range(len(names)), 2):
            if best[src] == 0:
                continue
            trial = list(best)
            trial[src] -= 1
            trial[dst] += 1
            if score(run(tuple(trial))) < score(run(best)):
                best, improved = tuple(trial), True
    return dict(zip(names, best)), run(best)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def _versus(static: Result, other: Result, mig_wait: Callable[[Result], float]) -> str:
    lower = 100 * (1 - statistics.fmean(other.jct) / statistics.fmean(static.jct))
    return (f"MIG mean wait x{mig_wait(other) / mig_wait(static):.2f} (goal <= 0.5), mean "
            f"completion time {abs(lower):.0f} % {'lower' if lower >= 0 else 'higher'} "
            "(goal: 25 % lower)")


def report(name: str, static_counts: dict[str, int], static: Result, dynamic: Result,
           seeded: Optional[Result] = None) -> str:
    lines = [f"trace {name}: best static layout "
             + ", ".join(f"{n} GPUs {k}" for k, n in static_counts.items() if n)
             + "; relayout starts from an even split of the menu"]
    lines.append("| request | static mean wait | relayout mean wait | static p95 | relayout p95 |")
    lines.append("|---|---|---|---|---|")
    for kind in sorted(set(static.waits) | set(dynamic.waits)):
        s, d = static.waits.get(kind, []), dynamic.waits.get(kind, [])
        lines.append(f"| {kind} | {statistics.fmean(s) / 60:.1f} min | "
                     f"{statistics.fmean(d) / 60:.1f} min | {p95(s) / 60:.1f} min | "
                     f"{p95(d) / 60:.1f} min |")
    mig = [k for k in static.waits if k != "whole"]

    def mig_wait(result: Result) -> float:
        values = [w for k in mig for w in result.waits.get(k, [])]
        return statistics.fmean(values) if values else 0.0

    lines += [
        f"| MIG jobs, mean wait | {mig_wait(static) / 60:.1f} min | "
        f"{mig_wait(dynamic) / 60:.1f} min | | |",
        f"| mean completion time | {statistics.fmean(static.jct) / 60:.1f} min | "
        f"{statistics.fmean(dynamic.jct) / 60:.1f} min | | |",
        f"| GPU-hours used / idle while jobs waited | {static.used_gpu_h:.0f} / "
        f"{static.idle_waiting_gpu_h:.0f} | {dynamic.used_gpu_h:.0f} / "
        f"{dynamic.idle_waiting_gpu_h:.0f} | | |",
        f"| layout changes per GPU-hour | 0 | {dynamic.changes / dynamic.gpu_hours:.4f} "
        f"({dynamic.changes} changes; at most {dynamic.most_changes_in_an_hour()} of one GPU "
        "in an hour) | | |",
        f"| jobs landed during a change / running jobs disturbed | 0 / {static.disturbed} | "
        f"{dynamic.landed_during_change} / {dynamic.disturbed} | | |",
    ]
    if mig_wait(static):
        lines.append(f"relayout against best static: {_versus(static, dynamic, mig_wait)}")
    if seeded is not None and mig_wait(static):
        lines.append("relayout starting from the best static layout: "
                     + _versus(static, seeded, mig_wait))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="append", default=[], metavar="FILE")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--sacct", metavar="FILE",
                        help="sacct --parsable2 -X -o Submit,Start,End,ReqTRES,User output")
    parser.add_argument("--write-trace", metavar="FILE", help="with --sacct: the trace to write")
    args = parser.parse_args()
    if args.sacct:
        count = sacct_to_trace(args.sacct, args.write_trace or "trace.csv")
        print(f"{count} GPU jobs written")
        return 0
    for path in args.trace:
        jobs = read_trace(path)
        counts, static = best_static(jobs, args.nodes, args.gpus)
        total = args.nodes * args.gpus
        even = {name: total // len(MENU_TEXT) + (i < total % len(MENU_TEXT))
                for i, name in enumerate(MENU_TEXT)}
        dynamic = simulate(jobs, spread(even, args.nodes, args.gpus), True)
        seeded = simulate(jobs, spread(counts, args.nodes, args.gpus), True)
        print(report(os.path.basename(path), counts, static, dynamic, seeded))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
