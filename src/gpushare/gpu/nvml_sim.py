# SPDX-License-Identifier: GPL-2.0-or-later
"""A simulated node behind the NVML seam: pynvml's function names, answered from a JSON profile.

Tests, the local Slurm of the test suite and demos run gpushare's real inventory code against
these profiles (``inventory=sim:/abs/path.json``); nothing here is used unless configured.

Profile format (``"format": 1``; sizes in MiB; every key below is required unless marked)::

    {
      "format": 1,
      "description": "free text",                        (optional)
      "hostname": "node01",                              (optional; default: this host's name)
      "driver_version": "550.90.07",
      "cuda_driver_version": 12040,                      (NVML's encoding: 12.4 -> 12040)
      "device_dir": "/dev",                              (optional; holds nvidiaN, nvidia-caps/)
      "mig_minors": "config 1\\nmonitor 2\\n...",         (optional; default: the driver's layout)
      "errors": {"nvmlInit": "LIBRARY_NOT_FOUND"},       (optional; NVML function -> error it
                                                          raises, NVML_ERROR_ name without prefix)
      "error_on_call": {"nvmlDeviceCreateGpuInstanceWithPlacement": [2, "INSUFFICIENT_RESOURCES"]},
                                                         (optional; only the Nth call of that
                                                          function in one process fails)
      "hang": ["nvmlInit"],                              (optional; these calls never return,
                                                          as a driver call stuck in the kernel)
      "freeze": "/sys/fs/cgroup/freezer/<name>",         (optional; with "hang": the hung call
                                                          first moves its process into this
                                                          cgroup v1 freezer and freezes it, so
                                                          that not even SIGKILL ends it until
                                                          thawed: uninterruptible sleep)
      "gpus": [                                          (NVML index = position in this list)
        {
          "minor": 0,                                    (the N of /dev/nvidiaN)
          "uuid": "GPU-...",
          "name": "NVIDIA H100 80GB HBM3",
          "memory_mib": 81559,
          "pci_bus_id": "00000000:18:00.0",
          "compute_mode": "default",                     (default|exclusive_process|prohibited;
                                                          null: NVML answers NOT_SUPPORTED)
          "mig": {"current": true, "pending": true},     (null: GPU without MIG support)
          "mig_devices": [                               (optional; only when mig.current)
            {"gi_id": 7, "ci_id": 0, "uuid": "MIG-...", "profile": "1g.10gb",
             "memory_mib": 9728,
             "gi_slices": 1, "ci_slices": 1,             (optional; derived from "profile")
             "name": "...",                              (optional; "<gpu name> MIG <profile>")
             "processes": [...]}                         (optional)
          ],
          "nvlinks": [{"active": true, "remote_pci_bus_id": "00000000:05:00.0"}, ...],
                                                         (link N = position; null: no NVLink)
          "fabric": {"state": "completed", "cluster_uuid": "<uuid>", "clique_id": 1,
                     "status": "success"},               (null: NOT_SUPPORTED)
          "processes": [{"pid": 4242, "used_memory_mib": 1024, "kind": "compute"}]
                                                         (kind compute|mps; null: NOT_SUPPORTED;
                                                          also on a MIG device)
          "gpm": {"dram_bw_util": 73.5}                  (optional; GPM, also on a MIG device)
        }
      ],
      "live_dir": "/abs/dir"                             (optional; live fake CUDA clients)
    }

Per-process utilisation (``sm_util``, ``mem_util`` of a process), MPS client lists, GPM and
``live_dir`` are described in ``gpushare.gpu.nvml_sim_usage``, which answers those calls.
MIG changes work as NVML's (``nvmlDeviceSetMigMode``,
``nvmlDeviceCreateGpuInstance[WithPlacement]``, ``nvmlGpuInstanceCreateComputeInstance``,
``nvmlComputeInstanceDestroy``, ``nvmlGpuInstanceDestroy`` and the profile queries): one
instance at a time, under NVIDIA's placement rules, IN_USE while a process runs on what is
destroyed, and each change is written back into the profile file, so that
the next inventory read (another process) sees it. A GPU instance without a compute instance
lives only in the process that made it (the profile format has no place for it).

``load_profile(path, device_root=...)`` moves the device files under another root (a test's
fake ``/dev``): ``device_dir`` becomes ``<device_root>/<device_dir>``.

Without ``mig_minors`` the simulator writes the driver's own numbering: ``config 1``,
``monitor 2``, then for GPU minor ``g``, GPU instance ``i`` (0-14) and compute instance ``c``
(0-7): ``gpu<g>/gi<i>/access`` = 3 + 135·g + 9·i and ``…/ci<c>/access`` that + 1 + c.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import string
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable, ClassVar, Optional

from gpushare.gpu.nvml_sim_profile import (
    _COMPUTE_MODES,
    _FABRIC_STATES,
    NVML_ERRORS,
    NVML_SUCCESS,
    PROFILE_FORMAT,
    ProfileError,
    load_profile,
    standard_mig_minors,
)
from gpushare.gpu.nvml_sim_usage import UsageCalls

__all__ = ["PROFILE_FORMAT", "ProfileError", "SimNvml", "load_profile", "standard_mig_minors"]

MIB = 1 << 20

_ERROR_TEXT = {
    1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported", 4: "Insufficient Permissions",
    5: "Already Initialized", 6: "Not Found", 7: "Insufficient Size", 9: "Driver Not Loaded",
    10: "Timeout", 12: "NVML Shared Library Not Found", 13: "Function Not Found",
    15: "GPU is lost", 16: "GPU requires restart",
    18: "RM has detected an NVML/RM version mismatch.", 19: "In use", 21: "No data",
    23: "Insufficient resources", 999: "Unknown Error",
}
_NOT_IN_MIG = 0xFFFFFFFF


class NVMLError(Exception):
    """Same shape as pynvml's: ``.value`` holds the code; ``NVMLError(code)`` picks the subclass."""

    _value_class: ClassVar[dict[int, type]] = {}
    value: int

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._value_class.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _ERROR_TEXT.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return getattr(other, "value", None) == self.value

    def __hash__(self) -> int:
        return hash(self.value)


