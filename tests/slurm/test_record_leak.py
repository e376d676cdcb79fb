# SPDX-License-Identifier: GPL-2.0-or-later
"""A job's records (its record, its tasks' file, its lock) never outlive its epilog, however
fast the job ends: jobs refused on the node, whose task stops at once, and short shared ones,
several at a time on one node.

Slurm reads plugstack.conf afresh for every job prolog, epilog and step. A plugstack.conf
rewritten in place (truncated, then written) is empty for an instant: an epilog that starts
then loads no gpushare and undoes nothing, and its job's records stay behind. The bed
rewrites it at every clean_bed test's start and end, right when the jobs of the test before
end; the second test shows that this must not leave records: the bed replaces the file in
one rename (SlurmBed._write in scripts/slurmbed.py), as a site's configuration management
should. The third: a job whose prolog's worker was killed while its supervisor hung (it
holds the job's lock past every bound): the epilog still undoes the job, and the supervisor
that comes back later brings no record back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.slurm.test_hostile import python_pid, with_timeout, worker_pid
from tests.slurm.test_mps import (
    FAULT_NODE,
    U1,
    assert_nothing_left,
    job_records,
    mps_entries,
    mps_records,
    set_fault,
    wait_drained,
)
from tests.slurm.test_mps import mps_bed as _mps_bed  # noqa: F401  (a fixture)

import procfs
import slurmbed

pytestmark = pytest.mark.slurm

USER = slurmbed.TEST_USERS[0]
NODE = "n2"
ROUNDS = int(os.environ.get("GPUSHARE_LEAK_ROUNDS", "6"))

# What ends fastest on one node: refused for a share mismatch, refused for a share beside a
# whole GPU, a share without a GPU (all three fail in their task), and a short shared job.
SRUNS = (
    (["--gres=mps:50", "--gpu-share=20", "true"], False),
    (["--gres=gpu:1", "--gpu-share=25", "true"], False),
    (["--gpu-share=25", "true"], False),
    (["--gres=mps:50", "true"], True),
)


def _no_jobs(bed) -> bool:
    return not bed.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip()


def _run_rounds(bed, rounds: int) -> list[tuple[bool, int]]:
    """Each kind of fast-ending job on NODE, all four at once, ``rounds`` times."""
    def srun(kind: tuple[list[str], bool]) -> tuple[bool, int]:
        args, runs = kind
        return runs, bed.run(["srun", "-w", NODE, *args], user=USER, check=False).returncode

    with ThreadPoolExecutor(max_workers=len(SRUNS)) as pool:
        return [result for _ in range(rounds) for result in pool.map(srun, SRUNS)]


def _left(bed) -> list[str]:
    """What is left of the jobs once every epilog had time to finish."""
    slurmbed.wait_until("every job gone", lambda: _no_jobs(bed), 120)
    with contextlib.suppress(AssertionError):
        slurmbed.wait_until("records removed", lambda: not job_records(bed) and
                            not mps_entries(bed), 30)
    return job_records(bed) + mps_entries(bed)


def _reap(bed) -> None:
    """Give back what a lost epilog left, as an admin would (``gpushare mps --reap``)."""
    bed.run(["/usr/bin/python3", "-m", "gpushare.cli", "mps", "--node", NODE, "--reap"],
            env={"PYTHONPATH": bed.path("lib", "python")}, check=False)
    for path in job_records(bed):
        os.unlink(path)


@pytest.mark.smoke
def test_fast_ending_jobs_leave_no_records(_mps_bed):  # noqa: F811  (the fixture above)
    bed = _mps_bed
    results = _run_rounds(bed, ROUNDS)
    assert all((code == 0) == runs for runs, code in results), results
    left = _left(bed)
    if left:
        _reap(bed)
    assert not left
    assert "DRAIN" not in bed.node_state(NODE)["State"]
    assert_nothing_left(bed)


def test_plugstack_rewritten_while_jobs_end_leaves_no_records(_mps_bed):  # noqa: F811
    """The bed's own plugstack.conf rewrite, as clean_bed does it between tests, while jobs
    end: every epilog must still load gpushare and undo its job."""
    bed = _mps_bed
    stop = threading.Event()

    def rewrite() -> None:
        while not stop.is_set():
            bed.write_plugstack(bed.plugstack_line())
            time.sleep(0.001)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        _run_rounds(bed, ROUNDS)
    finally:
        stop.set()
        writer.join()
        bed.write_plugstack(bed.plugstack_line())
    left = _left(bed)
    if left:
        _reap(bed)
        assert_nothing_left(bed)  # the next test starts clean either way
    assert not left


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def test_a_prolog_whose_supervisor_hangs_is_undone_by_its_epilog(_mps_bed):  # noqa: F811
    """The prolog's worker is killed while it starts the job's daemon, and its supervisor
    hangs (stopped), holding the job's lock past every bound (timeout=2: 24 s). The task
    gives up waiting; the epilog, after the same wait, drains the node with gpushare's
    cause (not Slurm's bare "Epilog error") and undoes the job all the same: its records,
    its lock, its daemon. The supervisor, resumed, reports the killed worker: the node is
    drained again, but the job, over, gets no record back."""
    bed = _mps_bed
    line = with_timeout(bed, 2)
    set_fault(bed, "slow_start")
    supervisor = 0
    try:
        job_id = bed.sbatch("echo RAN", "--gres=mps:25", "-w", FAULT_NODE, "-c1",
                            "--no-requeue", user=U1)
        worker = worker_pid(bed, job_id)
        slurmbed.wait_until("the daemon's record names the job", lambda: any(
            str(job_id) in record["jobs"] for record in mps_records(bed)), 60)
        supervisor = _parent(worker)
        os.kill(supervisor, signal.SIGSTOP)
        # What runs the job's Python: the worker, or its child in the prefork server (whose
        # end without a result ends the worker too).
        os.kill(python_pid(bed, job_id), signal.SIGKILL)
        info = bed.wait_job(job_id, timeout=120)
        assert info["JobState"] != "COMPLETED" and "RAN" not in bed.output(job_id, ""), info
        reason = wait_drained(bed, FAULT_NODE, timeout=120)
        assert reason.startswith("gpushare: prolog worker still ran at the epilog after 24 s "
                                 f"(job {job_id}; "), reason
        # Undone without the lock: the records, the lock and the daemon the worker started.
        slurmbed.wait_until("the job undone", lambda: not job_records(bed) and
                            not mps_entries(bed), 60)
        os.kill(supervisor, signal.SIGCONT)
        slurmbed.wait_until("the supervisor's report", lambda: any(
            f"job={job_id} cb=job_prolog_worker_lost python rc=0" in entry
            for entry in bed.debug_lines()), 60)
        slurmbed.wait_until("the supervisor gone", lambda: procfs.ended(supervisor), 30)
        assert not job_records(bed), job_records(bed)
        assert bed.job(job_id).get("Restarts") == "0"
        assert_nothing_left(bed)
    finally:
        if supervisor:
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGCONT)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bed.path("bin", "faults"))
        bed.write_plugstack(line)
        bed.resume(FAULT_NODE)
