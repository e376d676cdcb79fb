# SPDX-License-Identifier: GPL-2.0-or-later
"""Job device verification: every CUDA_VISIBLE_DEVICES form, each mismatch kind, healthy jobs."""

from __future__ import annotations

import json
import os

import pytest

from gpushare.gpu.gresconf import parse_gres_conf
from gpushare.gpu.inventory import GpuProcess, open_inventory
from gpushare.node.verify import profile_of_gres_type, verify_job_devices

PROFILE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src",
                                           "gpushare", "gpu", "profiles"))
A100 = os.path.join(PROFILE_DIR, "a100-mig-mixed.json")
GIB = 1 << 30


@pytest.fixture(scope="module")
def inv():
    return open_inventory("sim:" + A100)


def conf_for(inv, overrides=None, extra=""):
    """gres.conf for the A100 node: slices of GPUs 0 and 1 (indices 0-9), GPUs 2-3 whole (10-11).

    ``overrides`` maps a GRES index to a replacement line.
    """
    lines = []
    for gpu in inv.gpus:
        if gpu.mig_current:
            for mig in gpu.mig_devices:
                files = ",".join([gpu.device_file, *mig.caps_files])
                lines.append(f"Name=gpu Type={mig.profile} MultipleFiles={files}")
        else:
            lines.append(f"Name=gpu Type=a100 File={gpu.device_file}")
    for index, line in (overrides or {}).items():
        lines[index] = line
    return parse_gres_conf("\n".join(lines) + "\n" + extra, "/etc/slurm/gres.conf")


def test_healthy_whole_gpu_by_index(inv):
    result = verify_job_devices({"SLURM_JOB_GPUS": "10", "CUDA_VISIBLE_DEVICES": "10"}, "n1",
                                conf_for(inv), inv)
    assert result.ok and result.findings == [] and result.reason() == ""
    (dev,) = result.devices
    gpu = inv.gpus[2]
    assert (dev.slurm_index, dev.gres_name, dev.gres_type) == (10, "gpu", "a100")
    assert (dev.uuid, dev.gpu_uuid, dev.gpu_index, dev.minor) == (gpu.uuid, gpu.uuid, 2, 2)
    assert (dev.is_mig, dev.profile, dev.memory_total) == (False, "", 80 * GIB)
    assert dev.device_files == ["/dev/nvidia2"]


def test_healthy_mig_slices_by_mig_uuid(inv):
    gpu = inv.gpus[1]
    env = {"SLURM_JOB_GPUS": "7,9",
           "CUDA_VISIBLE_DEVICES": f"{gpu.mig_devices[0].uuid},{gpu.mig_devices[2].uuid}"}
    result = verify_job_devices(env, "n1", conf_for(inv), inv)
    assert result.ok and result.findings == []
    assert [(d.slurm_index, d.uuid, d.profile, d.is_mig, d.gpu_uuid) for d in result.devices] == [
        (7, gpu.mig_devices[0].uuid, "3g.40gb", True, gpu.uuid),
        (9, gpu.mig_devices[2].uuid, "1g.10gb", True, gpu.uuid)]
    assert result.devices[0].device_files == ["/dev/nvidia1", *gpu.mig_devices[0].caps_files]
    assert result.devices[0].memory_total == gpu.mig_devices[0].memory_total


def test_healthy_whole_gpu_by_gpu_uuid(inv):
    env = {"SLURM_JOB_GPUS": "10", "CUDA_VISIBLE_DEVICES": inv.gpus[2].uuid}
    result = verify_job_devices(env, "n1", conf_for(inv), inv)
    assert result.ok and [d.uuid for d in result.devices] == [inv.gpus[2].uuid]


def test_uuid_only_environment_resolves_through_nvml(inv):
    mig = inv.gpus[0].mig_devices[3]
    result = verify_job_devices({"CUDA_VISIBLE_DEVICES": mig.uuid}, "n1", conf_for(inv), inv)
    assert result.ok
    assert [(d.slurm_index, d.uuid, d.profile) for d in result.devices] == [
        (-1, mig.uuid, "1g.10gb")]


