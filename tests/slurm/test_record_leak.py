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
should.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.slurm.test_mps import assert_nothing_left, job_records, mps_entries
from tests.slurm.test_mps import mps_bed as _mps_bed  # noqa: F401  (a fixture)

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
