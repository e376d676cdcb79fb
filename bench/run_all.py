# SPDX-License-Identifier: GPL-2.0-or-later
"""Run every benchmark in bench/ one after another and print their tables (``make bench``).

Each benchmark compares with and without gpushare in one run and prints ratios; this
runner only orders them and reports any that failed.
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = (
    ("plugin cost per srun", "bench_srun.py", []),
    ("prolog + epilog cost of an MPS job", "bench_prolog.py", []),
    ("MPS daemon lifecycle", "bench_mps.py", []),
    ("a systemd scope per MPS daemon (under a booted systemd)", "bench_scope.py", []),
    ("gpushare metrics on a node with 8 GPUs and 64 jobs", "bench_metrics.py", []),
    ("gpushare usage: one sampling round, 8 GPUs and 50 jobs", "bench_usage.py", []),
    ("packing: 25 % shares vs whole GPUs", "bench_packing.py", []),
    ("submit hooks per request (Lua, Python)", "bench_submit_hooks.py", []),
    ("sbatch throughput with vs without the hook", "bench_sbatch.py", []),
    ("ownership plan at 10 000 nodes", "bench_plan.py", []),
    ("tidal GPUs: lending by window and by demand vs the static split", "bench_tidal.py", []),
)


def main() -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")]))
    failed = []
    for title, script, args in BENCHMARKS:
        path = os.path.join(HERE, script)
        if not os.path.exists(path):
            continue
        print(f"\n### {title} ({script})", flush=True)
        if subprocess.run([sys.executable, path, *args], env=env).returncode != 0:
            failed.append(script)
    if failed:
        print("\nfailed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
