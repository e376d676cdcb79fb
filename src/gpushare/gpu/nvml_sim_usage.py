# SPDX-License-Identifier: GPL-2.0-or-later
"""What a simulated node's GPUs run and how hard: processes, per-process utilisation,
MPS client lists and GPM samples, answered from the profile (``gpushare.gpu.nvml_sim``).

Kept apart from the simulator's identity, MIG and NVLink calls: these are the calls the
usage sampler makes, and they read keys of the profile that only its tests set.

Profile keys read here (see ``nvml_sim``'s format for the rest)::

    gpus[i] and gpus[i].mig_devices[j]:
      "processes": [{"pid": 4242, "used_memory_mib": 1024, "kind": "compute",
                     "sm_util": 30, "mem_util": 12}]   (sm_util, mem_util optional: % of
                                                         the sample period, as NVML's
                                                         smUtil/memUtil; default 0)
      "gpm": {"dram_bw_util": 73.5}                    (optional; GPM's DRAM bandwidth
                                                         use in % of peak; a GPU has GPM
                                                         when it or one of its MIG devices
                                                         has this key; a device without it
                                                         answers NOT_SUPPORTED to samples)
    top level:
      "live_dir": "/abs/dir"                            (optional; see below)

``live_dir`` lets a test's fake CUDA client, running as a job's user inside a real job,
appear on a GPU as a live process: it writes ``<live_dir>/<its pid>.json`` holding
``{"uuid": "GPU-..." or "MIG-...", "used_memory_mib", "kind", "sm_util", "mem_util"}``.
The directory must be root's with the sticky bit (as /tmp, so no user removes another's
entry). An entry counts only while its pid lives and the file's owner is that pid's real
uid, so a user can neither plant a process of someone else nor outlive their own; what a
user writes there is otherwise believed, which is why only a profile names the directory
and production (``inventory=nvml``) never reads one.

Any call here can answer an NVML error through the profile's ``errors`` (e.g.
``{"nvmlDeviceGetProcessesUtilizationInfo": "NOT_SUPPORTED"}``), as a driver before R550
or a GPU without GPM does.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import stat
from types import SimpleNamespace
from typing import Any, Callable, Optional

__all__ = ["UsageCalls", "live_processes", "usage_keys"]

MIB = 1 << 20
_NOT_IN_MIG = 0xFFFFFFFF
NVML_GPM_METRIC_DRAM_BW_UTIL = 10  # as pynvml
_LIVE_NAME = re.compile(r"([0-9]{1,10})\.json\Z")


class c_nvmlProcessUtilizationInfo_v1_t(ctypes.Structure):
    """pynvml's per-process utilisation sample (nvmlDeviceGetProcessesUtilizationInfo)."""

    _fields_ = [("timeStamp", ctypes.c_ulonglong), ("pid", ctypes.c_uint),
                ("smUtil", ctypes.c_uint), ("memUtil", ctypes.c_uint),
                ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint),
                ("jpgUtil", ctypes.c_uint), ("ofaUtil", ctypes.c_uint)]


class c_nvmlGpmSupport_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


class c_metricInfo_t(ctypes.Structure):
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p),
                ("unit", ctypes.c_char_p)]


