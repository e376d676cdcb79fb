# SPDX-License-Identifier: GPL-2.0-or-later
"""The node's GPUs as NVML reports them: one data model shared by check, verify, MPS and render.

Collection (``collect``) goes through the one seam where GPU facts enter gpushare,
``load_nvml``: the real pynvml module, or a simulated node (``gpushare.gpu.nvml_sim``). Which
one is configuration (the plugin's ``inventory=`` argument, the CLI's ``--source``), never a
guess about whether a GPU is present: a node that is configured for NVML and has no driver
fails loudly instead of quietly pretending to be a simulated node. Everything else in
gpushare reads these records and never calls NVML itself. They are NamedTuples: a job's
prolog collects them, and importing ``dataclasses`` would cost it about 5 ms of CPU.

MIG profile names (``1g.10gb``) follow nvidia-smi and Slurm's AutoDetect=nvml: the profile is
the part after ``MIG `` in the MIG device's NVML name (``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` →
``1g.10gb``, suffixes such as ``+me`` kept). When the name carries no profile, it is built from
``nvmlDeviceGetAttributes``: ``[<ci slices>c.]<gi slices>g.<ceil(memorySizeMB / 1024)>gb``, the
``c.`` part only when the compute instance has fewer slices than its GPU instance.

A MIG slice's device files are its parent's ``/dev/nvidia<minor>`` plus two capability files,
``/dev/nvidia-caps/nvidia-cap<N>`` for ``gpu<minor>/gi<gi>/access`` and
``gpu<minor>/gi<gi>/ci<ci>/access`` as listed in ``/proc/driver/nvidia-caps/mig-minors``.
"""

import contextlib
import math
import os
import re
from typing import Any, NamedTuple, Optional, Sequence

from gpushare.gpu.nvml import (
    SIM_PREFIX,
    InventoryError,
    describe_nvml_error,
    is_unsupported,
    nvml_call,
    text,
)

__all__ = [
    "MIG_MINORS_PATH",
    "FabricInfo",
    "Gpu",
    "GpuProcess",
    "Inventory",
    "InventoryError",
    "MigDevice",
    "NvLink",
    "collect",
    "inventory_from_dict",
    "load_nvml",
    "mig_caps_files",
    "mig_profile_from_attributes",
    "mig_profile_from_name",
    "open_inventory",
    "parse_mig_minors",
]

MIG_MINORS_PATH = "/proc/driver/nvidia-caps/mig-minors"
MIB = 1 << 20


class GpuProcess(NamedTuple):
    pid: int
    used_memory: int  # bytes; 0 when NVML does not say
    kind: str = "compute"  # compute | graphics | mps
    gi_id: Optional[int] = None  # GPU instance the process runs in, on a MIG-enabled GPU
    ci_id: Optional[int] = None


class MigDevice(NamedTuple):
    """One MIG slice (GPU instance + compute instance) on a parent GPU."""

    gpu_index: int
    gi_id: int
    ci_id: int
    profile: str  # e.g. "1g.10gb"
    uuid: str  # "MIG-..."
    memory_total: int  # bytes
    caps_files: Sequence[str] = ()  # /dev/nvidia-caps/nvidia-capN (gi, ci)
    gi_slices: int = 0
    ci_slices: int = 0
    processes: Sequence[GpuProcess] = ()


class NvLink(NamedTuple):
    link: int
    active: bool
    remote_pci_bus_id: str = ""


class FabricInfo(NamedTuple):
    """NVLink multi-node domain membership (nvmlDeviceGetGpuFabricInfoV)."""

    state: str  # not_supported | not_started | in_progress | completed
    cluster_uuid: str = ""
    clique_id: int = 0
    status: str = ""


class Gpu(NamedTuple):
    nvml_index: int  # "index" in to_dict() output
    minor: int  # /dev/nvidia<minor>
    uuid: str  # "GPU-..."
    name: str
    memory_total: int  # bytes
    pci_bus_id: str
    compute_mode: str  # default | exclusive_process | prohibited | unknown
    mig_current: bool
    mig_pending: bool
    mig_devices: Sequence[MigDevice] = ()
    nvlinks: Sequence[NvLink] = ()
    fabric: Optional[FabricInfo] = None
    processes: Sequence[GpuProcess] = ()
    device_dir: str = "/dev"  # where nvidia<minor> and nvidia-caps/ live
    unsupported: Sequence[str] = ()  # queries NVML does not support here

    @property
    def device_file(self) -> str:
        return os.path.join(self.device_dir, f"nvidia{self.minor}")


