# SPDX-License-Identifier: GPL-2.0-or-later
"""Simulated node profiles generated from an ownership plan: what NVML would report for each
GPU model, and a node laid out exactly as the plan says (``gpushare simulate``, the test bed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from gpushare.gpu.nvml_sim_mig import _sim_uuid, _slice_memory_mib
from gpushare.gpu.nvml_sim_profile import PROFILE_FORMAT, ProfileError

if TYPE_CHECKING:
    from gpushare.admin.plan import Plan

__all__ = ["SIM_MODELS", "profile_from_plan"]

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class _SimModel:
    """What NVML reports for one GPU model of ``gpushare.admin.mig_profiles.GPU_MODELS``.

    A plain class: this module is imported by prologs under ``inventory=sim:``, and a
    NamedTuple would compile its annotations there (see ``gpushare/__init__.py``).
    """

    __slots__ = ("driver", "fabric", "links", "memory_mib", "nvml_name", "wiring")

    def __init__(self, nvml_name: str, memory_mib: int, links: int, wiring: str, fabric: bool,
                 driver: tuple[str, int] = ("550.90.07", 12040)) -> None:
        self.nvml_name = nvml_name
        self.memory_mib = memory_mib
        self.links = links  # NVLinks per GPU (0: none, NVML answers NOT_SUPPORTED)
        # "nvswitch", "direct" (all-to-all among the node's GPUs), "pairs" (NVLink bridges),
        # "fabric" (multi-node NVLink: switch trays outside the host), "" (none)
        self.wiring = wiring
        self.fabric = fabric  # the GPU reports a fabric state (Hopper and later)
        self.driver = driver  # driver version, CUDA driver version (NVML's encoding)


# Keyed by the plan's model names; a test keeps this table complete.
SIM_MODELS: dict[str, _SimModel] = {
    "a100-40gb": _SimModel("NVIDIA A100-SXM4-40GB", 40960, 12, "direct", False,
                           ("535.183.01", 12020)),
    "a100-80gb": _SimModel("NVIDIA A100-SXM4-80GB", 81920, 12, "direct", False,
                           ("535.183.01", 12020)),
    "a30-24gb": _SimModel("NVIDIA A30", 24576, 4, "pairs", False, ("535.183.01", 12020)),
    "h100-80gb": _SimModel("NVIDIA H100 80GB HBM3", 81559, 18, "nvswitch", True),
    "h100-94gb": _SimModel("NVIDIA H100 NVL", 95830, 12, "pairs", False),
    "h200-141gb": _SimModel("NVIDIA H200", 143771, 18, "nvswitch", True),
    "b200-180gb": _SimModel("NVIDIA B200", 183359, 18, "nvswitch", True, ("570.133.20", 12080)),
    "gb200-186gb": _SimModel("NVIDIA GB200", 189471, 18, "fabric", True, ("570.133.20", 12080)),
    "l40s": _SimModel("NVIDIA L40S", 46068, 0, "", False),
    "l40": _SimModel("NVIDIA L40", 46068, 0, "", False),
    "l4": _SimModel("NVIDIA L4", 23034, 0, "", False),
}
def _bus_id(index: int) -> str:
    """A distinct PCI bus id per GPU, none of them an NVSwitch's (buses 05-08)."""
    return f"{index // 8:08X}:{0x18 + 0x20 * (index % 8):02X}:00.0"


def _nvlinks(sim: _SimModel, index: int, count: int) -> Optional[list[dict[str, Any]]]:
    if not sim.links:
        return None
    if sim.wiring == "nvswitch":  # the baseboard's four NVSwitches, links spread over them
        remotes = [f"00000000:{5 + link * 4 // sim.links:02X}:00.0" for link in range(sim.links)]
    elif sim.wiring == "fabric":  # switch trays of the rack: not PCI devices of this host
        remotes = [""] * sim.links
    elif sim.wiring == "pairs":  # an NVLink bridge to the neighbouring GPU, if there is one
        peer = index ^ 1
        if peer >= count:
            return [{"active": False, "remote_pci_bus_id": ""} for _ in range(sim.links)]
        remotes = [_bus_id(peer)] * sim.links
    else:  # direct: the links split evenly among the node's other GPUs
        peers = [i for i in range(count) if i != index]
        if not peers:
            return [{"active": False, "remote_pci_bus_id": ""} for _ in range(sim.links)]
        per_peer = sim.links // len(peers)
        remotes = [_bus_id(peer) for peer in peers for _ in range(per_peer)]
        remotes += [""] * (sim.links - len(remotes))
    return [{"active": bool(remote) or sim.wiring == "fabric", "remote_pci_bus_id": remote}
            for remote in remotes]


