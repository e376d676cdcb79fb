# SPDX-License-Identifier: GPL-2.0-or-later
"""Packing: 64 short jobs asking 25 % of a GPU vs 64 asking a whole GPU, on one 8-GPU node.

A real slurmctld schedules both batches (a job array each, ``sleep`` of a fixed time, one
CPU per job on a node configured with enough CPUs that CPU is never the limit) on the same
simulated 8×H100 node with gpushare's plugin: shares get their MPS daemons, whole GPUs
get their devices verified at prolog (the epilog skips Python). Makespan is the wall time
from Slurm's first allocation until the last job has ended, epilog included (see
run_batch); jobs per GPU-hour = jobs / (GPUs × makespan). Also printed: the peak number
of jobs running at once (from each job's start and end stamps), the machine's CPU time
per job (every process, prologs, epilogs and daemons included, less this script's own
polling), and the ratio of the two batches' throughput (goal ≥ 3.5×; 4× is the ideal for
25 % shares).

    python3 bench/bench_packing.py [--jobs 64] [--sleep 2] [--repeat 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))

import slurmbed

USER = slurmbed.TEST_USERS[0]
GPUS = 8
SCRIPT = "echo START=$(date +%s.%N)\nsleep {sleep}\necho END=$(date +%s.%N)\n"


def run_batch(bed: slurmbed.SlurmBed, gres: str, jobs: int, sleep: float) -> dict[str, float]:
    """Submit one array, wait for every task to end; makespan, peak concurrency, failures.

    The clock starts when Slurm allocates the first task (the first poll that finds one
    past PENDING), not at submission: slurmctld defers scheduling a submitted batch job
    by up to batch_sched_delay (3 s by default), a wait of chance that has nothing to do
    with how the GPUs are shared. Prologs, epilogs and every later scheduling pass are
    inside the makespan.
    """
    tag = f"pk{time.monotonic_ns()}"
    cpu_before = _cpu_seconds()
    array_id = bed.sbatch(SCRIPT.replace("{sleep}", f"{sleep:g}"), f"--array=1-{jobs}",
                          f"--gres={gres}", "-c1", f"--output={bed.out_dir}/{tag}_%a.out",
                          user=USER)
    allocated = None
    # Whole GPUs run jobs/GPUS waves one after another; far past that, something is wrong
    # (a drained node leaves jobs pending for ever).
    deadline = time.monotonic() + 120 + 2 * sleep * jobs / GPUS
    while True:
        states = bed.run(["squeue", "-h", "-r", "-t", "all", "-j", str(array_id), "-o",
                          "%T"]).stdout.split()
        if allocated is None and any(s != "PENDING" for s in states):
            allocated = time.time()
        done = [s for s in states if s in slurmbed.TERMINAL_STATES]
        if len(done) == jobs:
            break
        if time.monotonic() > deadline:
            reasons = bed.run(["sinfo", "-R", "-h", "-o", "%N: %E"]).stdout.strip()
            bed.keep = True  # its logs say why
            raise SystemExit(f"array {array_id} ({gres}): {len(done)} of {jobs} jobs ended "
                             f"in time; node problems: {reasons or 'none'}; logs kept in "
                             f"{bed.path('log')}")
        time.sleep(0.1)
    finished = time.time()
    cpu_used = _cpu_seconds() - cpu_before
    intervals = []
    for index in range(1, jobs + 1):
        with open(os.path.join(bed.out_dir, f"{tag}_{index}.out")) as handle:
            values = dict(line.split("=", 1) for line in handle.read().split() if "=" in line)
        intervals.append((float(values["START"]), float(values["END"])))
    return {
        "makespan": finished - allocated,
        "first_start": min(s for s, _ in intervals) - allocated,
        "peak": float(_peak(intervals)),
        "failed": float(sum(s != "COMPLETED" for s in done)),
        "cpu_per_job": cpu_used / jobs,
    }


def _cpu_seconds() -> float:
    """CPU time the machine has spent busy (every process, user + system), less this
    benchmark's own polling (its squeue children), which a longer batch would pay more of."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    own = os.times()
    return ((sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK") - own.children_user
            - own.children_system)


def _peak(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each job runs")
    parser.add_argument("--repeat", type=int, default=1, help="batches of each kind")
    parser.add_argument("--port", type=int, default=17690)
    parser.add_argument("--root", default="/tmp/gs-bench-pack")
    opts = parser.parse_args()

    bed = slurmbed.default_bed(root=opts.root, port_base=opts.port, node_count=1,
                               prefix="bpack")
    bed.nodes[0].cpus = 2 * opts.jobs  # CPU never limits how many jobs run at once
    # The share batch also runs without the plugin: what Slurm alone would pack, so the
    # cost of starting MPS daemons at that density shows separately.
    kinds = (("25 % share", "mps:25", True), ("25 % share, no plugin", "mps:25", False),
             ("whole GPU", "gpu:1", True))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in kinds}
    with bed:
        gpushare = bed.plugstack_line()
        run_batch(bed, "mps:25", 4, 0.1)  # warm-up: first Python start, page cache
        for _ in range(opts.repeat):
            for name, gres, plugin in kinds:
                bed.write_plugstack(gpushare if plugin else "")
                results[name].append(run_batch(bed, gres, opts.jobs, opts.sleep))

    print(f"{opts.jobs} jobs of {opts.sleep:g} s each on one node with {GPUS} GPUs, "
          f"{opts.repeat} batch(es) per kind, medians")
    print(f"{'request':<22} {'makespan s':>10} {'1st start s':>11} {'peak jobs':>9} "
          f"{'failed':>6} {'CPU ms/job':>10} {'jobs/GPU-hour':>13}")
    rate = {}
    for name, _, _ in kinds:
        runs = results[name]
        makespan = statistics.median(r["makespan"] for r in runs)
        rate[name] = opts.jobs / (GPUS * makespan / 3600)
        print(f"{name:<22} {makespan:>10.2f} "
              f"{statistics.median(r['first_start'] for r in runs):>11.2f} "
              f"{max(r['peak'] for r in runs):>9.0f} {sum(r['failed'] for r in runs):>6.0f} "
              f"{1000 * statistics.median(r['cpu_per_job'] for r in runs):>10.0f} "
              f"{rate[name]:>13.0f}")
    ratio = rate["25 % share"] / rate["whole GPU"]
    print(f"ratio 25 % share / whole GPU: {ratio:.2f}x (goal >= 3.5x, ideal 4x)")
    print(f"without the plugin (Slurm alone): "
          f"{rate['25 % share, no plugin'] / rate['whole GPU']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