class Inventory(NamedTuple):
    """Everything gpushare knows about one node's GPUs."""

    hostname: str
    driver_version: str
    cuda_driver_version: str
    source: str  # "nvml" or "sim:<path>"
    gpus: Sequence[Gpu] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists all the way down (JSON)."""
        return _plain(self)

    def gpu_by_uuid(self, uuid: str) -> Optional[Gpu]:
        return next((g for g in self.gpus if g.uuid == uuid), None)

    def gpu_by_minor(self, minor: int) -> Optional[Gpu]:
        return next((g for g in self.gpus if g.minor == minor), None)

    def mig_by_uuid(self, uuid: str) -> Optional[tuple[Gpu, MigDevice]]:
        for gpu in self.gpus:
            for mig in gpu.mig_devices:
                if mig.uuid == uuid:
                    return gpu, mig
        return None


# Fields whose JSON name differs (a NamedTuple field cannot be called ``index``).
_JSON_NAMES = {"nvml_index": "index"}
_FIELD_NAMES = {json_name: name for name, json_name in _JSON_NAMES.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {_JSON_NAMES.get(name, name): _plain(item)
                for name, item in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def inventory_from_dict(data: Any) -> Inventory:
    """The Inventory ``Inventory.to_dict()`` wrote; ValueError when ``data`` is not one
    (a file from another release, or damaged)."""
    try:
        return Inventory(**{**data, "gpus": [_gpu_from_dict(g) for g in data["gpus"]]})
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"not an inventory: {err}") from None


def _gpu_from_dict(data: dict[str, Any]) -> Gpu:
    fields = {_FIELD_NAMES.get(name, name): value for name, value in data.items()}
    fabric = fields.get("fabric")
    return Gpu(**{
        **fields,
        "mig_devices": [MigDevice(**{**m, "processes": [GpuProcess(**p)
                                                        for p in m["processes"]]})
                        for m in fields["mig_devices"]],
        "nvlinks": [NvLink(**link) for link in fields["nvlinks"]],
        "fabric": None if fabric is None else FabricInfo(**fabric),
        "processes": [GpuProcess(**p) for p in fields["processes"]],
    })


_MIG_NAME_RE = re.compile(r"\bMIG\s+(\S+)\s*$")


def mig_profile_from_name(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` → ``1g.10gb``; "" when the name has no profile."""
    match = _MIG_NAME_RE.search(name)
    return match.group(1) if match else ""


def mig_profile_from_attributes(gi_slices: int, ci_slices: int, memory_mb: int) -> str:
    """Build a profile name from slice counts and memory, the way nvidia-smi and Slurm do."""
    prefix = f"{ci_slices}c." if ci_slices and ci_slices != gi_slices else ""
    return f"{prefix}{gi_slices}g.{math.ceil(memory_mb / 1024)}gb"


def parse_mig_minors(content: str) -> dict[str, int]:
    """Parse mig-minors lines such as ``gpu0/gi1/ci0/access 13`` into {name: minor}."""
    minors: dict[str, int] = {}
    for line in content.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def mig_caps_files(minors: dict[str, int], gpu_minor: int, gi_id: int, ci_id: int,
                   device_dir: str = "/dev") -> list[str]:
    """The GI and CI capability device files a process needs to use one MIG slice."""
    files = []
    for cap in (f"gpu{gpu_minor}/gi{gi_id}/access", f"gpu{gpu_minor}/gi{gi_id}/ci{ci_id}/access"):
        if cap in minors:
            files.append(os.path.join(device_dir, "nvidia-caps", f"nvidia-cap{minors[cap]}"))
    return files


_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
_FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
_NOT_IN_MIG = 0xFFFFFFFF


