# SPDX-License-Identifier: GPL-2.0-or-later
"""MIG changes on the simulated node, as NVML makes them (``nvmlDeviceSetMigMode``, GPU and
compute instances created and destroyed under NVIDIA's placement rules), each written back
into the profile file so that the next process sees it; with the device handles they use.

A mixin of ``gpushare.gpu.nvml_sim.SimNvml``: the MIG layout changes are one concern, the
simulator's reads another.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
from types import SimpleNamespace
from typing import Any, Callable, Optional

from gpushare.gpu.nvml_sim_errors import NVML_ERRORS, NVML_SUCCESS, NVMLError

__all__ = ["MigChanges"]

MIB = 1 << 20


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


class MigChanges:
    """The MIG-changing calls of ``SimNvml`` (``profile``, ``_gis``, ``_gpu`` are its)."""

    profile: dict[str, Any]
    _gis: dict[int, dict[int, _GiHandle]]
    _gpus: list[_GpuHandle]
    _gpu: Callable[[Any], _GpuHandle]

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
