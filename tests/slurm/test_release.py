# SPDX-License-Identifier: GPL-2.0-or-later
"""What only Slurm 24.11 and later offer, on their own beds: NVLink domains as blocks of
topology/block (GB200 NVL72 racks) with ``--segment`` set by job_submit/gpushare, and several
MIG profiles Slurm owns on one node. On 22.05 these tests are skipped: it has neither.

Each bed has its own root (``<GPUSHARE_BED_ROOT>-block`` / ``-mig``), ports
(``GPUSHARE_BED_PORT`` + 200 / + 230) and node names (blk1.., mig1), so no cgroup or process
of another bed is touched.
"""

from __future__ import annotations

import os
import re

import pytest

import slurmbed

pytestmark = pytest.mark.slurm

ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed")
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))
BLOCK_PLAN = os.path.join(slurmbed.REPO, "tests", "plans", "block.yaml")
BLOCKS = {"rack0": {"blk1", "blk2"}, "rack1": {"blk3", "blk4"}, "rack2": {"blk5", "blk6"}}
USER = slurmbed.TEST_USERS[0]


@pytest.fixture(scope="module", autouse=True)
def needs_24_11():
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    if slurmbed.slurm_release() < (24, 11):
        pytest.skip(f"Slurm {slurmbed.slurm_release()} has no topology/block with --segment "
                    "and indexes one MIG profile per node")


@pytest.fixture(scope="module")
def block_bed():
    bed = slurmbed.with_python_hook(slurmbed.plan_bed(
        root=f"{ROOT}-block", port_base=PORT + 200, plan_path=BLOCK_PLAN))
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


def nodes_of(bed: slurmbed.SlurmBed, job_id: int) -> set[str]:
    listed = bed.run(["scontrol", "show", "hostnames", bed.job(job_id)["NodeList"]]).stdout
    return set(listed.split())


def blocks_of(nodes: set[str]) -> set[str]:
    return {name for name, members in BLOCKS.items() if members & nodes}


def test_the_bed_runs_topology_block(block_bed):
    shown = block_bed.run(["scontrol", "show", "topology"]).stdout
    for name in BLOCKS:
        assert re.search(rf"BlockName={name} ", shown), shown


@pytest.mark.smoke
def test_two_node_job_gets_a_segment_and_stays_in_one_block(block_bed):
    result = block_bed.run(["sbatch", "--parsable", "-N2", "--gres=gpu:h100:1", "--wrap",
                            "true"], user=USER)
    job_id = int(result.stdout.strip())
    assert "gpushare: --segment=2 (2 nodes fit in one NVLink domain)" in result.stderr
    info = block_bed.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    assert len(blocks_of(nodes_of(block_bed, job_id))) == 1, info["NodeList"]


def test_a_job_larger_than_a_block_takes_the_fewest_blocks(block_bed):
    result = block_bed.run(["sbatch", "--parsable", "-N4", "--gres=gpu:h100:1", "--wrap",
                            "true"], user=USER)
    job_id = int(result.stdout.strip())
    assert ("gpushare: --segment=2 (4 nodes in segments of 2, each in one NVLink domain of "
            "2 nodes)") in result.stderr
    info = block_bed.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", info
    nodes = nodes_of(block_bed, job_id)
    assert len(nodes) == 4 and len(blocks_of(nodes)) == 2, info["NodeList"]


def test_users_own_segment_is_kept(block_bed):
    result = block_bed.run(["sbatch", "--parsable", "-N2", "--segment=1", "--gres=gpu:h100:1",
                            "--hold", "--wrap", "true"], user=USER)
    job_id = int(result.stdout.strip())
    assert "gpushare:" not in result.stderr  # 24.11 shows no job's segment: the hook kept it
    block_bed.run(["scancel", str(job_id)], check=False)


# ---- several Slurm-owned MIG profiles on one node ------------------------------------------

MIG_PLAN = """\
version: 1
slurm: {mps_units_per_gpu: 100, sharing_flag: all_sharing}
policy: {untyped_gpu: a100}
node_groups:
  - name: mig
    nodes: mig1
    gpu_model: a100-80gb
    gpus: 4
    layout:
      0:
        owner: slurm
        mig:
          - {profile: 1g.10gb, count: 7}
      1:
        owner: slurm
        mig:
          - {profile: 3g.40gb}
          - {profile: 2g.20gb}
          - {profile: 1g.10gb}
      2: {owner: slurm}
      3: {owner: kubernetes}
"""


@pytest.fixture(scope="module")
def mig_bed(tmp_path_factory):
    plan = tmp_path_factory.mktemp("plan") / "mig.yaml"
    plan.write_text(MIG_PLAN)
    bed = slurmbed.plan_bed(root=f"{ROOT}-mig", port_base=PORT + 230, plan_path=str(plan))
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.mark.parametrize("gres", ["gpu:3g.40gb:1", "gpu:2g.20gb:1", "gpu:1g.10gb:8",
                                  "gpu:a100:1"])
def test_each_of_several_mig_profiles_runs_and_passes_verification(mig_bed, gres):
    job_id = mig_bed.sbatch("echo CVD=$CUDA_VISIBLE_DEVICES", f"--gres={gres}")
    info = mig_bed.wait_job(job_id)
    assert info["JobState"] == "COMPLETED", (info, mig_bed.logs(20))
    prologs = [line for line in mig_bed.debug_lines()
               if f"job={job_id} cb=job_prolog" in line and " rc=" in line]
    assert prologs and all(line.endswith(" rc=0") for line in prologs), prologs
    assert "DRAIN" not in mig_bed.node_state("mig1")["State"]
