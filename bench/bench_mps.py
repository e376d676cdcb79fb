# SPDX-License-Identifier: GPL-2.0-or-later
"""Wall time gpushare's MPS acquire + release adds to a job, with the stand-in daemon.

Scenarios, each repeated ``--iterations`` times, as root with a test user:
  by hand      start the stand-in with ``-d`` as the user, wait for its control socket,
               ``echo quit |`` it and wait for it to end: the least anyone must do
  first job    gpushare acquire + release that starts and stops the daemon
  joining job  acquire + release of a second job on an already running shared daemon
  nothing      an empty iteration (the loop's own cost)
Prints median and 90th percentile in milliseconds and the ratio to "by hand".

    python3 bench/bench_mps.py --iterations 50
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")]

from gpushare.node.config import PluginConfig  # noqa: E402
from gpushare.node.mps import MpsDevice, MpsManager  # noqa: E402
from mps_standin.harness import (  # noqa: E402
    StandinInstall,
    ensure_users,
    traversable_tmpdir,
    unusable_reason,
)

GPU = MpsDevice("GPU-00000000-1111-2222-3333-444444444444", 0, 80 << 30, "GPU 0")


def _wait(predicate, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError("stand-in did not react in time")
        time.sleep(0.005)


def by_hand(standin: StandinInstall, base: str, user) -> None:
    pipe, log = os.path.join(base, "hand-pipe"), os.path.join(base, "hand-log")
    for path in (pipe, log):
        os.mkdir(path, 0o700)
        os.chown(path, user.pw_uid, user.pw_gid)
    env = {"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": GPU.uuid,
           "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_LOG_DIRECTORY": log}
    ids = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    subprocess.run([standin.program, "-d"], env=env, check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **ids)
    _wait(lambda: os.path.exists(os.path.join(pipe, "control")))
    subprocess.run([standin.program], input=b"quit\n", env=env, check=True, timeout=30,
                   stdout=subprocess.DEVNULL, **ids)
    _wait(lambda: not standin.processes())
    shutil.rmtree(pipe)
    shutil.rmtree(log)


def measure(fn, iterations: int) -> list[float]:
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--mps-cgroup", default="auto",
                        help="plugstack mps_cgroup= for gpushare's daemons (auto, systemd, "
                        "none or a cgroup v2 directory)")
    args = parser.parse_args()
    reason = unusable_reason()
    if reason:
        print(f"bench_mps: cannot run: {reason}", file=sys.stderr)
        return 2
    user = ensure_users()[0]
    base = traversable_tmpdir("gpushare-bench-")
    standin = StandinInstall(base)
    try:
        config = PluginConfig(state_dir=os.path.join(base, "state"),
                              mps_control=standin.program, timeout=10.0,
                              mps_cgroup=args.mps_cgroup)
        mgr = MpsManager(config)
        job_ids = iter(range(1, 10**6))

        def first_job() -> None:
            job = next(job_ids)
            mgr.acquire(job_id=job, uid=user.pw_uid, gid=user.pw_gid, devices=[GPU],
                        share_percent=25)
            mgr.release(job)

        def joining_job() -> None:
            job = next(job_ids)
            mgr.acquire(job_id=job, uid=user.pw_uid, gid=user.pw_gid, devices=[GPU],
                        share_percent=25)
            mgr.release(job)

        results = {
            "nothing": measure(lambda: None, args.iterations),
            "by hand": measure(lambda: by_hand(standin, base, user), args.iterations),
            "first job": measure(first_job, args.iterations),
        }
        anchor = next(job_ids)
        mgr.acquire(job_id=anchor, uid=user.pw_uid, gid=user.pw_gid, devices=[GPU],
                    share_percent=25)
        results["joining job"] = measure(joining_job, args.iterations)
        mgr.release(anchor)
    finally:
        standin.kill_all()
        shutil.rmtree(base, ignore_errors=True)

    hand = statistics.median(results["by hand"])
    print(f"MPS acquire + release, stand-in daemon, {args.iterations} iterations each, "
          f"mps_cgroup={args.mps_cgroup}")
    print(f"{'scenario':<12} {'median ms':>10} {'p90 ms':>8} {'ratio to by hand':>17}")
    for name, times in results.items():
        ordered = sorted(times)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        median = statistics.median(times)
        print(f"{name:<12} {median:>10.2f} {p90:>8.2f} {median / hand:>17.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
