# SPDX-License-Identifier: GPL-2.0-or-later
"""Wall time gpushare adds to the prolog and epilog of an MPS job (stand-in daemon).

One local Slurm node; ``srun --gres=mps:25 printenv SLURM_JOB_ID`` is run, interleaved, with
  no plugin        plugstack.conf empty (Slurm's gres/mps alone)
  gpushare         the plugin starts the job's MPS daemon at prolog, stops it at epilog
  gpushare, joins  the same user already has a job (and so a daemon) on the GPU: the prolog
                   only takes a reference, the epilog only drops it
For each job, slurmd's log (millisecond timestamps) gives
  prolog   from "calling slurmstepd spank prolog" until the step's slurmstepd logs its
           first line (the spank prolog process, then the step's start: the same for
           every variant but what the plugin's callback adds)
  epilog   from "calling slurmstepd spank epilog" to "completed epilog"
and the client gives the end-to-end srun time; the plugin's debug log gives how long its
detached prolog and epilog workers ran (what the job's first task, and the next job's
prolog worker, may wait for), and where each worker's time went: the interpreter's start,
the imports, and the phases of its ``timing`` line (NVML, gres.conf, the plan, the records,
the wait for earlier epilogs, the daemon's start, its control socket, the caps). Prints
medians and what gpushare adds. Every worker here starts its own interpreter
(``prefork=no``), so that its start and imports are timed; ``bench_srun.py`` times the
default, in which a prefork server's child runs the worker's Python.

    python3 bench/bench_prolog.py [--rounds 5] [--per-round 6]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))

import slurmbed

USER = slurmbed.TEST_USERS[0]
_TS = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\]")


def _stamp(line: str) -> float | None:
    match = _TS.match(line)
    if not match:
        return None
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def spans_from_log(path: str) -> dict[int, dict[str, float]]:
    """Per job: prolog and epilog seconds, from slurmd's log."""
    spans: dict[int, dict[str, float]] = {}
    starts: dict[int, dict[str, float]] = {}
    pending: dict[str, float] = {}
    with open(path, errors="replace") as handle:
        for line in handle:
            ts = _stamp(line)
            if ts is None:
                continue
            for phase in ("prolog", "epilog"):
                if f"calling /usr/sbin/slurmstepd spank {phase}" in line:
                    pending[phase] = ts
                match = re.search(rf"Running spank/{phase} for jobid \[(\d+)\]", line)
                if match and phase in pending:
                    starts.setdefault(int(match.group(1)), {})[phase] = pending.pop(phase)
            # The step's slurmstepd logs "[<job>.<step>]" once Slurm has let it start.
            match = re.search(r"^\[[^]]+\] \[(\d+)\.", line)
            if match and "prolog" in starts.get(int(match.group(1)), {}):
                job = int(match.group(1))
                spans.setdefault(job, {}).setdefault("prolog", ts - starts[job]["prolog"])
            match = re.search(r"completed epilog for jobid (\d+)", line)
            if match and "epilog" in starts.get(int(match.group(1)), {}):
                job = int(match.group(1))
                spans.setdefault(job, {})["epilog"] = ts - starts[job]["epilog"]
    return spans


# The C glue's lines about a job's detached worker: its start, and its Python's return.
_WORKER_LINE = re.compile(r"(\d+\.\d+) .* job=(\d+) cb=job_(prolog|epilog) (detached|python rc=)")
_TIMING_LINE = re.compile(r"(\d+\.\d+) pid=(\d+) .* job=(\d+) debug timing (.*)")
_PYTHON_START = re.compile(r"(\d+\.\d+) pid=(\d+) .* python=start$")


_FAST = re.compile(r".* job=(\d+) cb=job_(prolog|epilog) python=skip "
                   r"reason=(joined|left-daemon)")


def fast_epilogs_from_debug_log(lines: list[str]) -> set[int]:
    """Jobs whose epilog the C glue finished without a worker (they left their daemon to
    other jobs)."""
    return {int(m[1]) for line in lines for m in [_FAST.match(line)] if m and m[2] == "epilog"}


def fast_prologs_from_debug_log(lines: list[str]) -> set[int]:
    """Jobs the C glue joined to their user's daemon without Python (a join ticket)."""
    return {int(m[1]) for line in lines for m in [_FAST.match(line)] if m and m[2] == "prolog"}