def test_no_gpus_no_findings(inv):
    result = verify_job_devices({}, "n1", conf_for(inv), inv)
    assert result.ok and result.devices == [] and result.findings == []


def test_profile_mismatch_reason(inv):
    gpu = inv.gpus[1]
    slice_2g = gpu.mig_devices[1]
    files = ",".join([gpu.device_file, *slice_2g.caps_files])
    conf = conf_for(inv, {8: f"Name=gpu Type=1g.10gb MultipleFiles={files}"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "8"}, "n1", conf, inv)
    (finding,) = result.findings
    assert finding.severity == "error" and not result.ok
    assert finding.where == "node n1, /etc/slurm/gres.conf:9"
    assert result.reason() == (
        f"gpushare: GRES gpu:1g.10gb index 8 is MIG 2g.20gb per NVML, not 1g.10gb "
        f"(GPU 1, {slice_2g.uuid})")
    assert files in finding.what
    assert "\n" not in result.reason()
    assert "2g.20gb" in finding.fix


def test_slurm_autodetect_type_names_are_accepted(inv):
    gpu = inv.gpus[1]
    files = ",".join([gpu.device_file, *gpu.mig_devices[0].caps_files])
    conf = conf_for(inv, {7: f"Name=gpu Type=nvidia_a100_3g.40gb MultipleFiles={files}"})
    assert verify_job_devices({"SLURM_JOB_GPUS": "7"}, "n1", conf, inv).ok
    conf = conf_for(inv, {7: f"Name=gpu Type=nvidia_a100_2g.20gb MultipleFiles={files}"})
    assert not verify_job_devices({"SLURM_JOB_GPUS": "7"}, "n1", conf, inv).ok


def test_autodetect_gres_conf_verifies_against_itself(inv):
    conf = parse_gres_conf("AutoDetect=nvml\n")
    result = verify_job_devices({"SLURM_JOB_GPUS": "0,7,10"}, "n1", conf, inv)
    assert result.ok
    assert [d.gres_type for d in result.devices] == [
        "nvidia_a100_1g.10gb", "nvidia_a100_3g.40gb", "nvidia_a100-sxm4-80gb"]
    assert result.devices[0].gres_type and result.devices[0].slurm_index == 0


def test_whole_gpu_in_mig_mode(inv):
    conf = conf_for(inv, {0: "Name=gpu Type=a100 File=/dev/nvidia0"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "0"}, "n1", conf, inv)
    assert [f.severity for f in result.findings] == ["error"]
    assert "handed out as a whole GPU but GPU 0" in result.reason()
    assert "is in MIG mode per NVML" in result.reason()


def test_mig_type_on_a_whole_gpu(inv):
    conf = conf_for(inv, {10: "Name=gpu Type=1g.10gb File=/dev/nvidia2"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "10"}, "n1", conf, inv)
    assert "is a whole GPU 2" in result.reason() and "not a MIG 1g.10gb slice" in result.reason()


def test_slice_files_on_a_gpu_not_in_mig_mode(inv):
    conf = conf_for(inv, {10: "Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia2,"
                              "/dev/nvidia-caps/nvidia-cap[291-292]"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "10"}, "n1", conf, inv)
    assert "is a MIG slice to Slurm but GPU 2" in result.reason()
    assert result.devices == []


def test_slice_that_nvml_does_not_have(inv):
    conf = conf_for(inv, {3: "Name=gpu Type=1g.10gb MultipleFiles=/dev/nvidia0,"
                             "/dev/nvidia-caps/nvidia-cap[21-22]"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "3"}, "n1", conf, inv)
    assert result.reason() == (
        "gpushare: GRES gpu:1g.10gb index 3 (/dev/nvidia0,/dev/nvidia-caps/nvidia-cap21,"
        f"/dev/nvidia-caps/nvidia-cap22): no MIG slice on GPU 0 ({inv.gpus[0].uuid}) has these "
        "nvidia-cap files per NVML and mig-minors")


