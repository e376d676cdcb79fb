# SPDX-License-Identifier: GPL-2.0-or-later
"""What a systemd scope per MPS daemon costs the first shared job on a GPU.

Boots a real systemd as PID 1 of namespaces of its own (scripts/systemd_node.py) and runs
``bench_mps.py`` inside it twice, alternating: ``mps_cgroup=none`` (the daemon stays where
its starter runs) and ``mps_cgroup=auto`` (systemd runs the node: ``systemd-run --scope``
makes a scope in gpushare.slice for each daemon start). Prints both tables and the ratio of
the first job's median (start + caps + stop of a daemon) with the scope to without.

    python3 bench/bench_scope.py --iterations 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")]

import systemd_node  # noqa: E402


def first_job_median(table: str) -> float:
    row = next(line for line in table.splitlines() if line.startswith("first job"))
    return float(row.split()[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating runs of each setting (medians of their medians)")
    args = parser.parse_args()
    reason = systemd_node.unusable_reason()
    if reason:
        print(f"bench_scope: cannot run: {reason}", file=sys.stderr)
        return 2
    medians: dict[str, list[float]] = {"none": [], "auto": []}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:2]))
    with systemd_node.SystemdNode() as node:
        for _ in range(args.rounds):
            for setting in medians:
                result = node.run([sys.executable, os.path.join(HERE, "bench_mps.py"),
                                   "--iterations", str(args.iterations),
                                   "--mps-cgroup", setting], timeout=600, env=env)
                print(result.stdout, flush=True)
                medians[setting].append(first_job_median(result.stdout))
    without, scoped = (statistics.median(medians[s]) for s in ("none", "auto"))
    print(f"first shared job on a GPU (daemon start, caps, stop), median of {args.rounds} "
          f"runs: no cgroup {without:.1f} ms, systemd scope {scoped:.1f} ms, "
          f"ratio {scoped / without:.2f}x (+{scoped - without:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