def _make_error_classes() -> dict[str, type]:
    classes = {}
    for name, value in NVML_ERRORS.items():
        class_name = "NVMLError_" + string.capwords(name, "_").replace("_", "")
        cls = type(class_name, (NVMLError,), {})
        NVMLError._value_class[value] = cls
        classes[class_name] = cls
    return classes


_ERROR_CLASSES = _make_error_classes()


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8)]


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=0x02000024)


class _GpuHandle:
    def __init__(self, index: int, data: dict[str, Any]) -> None:
        self.index = index
        self.data = data
        self.migs = [_MigHandle(self, m) for m in data["mig_devices"]]


class _MigHandle:
    def __init__(self, parent: _GpuHandle, data: dict[str, Any]) -> None:
        self.parent = parent
        self.data = data


class _GiHandle:
    """A GPU instance: its GPU, id, profile and memory-slice start."""

    def __init__(self, gpu: _GpuHandle, gi_id: int, profile: str, start: int) -> None:
        self.gpu, self.gi_id, self.profile, self.start = gpu, gi_id, profile, start


class _CiHandle:
    def __init__(self, gi: _GiHandle, ci_id: int) -> None:
        self.gi, self.ci_id = gi, ci_id


# NVML's GPU-instance profile index (NVML_GPU_INSTANCE_PROFILE_*) and profile ID per profile
# shape (compute slices, memory slices, media extensions), for 8- and 4-memory-slice GPUs.
_GI_INDEX = {(1, 1, False): 0, (2, 2, False): 1, (3, 4, False): 2, (4, 4, False): 3,
             (7, 8, False): 4, (1, 1, True): 7, (2, 2, True): 8, (1, 2, False): 9}
_GI_ID_8 = {(7, 8, False): 0, (4, 4, False): 5, (3, 4, False): 9, (2, 2, False): 14,
            (1, 2, False): 15, (1, 1, False): 19, (1, 1, True): 20}
_GI_ID_4 = {(4, 4, False): 0, (2, 2, False): 5, (2, 2, True): 6, (1, 1, False): 14,
            (1, 1, True): 21}
_CI_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def _hang(*_args: Any, **_kwargs: Any) -> Any:
    """A call that never returns, as NVML stuck in the driver: only a kill ends it."""
    while True:
        time.sleep(3600)


