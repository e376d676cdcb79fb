# SPDX-License-Identifier: GPL-2.0-or-later
"""What a user waits for: ``srun``/``salloc`` with and without gpushare, in one run.

A local Slurm of the test plan's nodes (tests/plans/bed.yaml: four 8-GPU H100 nodes and a
MIG node), configured as docs/admin.md says: the plugin with ``verify=strict`` and
``plan=``, simulated NVML per node, the MPS stand-in, the Lua submit hook, no PrologFlags,
``state_dir=`` on a tmpfs as its default ``/run/gpushare`` is (``--state-on-disk``: on the
bed's disk instead, where every record's sync costs a write to the disk).
Every srun is a new job. The cases:

  srun true                  no GPU sharing: the plugin's fast path
  srun --gres=mps:25 true    the first job on its GPU: the user's MPS daemon is started
                             by the job's worker (forked by the node's prefork server, its
                             core imported: prefork=yes, the default, which the warm-up runs
                             start), which verifies the GPU on the layout NVML gave a job at
                             most verify_reuse= seconds before (every job here comes within
                             seconds of the last), and stopped by the epilog
  ... NVML asked             the same with verify_reuse=0: every job asks NVML, as on a
                             node whose last job ended more than verify_reuse= s before
  ... prefork=no             the same two, each worker starting its own interpreter (as the
                             node's first job, and the first after 10 idle minutes, does)
  ... joining                another job of the same user holds the GPU's daemon: the
                             prolog only joins it
  srun --gpu-share=25 true   the same share through gpushare's option (the hook turns it
                             into mps:25); without gpushare the user types --gres=mps:25
  salloc true                an interactive allocation, no step

Blocks of ``--per-block`` runs alternate between "without" (plugstack.conf empty) and
"with"; medians over all blocks, printed as ratios. Before each run the bench waits, untimed,
until the jobs before it are gone from the node's gpushare state (their epilogs done), so a
"first on its GPU" job really starts the daemon and a joining job joins the holder's; a
second table says, from the plugin's debug log, how the jobs of each case were set up.

    python3 bench/bench_srun.py [--blocks 10] [--per-block 10] [--only TEXT]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))

import slurmbed

USER = slurmbed.TEST_USERS[0]
NODE = "n1"
LUA = os.path.join(slurmbed.REPO, "submit_hooks", "job_submit.lua")

# name, client command without gpushare, with gpushare, needs a holder job, goal, plugstack
# arguments added to the admin guide's
CASES = (
    ("srun true", ["srun", "-N1", "-w", NODE, "true"], None, False, 1.02, ""),
    ("srun --gres=mps:25 true, first on its GPU",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "true"], None, False, 1.10, ""),
    ("... first on its GPU, NVML asked",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "true"], None, False, 1.10,
     "verify_reuse=0"),
    ("... first on its GPU, prefork=no",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "true"], None, False, 1.10, "prefork=no"),
    ("... first on its GPU, NVML asked, prefork=no",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "true"], None, False, 1.10,
     "verify_reuse=0 prefork=no"),
    ("srun --gres=mps:25 true, joining a daemon",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "true"], None, True, 1.02, ""),
    ("srun --gpu-share=25 true, first on its GPU",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "true"],
     ["srun", "-N1", "-w", NODE, "--gpu-share=25", "true"], False, 1.10, ""),
    ("salloc true", ["salloc", "-N1", "-w", NODE, "true"], None, False, 1.02, ""),
    # The same first job with something to do: what the worker's start costs a job that
    # runs (the task waits for it once, before it starts), and what `sbatch --wait` sees.
    ("srun --gres=mps:25 sleep 2, first on its GPU",
     ["srun", "-N1", "-w", NODE, "--gres=mps:25", "sleep", "2"], None, False, 1.10, ""),
    ("sbatch --wait --gres=mps:25, first on its GPU",
     ["sbatch", "--wait", "-Q", "-N1", "-w", NODE, "--gres=mps:25", "-o", "/dev/null",
      "--wrap", "true"], None, False, 1.10, ""),
)
# Cases whose single run takes seconds: this share of --blocks x --per-block runs.
LONG_CASES = {"srun --gres=mps:25 sleep 2, first on its GPU": 5,
              "sbatch --wait --gres=mps:25, first on its GPU": 5}


def settle(bed: slurmbed.SlurmBed, jobs_left: int) -> None:
    """Wait (untimed) until only ``jobs_left`` gpushare job records are left on the node
    (the epilogs of the jobs before are done, and with them any daemon they alone held) and
    Slurm lists only that many jobs there (none still completing): both sides start each
    run on a node that has finished the run before, with gpushare or without."""
    records = os.path.join(bed.state_of(NODE), "jobs", "*.json")
    deadline = time.monotonic() + 30
    while len(glob.glob(records)) > jobs_left and time.monotonic() < deadline:
        time.sleep(0.01)
    while time.monotonic() < deadline and len(bed.run(
            ["squeue", "-h", "-w", NODE, "-o", "%i"]).stdout.split()) > jobs_left:
        time.sleep(0.01)


def timed(bed: slurmbed.SlurmBed, argv: list[str], count: int, jobs_left: int) -> list[float]:
    samples = []
    for _ in range(count):
        settle(bed, jobs_left)
        start = time.perf_counter()
        bed.run(argv, user=USER)
        samples.append(time.perf_counter() - start)
    settle(bed, jobs_left)
    return samples


SET_UP = (("NVML asked", re.compile(r" debug timing (.* )?nvml=")),
          ("NVML reused", re.compile(r" debug timing (.* )?nvml-reused=")),
          ("check reused", re.compile(r" debug timing (.* )?check-reused=")),
          ("worker started", re.compile(r" debug timing .*daemon-start=")),
          ("by prefork", re.compile(r"cb=job_prolog prefork rc=")),
          ("joined by a worker", re.compile(r" debug timing (?!.*daemon-start=).*verify=")),
          ("joined in C", re.compile(r"cb=job_prolog python=skip reason=joined")),
          ("epilog in C", re.compile(r"cb=job_epilog python=skip reason=left-daemon")))


def set_up_counts(lines: list[str]) -> dict[str, int]:
    """How the jobs whose lines these are were set up and ended (the plugin's debug log)."""
    return {name: sum(1 for line in lines if pattern.search(line)) for name, pattern in SET_UP}


def holder(bed: slurmbed.SlurmBed) -> int:
    """A job of the same user on the node's first GPU, so the next ones join its daemon."""
    job_id = bed.sbatch("sleep 3600", "--gres=mps:25", "-w", NODE, "-c1", user=USER)
    bed.wait_job(job_id, states={"RUNNING"})
    return job_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10,
                        help="blocks per side and case (default 10)")
    parser.add_argument("--per-block", type=int, default=10,
                        help="runs per block (default 10: 100 per side)")
    parser.add_argument("--port", type=int, default=17600)
    parser.add_argument("--root", default="/tmp/gs-bench-srun")
    parser.add_argument("--prolog-flags", default="", metavar="FLAGS",
                        help="slurm.conf PrologFlags= (default none, as docs/admin.md; e.g. "
                        "Alloc to see what it costs)")
    parser.add_argument("--state-on-disk", action="store_true",
                        help="state_dir= on the bed's disk, not on a tmpfs")
    parser.add_argument("--only", default="", metavar="TEXT",
                        help="run only the cases whose name contains TEXT (e.g. 'first')")
    opts = parser.parse_args()
    cases = [case for case in CASES if opts.only in case[0]]
    if not cases:
        parser.error(f"no case's name contains {opts.only!r}")

    bed = slurmbed.plan_bed(root=opts.root, port_base=opts.port, job_submit="lua",
                            job_submit_lua=LUA, prolog_flags=opts.prolog_flags,
                            state_tmpfs=not opts.state_on_disk)
    samples: dict[tuple[str, str], list[float]] = {}
    set_up: dict[str, dict[str, int]] = {}
    with bed:
        gpushare = bed.plugstack_line()
        for name, without, with_, needs_holder, _goal, extra in cases:
            line = gpushare.rstrip("\n") + (f" {extra}\n" if extra else "\n")
            sides = (("without", "", without), ("with", line, with_ or without))
            held = None
            if needs_holder:
                bed.write_plugstack(gpushare)
                held = holder(bed)
            left = 1 if held is not None else 0
            for _side, plugstack, argv in sides:  # warm-up
                bed.write_plugstack(plugstack)
                timed(bed, argv, 2, left)
            blocks = max(1, opts.blocks // LONG_CASES.get(name, 1))
            for _ in range(blocks):
                for side, plugstack, argv in sides:
                    bed.write_plugstack(plugstack)
                    seen = len(bed.debug_lines())
                    samples.setdefault((name, side), []).extend(
                        timed(bed, argv, opts.per_block, left))
                    if side == "with":
                        counts = set_up_counts(bed.debug_lines()[seen:])
                        for key, value in counts.items():
                            set_up.setdefault(name, {}).setdefault(key, 0)
                            set_up[name][key] += value
            if held is not None:
                bed.write_plugstack(gpushare)
                bed.run(["scancel", str(held)])
                bed.wait_job(held)
        bed.write_plugstack(gpushare)

    runs = opts.blocks * opts.per_block
    print(f"what a user waits for, {runs} runs per side in {opts.blocks} alternating blocks "
          f"(cases of seconds: 1/{max(LONG_CASES.values())} of that), medians (verify=strict, "
          f"plan=, Lua hook, PrologFlags={opts.prolog_flags or '-'}, state_dir= on "
          f"{'disk' if opts.state_on_disk else 'tmpfs'})")
    print(f"{'case':<46} {'without ms':>10} {'with ms':>9} {'added ms':>9} {'ratio':>7} "
          f"{'goal':>7}")
    for name, _without, _with, _holder, goal, _extra in cases:
        base = statistics.median(samples[(name, "without")])
        with_ = statistics.median(samples[(name, "with")])
        print(f"{name:<46} {base * 1000:>10.1f} {with_ * 1000:>9.1f} "
              f"{(with_ - base) * 1000:>9.1f} {with_ / base:>7.3f} {'<=' + str(goal):>7}")
    print(f"\nhow the timed jobs with gpushare were set up ({runs} per case)")
    print(f"{'case':<44} " + " ".join(f"{key:>15}" for key, _ in SET_UP))
    for name, *_rest in cases:
        counts = set_up.get(name, {})
        print(f"{name:<44} " + " ".join(f"{counts.get(key, 0):>15}" for key, _ in SET_UP))
    return 0


if __name__ == "__main__":
    sys.exit(main())