def workers_from_debug_log(lines: list[str]) -> dict[int, dict[str, float]]:
    """Per job: seconds each detached worker ran (the plugin's debug log, microseconds),
    from "cb=job_prolog detached" until its Python returned; likewise for the epilog."""
    spans: dict[int, dict[str, float]] = {}
    began: dict[tuple[int, str], float] = {}
    for line in lines:
        match = _WORKER_LINE.match(line)
        if not match:
            continue
        ts, job, phase, what = float(match[1]), int(match[2]), match[3], match[4]
        if what == "detached":
            began[(job, phase)] = ts
        elif (job, phase) in began:
            spans.setdefault(job, {})[phase] = ts - began.pop((job, phase))
    return spans


def phases_from_debug_log(lines: list[str]) -> dict[tuple[int, str], dict[str, float]]:
    """Per job and worker (prolog, epilog): milliseconds per phase, from the worker's
    ``timing`` line, plus ``interpreter``: from "detached" to "python=start" (the C glue's
    lines: the fork and the embedded interpreter's start; the imports come after)."""
    phases: dict[tuple[int, str], dict[str, float]] = {}
    detached: dict[tuple[int, str], float] = {}
    started: dict[int, float] = {}  # pid -> its python=start
    for line in lines:
        match = _WORKER_LINE.match(line)
        if match:
            if match[4] == "detached":
                detached[(int(match[2]), match[3])] = float(match[1])
            continue
        match = _PYTHON_START.match(line)
        if match:
            started[int(match[2])] = float(match[1])
            continue
        match = _TIMING_LINE.match(line)
        if not match:
            continue
        job = int(match[3])
        values = {k: float(v) for k, v in (kv.split("=") for kv in match[4].split())}
        kind = "prolog" if "verify" in values else "epilog"
        began, python = detached.get((job, kind)), started.get(int(match[2]))
        if began is not None and python is not None:
            values["interpreter"] = 1000 * (python - began)
        phases[(job, kind)] = values
    return phases


