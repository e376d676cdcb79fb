# SPDX-License-Identifier: GPL-2.0-or-later
"""One real local Slurm for the whole session, stopped at the end: munge, slurmctld and five
slurmd whose GPUs, gres.conf and topology come from tests/plans/bed.yaml.

``GPUSHARE_BED_ROOT`` and ``GPUSHARE_BED_PORT`` move it, so that two beds can run at once.
"""

from __future__ import annotations

import glob
import os
import subprocess

import pytest

import slurmbed

ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed")
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))


def _ensure_built() -> None:
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)


@pytest.fixture(scope="session")
def bed():
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    _ensure_built()
    cluster = slurmbed.plan_bed(root=ROOT, port_base=PORT)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _job_records(bed) -> list[str]:
    return sorted(glob.glob(os.path.join(bed.state_of("*"), "jobs", "*")))


def _jobs_end_without_records(bed) -> None:
    """The test's jobs are ended and their epilogs must remove their records: a test that
    leaves records fails itself (in its teardown), not the test after it, which starts
    clean because what was left is reaped here."""
    def queued() -> list[str]:
        return bed.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()

    # Every job in the queue, whoever's (a test may submit as users of its own).
    if queued():
        bed.run(["scancel", "--quiet", *queued()], check=False)
    slurmbed.wait_until("the test's jobs gone", lambda: not queued(), 120)
    try:
        slurmbed.wait_until("job records removed by the epilogs",
                            lambda: not _job_records(bed), 30)
    except AssertionError:
        left = _job_records(bed)
        jobs = sorted({os.path.basename(path).split(".")[0] for path in left})
        report = bed.lines_about(jobs)
        for node in sorted({path.split(os.sep)[-3] for path in left}):
            bed.run(["/usr/bin/python3", "-m", "gpushare.cli", "mps", "--node", node,
                     "--reap"], env={"PYTHONPATH": bed.path("lib", "python")}, check=False)
        for path in left:
            os.unlink(path)
        pytest.fail(f"the test left job records after its jobs ended: {left}\n"
                    f"what the logs say of jobs {jobs}:\n{report}")


@pytest.fixture
def clean_bed(bed):
    """The bed with its default plugstack, every node usable, after the test too; a test
    whose jobs leave records fails."""
    bed.write_plugstack(bed.plugstack_line())
    yield bed
    bed.write_plugstack(bed.plugstack_line())
    bed.resume(*(node.name for node in bed.nodes))
    _jobs_end_without_records(bed)
