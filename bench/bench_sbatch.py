# SPDX-License-Identifier: GPL-2.0-or-later
"""sbatch throughput with and without the submit hook: real submissions to a real slurmctld,
for job_submit.lua and for the job_submit/gpushare plugin (the Python rules).

Three private Slurms run side by side, rendered from tests/plans/bed.yaml (nodes renamed
per bed so no two share a cgroup name): no hook, Lua, Python. Each round sends one batch
of submissions to each, in a rotating order, so drift in the machine's load hits all three
alike. The jobs are held (``--hold``), so nothing runs, and cancelled after each batch. The
requests cycle through a single-node GPU job, a 2-node GPU job (a --switches rewrite), a
MIG request by autodetect name (a --gres rewrite) and a --gpu-share (a share rewrite).

    python3 bench/bench_sbatch.py [--submissions 1000] [--rounds 10] [--parallel 4]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

import slurmbed  # noqa: E402

GOAL = 0.97
REQUESTS = (
    ("--gres=gpu:1",),
    ("-N2", "--gres=gpu:1"),
    ("--gres=gpu:nvidia_a100_1g.10gb:1",),
    ("--gpu-share=25",),
)
HOOKS = (("none", "no hook"), ("lua", "job_submit.lua"), ("py", "job_submit/gpushare"))


def renamed_plan(prefix: str, out: str) -> str:
    """The bed plan with its nodes called <prefix>1.. instead of n1.."""
    with open(slurmbed.BED_PLAN) as handle:
        text = handle.read()
    with open(out, "w") as handle:
        handle.write(re.sub(r"(?<![\w-])n(?=\[|\d)", prefix, text))
    return out


def make_bed(hook: str, root_base: str, port: int) -> slurmbed.SlurmBed:
    root = f"{root_base}-{hook}"
    os.makedirs(os.path.dirname(root) or "/", exist_ok=True)
    plan = renamed_plan(f"sb{hook[0]}", f"{root}.plan.yaml")
    kwargs: dict[str, object] = {}
    if hook == "lua":
        kwargs = {"job_submit": "lua",
                  "job_submit_lua": os.path.join(slurmbed.REPO, "submit_hooks", "job_submit.lua")}
    elif hook == "py":
        kwargs = {"job_submit": "gpushare",
                  "extra_conf": "PluginDir=/usr/lib/x86_64-linux-gnu/slurm-wlm:"
                                + os.path.join(root, "jobsubmit")}
    bed = slurmbed.plan_bed(root=root, port_base=port, plan_path=plan, **kwargs)
    if hook == "py":
        prepare = bed.prepare

        def prepare_with_plugin() -> None:
            prepare()
            os.makedirs(bed.path("jobsubmit"))
            subprocess.run(["/usr/bin/python3",
                            os.path.join(slurmbed.REPO, "submit_hooks", "build.py"),
                            "--pythonpath", bed.path("lib", "python"),
                            "--out", bed.path("jobsubmit", "job_submit_gpushare.so")],
                           check=True, capture_output=True)

        bed.prepare = prepare_with_plugin  # type: ignore[method-assign]
    return bed


def submit_batch(bed: slurmbed.SlurmBed, count: int,
                 parallel: int) -> tuple[float, list[str]]:
    """Seconds for ``count`` held submissions (``parallel`` sbatch at a time); the job ids."""
    def one(i: int) -> str:
        result = bed.run(["sbatch", "--parsable", "--hold", "--output=/dev/null",
                          *REQUESTS[i % len(REQUESTS)], "--wrap", "true"], check=False)
        if result.returncode != 0:
            raise slurmbed.BedError(f"sbatch failed: {result.stderr.strip()}")
        return result.stdout.strip().split(";")[0]

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        ids = list(pool.map(one, range(count)))
    elapsed = time.perf_counter() - start
    bed.run(["scancel", *ids], check=False)
    return elapsed, ids


def rpc_usec(bed: slurmbed.SlurmBed, ids: list[str]) -> list[int]:
    """slurmctld's own time for each submit RPC (its log's usec=), hook included."""
    wanted = set(ids)
    with open(bed.path("log", "slurmctld.log"), errors="replace") as handle:
        found = re.findall(r"_slurm_rpc_submit_batch_job: JobId=(\d+) .*usec=(\d+)",
                           handle.read())
    return [int(usec) for job, usec in found if job in wanted]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=1000, help="per hook, in all")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=4, help="sbatch processes at a time")
    parser.add_argument("--port", type=int, default=18760)
    parser.add_argument("--root", default="/tmp/gs-bench-sbatch")
    opts = parser.parse_args()
    per_round = max(1, opts.submissions // opts.rounds)

    beds = {hook: make_bed(hook, opts.root, opts.port + 10 * i)
            for i, (hook, _) in enumerate(HOOKS)}
    started: list[slurmbed.SlurmBed] = []
    try:
        for bed in beds.values():
            started.append(bed.start())
        for hook, bed in beds.items():  # warm-up; also proves each hook is the one loaded
            result = bed.run(["sbatch", "--hold", "--output=/dev/null", "-N2",
                              "--gres=gpu:1", "--wrap", "true"])
            rewrote = "gpushare: --switches=" in result.stderr
            if rewrote != (hook != "none"):
                raise slurmbed.BedError(f"{hook}: unexpected hook behaviour: {result.stderr}")
            submit_batch(bed, min(20, per_round), opts.parallel)

        seconds = {hook: 0.0 for hook in beds}
        jobs = {hook: 0 for hook in beds}
        rates: dict[str, list[float]] = {hook: [] for hook in beds}
        measured: dict[str, list[str]] = {hook: [] for hook in beds}
        order = list(beds)
        for round_no in range(opts.rounds):
            shift = round_no % len(order)
            for hook in order[shift:] + order[:shift]:
                elapsed, ids = submit_batch(beds[hook], per_round, opts.parallel)
                seconds[hook] += elapsed
                jobs[hook] += len(ids)
                rates[hook].append(len(ids) / elapsed)
                measured[hook] += ids
        usec = {hook: rpc_usec(bed, measured[hook]) for hook, bed in beds.items()}
    finally:
        for bed in started:
            bed.stop()
        for hook in beds:
            os.unlink(f"{opts.root}-{hook}.plan.yaml")

    base = jobs["none"] / seconds["none"]
    base_median = statistics.median(rates["none"])
    print(f"sbatch throughput, {opts.rounds} interleaved rounds of {per_round} held "
          f"submissions per hook, {opts.parallel} at a time (goal: >= {GOAL:.2f}x)\n")
    print(f"{'hook':<22}{'jobs':>6}{'seconds':>10}{'subs/s':>9}{'ratio':>8}"
          f"{'median round':>14}{'ratio':>8}{'RPC usec p50':>14}{'p99':>7}")
    for hook, label in HOOKS:
        rate = jobs[hook] / seconds[hook]
        median = statistics.median(rates[hook])
        rpc = sorted(usec[hook]) or [0]
        print(f"{label:<22}{jobs[hook]:>6}{seconds[hook]:>10.2f}{rate:>9.1f}{rate / base:>7.3f}x"
              f"{median:>14.1f}{median / base_median:>7.3f}x"
              f"{statistics.median(rpc):>14.0f}{rpc[int(0.99 * (len(rpc) - 1))]:>7}")
    worst = min(jobs[h] / seconds[h] / base for h, _ in HOOKS if h != "none")
    print(f"\nworst ratio {worst:.3f}x: {'meets' if worst >= GOAL else 'misses'} the goal"
          " (RPC usec: slurmctld's own time per submission, from its log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
