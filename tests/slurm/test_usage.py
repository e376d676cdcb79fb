# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare usage against real jobs on the local Slurm: two users' jobs on one MPS GPU run
fake CUDA clients (registered with the simulated NVML), one round as root writes each job's
own figures and dcgm-exporter's mapping files, a simulated bandwidth hog is named and then
cleared, and the files go with the jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import slurmbed
from slurmbed import wait_until

pytestmark = pytest.mark.slurm

U1, U2 = slurmbed.TEST_USERS[0], slurmbed.TEST_USERS[1]
MIB = 1 << 20

# The fake client: registers its pid with the simulated NVML on the job's GPU (the UUID
# gpushare gave the task), then keeps running as the same process.
CLIENT = """python3 -c '
import json, os, sys
uuid = os.environ["GPUSHARE_GPU_UUIDS"].split(",")[0]
with open(os.path.join(sys.argv[1], "%d.json" % os.getpid()), "w") as f:
    json.dump({{"uuid": uuid, "kind": "mps", "used_memory_mib": {mem}, "sm_util": {sm},
               "mem_util": {mem_util}}}, f)
os.execvp("sleep", ["sleep", "300"])
' {live}"""


@pytest.fixture
def usage_bed(clean_bed):
    """The bed's n1 with a live-client directory and GPM in its profile, restored after."""
    bed = clean_bed
    profile_path = bed.path("nodes", "n1.json")
    with open(profile_path) as f:
        original = f.read()
    live = bed.path("live-n1")
    os.makedirs(live, exist_ok=True)
    os.chown(live, 0, 0)
    os.chmod(live, 0o1777)
    mapping = bed.path("dcgm-n1")
    plugstack = bed.path("etc", "usage-plugstack.conf")
    with open(plugstack, "w") as f:
        f.write(bed.plugstack_line().rstrip("\n") + f" hog_bw_pct=70 hog_seconds=0 "
                f"dcgm_mapping_dir={mapping}\n")
    bed.usage = {"live": live, "mapping": mapping, "plugstack": plugstack,
                 "profile": profile_path}
    set_bandwidth(bed, 90.0)
    yield bed
    with open(profile_path, "w") as f:
        f.write(original)
    for name in os.listdir(live):
        os.unlink(os.path.join(live, name))


def set_bandwidth(bed, pct: float) -> None:
    path = bed.usage["profile"]
    with open(path) as f:
        profile = json.load(f)
    profile["live_dir"] = bed.usage["live"]
    for gpu in profile["gpus"]:
        gpu["gpm"] = {"dram_bw_util": pct}
    with open(path + ".tmp", "w") as f:
        json.dump(profile, f)
    os.replace(path + ".tmp", path)


