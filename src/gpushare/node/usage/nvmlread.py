# SPDX-License-Identifier: GPL-2.0-or-later
"""What NVML says each GPU and MIG GPU instance runs, and how hard, in one pass.

Each call that the driver or GPU does not support is recorded by name and its figure left
out (never an error): per-process utilisation needs R550 and is not given for MIG
devices; GPM needs Hopper or later. GPM figures come from two samples; the reader keeps
each device's last sample, so a loop pays for one sample a device a round, and a single
round takes its two samples ``settle`` seconds apart.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from gpushare.gpu.nvml import is_unsupported, text

__all__ = ["DeviceSample", "NvmlReader", "ProcSample"]


class ProcSample:
    """One process on a device: memory in bytes, SM and memory-controller time in %
    (None where NVML gives none)."""

    __slots__ = ("kind", "mem_bytes", "mem_util", "pid", "sm")

    def __init__(self, pid: int, mem_bytes: Optional[int] = None, kind: str = "") -> None:
        self.pid, self.mem_bytes = pid, mem_bytes
        self.kind = kind  # "compute", "mps" (an MPS client), "" (seen only in utilisation)
        self.sm: Optional[float] = None
        self.mem_util: Optional[float] = None


class DeviceSample:
    """A whole GPU (``gi_id`` None) or a MIG device, its processes and DRAM bandwidth use."""

    __slots__ = ("bw_util", "gi_id", "gpu", "mig_profile", "procs", "util_measured", "uuid")

    def __init__(self, uuid: str, gpu: int, mig_profile: str = "",
                 gi_id: Optional[int] = None) -> None:
        self.uuid, self.gpu, self.mig_profile, self.gi_id = uuid, gpu, mig_profile, gi_id
        self.procs: dict[int, ProcSample] = {}
        self.bw_util: Optional[float] = None
        self.util_measured = False  # per-process SM/memory-controller time was read

    def counted(self) -> list[ProcSample]:
        """The processes whose figures are their own: where MPS clients are listed, the
        compute list holds their MPS server, whose figures are theirs (counted once)."""
        if any(proc.kind == "mps" for proc in self.procs.values()):
            return [proc for proc in self.procs.values() if proc.kind != "compute"]
        return list(self.procs.values())


class NvmlReader:
    """Reads the node's devices through ``nvml`` (pynvml or the simulator)."""

    def __init__(self, nvml: Any, settle: float = 0.1) -> None:
        self.nvml, self.settle = nvml, settle
        self.unsupported: set[str] = set()
        self._gpm: dict[str, Any] = {}  # device UUID -> its last GPM sample
        self._stamps: dict[str, int] = {}  # GPU UUID -> last utilisation time stamp

    def _try(self, name: str, *args: Any) -> Any:
        """Call ``nvml.<name>``; None (and the name recorded) when unsupported."""
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as err:
            if is_unsupported(self.nvml, err):
                self.unsupported.add(name)
            elif getattr(err, "value", None) != getattr(self.nvml, "NVML_ERROR_NOT_FOUND", -1):
                raise
            return None
        except AttributeError:  # a pynvml too old to know the call
            self.unsupported.add(name)
            return None

    def read(self) -> list[DeviceSample]:
        """Every GPU and MIG device with its processes and figures."""
        self.unsupported = set()
        devices: list[tuple[DeviceSample, Any, Any]] = []
        for index in range(self.nvml.nvmlDeviceGetCount()):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                mig = self.nvml.nvmlDeviceGetMigMode(handle)
            except self.nvml.NVMLError:  # a GPU without MIG: no figure is missing
                mig = None
            if mig and mig[0]:
                devices.extend(self._migs(index, handle))
            else:
                sample = DeviceSample(text(self.nvml.nvmlDeviceGetUUID(handle)), index)
                devices.append((sample, handle, None))
        for sample, handle, parent in devices:
            self._processes(sample, handle)
            if parent is None:
                self._utilisation(sample, handle)
        self._bandwidth(devices)
        return [sample for sample, _handle, _parent in devices]

    def _migs(self, index: int, parent: Any) -> list[tuple[DeviceSample, Any, Any]]:
        found = []
        for slot in range(self.nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
            try:
                handle = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, slot)
            except self.nvml.NVMLError:
                continue  # an empty slot
            name = text(self.nvml.nvmlDeviceGetName(handle))
            profile = name.rsplit(" MIG ", 1)[-1] if " MIG " in name else name
            gi_id = int(self.nvml.nvmlDeviceGetGpuInstanceId(handle))
            found.append((DeviceSample(text(self.nvml.nvmlDeviceGetUUID(handle)), index,
                                       profile, gi_id), handle, parent))
        return found

    def _processes(self, sample: DeviceSample, handle: Any) -> None:
        # Under MPS the compute list holds the MPS server, the MPS list its clients.
        for name, kind in (("nvmlDeviceGetComputeRunningProcesses", "compute"),
                           ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "mps")):
            for proc in self._try(name, handle) or ():
                if sample.gi_id is None and getattr(proc, "gpuInstanceId", 0xFFFFFFFF) \
                        not in (0xFFFFFFFF, None):
                    continue  # a MIG slice's process, counted on the slice
                used = getattr(proc, "usedGpuMemory", None)
                sample.procs[int(proc.pid)] = ProcSample(
                    int(proc.pid), None if used is None else int(used), kind)

    def _utilisation(self, sample: DeviceSample, handle: Any) -> None:
        if "nvmlDeviceGetProcessesUtilizationInfo" in self.unsupported:
            return
        try:
            infos = self.nvml.nvmlDeviceGetProcessesUtilizationInfo(
                handle, self._stamps.get(sample.uuid, 0))
        except self.nvml.NVMLError as err:
            if is_unsupported(self.nvml, err):
                self.unsupported.add("nvmlDeviceGetProcessesUtilizationInfo")
            else:  # NOT_FOUND: no process ran in the period
                sample.util_measured = True
            return
        except AttributeError:
            self.unsupported.add("nvmlDeviceGetProcessesUtilizationInfo")
            return
        sample.util_measured = True
        for info in infos:
            self._stamps[sample.uuid] = max(self._stamps.get(sample.uuid, 0),
                                            int(info.timeStamp))
            proc = sample.procs.setdefault(int(info.pid), ProcSample(int(info.pid)))
            # Several samples of one process in the period: its latest counts.
            proc.sm, proc.mem_util = float(info.smUtil), float(info.memUtil)

    def _gpm_sample(self, sample: DeviceSample, parent: Any, handle: Any) -> Any:
        gpm = self._try("nvmlGpmSampleAlloc")
        if gpm is None:
            return None
        if parent is None:
            got = self._try("nvmlGpmSampleGet", handle, gpm)
        else:
            got = self._try("nvmlGpmMigSampleGet", parent, sample.gi_id, gpm)
        if got is None:
            self._try("nvmlGpmSampleFree", gpm)
        return got

    def _bandwidth(self, devices: list[tuple[DeviceSample, Any, Any]]) -> None:
        present = {sample.uuid for sample, _h, _p in devices}
        for gone in set(self._gpm) - present:  # a MIG layout changed under the loop
            self._try("nvmlGpmSampleFree", self._gpm.pop(gone))
        capable = []
        for sample, handle, parent in devices:
            support = self._try("nvmlGpmQueryDeviceSupport", parent or handle)
            if support is None or not support.isSupportedDevice:
                self.unsupported.add("nvmlGpmQueryDeviceSupport")
                continue
            capable.append((sample, handle, parent))
        if any(sample.uuid not in self._gpm for sample, _h, _p in capable):
            for sample, handle, parent in capable:
                if sample.uuid not in self._gpm:
                    first = self._gpm_sample(sample, parent, handle)
                    if first is not None:
                        self._gpm[sample.uuid] = first
            time.sleep(self.settle)
        for sample, handle, parent in capable:
            before = self._gpm.pop(sample.uuid, None)
            after = self._gpm_sample(sample, parent, handle)
            if before is None or after is None:
                continue
            sample.bw_util = self._dram_bw(before, after)
            self._try("nvmlGpmSampleFree", before)
            self._gpm[sample.uuid] = after

    def _dram_bw(self, before: Any, after: Any) -> Optional[float]:
        request = self.nvml.c_nvmlGpmMetricsGet_t()
        request.version = self.nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = before, after
        request.metrics[0].metricId = self.nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        if self._try("nvmlGpmMetricsGet", request) is None:
            return None
        metric = request.metrics[0]
        if metric.nvmlReturn != 0:
            self.unsupported.add("nvmlGpmMetricsGet")
            return None
        return max(0.0, min(100.0, float(metric.value)))

    def close(self) -> None:
        for gpm in self._gpm.values():
            self._try("nvmlGpmSampleFree", gpm)
        self._gpm.clear()
