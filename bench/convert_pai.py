# SPDX-License-Identifier: GPL-2.0-or-later
"""Convert the Alibaba PAI GPU cluster trace (2020) into a relayout trace.

Source: Alibaba Cluster Trace Program, ``cluster-trace-gpu-v2020``
(https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2020), described in
Weng et al., "MLaaS in the Wild", NSDI '22. Its CSV files have no header line; the columns
are those of the published ``.header`` files:

    pai_job_table.csv:  job_name,inst_id,user,status,start_time,end_time
    pai_task_table.csv: job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,
                        plan_mem,plan_gpu,gpu_type

Times are seconds (shifted by a constant); a job's ``start_time`` is its submission, a
task's its launch. ``plan_gpu`` is a percentage of one GPU per instance (50.0: half a GPU,
800.0: eight). Each instance of a task with GPUs becomes one job of the trace: submitted
when its job was, running as long as its task ran, asking for the smallest MIG slice of an
H100-80GB holding its share (``--fractions mig``: up to 1/7 a 1g.10gb, 2/7 a 2g.20gb, 3/7
a 3g.40gb, more a whole GPU) or for MPS units (``--fractions mps``: 50.0 is mps:50), and
whole GPUs for 100.0 or more. Tasks that never ran (Waiting, no end) are left out.

    python3 bench/convert_pai.py --jobs pai_job_table.csv --tasks pai_task_table.csv \\
        --hours 24 --out pai-day.csv
    python3 bench/convert_pai.py --write-sample bench/traces/pai-sample   # the sample

The repository ships no part of the real trace (it is hundreds of megabytes and is fetched
from Alibaba's servers): bench/traces/pai-sample/ is a small **synthetic** sample in the
same format, written by ``--write-sample`` with a fixed seed, so that the converter and the
benchmark corpus run offline. Its figures say nothing about PAI's workload.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import sys
from typing import Iterable, Optional

JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
MIG_STEPS = ((100 / 7, "1g.10gb"), (200 / 7, "2g.20gb"), (300 / 7, "3g.40gb"))
MAX_GPUS_PER_JOB = 8


def _rows(path: str, columns: tuple[str, ...]) -> Iterable[dict[str, str]]:
    """The rows of a headerless PAI CSV (a first line naming the columns is skipped)."""
    with open(path, newline="", encoding="utf-8") as handle:
        for number, row in enumerate(csv.reader(handle)):
            if number == 0 and row and row[0] == columns[0]:
                continue
            if len(row) != len(columns):
                raise ValueError(f"{path}:{number + 1}: {len(row)} columns, the PAI format "
                                 f"has {len(columns)} ({','.join(columns)})")
            yield dict(zip(columns, row))


def _float(value: str) -> Optional[float]:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def gpu_flags(plan_gpu: float, fractions: str = "mig") -> Optional[str]:
    """The sbatch flags of one instance asking for ``plan_gpu`` % of a GPU."""
    if plan_gpu <= 0:
        return None
    if plan_gpu >= 100:
        return f"--gres=gpu:h100:{min(math.ceil(plan_gpu / 100 - 1e-9), MAX_GPUS_PER_JOB)}"
    if fractions == "mps":
        return f"--gres=mps:{max(round(plan_gpu), 1)}"
    for limit, profile in MIG_STEPS:
        if plan_gpu <= limit + 1e-9:
            return f"--gres=gpu:{profile}:1"
    return "--gres=gpu:h100:1"


def convert(jobs_path: str, tasks_path: str, fractions: str = "mig", from_hour: float = 0.0,
            hours: Optional[float] = 24.0) -> list[tuple[int, int, str, str]]:
    """The trace rows (submit_s, run_s, gpu_flags, user) of the jobs submitted in the
    window of ``hours`` from ``from_hour`` after the first job's submission."""
    jobs = {row["job_name"]: row for row in _rows(jobs_path, JOB_COLUMNS)}
    found = []
    for task in _rows(tasks_path, TASK_COLUMNS):
        job = jobs.get(task["job_name"])
        plan_gpu, submit = _float(task["plan_gpu"]), _float(job["start_time"]) if job else None
        start, end = _float(task["start_time"]), _float(task["end_time"])
        instances = _float(task["inst_num"]) or 1.0
        if job is None or plan_gpu is None or submit is None or start is None or end is None:
            continue
        flags = gpu_flags(plan_gpu, fractions)
        if flags is None or end <= start or task["status"] == "Waiting":
            continue
        for _ in range(max(int(instances), 1)):
            found.append((submit, int(end - start), flags, job["user"]))
    if not found:
        return []
    first = min(row[0] for row in found) + from_hour * 3600
    last = math.inf if hours is None else first + hours * 3600
    return sorted((int(s - first), run, flags, user) for s, run, flags, user in found
                  if first <= s < last)