def usage_round(bed) -> str:
    env = dict(bed.env, PYTHONPATH=os.path.join(slurmbed.REPO, "src"))
    result = subprocess.run([sys.executable, "-m", "gpushare.cli", "usage", "--node", "n1",
                             "--plugstack", bed.usage["plugstack"]],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stderr


def read(bed, name: str):
    path = os.path.join(bed.state_of("n1"), "usage", name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def test_two_users_jobs_on_one_mps_gpu_get_their_own_figures_and_a_named_hog(usage_bed):
    bed = usage_bed
    live = bed.usage["live"]
    one = bed.sbatch(CLIENT.format(mem=2048, sm=30, mem_util=60, live=live),
                     "--gres=mps:25", "-w", "n1", "-c1", user=U1)
    two = bed.sbatch(CLIENT.format(mem=1024, sm=50, mem_util=10, live=live),
                     "--gres=mps:25", "-w", "n1", "-c1", user=U2)
    wait_until("both clients registered", lambda: len(os.listdir(live)) == 2, 120)

    stderr = usage_round(bed)
    first, second = read(bed, f"{one}.json"), read(bed, f"{two}.json")
    assert first["user"] == U1 and second["user"] == U2
    assert first["devices"][0]["uuid"] == second["devices"][0]["uuid"]  # one MPS GPU
    assert (first["processes"], second["processes"]) == (1, 1)
    assert first["now"]["mem_bytes"] == 2048 * MIB and second["now"]["mem_bytes"] == 1024 * MIB
    assert first["now"]["sm_pct"] == 30 and second["now"]["sm_pct"] == 50
    # 90 % of the GPU's bandwidth split 60:10 by memory-controller time, estimated.
    assert first["now"]["bw_pct"] == pytest.approx(90 * 60 / 70)
    assert second["now"]["bw_pct"] == pytest.approx(90 * 10 / 70)
    assert first["quality"] == {"sm": "measured", "mem": "measured", "bw": "estimated"}

    uuid = first["devices"][0]["uuid"]
    node = read(bed, "node.json")
    device = next(d for d in node["devices"] if d["uuid"] == uuid)
    assert device["job_ids"] == sorted([one, two])
    assert device["hog"]["job_id"] == one and "MIG slice" in device["hog"]["advice"]
    assert f"job {one}" in stderr and "bandwidth hog" in stderr
    gpu = str(device["gpu"])
    with open(os.path.join(bed.usage["mapping"], gpu)) as f:
        assert f.read().split() == [str(job) for job in sorted([one, two])]

    set_bandwidth(bed, 20.0)
    stderr = usage_round(bed)
    device = next(d for d in read(bed, "node.json")["devices"] if d["uuid"] == uuid)
    assert device["hog"] is None and "no longer named" in stderr

    bed.run(["scancel", str(one), str(two)])
    for job in (one, two):
        bed.wait_job(job)
    wait_until("the jobs' records gone", lambda: not os.listdir(
        os.path.join(bed.state_of("n1"), "jobs")) or all(
        not name.startswith((f"{one}.", f"{two}.")) for name in
        os.listdir(os.path.join(bed.state_of("n1"), "jobs"))), 60)
    # Each job's epilog logged its GPU use at the end and took its figures away; the bed
    # has no slurmdbd, so AdminComment (sacctmgr) is refused, and the log says why.
    def logged() -> str:
        with open(bed.path("log", "slurmd-n1.log")) as f:
            text = f.read()
        return text if all(f"job {job}: GPU peak memory" in text
                           for job in (one, two)) else ""
    slurmd_log = str(wait_until("both jobs' GPU use logged by their epilogs", logged, 60))
    assert f"job {one}: GPU peak memory 2.0 GiB, mean SM 30 % (measured)" \
        in slurmd_log
    assert f"job {two}: GPU peak memory 1.0 GiB, mean SM 50 % (measured)" \
        in slurmd_log
    assert f"job {one}: its GPU use is not in AdminComment (it needs slurmdbd)" in slurmd_log
    assert f"job {one}: job {one}:" not in slurmd_log
    assert read(bed, f"{one}.json") is None and read(bed, f"{two}.json") is None
    usage_round(bed)
    assert read(bed, f"{one}.json") is None and read(bed, f"{two}.json") is None
    assert not os.path.exists(os.path.join(bed.usage["mapping"], gpu))


# A client of a whole GPU that shares nothing: Slurm names the GPU (SLURM_JOB_GPUS, its
# index on the node); the test passes the node's UUIDs by index.
WHOLE_CLIENT = """python3 -c '
import json, os, sys
uuid = sys.argv[2].split(",")[int(os.environ["SLURM_JOB_GPUS"].split(",")[0])]
with open(os.path.join(sys.argv[1], "%d.json" % os.getpid()), "w") as f:
    json.dump({{"uuid": uuid, "kind": "compute", "used_memory_mib": 3072, "sm_util": 80,
               "mem_util": 40}}, f)
os.execvp("sleep", ["sleep", "300"])
' {live} {uuids}"""


def test_a_whole_gpu_job_that_shares_nothing_gets_its_use_logged_at_its_end(usage_bed):
    """Such a job has no gpushare record (its prolog and epilog skip Python), but once the
    sampler kept figures for it (found through its Slurm cgroup), its epilog goes to the
    worker, which logs its GPU use and removes the figures."""
    bed = usage_bed
    if not bed.use_cgroup():
        pytest.skip("a job without a gpushare record is found through its cgroup")
    with open(bed.usage["profile"]) as f:
        gpus = sorted(json.load(f)["gpus"], key=lambda gpu: gpu["minor"])
    uuids = ",".join(gpu["uuid"] for gpu in gpus)
    job = bed.sbatch(WHOLE_CLIENT.format(live=bed.usage["live"], uuids=uuids),
                     "--gres=gpu:1", "-w", "n1", "-c1", user=U1)
    wait_until("the client registered", lambda: len(os.listdir(bed.usage["live"])) == 1, 120)
    assert not os.path.exists(os.path.join(bed.state_of("n1"), "jobs", f"{job}.json"))
    usage_round(bed)
    figures = read(bed, f"{job}.json")
    assert figures is not None and figures["user"] == U1 and figures["processes"] == 1
    assert figures["now"]["mem_bytes"] == 3072 * MIB and figures["now"]["sm_pct"] == 80

    bed.run(["scancel", str(job)])
    bed.wait_job(job)

    def logged() -> str:
        with open(bed.path("log", "slurmd-n1.log")) as f:
            text = f.read()
        return text if f"job {job}: GPU peak memory" in text else ""
    slurmd_log = str(wait_until("the job's GPU use logged by its epilog", logged, 60))
    assert f"job {job}: GPU peak memory 3.0 GiB, mean SM 80 % (measured)" \
        in slurmd_log
    wait_until("its figures removed", lambda: read(bed, f"{job}.json") is None, 60)
