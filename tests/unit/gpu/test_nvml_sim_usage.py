# SPDX-License-Identifier: GPL-2.0-or-later
"""The simulator's usage calls answer as pynvml does, and its live fake clients are only
believed for their own user while they live."""

import json
import os
import subprocess
import sys

import pytest

from gpushare.gpu.nvml_sim import ProfileError, SimNvml, load_profile
from gpushare.gpu.nvml_sim_usage import live_processes

GPU = "GPU-00000000-0000-0000-0000-000000000000"
MIG = "MIG-22222222-2222-2222-2222-222222222222"


def nvml(tmp_path, **extra):
    profile = {"format": 1, "driver_version": "560.35.03", "cuda_driver_version": 12060,
               "gpus": [
                   {"minor": 0, "uuid": GPU, "name": "NVIDIA H100", "memory_mib": 81559,
                    "pci_bus_id": "00000000:18:00.0", "mig": None, "gpm": {"dram_bw_util": 42},
                    "processes": [
                        {"pid": 10, "used_memory_mib": 100, "kind": "compute"},
                        {"pid": 11, "used_memory_mib": 200, "kind": "mps", "sm_util": 30,
                         "mem_util": 12}]},
                   {"minor": 1, "uuid": GPU.replace("0", "1"), "name": "NVIDIA H100",
                    "memory_mib": 81559, "pci_bus_id": "00000000:38:00.0",
                    "mig": {"current": True, "pending": True},
                    "mig_devices": [{"gi_id": 7, "ci_id": 0, "uuid": MIG, "profile": "1g.10gb",
                                     "memory_mib": 9728, "gpm": {"dram_bw_util": 9.5},
                                     "processes": [{"pid": 12, "used_memory_mib": 300,
                                                    "kind": "mps"}]}]}],
               **extra}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(profile))
    sim = SimNvml(load_profile(str(path)))
    sim.nvmlInit()
    return sim


def test_per_process_utilisation_has_pynvmls_shape(tmp_path):
    sim = nvml(tmp_path)
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    infos = {i.pid: i for i in sim.nvmlDeviceGetProcessesUtilizationInfo(gpu, 0)}
    assert set(infos) == {10, 11}
    assert (infos[11].smUtil, infos[11].memUtil, infos[10].smUtil) == (30, 12, 0)
    assert infos[11].timeStamp > 0 and infos[11].encUtil == 0
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(sim.nvmlDeviceGetHandleByIndex(1), 0)
    with pytest.raises(sim.NVMLError) as err:
        sim.nvmlDeviceGetProcessesUtilizationInfo(mig, 0)
    assert err.value.value == sim.NVML_ERROR_NOT_SUPPORTED


def test_mps_clients_v3_on_a_gpu_and_a_mig_device(tmp_path):
    sim = nvml(tmp_path)
    clients = sim.nvmlDeviceGetMPSComputeRunningProcesses_v3(sim.nvmlDeviceGetHandleByIndex(0))
    assert [(p.pid, p.usedGpuMemory) for p in clients] == [(11, 200 << 20)]
    parent = sim.nvmlDeviceGetHandleByIndex(1)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    on_slice = sim.nvmlDeviceGetMPSComputeRunningProcesses_v3(mig)
    assert [(p.pid, p.gpuInstanceId) for p in on_slice] == [(12, 7)]


def gpm_value(sim, handle, gi=None):
    first, second = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    for sample in (first, second):
        if gi is None:
            sim.nvmlGpmSampleGet(handle, sample)
        else:
            sim.nvmlGpmMigSampleGet(handle, gi, sample)
    request = sim.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = sim.NVML_GPM_METRICS_GET_VERSION, 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = sim.NVML_GPM_METRIC_DRAM_BW_UTIL
    sim.nvmlGpmMetricsGet(request)
    return request.metrics[0].value


def test_gpm_dram_bandwidth_per_gpu_and_per_gpu_instance(tmp_path):
    sim = nvml(tmp_path)
    gpu, parent = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    assert sim.nvmlGpmQueryDeviceSupport(gpu).isSupportedDevice == 1
    assert sim.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice == 1
    assert gpm_value(sim, gpu) == 42.0
    assert gpm_value(sim, parent, gi=7) == 9.5
    with pytest.raises(sim.NVMLError):
        sim.nvmlGpmSampleGet(parent, sim.nvmlGpmSampleAlloc())  # no whole-GPU figure
    with pytest.raises(sim.NVMLError):
        sim.nvmlGpmMigSampleGet(parent, 3, sim.nvmlGpmSampleAlloc())  # no such GI


@pytest.mark.parametrize("call", ["nvmlDeviceGetProcessesUtilizationInfo",
                                  "nvmlDeviceGetMPSComputeRunningProcesses_v3",
                                  "nvmlGpmSampleGet", "nvmlGpmQueryDeviceSupport"])
def test_each_call_can_answer_not_supported(tmp_path, call):
    sim = nvml(tmp_path, errors={call: "NOT_SUPPORTED"})
    with pytest.raises(sim.NVMLError) as err:
        getattr(sim, call)(sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlGpmSampleAlloc())
    assert err.value.value == sim.NVML_ERROR_NOT_SUPPORTED


def test_a_bad_usage_key_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"format": 1, "driver_version": "1", "cuda_driver_version": 1,
                                "gpus": [{"minor": 0, "uuid": GPU, "name": "x",
                                          "memory_mib": 1, "pci_bus_id": "x",
                                          "gpm": {"dram_bw_util": 140}}]}))
    with pytest.raises(ProfileError, match=r"gpus\[0\].gpm.dram_bw_util: expected a perc"):
        load_profile(str(path))


@pytest.fixture
def live(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the live directory is root's")
    directory = tmp_path / "live"
    directory.mkdir()
    os.chmod(directory, 0o1777)
    return directory


def register(directory, pid, uuid=GPU, owner=0, **fields):
    path = directory / f"{pid}.json"
    path.write_text(json.dumps({"uuid": uuid, "kind": "mps", "used_memory_mib": 64,
                                "sm_util": 5, **fields}))
    os.chown(path, owner, owner)


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_live_client_appears_on_its_device_while_it_lives(tmp_path, live):
    register(live, os.getpid(), mem_util=7)
    register(live, dead_pid())
    sim = nvml(tmp_path, live_dir=str(live))
    clients = sim.nvmlDeviceGetMPSComputeRunningProcesses_v3(sim.nvmlDeviceGetHandleByIndex(0))
    assert sorted(p.pid for p in clients) == sorted([11, os.getpid()])
    infos = sim.nvmlDeviceGetProcessesUtilizationInfo(sim.nvmlDeviceGetHandleByIndex(0), 0)
    assert [i.memUtil for i in infos if i.pid == os.getpid()] == [7]


def test_a_live_entry_for_someone_elses_process_or_a_link_is_ignored(live):
    register(live, os.getpid(), owner=1001)  # uid 1001 naming root's process
    # A link named for another live process of root's (not pid 1: in a pid namespace the
    # test itself may be pid 1).
    other = subprocess.Popen(["sleep", "60"])
    try:
        os.symlink("/etc/hostname", live / f"{other.pid}.json")
        assert live_processes(str(live)) == {}
    finally:
        other.kill()
        other.wait()


def test_a_live_directory_others_could_rewrite_is_not_read(live):
    register(live, os.getpid())
    os.chmod(live, 0o777)  # no sticky bit: anyone could replace anyone's entry
    assert live_processes(str(live)) == {}
    os.chmod(live, 0o1777)
    assert list(live_processes(str(live))) == [GPU]