def _frozen(freezer: str) -> Callable[..., Any]:
    """A call that never returns and that not even a kill ends: the process moves itself
    into ``freezer`` (a cgroup v1 freezer directory) and freezes it, as a process in
    uninterruptible sleep in the driver; it dies of a kill only once the cgroup is thawed."""
    def hang(*_args: Any, **_kwargs: Any) -> Any:
        try:
            with open(os.path.join(freezer, "cgroup.procs"), "w") as procs:
                procs.write("0")  # this process
            with open(os.path.join(freezer, "freezer.state"), "w") as state:
                state.write("FROZEN")
        except OSError as err:  # still hangs; a kill ends it
            sys.stderr.write(f"nvml_sim: cannot freeze in {freezer}: {err}\n")
        return _hang()

    return hang


class SimNvml(UsageCalls):
    """Answers the pynvml calls gpushare makes from a loaded profile, with pynvml's errors."""

    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_COMPUTEMODE_DEFAULT = 0
    NVML_COMPUTEMODE_PROHIBITED = 2
    NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 3
    NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
    NVML_GPU_FABRIC_STATE_NOT_STARTED = 1
    NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2
    NVML_GPU_FABRIC_STATE_COMPLETED = 3
    c_nvmlGpuFabricInfo_t = c_nvmlGpuFabricInfo_t
    c_nvmlGpuFabricInfoV_t = c_nvmlGpuFabricInfoV_t

    def __init__(self, profile: dict[str, Any]) -> None:
        self.profile = profile
        self.hostname: str = profile["hostname"]
        self.device_dir: str = profile["device_dir"]
        self._gpus = [_GpuHandle(i, g) for i, g in enumerate(profile["gpus"])]
        self._errors: dict[str, int] = profile["errors"]
        self._error_on_call: dict[str, tuple[int, int]] = profile.get("error_on_call", {})
        self._calls: dict[str, int] = {}
        self._gis: dict[int, dict[int, _GiHandle]] = {}  # GPU index -> GI id -> handle
        self._initialised = 0
        for name, value in NVML_ERRORS.items():
            setattr(self, f"NVML_ERROR_{name}", value)
        for name, cls in _ERROR_CLASSES.items():
            setattr(self, name, cls)

    @property
    def mig_minors_text(self) -> str:
        """What /proc/driver/nvidia-caps/mig-minors would hold on this node."""
        text = self.profile["mig_minors"]
        return text if text is not None else standard_mig_minors(
            [g["minor"] for g in self.profile["gpus"]])

    def fake_gpus_conf(self, cpus: int) -> str:
        """Slurm's fake_gpus.conf for this node's whole GPUs (read beside slurm.conf in place
        of probing them): type, CPUs, NVLink order, device file, UUID and env flag, so that
        a test Slurm without NVML knows the UUIDs that gres.conf ``Flags=env_uuid`` (26.05)
        puts in ``CUDA_VISIBLE_DEVICES``. A MIG-mode GPU is left out: its slices keep
        Slurm's indices, and their gres.conf order."""
        from gpushare.gpu.gresconf import slurm_gpu_type

        whole = [g for g in self.profile["gpus"] if not (g["mig"] and g["mig"]["current"])]
        lines = []
        for at, gpu in enumerate(whole):
            # Slurm orders the GPUs it merges with gres.conf by the -1 in their links.
            links = ",".join("-1" if i == at else "0" for i in range(len(whole)))
            line = "|".join((slurm_gpu_type(gpu["name"]), str(cpus), f"0-{cpus - 1}", links,
                             os.path.join(self.device_dir, f"nvidia{gpu['minor']}"),
                             gpu["uuid"], "nvidia_gpu_env"))
            if len(line) > 254:  # slurmd reads 256 bytes a line, its newline included
                raise ValueError(f"fake_gpus.conf line of GPU {gpu['minor']} is too long")
            lines.append(line + "\n")
        return "".join(lines)

    def __getattribute__(self, name: str) -> Any:
        attr = object.__getattribute__(self, name)
        if name.startswith("nvml") and callable(attr):
            profile = object.__getattribute__(self, "profile")
            if name in profile.get("hang", ()):
                return _frozen(profile["freeze"]) if profile.get("freeze") else _hang
            errors = object.__getattribute__(self, "_errors")
            if name in errors:
                code = errors[name]

                def failing(*_args: Any, **_kwargs: Any) -> Any:
                    raise NVMLError(code)

                return failing
            once = object.__getattribute__(self, "_error_on_call").get(name)
            if once is not None:
                calls = object.__getattribute__(self, "_calls")
                calls[name] = calls.get(name, 0) + 1
                if calls[name] == once[0]:
                    def failing_once(*_args: Any, **_kwargs: Any) -> Any:
                        raise NVMLError(once[1])

                    return failing_once
            if name not in ("nvmlInit", "nvmlInitWithFlags") and \
                    not object.__getattribute__(self, "_initialised"):
                def uninitialised(*_args: Any, **_kwargs: Any) -> Any:
                    raise NVMLError(NVML_ERRORS["UNINITIALIZED"])

                return uninitialised
        return attr

    # --- library -------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._initialised += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._initialised = max(0, self._initialised - 1)

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.profile["driver_version"]

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.profile["cuda_driver_version"]

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.profile["cuda_driver_version"]

    # --- handles -------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _GpuHandle:
        if not 0 <= index < len(self._gpus):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        return self._gpus[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: Any) -> Any:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self._gpus:
            if gpu.data["uuid"] == uuid:
                return gpu
            for mig in gpu.migs:
                if mig.data["uuid"] == uuid:
                    return mig
        raise NVMLError(NVML_ERRORS["NOT_FOUND"])

    @staticmethod
    def _gpu(handle: Any) -> _GpuHandle:
        if not isinstance(handle, _GpuHandle):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        return handle

    @staticmethod
    def _mig(handle: Any) -> _MigHandle:
        if not isinstance(handle, _MigHandle):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        return handle

    @staticmethod
    def _data(handle: Any) -> dict[str, Any]:
        if not isinstance(handle, (_GpuHandle, _MigHandle)):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        return handle.data

    # --- identity ------------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._data(handle)["uuid"]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._data(handle)["name"]

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        if isinstance(handle, _MigHandle):
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        return self._gpu(handle).data["minor"]

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> SimpleNamespace:
        total = self._data(handle)["memory_mib"] * MIB
        procs = self._data(handle)["processes"] or []
        used = sum(p["used_memory_mib"] for p in procs) * MIB
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        bus_id = self._data(handle.parent if isinstance(handle, _MigHandle) else handle)[
            "pci_bus_id"].encode()
        return SimpleNamespace(busId=bus_id, busIdLegacy=bus_id)

    def nvmlDeviceGetComputeMode(self, handle: Any) -> int:
        mode = self._gpu(handle).data["compute_mode"]
        if mode is None:
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        return _COMPUTE_MODES[mode]

    # --- MIG -----------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        mig = self._gpu(handle).data["mig"]
        if mig is None:
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        return [int(mig["current"]), int(mig["pending"])]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        mig = self._gpu(handle).data["mig"]
        return 7 if mig and mig["current"] else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _MigHandle:
        gpu = self._gpu(handle)
        if index >= self.nvmlDeviceGetMaxMigDeviceCount(gpu):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        if index >= len(gpu.migs):
            raise NVMLError(NVML_ERRORS["NOT_FOUND"])
        return gpu.migs[index]

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        return int(isinstance(handle, _MigHandle))

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        return self._mig(handle).data["gi_id"]

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        return self._mig(handle).data["ci_id"]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> _GpuHandle:
        return self._mig(handle).parent

    def nvmlDeviceGetAttributes(self, handle: Any) -> SimpleNamespace:
        if isinstance(handle, _GpuHandle):
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        data = self._mig(handle).data
        return SimpleNamespace(gpuInstanceSliceCount=data["gi_slices"],
                               computeInstanceSliceCount=data["ci_slices"],
                               memorySizeMB=data["memory_mib"])

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    # --- MIG changes (as mig-parted and the DRA driver make them) ----------------------------
    NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12
    NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x9
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0

    class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
        _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]

    def _model(self, gpu: _GpuHandle) -> Any:
        from gpushare.admin.mig_profiles import GPU_MODELS

        memory_gib = gpu.data["memory_mib"] / 1024
        found = [m for m in GPU_MODELS if m.mig_capable
                 and m.matches_nvml_name(gpu.data["name"], gpu.data["memory_mib"] * MIB)]
        if not found or not (gpu.data["mig"] or {}).get("current"):
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        return min(found, key=lambda m: abs(m.memory_gb - memory_gib))

    @staticmethod
    def _shape(spec: Any) -> tuple[int, int, bool]:
        return spec.compute_slices, spec.memory_slices, spec.name.endswith("+me")

    def _profile_ids(self, model: Any) -> dict[int, Any]:
        table = _GI_ID_4 if model.memory_slices == 4 else _GI_ID_8
        return {table[self._shape(p)]: p for p in model.profiles if self._shape(p) in table}

    def _instances(self, gpu: _GpuHandle) -> dict[int, _GiHandle]:
        """The GPU instances of a GPU: those with compute instances (its MIG devices, from the
        profile) and those created here without one yet."""
        gis = self._gis.setdefault(gpu.index, {})
        model = self._model(gpu) if gpu.data["mig_devices"] else None
        for dev in gpu.data["mig_devices"]:
            if dev["gi_id"] not in gis:
                profile = dev["profile"].split("c.", 1)[-1] if dev["profile"].count(".") > 1 \
                    else dev["profile"]
                spec = model.profile(profile) if model else None
                size = spec.memory_slices if spec else dev["gi_slices"]
                gis[dev["gi_id"]] = _GiHandle(gpu, dev["gi_id"], profile,
                                              self._start_of(model, dev["gi_id"], size))
        return gis

    @staticmethod
    def _start_of(model: Any, gi_id: int, size: int) -> int:
        total = model.memory_slices if model else 8
        level_first = {total: 0, total // 2: 1, total // 4: 3, total // 8: 7}
        return (gi_id - level_first.get(size, 0)) * size

    def _persist(self, gpu: _GpuHandle) -> None:
        """Write this GPU's MIG state back into the profile file (atomically)."""
        gpu.migs = [_MigHandle(gpu, m) for m in gpu.data["mig_devices"]]
        path = self.profile.get("path")
        if not path:
            return
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
        entry = raw["gpus"][gpu.index]
        entry["mig"] = dict(gpu.data["mig"])
        default_name = f"{gpu.data['name']} MIG "  # names derived on load are not written
        entry["mig_devices"] = [
            {k: v for k, v in m.items() if k != "name" or v != default_name + m["profile"]}
            for m in gpu.data["mig_devices"]]
        if not entry["mig_devices"]:
            del entry["mig_devices"]
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)

    @staticmethod
    def _busy(processes: Optional[list[dict[str, Any]]]) -> bool:
        return bool(processes)

    def nvmlDeviceSetMigMode(self, handle: Any, mode: int) -> int:
        gpu = self._gpu(handle)
        mig = gpu.data["mig"]
        if mig is None:
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        if self._busy(gpu.data["processes"]) or (
                not mode and (gpu.data["mig_devices"] or self._gis.get(gpu.index))):
            raise NVMLError(NVML_ERRORS["IN_USE"])
        mig["pending"] = bool(mode)
        status = NVML_SUCCESS
        if any(tag in gpu.data["name"] for tag in ("A100", "A30")):
            if mig["current"] != mig["pending"]:  # Ampere applies a mode change at reset
                status = NVML_ERRORS["RESET_REQUIRED"]
        else:
            mig["current"] = bool(mode)
        self._persist(gpu)
        return status

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: int,
                                            version: int = 2) -> SimpleNamespace:
        gpu = self._gpu(handle)
        model = self._model(gpu)
        if not 0 <= profile < self.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        for profile_id, spec in self._profile_ids(model).items():
            if _GI_INDEX.get(self._shape(spec)) == profile:
                return SimpleNamespace(
                    id=profile_id, isP2pSupported=0, sliceCount=spec.compute_slices,
                    instanceCount=spec.max_instances, multiprocessorCount=0,
                    memorySizeMB=_slice_memory_mib(spec.name, gpu.data["memory_mib"]),
                    name=f"MIG {spec.name}".encode())
        raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: int) -> _GiHandle:
        gpu = self._gpu(handle)
        spec = self._profile_ids(self._model(gpu)).get(profile_id)
        if spec is None:
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        for start in spec.starts:
            if self._fits(gpu, spec, start):
                return self._create_gi(gpu, spec, start)
        raise NVMLError(NVML_ERRORS["INSUFFICIENT_RESOURCES"])

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: Any, profile_id: int,
                                                 placement: Any) -> _GiHandle:
        gpu = self._gpu(handle)
        spec = self._profile_ids(self._model(gpu)).get(profile_id)
        place = getattr(placement, "_obj", placement)
        if spec is None or place.size != spec.memory_slices or place.start not in spec.starts:
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        if not self._fits(gpu, spec, place.start):
            raise NVMLError(NVML_ERRORS["INSUFFICIENT_RESOURCES"])
        return self._create_gi(gpu, spec, place.start)

    def _fits(self, gpu: _GpuHandle, spec: Any, start: int) -> bool:
        model = self._model(gpu)
        gis = self._instances(gpu).values()
        used: set[int] = set()
        compute = 0
        same = 0
        for gi in gis:
            other = model.profile(gi.profile)
            size = other.memory_slices if other else 1
            used.update(range(gi.start, gi.start + size))
            compute += other.compute_slices if other else 1
            same += gi.profile == spec.name
        return (start + spec.memory_slices <= model.memory_slices
                and not used & set(range(start, start + spec.memory_slices))
                and compute + spec.compute_slices <= model.compute_slices
                and same < spec.max_instances)

    def _create_gi(self, gpu: _GpuHandle, spec: Any, start: int) -> _GiHandle:
        from gpushare.admin.mig_profiles import gi_id_for_placement

        gi_id = gi_id_for_placement(self._model(gpu), start, spec.memory_slices)
        gi = _GiHandle(gpu, gi_id, spec.name, start)
        self._instances(gpu)[gi_id] = gi
        return gi

    def nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: int) -> _GiHandle:
        gpu = self._gpu(handle)
        if not (gpu.data["mig"] or {}).get("current"):
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        gi = self._instances(gpu).get(gi_id)
        if gi is None:
            raise NVMLError(NVML_ERRORS["NOT_FOUND"])
        return gi

    def nvmlGpuInstanceGetInfo(self, gi: Any) -> SimpleNamespace:
        if not isinstance(gi, _GiHandle) or gi.gi_id not in self._gis.get(gi.gpu.index, {}):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        spec = self._model(gi.gpu).profile(gi.profile)
        profile_id = next(i for i, p in self._profile_ids(self._model(gi.gpu)).items()
                          if p is spec)
        return SimpleNamespace(device=gi.gpu, id=gi.gi_id, profileId=profile_id,
                               placement=SimpleNamespace(start=gi.start,
                                                         size=spec.memory_slices))

    def _cis(self, gi: _GiHandle) -> list[dict[str, Any]]:
        return [m for m in gi.gpu.data["mig_devices"] if m["gi_id"] == gi.gi_id]

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: Any, profile: int,
                                                     eng_profile: int = 0,
                                                     version: int = 2) -> SimpleNamespace:
        if not isinstance(gi, _GiHandle):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        spec = self._model(gi.gpu).profile(gi.profile)
        slices = next((n for n, i in _CI_INDEX.items() if i == profile), None)
        if slices is None or slices > spec.compute_slices:
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        return SimpleNamespace(id=profile, sliceCount=slices,
                               instanceCount=spec.compute_slices // slices,
                               multiprocessorCount=0, name=f"MIG {spec.name}".encode())

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gi: Any, profile_id: int) -> _CiHandle:
        info = self.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, profile_id)
        spec = self._model(gi.gpu).profile(gi.profile)
        cis = self._cis(gi)
        if sum(c["ci_slices"] for c in cis) + info.sliceCount > spec.compute_slices:
            raise NVMLError(NVML_ERRORS["INSUFFICIENT_RESOURCES"])
        ci_id = min(set(range(8)) - {c["ci_id"] for c in cis})
        name = spec.name if info.sliceCount == spec.compute_slices \
            else f"{info.sliceCount}c.{spec.name}"
        gpu = gi.gpu
        gpu.data["mig_devices"].append({
            "gi_id": gi.gi_id, "ci_id": ci_id,
            "uuid": _sim_uuid("MIG-", gpu.data["uuid"], gi.gi_id, ci_id, name),
            "profile": name, "memory_mib": _slice_memory_mib(spec.name, gpu.data["memory_mib"]),
            "ci_slices": info.sliceCount, "gi_slices": spec.compute_slices,
            "name": f"{gpu.data['name']} MIG {name}", "processes": []})
        gpu.data["mig_devices"].sort(key=lambda m: (m["gi_id"], m["ci_id"]))
        self._persist(gpu)
        return _CiHandle(gi, ci_id)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: Any, ci_id: int) -> _CiHandle:
        if not isinstance(gi, _GiHandle):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        if not any(c["ci_id"] == ci_id for c in self._cis(gi)):
            raise NVMLError(NVML_ERRORS["NOT_FOUND"])
        return _CiHandle(gi, ci_id)

    def nvmlComputeInstanceDestroy(self, ci: Any) -> int:
        if not isinstance(ci, _CiHandle):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        devices = ci.gi.gpu.data["mig_devices"]
        found = [m for m in devices if m["gi_id"] == ci.gi.gi_id and m["ci_id"] == ci.ci_id]
        if not found:
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        if self._busy(found[0]["processes"]):
            raise NVMLError(NVML_ERRORS["IN_USE"])
        devices.remove(found[0])
        self._persist(ci.gi.gpu)
        return NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gi: Any) -> int:
        if not isinstance(gi, _GiHandle) or gi.gi_id not in self._gis.get(gi.gpu.index, {}):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        if self._cis(gi):
            raise NVMLError(NVML_ERRORS["IN_USE"])
        del self._gis[gi.gpu.index][gi.gi_id]
        self._persist(gi.gpu)
        return NVML_SUCCESS

    # --- NVLink and fabric ---------------------------------------------------------------
    def _link(self, handle: Any, link: int) -> dict[str, Any]:
        links = self._gpu(handle).data["nvlinks"]
        if links is None:
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        if not 0 <= link < min(len(links), self.NVML_NVLINK_MAX_LINKS):
            raise NVMLError(NVML_ERRORS["INVALID_ARGUMENT"])
        return links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        return int(self._link(handle, link)["active"])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> SimpleNamespace:
        bus_id = self._link(handle, link)["remote_pci_bus_id"].encode()
        return SimpleNamespace(busId=bus_id, busIdLegacy=bus_id)

    def _fill_fabric(self, handle: Any, ref: Any) -> int:
        fabric = self._gpu(handle).data["fabric"]
        if fabric is None:
            raise NVMLError(NVML_ERRORS["NOT_SUPPORTED"])
        info = ref._obj
        info.state = _FABRIC_STATES[fabric["state"]]
        info.cliqueId = fabric["clique_id"]
        status = fabric["status"]
        info.status = NVML_SUCCESS if status == "success" else NVML_ERRORS[status.upper()]
        ctypes.memmove(info.clusterUuid, fabric["cluster_uuid"], 16)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, ref: Any) -> int:
        return self._fill_fabric(handle, ref)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, ref: Any) -> int:
        return self._fill_fabric(handle, ref)


# Generated UUIDs are uuid5 names in this namespace (uuid is imported only to generate:
# prologs under inventory=sim: import this module).
_SIM_NAMESPACE = "6f1c1d55-6a7e-4b7e-9a51-3c0d9f1e5b21"


def _sim_uuid(prefix: str, *parts: object) -> str:
    """Stable per node, GPU and slice, so that rendering twice gives the same profile."""
    import uuid

    return prefix + str(uuid.uuid5(uuid.UUID(_SIM_NAMESPACE), "/".join(map(str, parts))))


def _slice_memory_mib(profile: str, gpu_memory_mib: int) -> int:
    """About what NVML reports for a slice: its nominal GB less the driver's reserve."""
    match = re.search(r"\.(\d+)gb", profile)
    nominal = int(match.group(1)) * 1024 if match else gpu_memory_mib // 8
    return min(nominal, gpu_memory_mib) * 95 // 100 // 128 * 128
