# SPDX-License-Identifier: GPL-2.0-or-later
"""Per-request cost of the submit hooks in-process: job_submit.lua (lupa, Lua 5.1 where
available) and the Python rules, p50/p99 in microseconds per kind of request.

The Lua column includes the Python->Lua call through lupa; the "empty call" row is that
overhead alone (a Lua function that returns at once), so Lua minus it is the hook's own cost
inside slurmctld. Goal: Lua p99 <= 50 us.

    python3 bench/bench_submit_hooks.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")]

from gpushare.submit.facts import load_facts  # noqa: E402
from gpushare.submit.hook import init, job_submit  # noqa: E402
from gpushare.submit.rules import NO_VAL, apply  # noqa: E402
from luahook import LuaHook, facts_path  # noqa: E402

BATCH = 100
UNSET = {"min_nodes": 1, "req_switch": NO_VAL, "wait4switch": NO_VAL}
REQUESTS = {
    "CPU only": {**UNSET},
    "--gres=gpu:1": {**UNSET, "tres_per_node": "gres:gpu:1"},
    "MIG autodetect name": {**UNSET, "tres_per_node": "gres:gpu:nvidia_a100_1g.10gb:1"},
    "-N 3 --gres=gpu:8": {**UNSET, "tres_per_node": "gres:gpu:8", "min_nodes": 3},
    "--gpu-share=25": {**UNSET, "spank_job_env": [
        "_SLURM_SPANK_OPTION_gpushare_gpu_share=25", "SLURM_X=1"]},
    "rejected mps:150": {**UNSET, "tres_per_node": "gres:mps:150"},
}


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)])


def time_calls(call, args_list) -> list[float]:
    out = []
    clock = time.perf_counter_ns
    for args in args_list:
        start = clock()
        call(*args)
        out.append((clock() - start) / 1000.0)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20000, help="requests per kind")
    args = parser.parse_args()
    n = args.requests
    path = facts_path("h100-2205")
    facts = load_facts(path)
    hook = LuaHook(path)
    init(path)
    submit = hook.lua.globals().slurm_job_submit
    # log_user in slurmctld appends to a buffer; keep the fake's recording out of the timing.
    hook.lua.execute("slurm.log_user = function(fmt, ...) end")
    empty = hook.lua.eval("function(job, part, uid) return 0 end")

    def time_lua(call, job):
        # Fresh job tables in small batches (the hook rewrites them), so that the Lua heap
        # holds about what slurmctld's does rather than n live tables for the GC to walk.
        out: list[float] = []
        for _ in range(0, n, BATCH):
            out += time_calls(call, [(hook.job_table(job), None, 0) for _ in range(BATCH)])
        return out

    rows = []
    rows.append(("empty call (lupa overhead)", time_lua(empty, REQUESTS["--gres=gpu:1"]),
                 None, None))
    for name, job in REQUESTS.items():
        lua = time_lua(submit, job)
        py = time_calls(apply, [(dict(job), facts)] * n)
        entry = time_calls(job_submit, [(dict(job), 1000)] * n)
        rows.append((name, lua, py, entry))

    head = (f"{'request':<28}{'Lua p50':>9}{'Lua p99':>9}{'Py p50':>9}{'Py p99':>9}"
            f"{'entry p99':>11}{'Py/Lua p50':>12}")
    print(f"{n} requests per kind, microseconds per request")
    print(head)
    print("-" * len(head))
    worst = 0.0
    for name, lua, py, entry in rows:
        l50, l99 = percentiles(lua)
        if py is None:
            print(f"{name:<28}{l50:>9.1f}{l99:>9.1f}")
            continue
        p50, p99 = percentiles(py)
        _, e99 = percentiles(entry)
        worst = max(worst, l99)
        print(f"{name:<28}{l50:>9.1f}{l99:>9.1f}{p50:>9.1f}{p99:>9.1f}{e99:>11.1f}"
              f"{p50 / l50:>12.2f}")
    print(f"\nworst Lua p99 {worst:.1f} us (goal <= 50 us, lupa call overhead included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