def test_device_file_of_no_gpu(inv):
    conf = conf_for(inv, {11: "Name=gpu Type=a100 File=/dev/nvidia9"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "11"}, "n1", conf, inv)
    assert "no GPU with minor 9 on this node per NVML" in result.reason()
    conf = conf_for(inv, {11: "Name=gpu Type=a100 MultipleFiles=/dev/nvidia2,/dev/nvidia3"})
    result = verify_job_devices({"SLURM_JOB_GPUS": "11"}, "n1", conf, inv)
    assert "names 2 GPU device files" in result.reason()


def test_index_beyond_gres_conf(inv):
    result = verify_job_devices({"SLURM_JOB_GPUS": "12"}, "n1", conf_for(inv), inv)
    assert result.reason() == ("gpushare: Slurm gave the job gpu index 12 but "
                               "/etc/slurm/gres.conf describes 12 gpu device(s) for node n1")


def test_owner_other_than_slurm(inv):
    mig = inv.gpus[0].mig_devices[0]
    owners = {mig.uuid: "kubernetes"}
    result = verify_job_devices({"SLURM_JOB_GPUS": "0,1"}, "n1", conf_for(inv), inv,
                                owner=owners.get)
    assert len(result.errors) == 1
    assert result.reason().endswith(f"belongs to kubernetes in the ownership plan, not to "
                                    f"slurm ({mig.uuid})")
    whole_parent = {inv.gpus[0].uuid: "kubernetes"}
    result = verify_job_devices({"SLURM_JOB_GPUS": "1"}, "n1", conf_for(inv), inv,
                                owner=whole_parent.get)
    assert "belongs to kubernetes" in result.reason()
    ok = verify_job_devices({"SLURM_JOB_GPUS": "0,10"}, "n1", conf_for(inv), inv,
                            owner=lambda uuid: "slurm")
    assert ok.ok


def test_slurms_slice_on_a_gpu_shared_with_kubernetes_is_slurms(inv):
    """A GPU whose slices the plan splits between owners is "mixed": each slice is judged by
    its own owner, never by its GPU's."""
    gpu = inv.gpus[0]
    owners = {gpu.uuid: "mixed", gpu.mig_devices[0].uuid: "slurm",
              gpu.mig_devices[1].uuid: "kubernetes"}
    assert verify_job_devices({"SLURM_JOB_GPUS": "0"}, "n1", conf_for(inv), inv,
                              owner=owners.get).ok
    refused = verify_job_devices({"SLURM_JOB_GPUS": "1"}, "n1", conf_for(inv), inv,
                                 owner=owners.get)
    assert "belongs to kubernetes in the ownership plan" in refused.reason()


def with_processes(inv, **by_gpu):
    """A copy of ``inv`` whose GPU ``g<i>`` runs the given processes."""
    gpus = list(inv.gpus)
    for key, processes in by_gpu.items():
        gpus[int(key[1:])] = gpus[int(key[1:])]._replace(processes=processes)
    return inv._replace(gpus=gpus)


def test_foreign_processes(inv):
    busy = with_processes(inv, g2=[GpuProcess(pid=100, used_memory=GIB),
                                   GpuProcess(pid=200, used_memory=GIB)],
                          g1=[GpuProcess(pid=300, used_memory=0, gi_id=3, ci_id=0)])
    env = {"SLURM_JOB_GPUS": "10"}
    result = verify_job_devices(env, "n1", conf_for(busy), busy, job_pids=[100])
    assert "is in use by process(es) 200 outside this job per NVML" in result.reason()
    assert verify_job_devices(env, "n1", conf_for(busy), busy, job_pids=[100, 200]).ok
    # a process in GPU instance 3 (the 2g.20gb slice) touches that slice only
    assert not verify_job_devices({"SLURM_JOB_GPUS": "8"}, "n1", conf_for(busy), busy).ok
    assert verify_job_devices({"SLURM_JOB_GPUS": "7"}, "n1", conf_for(busy), busy).ok


