# SPDX-License-Identifier: GPL-2.0-or-later
"""Replay a GPU job trace on a simulated Slurm cluster: the best static MIG layout for the
trace against layouts that follow the queue, chosen by the same code as `gpushare relayout`.

Run from the repository root:
    python3 bench/bench_relayout.py --trace bench/traces/shift.csv
    python3 bench/bench_relayout.py --trace mine.csv --plan plan.yaml   # the plan's cluster
    python3 bench/bench_relayout.py --corpus --sizes 4,8,16             # the corpus table
    python3 bench/bench_relayout.py --sacct sacct.txt --write-trace mine.csv   # convert

The trace is CSV with a header: submit_s, run_s, gpu_flags, user (docs/performance.md).
The simulator and its model of Slurm are gpushare.admin.relayout.sim's.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shlex
import statistics
import sys
from typing import Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpushare.admin.relayout.decide import Request
from gpushare.admin.relayout.demand import parse_request
from gpushare.admin.relayout.history import parse_sacct
from gpushare.admin.relayout.keep import DEFAULT_KEEP_H
from gpushare.admin.relayout.sim import (
    Cluster,
    Job,
    Result,
    cluster_from_plan,
    default_cluster,
    simulate,
    twice_the_run,
)
from gpushare.admin.relayout.static import best_static, even_split, spread
from gpushare.admin.relayout.trial import halves, ratio, replay_halves, times


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
    """``sacct --parsable2 -X -o Submit,Start,End,ReqTRES,User`` (or AllocTRES) → a trace,
    read as ``gpushare relayout --suggest`` reads it."""
    with open(path, encoding="utf-8") as handle:
        history = parse_sacct(handle.read())
    write_rows([(int(job.submit), int(job.run), _job_flags(job), job.user)
                for job in history.jobs], out)
    return len(history.jobs)


def _job_flags(job: Job) -> str:
    if job.kind == "whole":
        return f"--gres=gpu:{job.count}"
    if job.kind == "mps":
        return f"--gres=mps:{job.count}"
    return f"--gres=gpu:{job.kind}:{job.count}"


def write_rows(rows: list[tuple[int, int, str, str]], out: str) -> None:
    with open(out, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["submit_s", "run_s", "gpu_flags", "user"])
        writer.writerows(rows)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def _versus(static: Result, other: Result, mig_wait: Callable[[Result], float]) -> str:
    lower = 100 * (1 - statistics.fmean(other.jct) / statistics.fmean(static.jct))
    return (f"MIG mean wait x{mig_wait(other) / mig_wait(static):.2f} (goal <= 0.5), mean "
            f"completion time {abs(lower):.0f} % {'lower' if lower >= 0 else 'higher'} "
            "(goal: 25 % lower)" + (f"; {other.unfinished} jobs never ran, left out of its "
                                   "means" if other.unfinished else ""))


def _minutes(values: list[float], how: Callable[[list[float]], float]) -> str:
    """A statistic of waits in minutes; "none ran" where no job of the kind finished."""
    return f"{how(values) / 60:.1f} min" if values else "none ran"


def report(name: str, static_counts: dict[str, int], static: Result, dynamic: Result,
           seeded: Optional[Result] = None) -> str:
    lines = [f"trace {name}: best static layout "
             + ", ".join(f"{n} GPUs {k}" for k, n in static_counts.items() if n)
             + "; relayout starts from an even split of the menu"]
    lines.append("| request | static mean wait | relayout mean wait | static p95 | relayout p95 |")
    lines.append("|---|---|---|---|---|")
    for kind in sorted(set(static.waits) | set(dynamic.waits)):
        s, d = static.waits.get(kind, []), dynamic.waits.get(kind, [])
        lines.append(f"| {kind} | {_minutes(s, statistics.fmean)} | "
                     f"{_minutes(d, statistics.fmean)} | {_minutes(s, p95)} | "
                     f"{_minutes(d, p95)} |")
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


def _up(a: float, b: float) -> str:
    """a / b rounded up, so that a loss never reads as x1.000 (as --trial prints it)."""
    return times(ratio(a, b))


def same_start(label: str, still: Result, moved: Result) -> str:
    """Relayout against no change from the same start, every job counted (one never started
    with its wait until the replay's cut, so starving a kind shows)."""
    return (f"from {label}, relayout / no change: wait of all jobs "
            f"{_up(moved.censored_wait(), still.censored_wait())}, MIG and MPS "
            f"{_up(moved.censored_wait('mig'), still.censored_wait('mig'))}, whole "
            f"{_up(moved.censored_wait('whole'), still.censored_wait('whole'))}, completion "
            f"{_up(moved.censored_jct(), still.censored_jct())}; never started "
            f"{len(moved.unstarted)} vs {len(still.unstarted)}")


def tile(jobs: list[Job], copies: int) -> list[Job]:
    """``copies`` copies of a trace, the n-th submitted n seconds later: a trace sized for 4
    nodes, offered to 4 × ``copies``."""
    tiled = [Job(n * len(jobs) + j.id, j.submit + n, j.run, j.kind, j.count, j.user)
             for n in range(copies) for j in jobs]
    tiled.sort(key=lambda job: (job.submit, job.id))
    return tiled


def corpus(nodes: int, held_out: int = 0, directory: Optional[str] = None
           ) -> list[tuple[str, list[Job]]]:
    """The benchmark corpus at ``nodes`` nodes of 8 GPUs: the shipped traces and the
    converted PAI-format sample (sized for 4 nodes: tiled), and the generator family; with
    ``held_out`` 1 or 2, the family's first or second held-out set only; with ``directory``,
    its traces (sized for 4 nodes, e.g. convert_openb.py's windows) only."""
    import make_traces

    if directory is not None:
        return [(name, tile(read_trace(os.path.join(directory, name)), max(nodes // 4, 1)))
                for name in sorted(os.listdir(directory)) if name.endswith(".csv")]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces")
    traces = []
    for name in () if held_out else CORPUS_FILES:
        traces.append((name, tile(read_trace(os.path.join(here, name)), max(nodes // 4, 1))))
    members = {0: make_traces.FAMILY, 1: make_traces.HELD_OUT, 2: make_traces.HELD_OUT_2}
    for member in members[held_out]:
        # The process's own file: corpus runs side by side write the same members.
        path = os.path.join(here, f".{member.name}-{nodes}-{os.getpid()}.csv")
        write_rows(make_traces.generate(member, nodes * 8), path)
        jobs = read_trace(path)
        os.unlink(path)
        traces.append((member.name, jobs))
    return traces


CORPUS_FILES = ("shift.csv", "steady.csv", "bursts.csv", "pai-sample.csv")


def corpus_cluster(base: Cluster, jobs: list[Job], nodes: int) -> Cluster:
    """``base`` at ``nodes`` nodes; the default menu takes mps:100 too where jobs ask MPS."""
    cluster = base.resized(nodes)
    if base.name == "default" and any(job.kind == "mps" for job in jobs):
        from gpushare.admin.relayout.sim import DEFAULT_MENU

        cluster = default_cluster(nodes, base.gpus_per_node, (*DEFAULT_MENU, "mps:100"))
    return cluster


def _cell(result: Result) -> str:
    return (f"{result.censored_wait('mig') / 60:.1f} / {result.censored_wait() / 60:.1f} / "
            f"{result.censored_jct() / 60:.1f} | {len(result.unstarted)}")


CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                     "best-static.json")


def cached_best_static(jobs: list[Job], cluster: Cluster) -> tuple[dict[str, int], Result]:
    """best_static, its layout kept in build/best-static.json by the jobs and cluster: the
    static columns do not depend on relayout's code, and their search is most of a corpus
    run (the result is replayed again, so a stale entry cannot give a wrong number)."""
    import hashlib
    import json

    key = hashlib.sha256(repr((cluster.model.name, cluster.names, cluster.nodes,
                               cluster.gpus_per_node, [(j.submit, j.run, j.kind, j.count)
                                                       for j in jobs])).encode()).hexdigest()
    try:
        with open(CACHE, encoding="utf-8") as handle:
            known = json.load(handle)
    except (OSError, ValueError):
        known = {}
    if key in known:
        counts = {name: int(n) for name, n in known[key].items()}
        return counts, simulate(jobs, spread(counts, cluster), False, cluster)
    counts, result = best_static(jobs, cluster)
    import fcntl

    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    with open(CACHE + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # corpus runs side by side share it
        try:
            with open(CACHE, encoding="utf-8") as handle:
                known = json.load(handle)
        except (OSError, ValueError):
            known = {}
        known[key] = counts
        with open(CACHE + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(known, handle)
        os.replace(CACHE + ".tmp", CACHE)
    return counts, result


SPREAD_MAX = 8.0  # --limits spread: the most a time limit is above the run


def spread_limit(job: Job) -> float:
    """A time limit as users set them, far from their runs and each its own: the run times a
    factor drawn for the job (seeded by its id, so the same in every replay),
    log-uniform from 1 to ``SPREAD_MAX``."""
    return job.run * SPREAD_MAX ** random.Random(job.id).random()


def corpus_row(name: str, jobs: list[Job], cluster: Cluster, static: bool = True,
               keep_s: float = DEFAULT_KEEP_H * 3600,
               limit: Callable[[Job], float] = twice_the_run) -> str:
    """One row of the corpus table: the second half of the trace replayed four ways, each
    scored on the jobs that ran in all four (a layout that never runs a job is marked);
    without ``static``, only no relayout and relayout (the searches are most of the time)."""
    first, second, still, moved = replay_halves(jobs, cluster, keep_s, limit=limit)
    hindsight = suggested = None
    if static:
        _, hindsight = cached_best_static(second, cluster)
        learned, _ = cached_best_static(first, cluster)
        suggested = simulate(second, spread(learned, cluster), False, cluster)
    return (f"| {name} | {cluster.nodes} | {len(second)} | {_cell(still)} | {_cell(moved)} | "
            f"{_cell(hindsight) if hindsight else '- | -'} | "
            f"{_cell(suggested) if suggested else '- | -'} | "
            f"{_up(moved.censored_wait('mig'), still.censored_wait('mig'))} / "
            f"{_up(moved.censored_wait(), still.censored_wait())} / "
            f"{_up(moved.censored_jct(), still.censored_jct())} | "
            f"{moved.changes / moved.gpu_hours if moved.gpu_hours else 0:.3f} "
            f"({moved.most_changes_in_an_hour()}) | {moved.disturbed} |")


def _kind_wait(result: Result, kind: str) -> str:
    """Mean wait in minutes of one class ("slices": the MIG profiles; "mps"; "whole"), a job
    never started counted as in ``censored_wait``; "-" where the trace has none."""
    values = result.censored_waits(kind)
    return f"{statistics.fmean(values) / 60:.1f}" if values else "-"


def by_kind_row(name: str, jobs: list[Job], cluster: Cluster,
                keep_s: float = DEFAULT_KEEP_H * 3600,
                limit: Callable[[Job], float] = twice_the_run) -> str:
    """One row of the by-kind table: each class's mean wait, no relayout -> relayout from
    the even split, on the trace's second half: who pays for a change and who gains."""
    _, _, still, moved = replay_halves(jobs, cluster, keep_s, limit=limit)
    cells = (f"{_kind_wait(still, kind)} -> {_kind_wait(moved, kind)}"
             for kind in ("slices", "mps", "whole"))
    return f"| {name} | {cluster.nodes} | " + " | ".join(cells) + " |"


def suggest_row(name: str, jobs: list[Job], cluster: Cluster,
                keep_s: float = DEFAULT_KEEP_H * 3600,
                limit: Callable[[Job], float] = twice_the_run) -> str:
    """One row of the --from-suggest table: relayout started from ``--suggest``'s layout
    learned on the first half, against that layout left alone, on the second half (the
    site that runs the suggested layout and turns relayout on)."""
    learned, _ = cached_best_static(halves(jobs)[0], cluster)
    _, _, still, moved = replay_halves(jobs, cluster, keep_s, spread(learned, cluster), limit)
    return (f"| {name} | {cluster.nodes} | "
            f"{_up(moved.censored_wait('mig'), still.censored_wait('mig'))} / "
            f"{_up(moved.censored_wait(), still.censored_wait())} / "
            f"{_up(moved.censored_jct(), still.censored_jct())} | "
            + " | ".join(f"{_kind_wait(still, kind)} -> {_kind_wait(moved, kind)}"
                         for kind in ("slices", "mps", "whole"))
            + f" | {moved.changes} |")


SUGGEST_HEADER = (
    "Relayout started from --suggest's layout (learned on the first half) over that layout "
    "left alone, on the second half: mean wait of MIG and MPS jobs / of all jobs / mean "
    "completion time, then each class's mean wait in minutes, left alone -> relayout.\n\n"
    "| trace | nodes | relayout / left alone: MIG / all / completion | MIG slices | MPS units "
    "| whole GPUs | changes |\n|---|---|---|---|---|---|---|")


BY_KIND_HEADER = (
    "Mean wait in minutes, no relayout -> relayout from the even split, per class, over every "
    "job of the trace's second half (a job never started counts as in the corpus table).\n\n"
    "| trace | nodes | MIG slices | MPS units | whole GPUs |\n|---|---|---|---|---|")


CORPUS_HEADER = (
    "Each layout: mean wait of MIG and MPS jobs / mean wait of all jobs / mean completion "
    "time, minutes, over every job of the trace's second half (a job never started counts "
    "as waiting until two days after the last submission, and its run), then how many never "
    "started.\n\n"
    "| trace | nodes | jobs | no relayout | unstarted | relayout | unstarted | best static "
    "(hindsight) | unstarted | --suggest (first half) | unstarted | relayout / no relayout: "
    "MIG / all / completion | changes per GPU-hour (most of one GPU in an hour) | jobs "
    "disturbed |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="append", default=[], metavar="FILE")
    parser.add_argument("--nodes", type=int, help="nodes (default 4, or the plan's group's)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (without --plan)")
    parser.add_argument("--plan", metavar="FILE",
                        help="replay on this plan's node group with a relayout menu: its GPU "
                        "model, menu, nodes and Slurm GPUs per node")
    parser.add_argument("--group", metavar="NAME", help="with --plan: which node group")
    parser.add_argument("--corpus", action="store_true",
                        help="the corpus table: every trace, second half, four ways")
    parser.add_argument("--sizes", default="4,8,16", metavar="N,N,...",
                        help="with --corpus: the node counts (default 4,8,16)")
    parser.add_argument("--no-static", action="store_true",
                        help="with --corpus: leave out the two best-static columns")
    parser.add_argument("--held-out", type=int, choices=(0, 1, 2), default=0, metavar="SET",
                        help="with --corpus: the generator's held-out workloads instead (set 1 "
                        "or 2)")
    parser.add_argument("--traces", metavar="DIR",
                        help="with --corpus: the traces in DIR (each sized for 4 nodes, e.g. "
                        "convert_openb.py --windows DIR) instead of the shipped corpus")
    parser.add_argument("--by-kind", action="store_true",
                        help="with --corpus: each class's wait (MIG slices, MPS, whole GPUs), "
                        "no relayout against relayout, instead of the four columns")
    parser.add_argument("--from-suggest", action="store_true",
                        help="with --corpus: relayout started from --suggest's layout learned "
                        "on the first half, against that layout left alone, instead of the "
                        "four columns")
    parser.add_argument("--keep-hours", type=float, default=DEFAULT_KEEP_H, metavar="H",
                        help="relayout's floors: what MIG and MPS jobs held at once in the "
                        f"last H hours (default {DEFAULT_KEEP_H:g}, as gpushare relayout's; "
                        "0: none)")
    parser.add_argument("--limits", choices=("twice", "spread"), default="twice",
                        help="with --corpus: each job's time limit, all relayout's forecast "
                        "knows of its run: twice its run (default), or its run times a "
                        f"factor drawn for the job, log-uniform from 1 to {SPREAD_MAX:g} "
                        "(users' limits, most far above the run)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="with --corpus: only this trace (repeatable)")
    parser.add_argument("--sacct", metavar="FILE",
                        help="sacct --parsable2 -X -o Submit,Start,End,ReqTRES,User output")
    parser.add_argument("--write-trace", metavar="FILE", help="with --sacct: the trace to write")
    args = parser.parse_args()
    if args.sacct:
        count = sacct_to_trace(args.sacct, args.write_trace or "trace.csv")
        print(f"{count} GPU jobs written")
        return 0
    if args.plan:
        from gpushare.admin.plan import PlanError, load_plan

        try:
            base = cluster_from_plan(load_plan(args.plan), args.group, args.nodes)
        except (PlanError, ValueError) as err:
            print(f"bench_relayout: {err}", file=sys.stderr)
            return 2
    else:
        base = default_cluster(args.nodes or 4, args.gpus)
    if args.corpus:
        limit = spread_limit if args.limits == "spread" else twice_the_run
        print(BY_KIND_HEADER if args.by_kind else SUGGEST_HEADER if args.from_suggest
              else CORPUS_HEADER, flush=True)
        for size in (int(n) for n in args.sizes.split(",")):
            for name, jobs in corpus(size, args.held_out, args.traces):
                if args.only and name not in args.only:
                    continue
                cluster = corpus_cluster(base, jobs, size)
                keep_s = args.keep_hours * 3600
                print(by_kind_row(name, jobs, cluster, keep_s, limit) if args.by_kind else
                      suggest_row(name, jobs, cluster, keep_s, limit) if args.from_suggest else
                      corpus_row(name, jobs, cluster, not args.no_static, keep_s, limit),
                      flush=True)
        return 0
    for path in args.trace:
        jobs = read_trace(path)
        counts, static = cached_best_static(jobs, base)
        keep_s = args.keep_hours * 3600
        dynamic = simulate(jobs, spread(even_split(base), base), True, base, keep_s=keep_s)
        seeded = simulate(jobs, spread(counts, base), True, base, keep_s=keep_s)
        still = simulate(jobs, spread(even_split(base), base), False, base)
        print(report(os.path.basename(path), counts, static, dynamic, seeded))
        print(same_start("an even split", still, dynamic))
        print(same_start("the best static layout", static, seeded))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