class c_nvmlGpmMetric_t(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", ctypes.c_double), ("metricInfo", c_metricInfo_t)]


class c_nvmlGpmMetricsGet_t(ctypes.Structure):
    """pynvml's shape, with room for 16 metrics (pynvml's has NVML_GPM_METRIC_MAX)."""

    _fields_ = [("version", ctypes.c_uint), ("numMetrics", ctypes.c_uint),
                ("sample1", ctypes.py_object), ("sample2", ctypes.py_object),
                ("metrics", c_nvmlGpmMetric_t * 16)]


def usage_keys(r: Any, raw: dict[str, Any], where: str, procs: Optional[list[dict[str, Any]]],
               raw_procs: Any) -> dict[str, Any]:
    """Parse a device's ``gpm`` and its processes' ``sm_util``/``mem_util`` (``r``: the
    profile reader, which names the field in an error)."""
    if procs is not None:
        for i, (proc, rawp) in enumerate(zip(procs, raw_procs or ())):
            for key in ("sm_util", "mem_util"):
                value = r.get(rawp, key, int, f"{where}.processes[{i}]", 0)
                if not 0 <= value <= 100:
                    raise r.fail(f"{where}.processes[{i}].{key}", "a percentage 0-100")
                proc[key] = value
    gpm = r.get(raw, "gpm", dict, where, None, nullable=True)
    if gpm is None:
        return {"gpm": None}
    value = gpm.get("dram_bw_util")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise r.fail(f"{where}.gpm.dram_bw_util", "a percentage 0-100")
    return {"gpm": {"dram_bw_util": float(value)}}


def _owner(proc_root: str, pid: int) -> Optional[int]:
    """The real uid of a live process; None when it is gone or a zombie."""
    try:
        with open(f"{proc_root}/{pid}/status", "rb") as f:
            status = f.read(1 << 16)
    except OSError:
        return None
    state = re.search(rb"^State:\s+([A-Z])", status, re.MULTILINE)
    uid = re.search(rb"^Uid:\s+(\d+)", status, re.MULTILINE)
    if not state or state.group(1) in (b"Z", b"X") or not uid:
        return None
    return int(uid.group(1))


def live_processes(live_dir: str, proc_root: str = "/proc") -> dict[str, list[dict[str, Any]]]:
    """The fake clients registered in ``live_dir``, by device UUID (see the module's
    docstring for who is believed, and why the directory must be root's and sticky)."""
    try:
        dir_fd = os.open(live_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        info = os.fstat(dir_fd)
        if info.st_uid != 0 or not info.st_mode & stat.S_ISVTX:
            return {}
        for name in os.listdir(dir_fd):
            match = _LIVE_NAME.match(name)
            if not match:
                continue
            entry = _read_entry(dir_fd, name, int(match.group(1)), proc_root)
            if entry is not None:
                found.setdefault(entry.pop("uuid"), []).append(entry)
    finally:
        os.close(dir_fd)
    return found


def _read_entry(dir_fd: int, name: str, pid: int, proc_root: str) -> Optional[dict[str, Any]]:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or _owner(proc_root, pid) != info.st_uid:
            return None
        data = json.loads(os.read(fd, 4096) or b"null")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or not isinstance(data.get("uuid"), str):
        return None
    entry = {"uuid": data["uuid"], "pid": pid, "kind": "mps" if data.get("kind") == "mps"
             else "compute"}
    for key, limit in (("used_memory_mib", 1 << 24), ("sm_util", 100), ("mem_util", 100)):
        value = data.get(key, 0)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit
        entry[key] = value if ok else 0
    return entry


def _proc(p: dict[str, Any], gi: int = _NOT_IN_MIG, ci: int = _NOT_IN_MIG) -> SimpleNamespace:
    return SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_memory_mib"] * MIB or None,
                           gpuInstanceId=gi, computeInstanceId=ci)


class UsageCalls:
    """The process, utilisation and GPM calls of ``SimNvml`` (a mixin: ``profile``,
    ``_gpu``, ``_data`` and the error constants are the simulator's)."""

    profile: dict[str, Any]
    NVMLError: Any
    NVML_ERROR_NOT_SUPPORTED: int
    _gpu: Callable[[Any], Any]
    _data: Callable[[Any], dict[str, Any]]
    NVML_GPM_METRIC_DRAM_BW_UTIL = NVML_GPM_METRIC_DRAM_BW_UTIL
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_SUPPORT_VERSION = 1
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    c_nvmlProcessUtilizationInfo_v1_t = c_nvmlProcessUtilizationInfo_v1_t

    def _error(self, name: str) -> Exception:
        err: Exception = self.NVMLError(getattr(self, f"NVML_ERROR_{name}"))
        return err

    def _device_procs(self, data: dict[str, Any]) -> Optional[list[dict[str, Any]]]:
        """A device's processes: the profile's, then the live fake clients on it."""
        procs = data["processes"]
        live_dir = self.profile.get("live_dir")
        if procs is None or not live_dir:
            return procs
        return procs + live_processes(live_dir).get(data["uuid"], [])

    def _procs_of(self, handle: Any) -> list[tuple[dict[str, Any], int, int]]:
        """(process, GI id, CI id) of a GPU (with its slices') or a MIG device."""
        parent = getattr(handle, "parent", None)
        if parent is not None:
            procs = self._device_procs(handle.data)
            if procs is None:
                raise self._error("NOT_SUPPORTED")
            return [(p, handle.data["gi_id"], handle.data["ci_id"]) for p in procs]
        gpu = self._gpu(handle)
        procs = self._device_procs(gpu.data)
        if procs is None:
            raise self._error("NOT_SUPPORTED")
        found = [(p, _NOT_IN_MIG, _NOT_IN_MIG) for p in procs]
        for mig in gpu.migs:  # the parent handle aggregates its slices' processes
            found.extend((p, mig.data["gi_id"], mig.data["ci_id"])
                         for p in self._device_procs(mig.data) or [])
        return found

    def _processes(self, handle: Any, kind: str) -> list[SimpleNamespace]:
        return [_proc(p, gi, ci) for p, gi, ci in self._procs_of(handle) if p["kind"] == kind]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        return self._processes(handle, "compute")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        return self._processes(handle, "mps")

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses
    nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetMPSComputeRunningProcesses

    def nvmlDeviceGetProcessesUtilizationInfo(
            self, handle: Any, timeStamp: int) -> list[Any]:
        """As NVML: a GPU's processes' SM and memory-controller time in the last sample
        period; MIG devices have none (NOT_SUPPORTED), nor does a GPU without processes
        (NOT_FOUND)."""
        if getattr(handle, "parent", None) is not None:
            raise self._error("NOT_SUPPORTED")
        procs = self._procs_of(handle)
        if not procs:
            raise self._error("NOT_FOUND")
        stamp = max(int(timeStamp), 1) + 1
        return [c_nvmlProcessUtilizationInfo_v1_t(timeStamp=stamp, pid=p["pid"],
                                                  smUtil=p.get("sm_util", 0),
                                                  memUtil=p.get("mem_util", 0))
                for p, _gi, _ci in procs]

    # --- GPM -----------------------------------------------------------------------------
    def _gpm(self, data: dict[str, Any]) -> dict[str, Any]:
        gpm = data.get("gpm")
        if gpm is None:
            raise self._error("NOT_SUPPORTED")
        return gpm

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> c_nvmlGpmSupport_t:
        """A GPU has GPM when the profile gives it, or any of its MIG devices, a figure."""
        data = self._data(handle)
        devices = [data] + [m.data for m in getattr(handle, "migs", [])]
        supported = any(d.get("gpm") is not None for d in devices)
        return c_nvmlGpmSupport_t(version=1, isSupportedDevice=int(supported))

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        return SimpleNamespace(value=None)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        sample.value = None

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        sample.value = self._gpm(self._gpu(handle).data)["dram_bw_util"]
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gi_id: int, sample: Any) -> Any:
        gpu = self._gpu(handle)
        found = [m for m in gpu.migs if m.data["gi_id"] == gi_id]
        if not found:
            raise self._error("INVALID_ARGUMENT")
        sample.value = self._gpm(found[0].data)["dram_bw_util"]
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        """The later sample's figure: a simulated device's use is steady between samples."""
        try:
            first, second = request.sample1, request.sample2
        except ValueError:  # a sample never set: a NULL pointer to NVML
            raise self._error("INVALID_ARGUMENT") from None
        if getattr(first, "value", None) is None or getattr(second, "value", None) is None:
            raise self._error("INVALID_ARGUMENT")
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId == NVML_GPM_METRIC_DRAM_BW_UTIL:
                metric.value, metric.nvmlReturn = second.value, 0
            else:
                metric.nvmlReturn = self.NVML_ERROR_NOT_SUPPORTED
        return request