def _fabric(sim: _SimModel, plan: Plan, node: str, group_name: str) -> Optional[dict[str, Any]]:
    if not sim.fabric:
        return None
    if sim.wiring != "fabric":  # NVSwitch inside the node: registered, no multi-node domain
        return {"state": "completed", "status": "success", "cluster_uuid": _ZERO_UUID,
                "clique_id": 0}
    # Multi-node NVLink: the plan's domain of the node is its clique; without one, its group.
    clique, key = 1, f"group/{group_name}"
    for position, domain in enumerate(plan.domains, start=1):
        if node in domain.nodes:
            clique, key = position, f"domain/{domain.name}"
    return {"state": "completed", "status": "success",
            "cluster_uuid": _sim_uuid("", key), "clique_id": clique}


def profile_from_plan(plan: Plan, node: str) -> dict[str, Any]:
    """A simulated node profile for ``node`` exactly as the plan lays it out.

    Every GPU of the node's group, with the model's NVML name, memory, NVLinks and fabric
    state; each MIG GPU holds every slice the plan describes (whoever owns it) at the
    placement the plan gives or solves, so that the GPU-instance ids, and with them the
    capability files, are those ``gpushare render gres`` writes. A site can run its own plan
    through gpushare (``inventory=sim:``, ``--source sim:``) before touching hardware.
    """
    from gpushare.admin.mig_profiles import gi_id_for_placement

    group = plan.group_of(node)
    if group is None:
        raise ProfileError(f"{plan.path}: node {node} is in no node group of the plan")
    sim = SIM_MODELS.get(group.model.name)
    if sim is None:
        raise ProfileError(f"gpushare cannot simulate GPU model {group.model.name} yet")
    gpus = []
    for gpu in group.gpus:
        mig: Optional[dict[str, bool]] = None
        if group.model.mig_capable:
            mig = {"current": gpu.mig, "pending": gpu.mig}
        entry: dict[str, Any] = {
            "minor": gpu.index,
            "uuid": _sim_uuid("GPU-", node, gpu.index),
            "name": sim.nvml_name,
            "memory_mib": sim.memory_mib,
            "pci_bus_id": _bus_id(gpu.index),
            "compute_mode": "default",
            "mig": mig,
        }
        if gpu.mig:
            devices = []
            for mig_slice in sorted(gpu.slices, key=lambda s: s.placement):
                spec = group.model.profile(mig_slice.profile)
                assert spec is not None  # the plan parser checked it
                gi = gi_id_for_placement(group.model, mig_slice.placement, spec.memory_slices)
                devices.append({"gi_id": gi, "ci_id": 0,
                                "uuid": _sim_uuid("MIG-", node, gpu.index, gi),
                                "profile": mig_slice.profile,
                                "memory_mib": _slice_memory_mib(mig_slice.profile,
                                                                sim.memory_mib),
                                "processes": []})
            entry["mig_devices"] = sorted(devices, key=lambda d: d["gi_id"])
        entry["nvlinks"] = _nvlinks(sim, gpu.index, len(group.gpus))
        entry["fabric"] = _fabric(sim, plan, node, group.name)
        entry["processes"] = []
        gpus.append(entry)
    owners = ", ".join(sorted({gpu.owner for gpu in group.gpus}))
    return {
        "format": PROFILE_FORMAT,
        "description": f"node {node} of group {group.name} in {plan.path}: {len(gpus)}x "
                       f"{sim.nvml_name} ({owners}), generated from the ownership plan",
        "hostname": node,
        "driver_version": sim.driver[0],
        "cuda_driver_version": sim.driver[1],
        "device_dir": "/dev",
        "gpus": gpus,
    }
