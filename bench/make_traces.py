# SPDX-License-Identifier: GPL-2.0-or-later
"""Write the shipped relayout traces (fixed seeds) into bench/traces/.

Run from the repository root: python3 bench/make_traces.py
The traces are sized for the simulator's default cluster (4 nodes × 8 H100-80GB):
- steady.csv: a day of the same mix of 1g.10gb inference, 3g.40gb and whole-GPU jobs;
- shift.csv: a day moving from small inference slices (morning) to 3g.40gb and whole-GPU
  training jobs (evening);
- bursts.csv: a day of quiet load with six bursts of one kind each.

It also holds the seeded generator family of the benchmark corpus (:func:`generate`,
:data:`FAMILY`): load from 50 % to 120 % of the cluster, demand swinging between two mixes
of 1g/2g/3g/whole-GPU and MPS jobs with a period of 4 to 24 hours; the same seed gives the
same trace.
"""

from __future__ import annotations

import csv
import math
import os
import random
from typing import NamedTuple

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


# The generator family. Per kind: (run seconds low, high), the per-node counts to draw from,
# and the sbatch flags of one job.
_KINDS: dict[str, tuple[tuple[int, int], tuple[int, ...], str]] = {
    "1g": ((600, 2400), (1, 1, 2), "--gres=gpu:1g.10gb:{n}"),
    "2g": ((1200, 3600), (1, 2), "--gres=gpu:2g.20gb:{n}"),
    "3g": ((1800, 5400), (1, 1, 2), "--gres=gpu:3g.40gb:{n}"),
    "whole": ((3600, 10800), (1, 2, 4), "--gres=gpu:h100:{n}"),
    "mps": ((600, 2400), (25, 50), "--gres=mps:{n}"),
}
_GPU_SHARE = {"1g": 1 / 7, "2g": 2 / 7, "3g": 3 / 7, "whole": 1.0, "mps": 1 / 100}
MIXES: dict[str, dict[str, float]] = {
    "inference": {"1g": 0.7, "2g": 0.2, "3g": 0.1},
    "sweeps": {"2g": 0.6, "1g": 0.2, "3g": 0.2},
    "training": {"3g": 0.4, "whole": 0.5, "1g": 0.1},
    "mixed": {"1g": 0.3, "2g": 0.2, "3g": 0.2, "whole": 0.2, "mps": 0.1},
    "mps": {"mps": 0.6, "1g": 0.2, "whole": 0.2},
}


class Member(NamedTuple):
    """One trace of the family: demand swings from mix ``a`` to mix ``b`` and back every
    ``period_h`` hours, offering ``load`` times what the cluster's GPUs can run."""

    name: str
    seed: int
    load: float
    period_h: float
    a: str
    b: str


FAMILY: tuple[Member, ...] = (
    Member("gen-load50-24h", 11, 0.5, 24, "inference", "training"),
    Member("gen-load80-12h", 12, 0.8, 12, "inference", "sweeps"),
    Member("gen-load100-8h", 13, 1.0, 8, "inference", "training"),
    Member("gen-load120-4h", 14, 1.2, 4, "mixed", "training"),
    Member("gen-load90-24h-mps", 15, 0.9, 24, "mps", "training"),
)
# Workloads that relayout's prediction was never looked at on while it was built: seeds and
# parameters of their own, in the family's ranges, reported apart (bench_relayout --held-out).
HELD_OUT: tuple[Member, ...] = (
    Member("held-load60-6h", 101, 0.6, 6, "sweeps", "training"),
    Member("held-load110-16h", 102, 1.1, 16, "inference", "mixed"),
    Member("held-load70-4h-mps", 103, 0.7, 4, "mps", "sweeps"),
    Member("held-load100-12h", 104, 1.0, 12, "training", "inference"),
    Member("held-load120-24h", 105, 1.2, 24, "mixed", "sweeps"),
)
# A second held-out set, first run after the prediction's safety margin was set from what
# the first one showed.
HELD_OUT_2: tuple[Member, ...] = (
    Member("fresh-load50-8h", 201, 0.5, 8, "sweeps", "inference"),
    Member("fresh-load90-6h", 202, 0.9, 6, "training", "sweeps"),
    Member("fresh-load120-12h-mps", 203, 1.2, 12, "mps", "inference"),
    Member("fresh-load80-24h", 204, 0.8, 24, "mixed", "inference"),
    Member("fresh-load100-4h", 205, 1.0, 4, "inference", "sweeps"),
)


def _work_h(kind: str) -> float:
    """The GPU-hours one job of ``kind`` holds, on average."""
    (low, high), counts, _ = _KINDS[kind]
    return _GPU_SHARE[kind] * sum(counts) / len(counts) * (low + high) / 2 / 3600


def generate(member: Member, gpus: int, hours: float = 24.0) -> list[tuple[int, int, str, str]]:
    """The rows (submit_s, run_s, gpu_flags, user) of ``member`` on a cluster of ``gpus``
    GPUs: deterministic for a seed, whatever else runs."""
    if not 0 < member.load <= 10 or member.period_h <= 0 or gpus <= 0:
        raise ValueError(f"{member.name}: load, period and GPUs must be positive")
    rng = random.Random(member.seed)
    mix_a, mix_b = MIXES[member.a], MIXES[member.b]
    rows: list[tuple[int, int, str, str]] = []
    t, end = 0.0, hours * 3600
    while True:
        phase = (1 - math.cos(2 * math.pi * t / (member.period_h * 3600))) / 2  # 0: a, 1: b
        weights = {k: (1 - phase) * mix_a.get(k, 0) + phase * mix_b.get(k, 0) for k in _KINDS}
        per_job_h = sum(w * _work_h(k) for k, w in weights.items())
        per_hour = member.load * gpus / per_job_h  # jobs an hour that offer ``load``
        t += rng.expovariate(per_hour / 3600.0)
        if t >= end:
            return rows
        kind = rng.choices(list(weights), list(weights.values()))[0]
        (low, high), counts, flags = _KINDS[kind]
        rows.append((int(t), int(rng.uniform(low, high)), flags.format(n=rng.choice(counts)),
                     f"u{rng.randrange(20)}"))


if __name__ == "__main__":
    os.makedirs(os.path.join(HERE, "traces"), exist_ok=True)
    steady()
    shift()
    bursts()
