# SPDX-License-Identifier: GPL-2.0-or-later
"""A job's GPU use reaches its AdminComment through a real slurmdbd: the bed gains MariaDB
and slurmdbd for this module (slurmctld restarted with accounting), and loses them after."""

from __future__ import annotations

import os

import pytest
from tests.slurm.test_usage import CLIENT, U1, usage_round
from tests.slurm.test_usage import usage_bed as _usage_bed  # noqa: F401  (a fixture)

import slurmdbd_bed
from slurmbed import TEST_USERS, wait_until

pytestmark = pytest.mark.slurm
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))


@pytest.fixture(scope="module")
def accounting(bed):
    """MariaDB and slurmdbd for the session's bed, slurmctld restarted to use them."""
    reason = slurmdbd_bed.unusable_reason()
    if reason:
        # make deps installs the packages on Debian 12 (slurmdbd_bed.RELEASES); every
        # release root of `make test` has them, with the client library its slurmdbd needs.
        pytest.skip(reason)
    with slurmdbd_bed.accounting_for(bed, PORT + 90, PORT + 91, bed.wait_idle,
                                     TEST_USERS) as acct:
        yield acct


def lowercases_admin_comment() -> bool:
    """sacctmgr before 23.02 lowercases the AdminComment it sets (SchedMD bug 14338)."""
    from gpushare.admin.plan.model import release_tuple
    from gpushare.admin.slurm_client import installed_release

    return release_tuple(installed_release() or "24.11") < (23, 2)


def admin_comment(bed, job: int, user: str) -> str:
    result = bed.run(["sacct", "-n", "-X", "-P", "-j", str(job), "-o", "AdminComment"],
                     user=user, check=False)
    return result.stdout.strip()


def test_a_sampled_job_end_appends_its_gpu_use_to_admin_comment(accounting, _usage_bed):  # noqa: F811
    bed = _usage_bed
    live = bed.usage["live"]
    job = bed.sbatch(CLIENT.format(mem=2048, sm=30, mem_util=60, live=live),
                     "--gres=mps:25", "-w", "n1", "-c1", user=U1)
    wait_until("the client registered", lambda: len(os.listdir(live)) == 1, 120)
    # A user cannot set AdminComment; an operator's earlier text is kept first.
    refused = bed.run(["scontrol", "update", f"jobid={job}", "AdminComment=mine"], user=U1,
                      check=False)
    assert refused.returncode != 0, refused.stdout + refused.stderr
    bed.run(["scontrol", "update", f"jobid={job}", "AdminComment=operator note"])
    usage_round(bed)
    bed.run(["scancel", str(job)])
    bed.wait_job(job)
    want = "operator note; gpushare: GPU peak memory 2.0 GiB, mean SM 30 % (measured)"
    if lowercases_admin_comment():
        want = want.lower()  # 22.05's sacctmgr lowercases what it sets (docs/admin.md)
    try:
        got = wait_until("the GPU use in AdminComment",
                         lambda: want in admin_comment(bed, job, U1) and
                         admin_comment(bed, job, U1), 60)
    except BaseException:
        print(bed.lines_about([str(job)]), accounting.logs())
        print("sacct:", admin_comment(bed, job, "root"))
        raise
    assert str(got).startswith(want)
