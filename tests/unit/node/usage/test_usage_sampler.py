# SPDX-License-Identifier: GPL-2.0-or-later
"""Sampling rounds on a simulated node: each job's own figures and how they were got,
the bandwidth split, a hog named and cleared, dcgm-exporter's files, and cleanup."""

import os

import pytest

from gpushare.node.usage.sampler import Sampler, UsageSettings
from gpushare.node.usage.store import UsageStore

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
MIG1 = "MIG-22222222-2222-2222-2222-222222222222"
MIB = 1 << 20
PIPE1, PIPE2 = "/run/gs/mps/a/pipe", "/run/gs/mps/b/pipe"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def two_users(node):
    """Jobs 7 (uid 1001) and 8 (uid 1002) share GPU 0 through their own MPS daemons."""
    node.job(7, 1001, GPU0, 50, PIPE1)
    node.job(8, 1002, GPU0, 50, PIPE2)
    node.process(100, 1001, env={"CUDA_MPS_PIPE_DIRECTORY": PIPE1})
    node.process(200, 1002, env={"CUDA_MPS_PIPE_DIRECTORY": PIPE2})
    node.on_gpu(100, GPU0, 2048, sm=30, mem_util=60)
    node.on_gpu(200, GPU0, 1024, sm=50, mem_util=20)
    node.bandwidth(GPU0, 80.0)


def sampler(node, clock, nvml=None, **settings):
    return Sampler(node.state, nvml or node.nvml(), UsageSettings(**settings),
                   proc_root=node.proc, clock=clock, settle=0.0, cgroup_root=node.cgroup)


def test_two_users_jobs_on_one_mps_gpu_get_their_own_figures(node):
    two_users(node)
    sampler(node, Clock()).round()
    store = UsageStore(node.state)
    seven, eight = store.read_job(7), store.read_job(8)
    assert (seven.uid, seven.user != "", seven.processes) == (1001, True, 1)
    assert seven.now.mem_bytes == 2048 * MIB and eight.now.mem_bytes == 1024 * MIB
    assert seven.now.sm_pct == 30 and eight.now.sm_pct == 50
    # 80 % of the GPU's bandwidth split 60:20 by memory-controller time.
    assert seven.now.bw_pct == pytest.approx(60.0) and eight.now.bw_pct == pytest.approx(20.0)
    assert seven.quality == {"sm": "measured", "mem": "measured", "bw": "estimated"}
    assert seven.devices == [{"uuid": GPU0, "gpu": 0, "mig_profile": "", "share": 50}]
    device = store.read_node().devices[0]
    assert device.uuid == GPU0 and device.job_ids == [7, 8] and device.bw_util_pct == 80.0


def test_peak_memory_and_means_accumulate_over_rounds(node):
    two_users(node)
    clock = Clock()
    node.nvml()
    one = sampler(node, clock)
    one.round()
    node.clear()
    node.on_gpu(100, GPU0, 512, sm=10, mem_util=60)
    one.reader.nvml = node.nvml()
    clock.now += 10
    one.round()
    seven = UsageStore(node.state).read_job(7)
    assert seven.samples == 2 and seven.now.mem_bytes == 512 * MIB
    assert seven.peak_mem_bytes == 2048 * MIB and seven.mean_sm_pct == 20.0
    assert (seven.first, seven.updated) == (1000.0, 1010.0)


def test_a_mig_slice_alone_has_its_bandwidth_measured_and_no_sm_figure(node):
    node.job(9, 1001, MIG1, None, gpu_index=1, profile="1g.10gb")
    node.process(300, 1001, "/system.slice/slurmstepd.scope/job_9/step_0/user/task_0")
    node.on_gpu(300, MIG1, 4096, kind="compute")
    node.bandwidth(MIG1, 35.0)
    sampler(node, Clock()).round()
    nine = UsageStore(node.state).read_job(9)
    assert nine.now.bw_pct == 35.0 and nine.now.mem_bytes == 4096 * MIB
    assert nine.now.sm_pct is None
    assert nine.quality == {"sm": "unavailable", "mem": "measured", "bw": "measured"}


def test_unsupported_calls_are_named_and_their_figures_unavailable(node):
    two_users(node)
    node.profile["errors"] = {"nvmlDeviceGetProcessesUtilizationInfo": "NOT_SUPPORTED",
                              "nvmlGpmSampleGet": "NOT_SUPPORTED"}
    node.profile["gpus"][0]["gpm"] = {"dram_bw_util": 80}
    sampler(node, Clock()).round()
    store = UsageStore(node.state)
    seven = store.read_job(7)
    assert "nvmlDeviceGetProcessesUtilizationInfo" in seven.unsupported
    assert "nvmlGpmSampleGet" in store.read_node().unsupported
    assert seven.now.sm_pct is None and seven.now.bw_pct is None
    assert seven.now.mem_bytes == 2048 * MIB
    assert seven.quality == {"sm": "unavailable", "mem": "measured", "bw": "unavailable"}


def test_another_users_process_claiming_a_job_is_not_in_its_figures(node):
    two_users(node)
    # uid 1002 runs a second client that names job 7's daemon and job id.
    node.process(201, 1002, env={"CUDA_MPS_PIPE_DIRECTORY": PIPE1, "SLURM_JOB_ID": "7"})
    node.on_gpu(201, GPU0, 8192, sm=40, mem_util=10)
    sampler(node, Clock()).round()
    seven = UsageStore(node.state).read_job(7)
    assert seven.processes == 1 and seven.now.mem_bytes == 2048 * MIB


