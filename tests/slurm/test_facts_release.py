# SPDX-License-Identifier: GPL-2.0-or-later
"""Both submit hooks inside the real slurmctld refuse facts rendered for the other Slurm
request syntax (22.05's ``gres:gpu:1`` against 23.11's ``gres/gpu:1``): slurmctld's log
says why, and jobs pass unchanged, never rewritten into strings slurmctld rejects.

Each hook gets its own bed from tests/plans/bed.yaml on ``GPUSHARE_BED_PORT`` + 260 (Lua) or
+ 290 (Python), rooted at ``<GPUSHARE_BED_ROOT>-facts-lua`` / ``-facts-py``; jobs are
submitted held and cancelled, so none runs beside another bed's on the same node names.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import slurmbed

ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed")
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))
LUA = os.path.join(slurmbed.REPO, "submit_hooks", "job_submit.lua")


def other_release() -> str:
    """A release whose request syntax is not the running Slurm's."""
    return "24.11" if slurmbed.slurm_release() < (23, 11) else "22.05"


@pytest.fixture(scope="module", params=("lua", "py"))
def mismatched(request):
    """A bed whose hook reads facts rendered for the other release."""
    from gpushare.admin.plan import load_plan, with_slurm_version
    from gpushare.admin.render_facts import render_facts

    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if not os.path.exists(os.path.join(slurmbed.BUILD, "spank_gpushare.so")):
        subprocess.run(["make", "-C", slurmbed.REPO, "build"], check=True)
    root = f"{ROOT}-facts-{request.param}"
    if request.param == "lua":
        bed = slurmbed.plan_bed(root=root, port_base=PORT + 260, job_submit="lua",
                                job_submit_lua=LUA)
    else:
        bed = slurmbed.with_python_hook(slurmbed.plan_bed(root=root, port_base=PORT + 290))
    plan = with_slurm_version(load_plan(slurmbed.BED_PLAN), other_release())
    bed.facts_json = json.dumps(render_facts(plan))
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


def test_facts_for_the_other_release_are_refused_and_jobs_pass(mismatched):
    bed = mismatched
    syntax = "gres/gpu:1" if other_release() == "24.11" else "gres:gpu:1"
    with open(bed.path("log", "slurmctld.log"), errors="replace") as handle:
        refusals = [line for line in handle if "refusing the facts" in line]
    assert refusals, "slurmctld's log does not say the facts were refused"
    assert f"{bed.facts_path} was rendered for Slurm" in refusals[0], refusals[0]
    assert f"(requests as {syntax}), but this slurmctld is Slurm" in refusals[0], refusals[0]
    assert "render the facts again" in refusals[0], refusals[0]
    # The bed's plan turns an untyped --gres=gpu:1 into h100 and says so; refused facts
    # leave the request as the user wrote it.
    result = bed.run(["sbatch", "--parsable", "--hold", "--gres=gpu:1", "--wrap", "true"],
                     user=slurmbed.TEST_USERS[0], check=False)
    assert result.returncode == 0, result.stderr
    assert "gpushare:" not in result.stderr, result.stderr
    job_id = result.stdout.strip().split(";")[0]
    shown = bed.run(["scontrol", "show", "job", job_id]).stdout
    bed.run(["scancel", job_id], check=False)
    assert "h100" not in shown, shown
