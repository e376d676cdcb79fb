# SPDX-License-Identifier: GPL-2.0-or-later
"""Write the shipped relayout traces (fixed seeds) into bench/traces/.

Run from the repository root: python3 bench/make_traces.py
The traces are sized for the simulator's default cluster (4 nodes × 8 H100-80GB):
- steady.csv: a day of the same mix of 1g.10gb inference, 3g.40gb and whole-GPU jobs;
- shift.csv: a day moving from small inference slices (morning) to 3g.40gb and whole-GPU
  training jobs (evening);
- bursts.csv: a day of quiet load with six bursts of one kind each.
"""

from __future__ import annotations

import csv
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
DAY = 86400


def _job(rng: random.Random, kind: str) -> tuple[int, str]:
    """(run seconds, sbatch GPU flags) of one job of ``kind``."""
    if kind == "small":
        return int(rng.uniform(600, 2400)), f"--gres=gpu:1g.10gb:{rng.choice((1, 1, 2))}"
    if kind == "mid":
        return int(rng.uniform(1800, 5400)), f"--gres=gpu:3g.40gb:{rng.choice((1, 1, 2))}"
    return int(rng.uniform(3600, 10800)), f"--gres=gpu:h100:{rng.choice((1, 2, 4))}"


def _write(name: str, rows: list[tuple[int, int, str, str]]) -> None:
    rows.sort()
    with open(os.path.join(HERE, "traces", name), "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["submit_s", "run_s", "gpu_flags", "user"])
        writer.writerows(rows)


def _poisson(rng: random.Random, start: float, end: float, per_hour: float) -> list[float]:
    times, t = [], start
    while True:
        t += rng.expovariate(per_hour / 3600.0)
        if t >= end:
            return times
        times.append(t)


# GPU share of one job of each kind, on average: small 1.33/7, mid 1.33 × 3/7, whole 2.33.
def steady() -> None:
    rng = random.Random(1)
    rows = []
    for t in _poisson(rng, 0, DAY, 36):
        kind = rng.choices(("small", "mid", "whole"), (0.6, 0.3, 0.1))[0]
        run, flags = _job(rng, kind)
        rows.append((int(t), run, flags, f"u{rng.randrange(20)}"))
    _write("steady.csv", rows)


def shift() -> None:
    """Small inference slices until 06:00, training (3g.40gb and whole GPUs) from 16:00, a
    linear change between: each phase alone fits the cluster, both together do not."""
    rng = random.Random(2)
    rows = []
    for kind, per_hour in (("small", 250.0), ("mid", 8.0), ("whole", 5.0)):
        for t in _poisson(rng, 0, DAY, per_hour):
            frac = min(max((t - 6 * 3600) / (10 * 3600), 0.0), 1.0)  # 06:00 → 16:00
            keep = 1.0 - frac if kind == "small" else frac
            if rng.random() >= keep:
                continue
            run, flags = _job(rng, kind)
            rows.append((int(t), run, flags, f"u{rng.randrange(20)}"))
    _write("shift.csv", rows)


def bursts() -> None:
    rng = random.Random(3)
    rows = []
    for t in _poisson(rng, 0, DAY, 25):
        kind = rng.choices(("small", "mid", "whole"), (0.6, 0.3, 0.1))[0]
        run, flags = _job(rng, kind)
        rows.append((int(t), run, flags, f"u{rng.randrange(20)}"))
    for burst in range(6):
        start = 2 * 3600 + burst * 3.5 * 3600
        kind = ("small", "mid", "small", "whole", "mid", "small")[burst]
        for t in _poisson(rng, start, start + 1800, 120 if kind == "small" else 40):
            run, flags = _job(rng, kind)
            rows.append((int(t), run, flags, f"burst{burst}"))
    _write("bursts.csv", rows)


if __name__ == "__main__":
    os.makedirs(os.path.join(HERE, "traces"), exist_ok=True)
    steady()
    shift()
    bursts()