def write_trace(rows: list[tuple[int, int, str, str]], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["submit_s", "run_s", "gpu_flags", "user"])
        writer.writerows(rows)


def write_sample(directory: str, seed: int = 2020, jobs: int = 900) -> None:
    """A synthetic sample in the PAI format: a day of jobs, inference-heavy by night (short
    fractional-GPU tasks), training by day (whole GPUs, some multi-instance)."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    base = 1_739_000.0
    job_rows, task_rows = [], []
    for _ in range(jobs):
        submit = base + rng.uniform(0, 86400)
        hour = (submit - base) / 3600
        day = 8 <= hour < 20
        name = f"{rng.getrandbits(96):024x}"
        user = f"{rng.randrange(40):012x}"
        if rng.random() < (0.35 if day else 0.85):
            plan_gpu = rng.choice((10.0, 12.5, 25.0, 25.0, 50.0))
            run, instances = rng.uniform(300, 2400), 1
        else:
            plan_gpu = rng.choice((100.0, 100.0, 200.0, 400.0, 800.0))
            run, instances = rng.uniform(1800, 9000), rng.choice((1, 1, 1, 2))
        wait = rng.expovariate(1 / 120)
        status = rng.choices(("Terminated", "Failed", "Waiting"), (0.85, 0.13, 0.02))[0]
        end = "" if status == "Waiting" else f"{submit + wait + run:.1f}"
        start = "" if status == "Waiting" else f"{submit + wait:.1f}"
        job_rows.append((name, f"{rng.getrandbits(240):060x}", user, status, f"{submit:.1f}",
                         end))
        task_rows.append((name, rng.choice(("tensorflow", "worker", "PyTorchWorker")),
                          f"{instances:.1f}", status, start, end,
                          f"{rng.choice((400, 600, 800)):.1f}", f"{rng.uniform(4, 60):.6f}",
                          f"{plan_gpu:.1f}", rng.choice(("V100", "T4", "P100", "MISC"))))
    for filename, rows in (("pai_job_table.csv", job_rows), ("pai_task_table.csv", task_rows)):
        with open(os.path.join(directory, filename), "w", newline="",
                  encoding="utf-8") as out:
            csv.writer(out, lineterminator="\n").writerows(rows)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", metavar="FILE", help="pai_job_table.csv")
    parser.add_argument("--tasks", metavar="FILE", help="pai_task_table.csv")
    parser.add_argument("--fractions", choices=("mig", "mps"), default="mig",
                        help="what a fractional GPU becomes (default mig)")
    parser.add_argument("--from-hour", type=float, default=0.0, metavar="H",
                        help="start the window H hours after the first submission")
    parser.add_argument("--hours", type=float, default=24.0, metavar="H",
                        help="the window's length (default 24; 0: all)")
    parser.add_argument("--out", metavar="FILE", help="the trace to write")
    parser.add_argument("--write-sample", metavar="DIR",
                        help="write the synthetic sample in the PAI format into DIR")
    args = parser.parse_args(argv)
    if args.write_sample:
        write_sample(args.write_sample)
        return 0
    if not (args.jobs and args.tasks and args.out):
        parser.error("give --jobs, --tasks and --out (or --write-sample DIR)")
    try:
        rows = convert(args.jobs, args.tasks, args.fractions, args.from_hour,
                       args.hours or None)
    except (OSError, ValueError) as err:
        print(f"convert_pai: {err}", file=sys.stderr)
        return 2
    write_trace(rows, args.out)
    print(f"{len(rows)} GPU jobs written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
