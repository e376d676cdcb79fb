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
Beside it: reading and checking a profile (``nvml_sim_profile``), MIG changes
(``nvml_sim_mig``), NVML's errors (``nvml_sim_errors``) and profiles generated from an
ownership plan (``nvml_sim_plan``).
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
import os
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable

from gpushare.gpu.nvml_sim_errors import ERROR_CLASSES, NVML_ERRORS, NVML_SUCCESS, NVMLError
from gpushare.gpu.nvml_sim_mig import MigChanges, _GiHandle, _GpuHandle, _MigHandle
from gpushare.gpu.nvml_sim_profile import (
    _COMPUTE_MODES,
    _FABRIC_STATES,
    PROFILE_FORMAT,
    ProfileError,
    load_profile,
    standard_mig_minors,
)
from gpushare.gpu.nvml_sim_usage import UsageCalls

__all__ = ["PROFILE_FORMAT", "ProfileError", "SimNvml", "load_profile", "standard_mig_minors"]

MIB = 1 << 20

_NOT_IN_MIG = 0xFFFFFFFF


class c_nvmlGpuFabricInfo_t(ctypes.Structure):
    _fields_ = [("clusterUuid", ctypes.c_uint8 * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8)]


class c_nvmlGpuFabricInfoV_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * 16),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32),
                ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]

    def __init__(self) -> None:
        super().__init__(version=0x02000024)


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


class SimNvml(UsageCalls, MigChanges):
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
        for name, cls in ERROR_CLASSES.items():
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
