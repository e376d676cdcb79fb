# SPDX-License-Identifier: GPL-2.0-or-later
"""A node for the sampler's tests: a simulated NVML profile, a fake /proc and job records."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import pytest

from gpushare.gpu.nvml_sim import SimNvml, load_profile
from gpushare.node.state import JobRecord, JobStore

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG1 = "MIG-22222222-2222-2222-2222-222222222222"


class FakeNode:
    def __init__(self, root: str) -> None:
        self.root = root
        self.proc = os.path.join(root, "proc")
        self.cgroup = os.path.join(root, "cgroup")
        self.state = os.path.join(root, "state")
        os.makedirs(self.proc)
        self.profile_path = os.path.join(root, "node.json")
        self.profile: dict[str, Any] = {
            "format": 1, "driver_version": "560.35.03", "cuda_driver_version": 12060,
            "gpus": [
                {"minor": 0, "uuid": GPU0, "name": "NVIDIA H100 80GB HBM3",
                 "memory_mib": 81559, "pci_bus_id": "00000000:18:00.0", "mig": None,
                 "processes": [], "gpm": {"dram_bw_util": 0}},
                {"minor": 1, "uuid": GPU1, "name": "NVIDIA H100 80GB HBM3",
                 "memory_mib": 81559, "pci_bus_id": "00000000:38:00.0",
                 "mig": {"current": True, "pending": True}, "processes": [],
                 "mig_devices": [{"gi_id": 7, "ci_id": 0, "uuid": MIG1,
                                  "profile": "1g.10gb", "memory_mib": 9728,
                                  "processes": [], "gpm": {"dram_bw_util": 0}}]},
            ]}

    def write_profile(self) -> None:
        with open(self.profile_path, "w") as f:
            json.dump(self.profile, f)

    def nvml(self) -> SimNvml:
        self.write_profile()
        nvml = SimNvml(load_profile(self.profile_path))
        nvml.nvmlInit()
        return nvml

    def process(self, pid: int, uid: int, cgroup: str = "/user.slice",
                env: Optional[dict[str, str]] = None, exe: str = "/usr/bin/python3",
                cmdline: bytes = b"python3\0", state: str = "S",
                cgroup_owner: int = 0) -> None:
        """A process; its cgroup directory made, root's unless ``cgroup_owner`` says (a
        user's own, as below a systemd-delegated cgroup)."""
        made = os.path.join(self.cgroup, cgroup.lstrip("/"))
        os.makedirs(made, exist_ok=True)
        if cgroup_owner:  # the user's from their delegated cgroup (user@<uid>.service) down
            at = self.cgroup
            delegated = False
            for part in cgroup.strip("/").split("/"):
                at = os.path.join(at, part)
                delegated = delegated or part.startswith("user@")
                if delegated:
                    os.chown(at, cgroup_owner, cgroup_owner)
        where = os.path.join(self.proc, str(pid))
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, "status"), "w") as f:
            f.write(f"Name:\tx\nState:\t{state} (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        with open(os.path.join(where, "cgroup"), "w") as f:
            f.write(f"0::{cgroup}\n")
        with open(os.path.join(where, "environ"), "wb") as f:
            f.write(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))
        with open(os.path.join(where, "cmdline"), "wb") as f:
            f.write(cmdline)
        if os.path.lexists(os.path.join(where, "exe")):
            os.unlink(os.path.join(where, "exe"))
        os.symlink(exe, os.path.join(where, "exe"))

    def on_gpu(self, pid: int, uuid: str, mem_mib: int, sm: int = 0, mem_util: int = 0,
               kind: str = "mps") -> None:
        proc = {"pid": pid, "used_memory_mib": mem_mib, "kind": kind, "sm_util": sm,
                "mem_util": mem_util}
        for gpu in self.profile["gpus"]:
            if gpu["uuid"] == uuid:
                gpu["processes"].append(proc)
            for mig in gpu.get("mig_devices", []):
                if mig["uuid"] == uuid:
                    mig["processes"].append(proc)

    def bandwidth(self, uuid: str, pct: float) -> None:
        for gpu in self.profile["gpus"]:
            if gpu["uuid"] == uuid:
                gpu["gpm"] = {"dram_bw_util": pct}
            for mig in gpu.get("mig_devices", []):
                if mig["uuid"] == uuid:
                    mig["gpm"] = {"dram_bw_util": pct}

    def clear(self) -> None:
        for gpu in self.profile["gpus"]:
            gpu["processes"] = []
            for mig in gpu.get("mig_devices", []):
                mig["processes"] = []

    def job(self, job_id: int, uid: int, uuid: str, share: Optional[int] = 50,
            pipe_dir: str = "", gpu_index: int = 0, profile: str = "") -> None:
        mps = {"pipe_dir": pipe_dir} if pipe_dir else None
        JobStore(self.state).write(JobRecord(
            job_id, uid, uid, "n1", "shared" if share else "private", share or 0,
            devices=[{"uuid": uuid, "gpu_index": gpu_index, "profile": profile}], mps=mps))

    def end(self, job_id: int) -> None:
        JobStore(self.state).remove(job_id)


@pytest.fixture
def node(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the state and usage directories are root's")
    return FakeNode(str(tmp_path))