def test_a_hog_is_named_after_the_hold_time_and_cleared_when_use_drops(node, caplog):
    two_users(node)
    clock = Clock()
    store = UsageStore(node.state)
    sampler(node, clock, hog_bw_pct=70, hog_seconds=30).round()
    assert store.read_node().devices[0].hog is None  # above, not yet for 30 s
    clock.now += 30
    sampler(node, clock, hog_bw_pct=70, hog_seconds=30).round()
    hog = store.read_node().devices[0].hog
    assert hog["job_id"] == 7 and hog["bw_pct"] == 60.0 and hog["since"] == 1030.0
    assert "MIG slice" in hog["advice"] and "--gres=gpu:1g.10gb:1" in hog["advice"]
    assert any("job 7" in r.message and "bandwidth hog" in r.message for r in caplog.records)
    node.bandwidth(GPU0, 40.0)
    clock.now += 10
    sampler(node, clock, hog_bw_pct=70, hog_seconds=30).round()
    device = store.read_node().devices[0]
    assert device.hog is None and device.above_since is None
    assert any("no longer named" in r.message for r in caplog.records)


def test_a_device_of_one_job_names_no_hog(node):
    two_users(node)
    node.end(8)
    node.clear()
    node.on_gpu(100, GPU0, 2048, sm=30, mem_util=60)
    clock = Clock()
    for _ in range(3):
        sampler(node, clock, hog_bw_pct=50, hog_seconds=0).round()
        clock.now += 10
    assert UsageStore(node.state).read_node().devices[0].hog is None


def test_files_of_ended_jobs_go_in_the_next_round(node):
    two_users(node)
    sampler(node, Clock()).round()
    assert UsageStore(node.state).job_ids() == [7, 8]
    node.end(8)
    sampler(node, Clock(1010)).round()
    assert UsageStore(node.state).job_ids() == [7]


def test_an_unshared_job_is_found_through_its_cgroup(node):
    os.makedirs(os.path.join(node.state, "jobs"), mode=0o700, exist_ok=True)
    node.process(400, 1003, "/system.slice/slurmstepd.scope/job_12/step_0/user/task_0")
    node.on_gpu(400, GPU0, 100, sm=90, mem_util=5, kind="compute")
    sampler(node, Clock()).round()
    twelve = UsageStore(node.state).read_job(12)
    assert twelve.uid == 1003 and twelve.now.sm_pct == 90
    assert twelve.now.bw_pct == 0.0  # alone on the GPU, whose bandwidth use is 0
    node.clear()
    sampler(node, Clock(1010)).round()
    assert UsageStore(node.state).read_job(12) is None


@pytest.mark.parametrize("names, expected", [
    ("index", {"0": "7\n8\n", "1": "9\n", "1-7": "9\n"}),
    ("uuid", {GPU0: "7\n8\n", MIG1: "9\n"}),
])
def test_dcgm_mapping_files_list_each_devices_jobs(node, names, expected):
    two_users(node)
    node.job(9, 1001, MIG1, None, gpu_index=1, profile="1g.10gb")
    mapping = os.path.join(node.root, "dcgm")
    os.makedirs(mapping, mode=0o755)
    with open(os.path.join(mapping, "5"), "w") as stale:  # a GPU whose job ended
        stale.write("3\n")
    with open(os.path.join(mapping, "README"), "w") as other:  # not the sampler's
        other.write("x")
    sampler(node, Clock(), dcgm_mapping_dir=mapping, dcgm_mapping_names=names).round()
    found = {}
    for name in os.listdir(mapping):
        if name != "README":
            with open(os.path.join(mapping, name)) as f:
                found[name] = f.read()
    assert found == expected
    assert os.path.exists(os.path.join(mapping, "README"))
    node.end(7)
    node.end(8)
    node.end(9)
    sampler(node, Clock(1010), dcgm_mapping_dir=mapping, dcgm_mapping_names=names).round()
    assert os.listdir(mapping) == ["README"]  # a file without jobs would drop the GPU's series


def test_a_user_cannot_plant_figures_for_a_job_without_a_record(node):
    os.makedirs(os.path.join(node.state, "jobs"), mode=0o700, exist_ok=True)
    path = "/user.slice/user-1002.slice/user@1002.service/slurmstepd.scope/job_12/x"
    node.process(400, 1002, path, cgroup_owner=1002)
    node.on_gpu(400, GPU0, 100, sm=90, mem_util=5, kind="compute")
    sampler(node, Clock()).round()
    assert UsageStore(node.state).read_job(12) is None


def test_the_mps_servers_own_listing_is_not_counted_beside_its_clients(node):
    two_users(node)
    # Each user's MPS server: in the compute list, with its clients' memory and time.
    node.process(150, 1001, env={"CUDA_MPS_PIPE_DIRECTORY": PIPE1})
    node.process(250, 1002, env={"CUDA_MPS_PIPE_DIRECTORY": PIPE2})
    node.on_gpu(150, GPU0, 2048, sm=30, mem_util=60, kind="compute")
    node.on_gpu(250, GPU0, 1024, sm=50, mem_util=20, kind="compute")
    sampler(node, Clock()).round()
    seven = UsageStore(node.state).read_job(7)
    assert seven.processes == 1 and seven.now.mem_bytes == 2048 * MIB
    assert seven.now.sm_pct == 30 and seven.now.bw_pct == pytest.approx(60.0)


def test_one_unreadable_record_does_not_stop_the_round(node, caplog):
    two_users(node)
    with open(os.path.join(node.state, "jobs", "9.json"), "w") as f:
        f.write("{not json")
    sampler(node, Clock()).round()
    assert UsageStore(node.state).job_ids() == [7, 8]
    assert any("job 9: its record cannot be read" in r.message for r in caplog.records)