class _Collector:
    """Reads one node through an NVML implementation; each failure names what it was doing."""

    def __init__(self, nvml: Any, minors: dict[str, int], device_dir: str,
                 topology: bool = True) -> None:
        self.nvml = nvml
        self.minors = minors
        self.device_dir = device_dir
        self.topology = topology

    def call(self, what: str, fn_name: str, *args: Any) -> Any:
        return nvml_call(self.nvml, what, getattr(self.nvml, fn_name), *args)

    def optional(self, unsupported: list[str], feature: str, what: str, fn_name: str,
                 *args: Any) -> Any:
        """Call a query whose absence on this GPU/driver is a fact (noted), not an error."""
        fn = getattr(self.nvml, fn_name, None)
        mismatch = getattr(self.nvml, "NVMLLibraryMismatchError", ())
        if fn is None:
            unsupported.append(feature)
            return None
        try:
            return fn(*args)
        except mismatch:
            unsupported.append(feature)  # pynvml newer than the driver: no such call here
            return None
        except self.nvml.NVMLError as err:
            if is_unsupported(self.nvml, err):
                unsupported.append(feature)
                return None
            raise InventoryError(describe_nvml_error(self.nvml, err, what)) from None

    def gpu(self, index: int) -> Gpu:
        nv = self.nvml
        where = f"GPU {index}"
        handle = self.call(f"get the handle of {where}", "nvmlDeviceGetHandleByIndex", index)
        uuid = text(self.call(f"read the UUID of {where}", "nvmlDeviceGetUUID", handle))
        where = f"GPU {index} ({uuid})"
        minor = int(self.call(f"read the minor number of {where}", "nvmlDeviceGetMinorNumber",
                              handle))
        name = text(self.call(f"read the name of {where}", "nvmlDeviceGetName", handle))
        memory_total = int(self.call(f"read the memory of {where}", "nvmlDeviceGetMemoryInfo",
                                     handle).total)
        pci_bus_id = text(self.call(f"read the PCI info of {where}", "nvmlDeviceGetPciInfo",
                                    handle).busId)
        unsupported: list[str] = []
        mode = self.optional(unsupported, "compute_mode", f"read the compute mode of {where}",
                             "nvmlDeviceGetComputeMode", handle)
        compute_mode = ("unknown" if mode is None
                        else _COMPUTE_MODES.get(int(mode), f"mode{int(mode)}"))
        mig = self.optional(unsupported, "mig", f"read the MIG mode of {where}",
                            "nvmlDeviceGetMigMode", handle)
        mig_current = mig is not None and int(mig[0]) == nv.NVML_DEVICE_MIG_ENABLE
        mig_pending = mig is not None and int(mig[1]) == nv.NVML_DEVICE_MIG_ENABLE
        mig_devices = self.mig_devices(index, minor, handle, where) if mig_current else []
        nvlinks: list[NvLink] = []
        fabric = None
        if self.topology:
            nvlinks = self.nvlinks(unsupported, handle, where)
            fabric = self.fabric(unsupported, handle, where)
        processes = self.processes(unsupported, handle, where)
        return Gpu(nvml_index=index, minor=minor, uuid=uuid, name=name, memory_total=memory_total,
                   pci_bus_id=pci_bus_id, compute_mode=compute_mode, mig_current=mig_current,
                   mig_pending=mig_pending, mig_devices=mig_devices, nvlinks=nvlinks,
                   fabric=fabric, processes=processes, device_dir=self.device_dir,
                   unsupported=unsupported)

    def mig_devices(self, gpu_index: int, gpu_minor: int, handle: Any,
                    where: str) -> list[MigDevice]:
        nv = self.nvml
        count = int(self.call(f"read the MIG device count of {where}",
                              "nvmlDeviceGetMaxMigDeviceCount", handle))
        devices = []
        for i in range(count):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nv.NVMLError as err:
                if err.value in (nv.NVML_ERROR_NOT_FOUND, nv.NVML_ERROR_INVALID_ARGUMENT):
                    continue  # indexes are not always contiguous after slices are destroyed
                raise InventoryError(describe_nvml_error(
                    nv, err, f"get MIG device {i} of {where}")) from None
            what = f"MIG device {i} of {where}"
            gi = int(self.call(f"read the GPU instance id of {what}",
                               "nvmlDeviceGetGpuInstanceId", mig))
            ci = int(self.call(f"read the compute instance id of {what}",
                               "nvmlDeviceGetComputeInstanceId", mig))
            attrs = self.call(f"read the attributes of {what}", "nvmlDeviceGetAttributes", mig)
            name = text(self.call(f"read the name of {what}", "nvmlDeviceGetName", mig))
            gi_slices = int(attrs.gpuInstanceSliceCount)
            ci_slices = int(attrs.computeInstanceSliceCount)
            profile = mig_profile_from_name(name) or mig_profile_from_attributes(
                gi_slices, ci_slices, int(attrs.memorySizeMB))
            devices.append(MigDevice(
                gpu_index=gpu_index,
                gi_id=gi,
                ci_id=ci,
                profile=profile,
                uuid=text(self.call(f"read the UUID of {what}", "nvmlDeviceGetUUID", mig)),
                memory_total=int(self.call(f"read the memory of {what}",
                                           "nvmlDeviceGetMemoryInfo", mig).total),
                caps_files=mig_caps_files(self.minors, gpu_minor, gi, ci, self.device_dir),
                gi_slices=gi_slices,
                ci_slices=ci_slices,
                processes=self.processes([], mig, what),
            ))
        return devices

    def nvlinks(self, unsupported: list[str], handle: Any, where: str) -> list[NvLink]:
        """Walk every possible link as Slurm does: skip absent lanes, stop when unsupported."""
        nv = self.nvml
        links: list[NvLink] = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = int(nv.nvmlDeviceGetNvLinkState(handle, link)) == 1
            except nv.NVMLError as err:
                if err.value == nv.NVML_ERROR_INVALID_ARGUMENT:
                    continue
                if is_unsupported(nv, err):
                    if not links:
                        unsupported.append("nvlink")
                    break
                raise InventoryError(describe_nvml_error(
                    nv, err, f"read NVLink {link} of {where}")) from None
            remote = ""
            if active:
                pci = self.optional(unsupported, f"nvlink{link}_remote",
                                    f"read the remote end of NVLink {link} of {where}",
                                    "nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
                remote = text(pci.busId) if pci is not None else ""
            links.append(NvLink(link=link, active=active, remote_pci_bus_id=remote))
        return links

    def fabric(self, unsupported: list[str], handle: Any, where: str) -> Optional[FabricInfo]:
        """Fabric (multi-node NVLink domain) state; the versioned call first, then the old one."""
        import ctypes
        import uuid as uuidlib

        nv = self.nvml
        for fn_name, struct_name in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                                     ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
            fn = getattr(nv, fn_name, None)
            struct = getattr(nv, struct_name, None)
            if fn is None or struct is None:
                continue
            info = struct()
            try:
                fn(handle, ctypes.byref(info))
            except nv.NVMLError as err:
                if err.value == nv.NVML_ERROR_FUNCTION_NOT_FOUND:
                    continue  # driver older than this call: try the older one
                if is_unsupported(nv, err):
                    break
                raise InventoryError(describe_nvml_error(
                    nv, err, f"read the fabric info of {where}")) from None
            state = _FABRIC_STATES.get(int(info.state), f"state{int(info.state)}")
            if state != "completed":
                return FabricInfo(state=state)
            raw = bytes(info.clusterUuid)
            return FabricInfo(state=state,
                              cluster_uuid=str(uuidlib.UUID(bytes=raw)) if any(raw) else "",
                              clique_id=int(info.cliqueId),
                              status=("success" if int(info.status) == nv.NVML_SUCCESS
                                      else _error_text(nv, int(info.status))))
        unsupported.append("fabric")
        return None

    def processes(self, unsupported: list[str], handle: Any, where: str) -> list[GpuProcess]:
        found: dict[int, GpuProcess] = {}
        for kind, feature, fn_name in (
            ("compute", "processes", "nvmlDeviceGetComputeRunningProcesses"),
            ("mps", "mps_processes", "nvmlDeviceGetMPSComputeRunningProcesses"),
        ):
            procs = self.optional(unsupported, feature, f"list the processes on {where}",
                                  fn_name, handle)
            for proc in procs or []:
                gi = getattr(proc, "gpuInstanceId", _NOT_IN_MIG)
                ci = getattr(proc, "computeInstanceId", _NOT_IN_MIG)
                found.setdefault(int(proc.pid), GpuProcess(
                    pid=int(proc.pid),
                    used_memory=int(proc.usedGpuMemory or 0),
                    kind=kind,
                    gi_id=None if gi in (None, _NOT_IN_MIG) else int(gi),
                    ci_id=None if ci in (None, _NOT_IN_MIG) else int(ci),
                ))
        return sorted(found.values(), key=lambda p: p.pid)


def _error_text(nvml: Any, value: int) -> str:
    try:
        return str(nvml.NVMLError(value))
    except Exception:
        return f"NVML error {value}"


def collect(nvml: Any, source: str, mig_minors_text: Optional[str] = None,
            device_dir: str = "/dev", hostname: Optional[str] = None,
            topology: bool = True) -> Inventory:
    """Read every GPU, MIG slice, NVLink, fabric state and process through ``nvml``.

    ``nvml`` is what ``load_nvml`` returned; ``mig_minors_text`` is the content of
    /proc/driver/nvidia-caps/mig-minors (None: MIG slices get no caps files). Without
    ``topology`` the NVLinks and fabric state are not read (18 links per GPU are most of the
    NVML calls, and a job's prolog verifies devices, not links).
    """
    nvml_call(nvml, "initialise NVML", nvml.nvmlInit)
    try:
        collector = _Collector(nvml, parse_mig_minors(mig_minors_text or ""), device_dir,
                               topology)
        return Inventory(
            hostname=hostname or os.uname().nodename,
            driver_version=text(nvml_call(nvml, "read the driver version",
                                          nvml.nvmlSystemGetDriverVersion)),
            cuda_driver_version=_cuda_version(nvml_call(
                nvml, "read the CUDA driver version", nvml.nvmlSystemGetCudaDriverVersion_v2)),
            source=source,
            gpus=[collector.gpu(i) for i in range(
                int(nvml_call(nvml, "count the GPUs", nvml.nvmlDeviceGetCount)))],
        )
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _cuda_version(value: Any) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    number = int(value)
    return f"{number // 1000}.{number % 1000 // 10}"


def load_nvml(source: str) -> Any:
    """Return the NVML implementation named by ``source``: ``nvml`` or ``sim:/abs/profile.json``."""
    if source == "nvml":
        try:
            import pynvml
        except ImportError:
            raise InventoryError(
                "the nvidia-ml-py package (module pynvml) is not installed for this Python; "
                "install it with: pip install nvidia-ml-py"
            ) from None
        return pynvml
    if source.startswith(SIM_PREFIX):
        from gpushare.gpu import nvml_sim

        return nvml_sim.SimNvml(nvml_sim.load_profile(source[len(SIM_PREFIX):]))
    raise InventoryError(
        f"unknown GPU inventory source {source!r}; use nvml (the node's NVIDIA driver) or "
        "sim:<absolute path of a simulated node profile>"
    )


def open_inventory(source: str, mig_minors_path: str = MIG_MINORS_PATH,
                   topology: bool = True) -> Inventory:
    """Load the configured NVML (``nvml`` or ``sim:<profile>``) and collect the node's GPUs."""
    nvml = load_nvml(source)
    if source.startswith(SIM_PREFIX):
        return collect(nvml, source, nvml.mig_minors_text, nvml.device_dir, nvml.hostname,
                       topology)
    minors_text: Optional[str] = None
    try:
        with open(mig_minors_path, encoding="ascii", errors="replace") as f:
            minors_text = f.read()
    except FileNotFoundError:
        minors_text = None  # no MIG-capable driver: slices (if any) get no caps files
    except OSError as err:
        raise InventoryError(f"cannot read {mig_minors_path}: {err.strerror}") from None
    return collect(nvml, source, minors_text, topology=topology)