def test_mps_job_indexes_mps_lines_and_tolerates_other_jobs(inv):
    busy = with_processes(inv, g3=[GpuProcess(pid=999, used_memory=GIB, kind="mps")])
    conf = conf_for(busy, extra="Name=mps Count=100 File=/dev/nvidia2\n"
                                "Name=mps Count=100 File=/dev/nvidia3\n")
    env = {"SLURM_JOB_GPUS": "1", "CUDA_VISIBLE_DEVICES": "1",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    result = verify_job_devices(env, "n1", conf, busy)
    assert [(d.gres_name, d.slurm_index, d.uuid) for d in result.devices] == [
        ("mps", 1, busy.gpus[3].uuid)]
    # GPU 3 has MIG enable pending: a warning, not a failure
    assert result.ok
    assert [f.severity for f in result.findings] == ["warning"]
    assert "MIG mode enable pending" in result.findings[0].what
    # the same GPU held whole (gpu index 11): another job's process there is an error
    whole = verify_job_devices({"SLURM_JOB_GPUS": "11"}, "n1", conf, busy, gres_name="gpu")
    assert "process(es) 999 outside this job" in whole.reason()


def test_cuda_visible_devices_disagreements(inv):
    conf = conf_for(inv)
    result = verify_job_devices({"SLURM_JOB_GPUS": "10", "CUDA_VISIBLE_DEVICES": "11"}, "n1",
                                conf, inv)
    assert result.reason() == ("gpushare: CUDA_VISIBLE_DEVICES=11 disagrees with "
                               "SLURM_JOB_GPUS=10")
    result = verify_job_devices({"SLURM_JOB_GPUS": "10", "CUDA_VISIBLE_DEVICES":
                                 inv.gpus[3].uuid}, "n1", conf, inv)
    assert f"CUDA_VISIBLE_DEVICES names {inv.gpus[3].uuid} but gres.conf maps" in result.reason()
    result = verify_job_devices({"SLURM_JOB_GPUS": "10", "CUDA_VISIBLE_DEVICES":
                                 "MIG-00000000-0000-0000-0000-000000000000"}, "n1", conf, inv)
    assert "which is not on this node per NVML" in result.reason()
    result = verify_job_devices({"SLURM_JOB_GPUS": "10,11", "CUDA_VISIBLE_DEVICES":
                                 inv.gpus[2].uuid}, "n1", conf, inv)
    assert "names 1 device(s) but SLURM_JOB_GPUS=10,11 names 2" in result.reason()
    result = verify_job_devices({"CUDA_VISIBLE_DEVICES": "gpu0"}, "n1", conf, inv)
    assert "neither an index nor a GPU-/MIG- UUID" in result.reason()
    result = verify_job_devices({"SLURM_JOB_GPUS": "MIG-x"}, "n1", conf, inv)
    assert "not a GRES index" in result.reason()


def test_minor_numbers_differ_from_nvml_indices(tmp_path):
    with open(A100) as f:
        raw = json.load(f)
    raw["gpus"][2]["minor"], raw["gpus"][3]["minor"] = 3, 2
    path = tmp_path / "swapped.json"
    path.write_text(json.dumps(raw))
    swapped = open_inventory(f"sim:{path}")
    conf = parse_gres_conf("Name=gpu Type=a100 File=/dev/nvidia[2-3]\n")
    result = verify_job_devices({"SLURM_JOB_GPUS": "0"}, "n1", conf, swapped)
    (dev,) = result.devices
    # /dev/nvidia2 is NVML GPU 3 here, whose MIG enable is pending
    assert (dev.gpu_index, dev.minor, dev.uuid) == (3, 2, swapped.gpus[3].uuid)
    assert [f.severity for f in result.findings] == ["warning"]


@pytest.mark.parametrize("gres_type,profile", [
    ("1g.10gb", "1g.10gb"), ("nvidia_a100_1g.10gb", "1g.10gb"), ("a100_3g.40gb", "3g.40gb"),
    ("nvidia_h100_80gb_hbm3_1g.10gb+me", "1g.10gb+me"), ("1c.3g.40gb", "1c.3g.40gb"),
    ("a100", ""), ("nvidia_a100-sxm4-80gb", ""), ("", ""),
])
def test_profile_of_gres_type(gres_type, profile):
    assert profile_of_gres_type(gres_type) == profile