def run_jobs(bed: slurmbed.SlurmBed, node: str, count: int) -> list[tuple[int, float]]:
    jobs = []
    for _ in range(count):
        start = time.perf_counter()
        result = bed.run(["srun", "-w", node, "--gres=mps:25", "-c1", "printenv",
                          "SLURM_JOB_ID"], user=USER)
        jobs.append((int(result.stdout.strip()), time.perf_counter() - start))
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=6)
    parser.add_argument("--port", type=int, default=17680)
    parser.add_argument("--root", default="/tmp/gs-bench-prolog")
    opts = parser.parse_args()

    bed = slurmbed.default_bed(root=opts.root, port_base=opts.port, node_count=1,
                               prefix="bprolog")
    node = bed.nodes[0].name
    names = ("no plugin", "gpushare", "gpushare, joins")
    jobs: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
    with bed:
        # Each worker starts its own interpreter (prefork=no), whose start and imports this
        # bench times; bench_srun.py times the default, a prefork server's children.
        gpushare = bed.plugstack_line().rstrip("\n") + " prefork=no\n"
        for name in names:  # warm-up (page cache, first Python start)
            bed.write_plugstack("" if name == "no plugin" else gpushare)
            run_jobs(bed, node, 1)
        for _ in range(opts.rounds):
            for name in names:
                bed.write_plugstack("" if name == "no plugin" else gpushare)
                holder = None
                if name == "gpushare, joins":
                    holder = bed.sbatch("sleep 600", "-w", node, "--gres=mps:25", "-c1",
                                        user=USER)
                    bed.wait_job(holder, states={"RUNNING"})
                    _wait_daemon(bed)
                jobs[name].extend(run_jobs(bed, node, opts.per_round))
                if holder is not None:
                    bed.run(["scancel", str(holder)])
                    bed.wait_job(holder)
        time.sleep(2)  # the last epilogs
        spans = spans_from_log(bed.path("log", f"slurmd-{node}.log"))
        debug_lines = bed.debug_lines()
        workers = workers_from_debug_log(debug_lines)
        fast = fast_epilogs_from_debug_log(debug_lines)
        joined = fast_prologs_from_debug_log(debug_lines)

    rows = []
    for name in names:
        ids = [job for job, _ in jobs[name]]
        prolog = [spans[j]["prolog"] for j in ids if "prolog" in spans.get(j, {})]
        epilog = [spans[j]["epilog"] for j in ids if "epilog" in spans.get(j, {})]
        srun = [seconds for _, seconds in jobs[name]]
        # Without the plugin there is no worker (a round's last epilog may run once the next
        # round's plugstack.conf is in place: not this variant's).
        counted = ids if name != "no plugin" else []
        pro_worker = [workers[j]["prolog"] for j in counted if "prolog" in workers.get(j, {})]
        epi_worker = [workers[j]["epilog"] for j in counted if "epilog" in workers.get(j, {})]
        rows.append((name, len(ids), _ms(prolog), _ms(epilog), _ms(srun), _ms(pro_worker),
                     _ms(epi_worker), sum(1 for j in counted if j in joined),
                     sum(1 for j in counted if j in fast)))
    base = rows[0]
    print(f"srun --gres=mps:25, {opts.rounds} rounds x {opts.per_round} jobs per variant, "
          "medians in ms (slurmd log timestamps have 1 ms resolution). prolog/epilog: what "
          "Slurm waits for; workers: gpushare's detached prolog and epilog work, which the "
          "job's first task (prolog) or the next prolog worker (epilog) waits for; pro/epi in "
          "C: jobs whose prolog (joined or started with a ticket) or epilog (left others on the "
          "daemon) needed no worker")
    print(f"{'variant':<18} {'jobs':>5} {'prolog':>8} {'epilog':>8} {'pro+epi':>8} "
          f"{'added':>7} {'srun':>8} {'added':>7} {'pro wkr':>8} {'epi wkr':>8} "
          f"{'pro in C':>8} {'epi in C':>8}")
    for name, count, prolog, epilog, srun, pro_worker, epi_worker, pro_c, epi_c in rows:
        both = prolog + epilog
        print(f"{name:<18} {count:>5} {prolog:>8.1f} {epilog:>8.1f} {both:>8.1f} "
              f"{both - base[2] - base[3]:>+7.1f} {srun:>8.1f} {srun - base[4]:>+7.1f} "
              f"{pro_worker:>8.1f} {epi_worker:>8.1f} {pro_c:>8} {epi_c:>8}")
    print_phases(names[1:], jobs, phases_from_debug_log(debug_lines))
    return 0


def print_phases(names: tuple[str, ...], jobs: dict[str, list[tuple[int, float]]],
                 phases: dict[tuple[int, str], dict[str, float]]) -> None:
    """Medians per phase of each variant's prolog and epilog workers."""
    print("\nwhere the workers' time goes, medians in ms (a phase some of a column's workers "
          "skip counts 0 for them; '-': none had it; total: the timing line's own, after the "
          "imports)")
    columns: list[tuple[str, str]] = [(n, k) for n in names for k in ("prolog", "epilog")]
    table: dict[tuple[str, str], dict[str, float]] = {}
    order: list[str] = ["interpreter"]
    for name, kind in columns:
        rows = [phases[(job, kind)] for job, _ in jobs[name] if (job, kind) in phases]
        for row in rows:
            order.extend(key for key in row if key not in order)
        table[(name, kind)] = {key: statistics.median(row.get(key, 0.0) for row in rows)
                               for key in {k for row in rows for k in row}} if rows else {}
    order = [key for key in order if key != "total"] + ["total"]
    heads = [f"{name.replace('gpushare', 'gs')} {kind}"[:18] for name, kind in columns]
    print(f"{'phase':<14} " + " ".join(f"{head:>18}" for head in heads))
    for key in order:
        cells = [table[c].get(key) for c in columns]
        print(f"{key:<14} " + " ".join(f"{v:>18.1f}" if v is not None else f"{'-':>18}"
                                       for v in cells))


def _ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def _wait_daemon(bed: slurmbed.SlurmBed, limit: float = 30.0) -> None:
    records = os.path.join(bed.state_of("*"), "daemons", "*.json")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if glob.glob(records):
            return
        time.sleep(0.05)
    raise RuntimeError("the holder job's MPS daemon did not start")


if __name__ == "__main__":
    sys.exit(main())
