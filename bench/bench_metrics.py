# SPDX-License-Identifier: GPL-2.0-or-later
"""What ``gpushare metrics`` costs on a busy node, and whether a prolog ever waits for it.

The node: 8 GPUs, 64 shared jobs (8 per GPU, four of each of two users: 16 running
stand-in MPS daemons), their job records, and counters. Measured, as root:
  collect      one in-process collection and rendering (what the timer's run does after
               Python has started)
  command      one whole ``gpushare metrics --textfile`` run, interpreter start included,
               from bytecode as the RPM installs it
  count        one prolog's counting step (``counters.count``) alone, and while metrics
               runs in a loop beside it
and, during one collection, every ``flock`` it takes and how long the counters' shared
lock is held (the only lock a prolog's counting step can wait on; MPS key locks are taken
only for a daemon that is not running, and then without waiting).

    python3 bench/bench_metrics.py --runs 20
"""

from __future__ import annotations

import argparse
import fcntl
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "scripts")]

from gpushare.admin import metrics  # noqa: E402
from gpushare.node import counters  # noqa: E402
from gpushare.node.config import PluginConfig  # noqa: E402
from gpushare.node.mps import MpsDevice, MpsManager  # noqa: E402
from gpushare.node.state import JobRecord, JobStore  # noqa: E402
from mps_standin.harness import (  # noqa: E402
    StandinInstall,
    ensure_users,
    traversable_tmpdir,
    unusable_reason,
)

GPUS = [MpsDevice(f"GPU-{i:08d}-1111-2222-3333-444444444444", i, 80 << 30, f"GPU {i}")
        for i in range(8)]
JOBS = 64


def populate(config: PluginConfig, users) -> None:
    """64 jobs on 8 GPUs through the real MpsManager, with records and some counts."""
    manager = MpsManager(config)
    store = JobStore(config.state_dir)
    for job_id in range(1, JOBS + 1):
        gpu = GPUS[job_id % len(GPUS)]
        user = users[job_id // len(GPUS) % len(users)]  # both users on every GPU
        lease = manager.acquire(job_id, user.pw_uid, user.pw_gid, [gpu], share_percent=12)
        store.write(JobRecord(job_id=job_id, uid=user.pw_uid, gid=user.pw_gid, node="bench",
                              mode="shared", share_percent=12, slurm_gpus=[str(gpu.gpu_index)],
                              devices=[{"uuid": gpu.uuid, "gpu_index": gpu.gpu_index,
                                        "profile": ""}], mps=lease.to_record()))
        counters.begin()
        counters.count("job_prolog", 0, config)


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(values):7.2f} ms   p90 {p90:7.2f} ms   max " \
           f"{ordered[-1]:7.2f} ms"


def count_times(config: PluginConfig, times: int) -> list[float]:
    found = []
    for _ in range(times):
        start = time.perf_counter()
        counters.begin()
        counters.count("job_epilog", 0, config)
        found.append((time.perf_counter() - start) * 1000)
    return found


def _metrics_loop(config: PluginConfig, stop) -> None:
    while not stop.is_set():
        metrics.render(metrics.collect(config, "bench", check_processes=True)[0])


def lock_report(config: PluginConfig) -> tuple[list[str], float]:
    """The flocks one collection takes, and the counters' shared lock's hold time (ms)."""
    taken: list[str] = []
    real = fcntl.flock

    def spy(fd: int, operation: int) -> None:
        kind = {fcntl.LOCK_SH: "shared", fcntl.LOCK_EX: "exclusive"}.get(
            operation & ~fcntl.LOCK_NB, "unlock")
        taken.append(f"{os.readlink(f'/proc/self/fd/{fd}')} {kind}"
                     f"{' (no wait)' if operation & fcntl.LOCK_NB else ''}")
        real(fd, operation)

    fcntl.flock = spy
    try:
        metrics.collect(config, "bench", check_processes=True)
    finally:
        fcntl.flock = real
    # What counters.read holds the lock for: one read of the file.
    holds = []
    path = os.path.join(config.state_dir, counters.FILE)
    for _ in range(2000):
        fd = os.open(path, os.O_RDONLY)
        real(fd, fcntl.LOCK_SH)
        start = time.perf_counter()
        counters._read_all(fd)
        holds.append((time.perf_counter() - start) * 1000)
        os.close(fd)
    return taken, max(holds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    reason = unusable_reason()
    if reason:
        print(f"bench_metrics: cannot run: {reason}", file=sys.stderr)
        return 2
    users = ensure_users()[:2]
    base = traversable_tmpdir("gpushare-bench-")
    standin = StandinInstall(base)
    try:
        config = PluginConfig(state_dir=os.path.join(base, "state"),
                              mps_control=standin.program, timeout=10.0)
        populate(config, users)
        text = metrics.render(metrics.collect(config, "bench", check_processes=True)[0])
        running = sum(1 for line in text.splitlines()
                      if line.startswith("gpushare_mps_daemon_up{") and line.endswith(" 1"))
        collect = []
        for _ in range(args.runs):
            start = time.perf_counter()
            metrics.render(metrics.collect(config, "bench", check_processes=True)[0])
            collect.append((time.perf_counter() - start) * 1000)
        textfile = os.path.join(base, "gpushare.prom")
        argv = [sys.executable, "-m", "gpushare.cli", "metrics", "--state-dir",
                config.state_dir, "--node", "bench", "--textfile", textfile]
        # From bytecode, as the RPM installs it (compileall), kept out of the tree.
        env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "src"),
                   PYTHONPYCACHEPREFIX=os.path.join(base, "pycache"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run(argv, env=env, check=True)  # writes the bytecode
        command = []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run(argv, env=env, check=True)
            command.append((time.perf_counter() - start) * 1000)
        alone = count_times(config, 500)
        context = multiprocessing.get_context("fork")
        stop = context.Event()
        loop = context.Process(target=_metrics_loop, args=(config, stop))
        loop.start()
        try:
            beside = count_times(config, 500)
        finally:
            stop.set()
            loop.join()
        taken, hold = lock_report(config)
    finally:
        standin.kill_all()
        shutil.rmtree(base, ignore_errors=True)

    print(f"gpushare metrics on a node with {len(GPUS)} GPUs, {JOBS} jobs, {running} running "
          f"MPS daemons ({len(text.splitlines())} lines of output), {args.runs} runs each")
    print(f"collect + render (in process)   {ms(collect)}")
    print(f"whole command, Python included  {ms(command)}")
    print(f"a prolog's count, alone          {ms(alone)}")
    print(f"  ... beside metrics in a loop   {ms(beside)}")
    print("locks one run takes: " + ("; ".join(sorted(set(taken))) or "none"))
    print(f"longest hold of the counters' shared lock: {hold * 1000:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
