"""The node's GPUs as NVML reports them: one data model shared by check, verify, MPS and render.

Collection (``collect``) goes through the NVML seam in ``gpushare.nvml``; everything else in
gpushare reads these dataclasses and never calls NVML itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class MigDevice:
    """One MIG slice (GPU instance + compute instance) on a parent GPU."""

    gpu_index: int
    gi_id: int
    ci_id: int
    profile: str  # e.g. "1g.10gb"
    uuid: str  # "MIG-..."
    memory_total: int  # bytes
    caps_files: list[str] = field(default_factory=list)  # /dev/nvidia-caps/nvidia-capN (gi, ci)


@dataclass
class NvLink:
    link: int
    active: bool
    remote_pci_bus_id: str = ""


@dataclass
class FabricInfo:
    """NVLink multi-node domain membership (nvmlDeviceGetGpuFabricInfoV)."""

    state: str  # not_supported | not_started | in_progress | completed
    cluster_uuid: str = ""
    clique_id: int = 0
    status: str = ""


@dataclass
class GpuProcess:
    pid: int
    used_memory: int  # bytes; 0 when NVML does not say
    kind: str = "compute"  # compute | graphics | mps


@dataclass
class Gpu:
    index: int
    minor: int  # /dev/nvidia<minor>
    uuid: str  # "GPU-..."
    name: str
    memory_total: int  # bytes
    pci_bus_id: str
    compute_mode: str  # default | exclusive_process | prohibited
    mig_current: bool
    mig_pending: bool
    mig_devices: list[MigDevice] = field(default_factory=list)
    nvlinks: list[NvLink] = field(default_factory=list)
    fabric: Optional[FabricInfo] = None
    processes: list[GpuProcess] = field(default_factory=list)

    @property
    def device_file(self) -> str:
        return f"/dev/nvidia{self.minor}"


@dataclass
class Inventory:
    """Everything gpushare knows about one node's GPUs."""

    hostname: str
    driver_version: str
    cuda_driver_version: str
    source: str  # "nvml" or "sim:<path>"
    gpus: list[Gpu] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
