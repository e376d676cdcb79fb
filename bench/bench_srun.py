"""`srun true` latency: no plugin, a C no-op SPANK plugin, and gpushare (with and without a
share), in one run on one local Slurm, interleaved, medians, printed as ratios.

    python3 bench/bench_srun.py [--rounds 5] [--per-round 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import slurmbed

HERE = os.path.dirname(os.path.abspath(__file__))
USER = slurmbed.TEST_USERS[0]


def build_noop(out_dir: str) -> str:
    out = os.path.join(out_dir, "spank_noop.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", out,
                    os.path.join(HERE, "noop_spank.c")], check=True)
    return out


def time_sruns(bed: slurmbed.SlurmBed, args: list[str], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        bed.run(["srun", "-N1", "-w", bed.nodes[0].name, *args, "true"], user=USER)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--port", type=int, default=17600)
    opts = parser.parse_args()

    bed = slurmbed.default_bed(root="/tmp/gs-bench-srun", port_base=opts.port,
                               node_count=1, prefix="bench")
    with bed:
        noop = build_noop(bed.path("lib"))
        gpushare = bed.plugstack_line()
        variants = [
            ("no plugin", "", []),
            ("C no-op plugin", f"required {noop}\n", []),
            ("gpushare, no share", gpushare, []),
            ("no plugin, mps job", "", ["--gres=mps:25"]),
            ("gpushare, mps job", gpushare, ["--gres=mps:25"]),
        ]
        samples: dict[str, list[float]] = {name: [] for name, _, _ in variants}
        for _name, plugstack, args in variants:  # warm-up
            bed.write_plugstack(plugstack)
            time_sruns(bed, args, 2)
        for _ in range(opts.rounds):
            for name, plugstack, args in variants:
                bed.write_plugstack(plugstack)
                samples[name].extend(time_sruns(bed, args, opts.per_round))
        bed.write_plugstack(gpushare)

    median = {name: statistics.median(values) for name, values in samples.items()}
    base = {"no plugin": median["no plugin"], "no plugin, mps job": median["no plugin, mps job"]}
    rows = [
        ("no plugin", "no plugin", None),
        ("C no-op plugin", "no plugin", None),
        ("gpushare, no share", "no plugin", 1.02),
        ("no plugin, mps job", "no plugin, mps job", None),
        ("gpushare, mps job", "no plugin, mps job", 1.10),
    ]
    print(f"srun true, {opts.rounds} rounds x {opts.per_round} runs, medians")
    print(f"{'variant':<22} {'median ms':>10} {'ratio':>7} {'vs':<20} {'goal':>6}")
    for name, against, goal in rows:
        ratio = median[name] / base[against]
        print(f"{name:<22} {median[name] * 1000:>10.1f} {ratio:>7.3f} {against:<20} "
              f"{'<=' + str(goal) if goal else '':>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
