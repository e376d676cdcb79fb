# SPDX-License-Identifier: GPL-2.0-or-later
"""What one ``gpushare usage`` round costs on a busy node, in CPU.

The node: 8 simulated GPUs (GPM on), 50 jobs of two users spread over them, each with two
MPS clients (100 GPU processes), their job records, and a process tree of the clients plus
``--others`` unrelated processes. The clients are charged through their Slurm cgroups
(``job_<id>``), or with ``--sluid`` through 26.05's SLUID cgroups, which makes the round
map SLUIDs through the jobs' slurmstepd processes (a scan of every process). Measured, as
root: the CPU time (user + system) of one round in a loop (GPM samples kept from the
round before, as ``--loop`` does), and that as a share of one core at ``--interval``.

The simulator answers NVML in Python; the driver's calls cost their own time (not CPU of
this process when they wait on the GPU), so this is the sampler's own work: reading
/proc, charging processes, the figures, the files.

    python3 bench/bench_usage.py --rounds 30
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src")]

from gpushare.gpu.nvml_sim import SimNvml, load_profile  # noqa: E402
from gpushare.node.state import JobRecord, JobStore  # noqa: E402
from gpushare.node.usage.sampler import Sampler, UsageSettings  # noqa: E402

GPUS, JOBS, CLIENTS = 8, 50, 2
USERS = (1001, 1002)


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-1111-2222-3333-444444444444"


def write_proc(proc: str, pid: int, uid: int, cgroup: str, exe: str = "/usr/bin/python3",
               cmdline: bytes = b"python3\0") -> None:
    os.makedirs(os.path.join(proc, "..", "cgroup", cgroup.lstrip("/")), exist_ok=True)
    where = os.path.join(proc, str(pid))
    os.makedirs(where)
    with open(os.path.join(where, "status"), "w") as f:
        f.write(f"Name:\tx\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\n"
                f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    with open(os.path.join(where, "cgroup"), "w") as f:
        f.write(f"0::{cgroup}\n")
    with open(os.path.join(where, "cmdline"), "wb") as f:
        f.write(cmdline)
    with open(os.path.join(where, "environ"), "wb") as f:
        f.write(b"HOME=/home/x\0PATH=/usr/bin\0" * 20)
    os.symlink(exe, os.path.join(where, "exe"))


def build(root: str, sluid: bool, others: int) -> str:
    """The node under ``root``: its profile's path."""
    proc, state = os.path.join(root, "proc"), os.path.join(root, "state")
    os.makedirs(proc)
    gpus = [{"minor": i, "uuid": uuid(i), "name": "NVIDIA H100 80GB HBM3",
             "memory_mib": 81559, "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "mig": None,
             "processes": [], "gpm": {"dram_bw_util": 50 + i}} for i in range(GPUS)]
    store = JobStore(state)
    pid = 1000
    for job in range(1, JOBS + 1):
        gpu, uid = job % GPUS, USERS[job % 2]
        name = f"s{job:012d}X" if sluid else str(job)
        base = f"/system.slice/slurmstepd.scope/job_{name}"
        if sluid:
            pid += 1
            write_proc(proc, pid, 0, f"{base}/step_extern/slurm", "/usr/sbin/slurmstepd",
                       f"slurmstepd: [{job}.extern]\0".encode())
        for _ in range(CLIENTS):
            pid += 1
            write_proc(proc, pid, uid, f"{base}/step_0/user/task_0")
            gpus[gpu]["processes"].append({"pid": pid, "used_memory_mib": 1024 + job,
                                           "kind": "mps", "sm_util": job % 40,
                                           "mem_util": job % 30})
        store.write(JobRecord(job, uid, uid, "bench", "shared", 12, [str(gpu)],
                              devices=[{"uuid": uuid(gpu), "gpu_index": gpu, "profile": ""}]))
    for _ in range(others):
        pid += 1
        write_proc(proc, pid, 0 if pid % 3 else 1001, "/system.slice/other.service")
    path = os.path.join(root, "node.json")
    with open(path, "w") as f:
        json.dump({"format": 1, "driver_version": "560.35.03", "cuda_driver_version": 12060,
                   "gpus": gpus}, f)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--others", type=int, default=600,
                        help="unrelated processes on the node (default 600)")
    parser.add_argument("--sluid", action="store_true", help="26.05 SLUID-named cgroups")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_usage: run as root (the state directory is root's)", file=sys.stderr)
        return 2
    root = tempfile.mkdtemp(prefix="gs-bench-usage-")
    try:
        profile = build(root, args.sluid, args.others)
        nvml = SimNvml(load_profile(profile))
        nvml.nvmlInit()
        sampler = Sampler(os.path.join(root, "state"), nvml, UsageSettings(args.interval),
                          proc_root=os.path.join(root, "proc"), settle=0.0,
                          cgroup_root=os.path.join(root, "cgroup"))
        sampler.round()  # the first round takes GPM's first samples
        cpu = []
        for _ in range(args.rounds):
            start = time.process_time()
            node = sampler.round()
            cpu.append(time.process_time() - start)
        jobs = len(os.listdir(os.path.join(root, "state", "usage"))) - 1
        assert jobs == JOBS and len(node.devices) == GPUS, (jobs, len(node.devices))
        median = statistics.median(cpu)
        print(f"node: {GPUS} GPUs, {JOBS} jobs, {JOBS * CLIENTS} GPU processes, "
              f"{args.others} other processes, cgroups named by "
              f"{'SLUID' if args.sluid else 'job id'}")
        print(f"CPU per round: median {median * 1000:.1f} ms, min {min(cpu) * 1000:.1f} ms, "
              f"max {max(cpu) * 1000:.1f} ms over {args.rounds} rounds")
        print(f"share of one core at a {args.interval:g} s interval: "
              f"{median / args.interval * 100:.2f} % (goal <= 1 %)")
    finally:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
