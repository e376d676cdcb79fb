# SPDX-License-Identifier: GPL-2.0-or-later
"""A shared job's GPU check reuses the layout NVML gave another job for verify_reuse=
seconds, while the files the check reads are unchanged; a failing check asks NVML again."""

import json
import os
import shutil

import pytest

from gpushare.gpu import inventory as gpu_inventory
from gpushare.gpu.inventory import GpuProcess, inventory_from_dict, open_inventory
from gpushare.node import inventory_cache, job
from gpushare.node.config import parse_plugin_args
from gpushare.node.phases import Phases

PROFILES = os.path.join(os.path.dirname(gpu_inventory.__file__), "profiles")
H100 = os.path.join(PROFILES, "h100-8x-nvswitch.json")
A100 = os.path.join(PROFILES, "a100-mig-mixed.json")

def _read_json(path):
    with open(path) as handle:
        return json.load(handle)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory is root's")


def test_an_inventory_survives_its_json_with_processes_and_slices():
    inv = open_inventory("sim:" + A100)
    gpu = inv.gpus[0]
    first_slice = gpu.mig_devices[0]._replace(processes=[GpuProcess(42, 5, "mps")])
    busy = gpu._replace(processes=[GpuProcess(41, 1 << 30, "compute", 1, 0)],
                        mig_devices=[first_slice, *gpu.mig_devices[1:]])
    inv = inv._replace(gpus=[busy, *inv.gpus[1:]])
    assert inventory_from_dict(json.loads(json.dumps(inv.to_dict()))) == inv
    with pytest.raises(ValueError, match="not an inventory"):
        inventory_from_dict({"hostname": "n1", "gpus": [{"index": 0}]})


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A simulated H100 node: its profile, gres.conf beside slurm.conf, a root state dir."""
    os.chmod(tmp_path, 0o755)
    profile = str(tmp_path / "profile.json")
    shutil.copy(H100, profile)
    (tmp_path / "slurm.conf").write_text("")
    gres = tmp_path / "gres.conf"
    gres.write_text("NodeName=n1 Name=gpu Type=h100 File=/dev/nvidia[0-7]\n" + "".join(
        f"NodeName=n1 Name=mps Count=100 File=/dev/nvidia{i}\n" for i in range(8)))
    asked = []
    real = job._ask_nvml

    def counting(source):
        asked.append(source)
        return real(source)

    monkeypatch.setattr(job, "_ask_nvml", counting)
    config = parse_plugin_args([f"state_dir={tmp_path}/state", "verify=strict",
                                f"inventory=sim:{profile}"])
    os.makedirs(config.state_dir, mode=0o755)

    class Node:
        pass

    n = Node()
    n.config, n.profile, n.gres, n.asked, n.tmp = config, profile, gres, asked, tmp_path
    n.env = {"SLURM_JOB_GPUS": "2", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
             "SLURM_CONF": str(tmp_path / "slurm.conf")}
    return n


def shared_request(node, job_id=7, **env):
    return job.JobRequest(job_id, 1001, 1001, "n1", env={**node.env, **env})


@needs_root
def test_the_next_shared_jobs_reuse_nvmls_answer_until_verify_reuse_passes(node):
    first = job.verify_devices(node.config, shared_request(node))
    assert len(node.asked) == 1 and first.asked is not None
    phases = Phases()
    second = job.verify_devices(node.config, shared_request(node, 8), phases)
    assert len(node.asked) == 1, "a job seconds later asks NVML again"
    # The same devices: the first job's clean check is taken as it is.
    assert set(phases.spent) == {"check-reused"}, phases.spent
    assert second == first and second.asked == first.asked
    # Another GPU is checked, on the layout NVML gave the first job, and kept in turn.
    phases = Phases()
    other = job.verify_devices(node.config, shared_request(node, 9, SLURM_JOB_GPUS="3"), phases)
    assert "nvml-reused" in phases.spent and "nvml" not in phases.spent
    assert [d.slurm_index for d in other.devices] == [3] and other.asked == first.asked
    phases = Phases()
    again = job.verify_devices(node.config, shared_request(node, 10, SLURM_JOB_GPUS="3"),
                               phases)
    assert set(phases.spent) == {"check-reused"} and again == other
    assert len(node.asked) == 1
    # The file the worker leaves is root's, holds no processes, and the two clean checks.
    path = os.path.join(node.config.state_dir, inventory_cache.FILE_NAME)
    saved = _read_json(path)
    assert os.stat(path).st_uid == 0 and saved["source"] == node.config.inventory
    assert all(gpu["processes"] == [] for gpu in saved["inventory"]["gpus"])
    assert sorted(saved["checks"]) == ["n1 mps 2 -", "n1 mps 3 -"]
    assert saved["checks"]["n1 mps 2 -"] == [d.to_dict() for d in first.devices]
    # verify_reuse= seconds after NVML was asked, the next job asks again.
    assert inventory_cache.load(node.config.state_dir, node.config.inventory,
                                job.checked_files(node.config, node.env), 60,
                                now=first.asked + 61) is None


@needs_root
@pytest.mark.parametrize("change", ["gres.conf", "profile", "stale file", "other source"])
def test_a_changed_file_or_source_makes_the_next_job_ask_nvml(node, change):
    job.verify_devices(node.config, shared_request(node))
    config = node.config
    if change == "gres.conf":
        node.gres.write_text(node.gres.read_text() + "# edited\n")
    elif change == "profile":
        os.utime(node.profile, ns=(1, 1))
    elif change == "stale file":
        path = os.path.join(config.state_dir, inventory_cache.FILE_NAME)
        data = _read_json(path)
        data["asked"] -= 3600
        with open(path, "w") as handle:
            json.dump(data, handle)
    else:
        other = str(node.tmp / "other.json")
        shutil.copy(H100, other)
        config = config._replace(inventory=f"sim:{other}")
    job.verify_devices(config, shared_request(node, 8))
    assert len(node.asked) == 2


@needs_root
def test_whole_gpu_jobs_and_verify_reuse_0_always_ask_nvml(node):
    job.verify_devices(node.config, shared_request(node))
    whole = job.JobRequest(8, 1001, 1001, "n1",
                           env={"SLURM_JOB_GPUS": "3", "SLURM_CONF": node.env["SLURM_CONF"]})
    job.verify_devices(node.config, whole)  # its check looks for processes: NVML's, now
    assert len(node.asked) == 2
    no_reuse = node.config._replace(verify_reuse=0.0)
    job.verify_devices(no_reuse, shared_request(node, 9))
    job.verify_devices(no_reuse, shared_request(node, 10))
    assert len(node.asked) == 4


@needs_root
def test_a_check_that_fails_on_reused_facts_is_decided_on_nvmls_own_answer(node):
    job.verify_devices(node.config, shared_request(node))
    path = os.path.join(node.config.state_dir, inventory_cache.FILE_NAME)
    data = _read_json(path)
    data["inventory"]["gpus"][2]["mig_current"] = True  # what NVML said then, not now
    data["checks"] = {}  # and no check done on it yet
    with open(path, "w") as handle:
        json.dump(data, handle)
    checked = job.verify_devices(node.config, shared_request(node, 8))
    assert len(node.asked) == 2 and checked.devices[0].uuid.startswith("GPU-")
    # And a node NVML really finds wrong is drained on NVML's word.
    with open(node.profile) as handle:
        profile = json.load(handle)
    profile["gpus"][2]["mig"] = {"current": True, "pending": True}
    with open(node.profile, "w") as handle:
        json.dump(profile, handle)
    with pytest.raises(job.NodeError, match="MIG mode"):
        job.verify_devices(node.config, shared_request(node, 9))
    assert len(node.asked) == 3


@needs_root
def test_a_cache_file_others_could_write_is_not_read(node):
    job.verify_devices(node.config, shared_request(node))
    path = os.path.join(node.config.state_dir, inventory_cache.FILE_NAME)
    os.rename(path, path + ".real")
    os.symlink(path + ".real", path)
    job.verify_devices(node.config, shared_request(node, 8))
    assert len(node.asked) == 2


@needs_root
def test_only_a_check_that_found_nothing_is_taken_as_it_is(node):
    """A check with a warning is done again by each job (which says it again); a kept
    check that is not a list of devices is done again too."""
    with open(node.profile) as handle:
        profile = json.load(handle)
    profile["gpus"][3]["mig"] = {"current": False, "pending": True}  # a warning, not an error
    with open(node.profile, "w") as handle:
        json.dump(profile, handle)
    warned = job.verify_devices(node.config, shared_request(node, 7, SLURM_JOB_GPUS="3"))
    assert [d.slurm_index for d in warned.devices] == [3]
    phases = Phases()
    job.verify_devices(node.config, shared_request(node, 8, SLURM_JOB_GPUS="3"), phases)
    assert "nvml-reused" in phases.spent and "check-reused" not in phases.spent
    job.verify_devices(node.config, shared_request(node, 9))
    path = os.path.join(node.config.state_dir, inventory_cache.FILE_NAME)
    data = _read_json(path)
    assert list(data["checks"]) == ["n1 mps 2 -"]
    data["checks"]["n1 mps 2 -"] = [{"uuid": "GPU-x"}]
    with open(path, "w") as handle:
        json.dump(data, handle)
    phases = Phases()
    checked = job.verify_devices(node.config, shared_request(node, 10), phases)
    assert "nvml-reused" in phases.spent and checked.devices[0].slurm_index == 2
    assert _read_json(path)["checks"]["n1 mps 2 -"] == [d.to_dict() for d in checked.devices]
    assert len(node.asked) == 1
