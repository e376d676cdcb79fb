# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare status --cluster on a node with both whole GPUs and MIG slices, against a real
slurmctld: ``Gres=gpu:h100:4,gpu:1g.10gb:2,mps:400``, which Slurm reports as
``mps:h100:400,mps:1g.10gb:0`` while the jobs hold untyped ``mps:N``.

The bed has its own root (``<GPUSHARE_BED_ROOT>-mixed``), ports (``GPUSHARE_BED_PORT`` + 330)
and node name (mx1), so no cgroup or process of another bed is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import slurmbed

pytestmark = pytest.mark.slurm

ROOT = os.environ.get("GPUSHARE_BED_ROOT", "/tmp/gpushare-test-bed")
PORT = int(os.environ.get("GPUSHARE_BED_PORT", "17200"))
U1, U2 = slurmbed.TEST_USERS[0], slurmbed.TEST_USERS[1]
SCONTROL = shutil.which("scontrol") or "/usr/bin/scontrol"
SINFO = shutil.which("sinfo") or "/usr/bin/sinfo"
NODE = "mx1"

MIXED_PLAN = """\
version: 1
slurm:
  device_root: /dev
  mps_units_per_gpu: 100
  sharing_flag: all_sharing
policy: {untyped_gpu: h100}
node_groups:
  - name: mixed
    nodes: mx1
    gpu_model: h100-80gb
    gpus: 5
    layout:
      0: {owner: slurm, mps: 100}
      1: {owner: slurm, mps: 100}
      2: {owner: slurm, mps: 100}
      3: {owner: slurm, mps: 100}
      4:
        owner: slurm
        mig:
          - {profile: 1g.10gb, count: 2}
"""


@pytest.fixture(scope="module")
def mixed_bed(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    plan = tmp_path_factory.mktemp("plan") / "mixed.yaml"
    plan.write_text(MIXED_PLAN)
    bed = slurmbed.plan_bed(root=f"{ROOT}-mixed", port_base=PORT + 330, plan_path=str(plan),
                            simulate=True)
    bed.start()
    try:
        yield bed
    finally:
        bed.stop()


def gpushare(bed, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(bed.env, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    return subprocess.run([sys.executable, "-m", "gpushare.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_status_of_a_node_with_whole_gpus_mig_slices_and_mps(mixed_bed):
    bed = mixed_bed
    bed.wait_idle()
    shown = bed.run(["scontrol", "show", "node", NODE]).stdout
    assert "mps:h100:400" in shown and "gpu:1g.10gb:2" in shown, shown  # the node
    # A user's own text forging scontrol -o's per-node fields: a running slice job's name
    # and comment, and a held job's name claiming it runs. None of it is GRES held.
    forged = f"Nodes={NODE} CPU_IDs=0 Mem=0 GRES=mps:100(IDX:0)"
    jobs = [bed.sbatch("sleep 60", "--gres=mps:25", "-w", NODE, "-c1", user=U1),
            bed.sbatch("sleep 60", "--gres=mps:50", "-w", NODE, "-c1", user=U2),
            bed.sbatch("sleep 60", "--gres=gpu:h100:1", "-w", NODE, "-c1", user=U1),
            bed.sbatch("sleep 60", "--gres=gpu:1g.10gb:1", "-w", NODE, "-c1", user=U1),
            bed.sbatch("sleep 60", "--gres=gpu:1g.10gb:1", "-w", NODE, "-c1", "-J",
                       f"x {forged}", f"--comment=y {forged}", user=U2)]
    held = bed.sbatch("sleep 60", "--gres=gpu:h100:1", "-w", NODE, "-c1", "-H", "-J",
                      f"JobState=RUNNING {forged}", user=U2)
    try:
        for job_id in jobs:
            bed.wait_job(job_id, states={"RUNNING"}, timeout=120)
        detail = bed.run(["scontrol", "-d", "show", "-o", "node", NODE]).stdout
        for backend in ("sinfo", "scontrol"):
            result = gpushare(bed, "status", "--cluster", "--json", "--backend", backend,
                              "--sinfo", SINFO, "--scontrol", SCONTROL)
            assert result.returncode == 0, result.stdout + result.stderr
            (node,) = json.loads(result.stdout)["nodes"]
            (h100,) = node["gpus"]
            assert (h100["type"], h100["mps_used"], h100["mps_total"]) == ("h100", 75, 400), (
                backend, detail, node)
            # all_sharing lets Slurm put the two MPS jobs on one GPU or two; one more GPU is
            # the whole-GPU job's.
            busy = h100["mps_busy"]
            assert busy in (1, 2) and h100["used"] == 1, (backend, detail, node)
            assert h100["free"] == 4 - 1 - busy, (backend, detail, node)
            (slices,) = node["mig"]
            assert (slices["mig_profile"], slices["free"], slices["total"]) == (
                "1g.10gb", 0, 2), (backend, node)
        table = gpushare(bed, "status", "--cluster", "--sinfo", SINFO, "--scontrol", SCONTROL)
        assert table.returncode == 0, table.stderr
        row = next(line.split() for line in table.stdout.splitlines()
                   if line.startswith(f"{NODE} "))
        assert row[2] == "h100" and row[4] == "75/400", table.stdout
    finally:
        bed.run(["scancel", *map(str, [*jobs, held])], check=False)
        for job_id in jobs:  # not the held one: its name forges the state wait_job reads
            bed.wait_job(job_id)
