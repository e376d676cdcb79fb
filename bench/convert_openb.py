# SPDX-License-Identifier: GPL-2.0-or-later
"""Convert the Alibaba GPU-sharing cluster trace (2023) into relayout traces.

Source: Alibaba Cluster Trace Program, ``cluster-trace-gpu-v2023``
(https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023), described in
Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent", USENIX ATC '23. ``csv/openb_pod_list_default.csv`` lists 8,152 pods of a
production cluster of about 6,200 GPUs, with a header line:

    name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
    deletion_time,scheduled_time

Times are seconds from the trace's start. ``num_gpu`` is 0 to 8; a pod of one GPU asks for
``gpu_milli`` thousandths of it (a GPU shared with other pods below 1000). Each pod with GPUs
that was scheduled becomes one job: submitted at its creation, running from its scheduling to
its deletion (a pod still running when the trace was taken ends there), asking for the
smallest MIG slice of an H100-80GB that holds its share, or MPS units (``--fractions``, as
``convert_pai.py``), and whole GPUs for a whole share or more. Pods never scheduled (Pending)
are left out. The trace names no user: each job's user is its pod's name.

The repository ships no part of this trace (the data is Alibaba's, published for research and
study); fetch the CSV and convert it:

    curl -LO https://raw.githubusercontent.com/alibaba/clusterdata/master/\\
cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv
    python3 bench/convert_openb.py --pods openb_pod_list_default.csv --windows DIR

``--windows DIR`` writes every window of ``--days`` (2) days that starts at a whole day of
the trace and holds at least ``--min-jobs`` (200) GPU jobs as ``DIR/openb-dayD.csv``: the
benchmark's corpus (``bench_relayout.py --corpus --traces DIR``) learns ``--suggest``'s layout
on each window's first day and replays its second.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from convert_pai import gpu_flags, write_trace

COLUMNS = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time",
           "scheduled_time")
DAY_S = 86400

Row = tuple[int, int, str, str]  # submit_s, run_s, gpu_flags, user


def _number(value: str, path: str, line: int, column: str) -> Optional[float]:
    """A time or count of the trace; None where the cell is empty (a pod never scheduled)."""
    if value.strip() == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{path}:{line}: {column} is {value!r}, not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{path}:{line}: {column} is {value!r}, not a time or count")
    return number


def read_pods(path: str, fractions: str = "mig") -> list[tuple[float, Row]]:
    """(creation time, trace row) of every scheduled pod with GPUs, the row's submit time
    still the trace's own."""
    found: list[tuple[float, Row]] = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no column {', '.join(missing)}: not an openb_pod_list "
                             f"file (its header names {','.join(COLUMNS)})")
        for line, pod in enumerate(reader, start=2):
            gpus = _number(pod["num_gpu"], path, line, "num_gpu")
            milli = _number(pod["gpu_milli"], path, line, "gpu_milli")
            created = _number(pod["creation_time"], path, line, "creation_time")
            scheduled = _number(pod["scheduled_time"], path, line, "scheduled_time")
            deleted = _number(pod["deletion_time"], path, line, "deletion_time")
            if not gpus or created is None or scheduled is None or deleted is None \
                    or deleted <= scheduled:
                continue
            # gpu_milli is the share of one GPU for a pod of one; more GPUs are whole.
            percent = milli / 10 if gpus == 1 and milli else gpus * 100
            flags = gpu_flags(percent, fractions)
            if flags is not None:
                found.append((created, (0, int(deleted - scheduled), flags, pod["name"])))
    return sorted(found)


def window(pods: list[tuple[float, Row]], from_day: float, days: float) -> list[Row]:
    """The rows submitted within ``days`` from day ``from_day`` of the trace, their submit
    times from the window's start."""
    first, last = from_day * DAY_S, (from_day + days) * DAY_S
    return [(int(created - first), run, flags, user)
            for created, (_, run, flags, user) in pods if first <= created < last]


def windows(pods: list[tuple[float, Row]], days: float = 2.0, min_jobs: int = 200
            ) -> list[tuple[int, list[Row]]]:
    """Every window of ``days`` starting at a whole day of the trace that holds at least
    ``min_jobs`` jobs: (its first day, its rows)."""
    if not pods:
        return []
    found = []
    for day in range(int(pods[0][0] // DAY_S), int(pods[-1][0] // DAY_S) + 1):
        rows = window(pods, day, days)
        if len(rows) >= min_jobs:
            found.append((day, rows))
    return found


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", required=True, metavar="FILE",
                        help="openb_pod_list_default.csv (or another openb_pod_list file)")
    parser.add_argument("--fractions", choices=("mig", "mps"), default="mig",
                        help="what a shared GPU becomes (default mig)")
    parser.add_argument("--days", type=float, default=2.0, metavar="N",
                        help="each window's length in days (default 2)")
    parser.add_argument("--from-day", type=float, metavar="D",
                        help="with --out: the window's first day of the trace")
    parser.add_argument("--out", metavar="FILE", help="one window's trace (with --from-day)")
    parser.add_argument("--windows", metavar="DIR",
                        help="write every window of --days days holding --min-jobs jobs")
    parser.add_argument("--min-jobs", type=int, default=200, metavar="N",
                        help="with --windows: the fewest GPU jobs a window holds (default 200)")
    args = parser.parse_args(argv)
    if bool(args.windows) == bool(args.out) or (args.out and args.from_day is None):
        parser.error("give --windows DIR, or --out FILE with --from-day D")
    if args.days <= 0:
        parser.error("--days must be above 0")
    try:
        pods = read_pods(args.pods, args.fractions)
    except (OSError, ValueError) as err:
        print(f"convert_openb: {err}", file=sys.stderr)
        return 2
    if args.out:
        rows = window(pods, args.from_day, args.days)
        write_trace(rows, args.out)
        print(f"{len(rows)} GPU jobs written to {args.out}")
        return 0
    os.makedirs(args.windows, exist_ok=True)
    found = windows(pods, args.days, args.min_jobs)
    for day, rows in found:
        write_trace(rows, os.path.join(args.windows, f"openb-day{day}.csv"))
    print(f"{len(found)} windows of {args.days:g} days written to {args.windows} "
          f"({sum(len(rows) for _, rows in found)} GPU jobs in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
