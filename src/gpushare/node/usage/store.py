# SPDX-License-Identifier: GPL-2.0-or-later
"""What each job uses of its GPUs, as the node's sampler last saw it: typed, versioned files.

The sampler (``gpushare usage``) writes, every interval, one file per running job,
``<state_dir>/usage/<job_id>.json``, and one for the node, ``<state_dir>/usage/node.json``.
``gpushare job``, ``gpushare mps``, ``gpushare metrics`` and the job's epilog read them;
nothing else writes them. The directory is root's (checked on every open, as the job
records' are), the files 0644 and replaced atomically: any user may read a job's figures,
as any user may read ``squeue``; none can plant or change them.

Each figure carries how it was obtained, because NVML gives some only on some drivers
and GPUs, and nothing gives a per-client bandwidth figure under MPS:

* ``measured``: NVML reports it for the job's own processes;
* ``estimated``: derived, e.g. the GPU's or GI's DRAM bandwidth (GPM) split by the clients'
  memory-controller time;
* ``unavailable``: the driver did not support a call it needs (the call is named in
  ``unsupported``).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from gpushare.common import safefs
from gpushare.node.state import USAGE_DIR

__all__ = [
    "QUALITIES",
    "USAGE_VERSION",
    "DeviceUsage",
    "Figures",
    "JobUsage",
    "NodeUsage",
    "UsageStore",
]

USAGE_VERSION = 1
QUALITIES = ("measured", "estimated", "unavailable")
NODE_FILE = "node.json"
_JOB_FILE = re.compile(r"([0-9]+)\.json\Z")


def _quality(value: Any, where: str) -> str:
    if value not in QUALITIES:
        raise ValueError(f"{where}: quality {value!r} is not one of {', '.join(QUALITIES)}")
    return str(value)


def _number(value: Any, where: str) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{where}: {value!r} is not a number >= 0 or null")
    return float(value)


class Figures:
    """One sample of a job's (or a device's) use: SM %, device memory in bytes, and its
    share of the device's DRAM bandwidth in % of the device's peak; None where unknown."""

    __slots__ = ("bw_pct", "mem_bytes", "sm_pct")

    def __init__(self, sm_pct: Optional[float] = None, mem_bytes: Optional[int] = None,
                 bw_pct: Optional[float] = None) -> None:
        self.sm_pct, self.mem_bytes, self.bw_pct = sm_pct, mem_bytes, bw_pct

    def to_dict(self) -> dict[str, Any]:
        return {"sm_pct": self.sm_pct, "mem_bytes": self.mem_bytes, "bw_pct": self.bw_pct}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> Figures:
        mem = _number(data.get("mem_bytes"), f"{where}.mem_bytes")
        return cls(_number(data.get("sm_pct"), f"{where}.sm_pct"),
                   None if mem is None else int(mem),
                   _number(data.get("bw_pct"), f"{where}.bw_pct"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Figures) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


class JobUsage:
    """One job's use of its GPUs or MIG slices on this node, now and since it started.

    ``devices``: ``{"uuid", "gpu" (NVML index of the GPU), "mig_profile" ("" for a whole
    GPU), "share" (the job's MPS share in %, None when not shared)}``. ``quality`` maps
    ``sm``, ``mem`` and ``bw`` to one of QUALITIES. Means are over ``samples``.
    """

    FIELDS = ("version", "job_id", "uid", "user", "devices", "first", "updated", "interval",
              "now", "peak_mem_bytes", "samples", "sm_sum", "bw_sum", "quality",
              "unsupported", "processes")
    __slots__ = FIELDS

    def __init__(self, job_id: int, uid: int, user: str, devices: list[dict[str, Any]],
                 first: float, updated: float, interval: float,
                 now: Optional[Figures] = None, peak_mem_bytes: int = 0, samples: int = 0,
                 sm_sum: float = 0.0, bw_sum: float = 0.0,
                 quality: Optional[dict[str, str]] = None,
                 unsupported: Optional[list[str]] = None, processes: int = 0,
                 version: int = USAGE_VERSION) -> None:
        self.version, self.job_id, self.uid, self.user = version, job_id, uid, user
        self.devices = list(devices)
        self.first, self.updated, self.interval = first, updated, interval
        self.now = now or Figures()
        self.peak_mem_bytes, self.samples = peak_mem_bytes, samples
        self.sm_sum, self.bw_sum = sm_sum, bw_sum
        self.quality = dict(quality or {"sm": "unavailable", "mem": "unavailable",
                                        "bw": "unavailable"})
        self.unsupported = list(unsupported or ())
        self.processes = processes

    def add(self, figures: Figures, when: float) -> None:
        """Fold one sample in: now, peak memory, the sums behind the means."""
        self.now = figures
        self.updated = when
        self.samples += 1
        self.sm_sum += figures.sm_pct or 0.0
        self.bw_sum += figures.bw_pct or 0.0
        self.peak_mem_bytes = max(self.peak_mem_bytes, figures.mem_bytes or 0)

    @property
    def mean_sm_pct(self) -> Optional[float]:
        return self.sm_sum / self.samples if self.samples else None

    @property
    def mean_bw_pct(self) -> Optional[float]:
        return self.bw_sum / self.samples if self.samples else None

    def to_dict(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.FIELDS}
        data["now"] = self.now.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobUsage:
        where = f"usage of job {data.get('job_id')!r}"
        if data.get("version") != USAGE_VERSION:
            raise ValueError(f"{where}: version {data.get('version')!r}, this gpushare reads "
                             f"{USAGE_VERSION}")
        quality = data.get("quality") or {}
        return cls(int(data["job_id"]), int(data["uid"]), str(data["user"]),
                   list(data["devices"]), float(data["first"]), float(data["updated"]),
                   float(data["interval"]),
                   Figures.from_dict(data.get("now") or {}, f"{where}.now"),
                   int(data.get("peak_mem_bytes") or 0), int(data.get("samples") or 0),
                   float(data.get("sm_sum") or 0.0), float(data.get("bw_sum") or 0.0),
                   {key: _quality(quality.get(key, "unavailable"), f"{where}.quality.{key}")
                    for key in ("sm", "mem", "bw")},
                   [str(call) for call in data.get("unsupported") or ()],
                   int(data.get("processes") or 0))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobUsage) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


class DeviceUsage:
    """One GPU or MIG GPU instance as the sampler saw it: its DRAM bandwidth use in % of
    peak (GPM), the jobs on it, and the job named as its bandwidth hog (None when none:
    ``{"job_id", "user", "since", "bw_pct", "advice"}``). ``above_since``: since when its
    bandwidth use has stayed above the hog threshold (None when below; absent from files of
    earlier samplers)."""

    FIELDS = ("uuid", "gpu", "mig_profile", "bw_util_pct", "bw_quality", "job_ids", "hog",
              "above_since")
    __slots__ = FIELDS

    def __init__(self, uuid: str, gpu: int, mig_profile: str, bw_util_pct: Optional[float],
                 bw_quality: str, job_ids: list[int],
                 hog: Optional[dict[str, Any]] = None,
                 above_since: Optional[float] = None) -> None:
        self.uuid, self.gpu, self.mig_profile = uuid, gpu, mig_profile
        self.bw_util_pct, self.bw_quality = bw_util_pct, bw_quality
        self.job_ids, self.hog = list(job_ids), hog
        self.above_since = above_since

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeviceUsage:
        where = f"usage of device {data.get('uuid')!r}"
        return cls(str(data["uuid"]), int(data["gpu"]), str(data.get("mig_profile") or ""),
                   _number(data.get("bw_util_pct"), f"{where}.bw_util_pct"),
                   _quality(data.get("bw_quality", "unavailable"), f"{where}.bw_quality"),
                   [int(job) for job in data.get("job_ids") or ()], data.get("hog"),
                   _number(data.get("above_since"), f"{where}.above_since"))


class NodeUsage:
    """The node's last sampling round: when, how often, its devices, and the NVML calls
    the driver did not support."""

    __slots__ = ("devices", "interval", "unsupported", "updated", "version")

    def __init__(self, updated: float, interval: float, devices: list[DeviceUsage],
                 unsupported: Optional[list[str]] = None,
                 version: int = USAGE_VERSION) -> None:
        self.version, self.updated, self.interval = version, updated, interval
        self.devices, self.unsupported = list(devices), list(unsupported or ())

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "updated": self.updated, "interval": self.interval,
                "devices": [device.to_dict() for device in self.devices],
                "unsupported": self.unsupported}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeUsage:
        if data.get("version") != USAGE_VERSION:
            raise ValueError(f"node usage: version {data.get('version')!r}, this gpushare "
                             f"reads {USAGE_VERSION}")
        return cls(float(data["updated"]), float(data["interval"]),
                   [DeviceUsage.from_dict(d) for d in data.get("devices") or ()],
                   [str(call) for call in data.get("unsupported") or ()])


class UsageStore:
    """``<state_dir>/usage``: read by anyone, written by root's sampler only."""

    def __init__(self, state_dir: str) -> None:
        self.directory = os.path.join(state_dir, USAGE_DIR)

    def _open(self, create: bool) -> Optional[int]:
        try:
            return safefs.open_root_dir(self.directory, create=create)
        except FileNotFoundError:
            return None

    def _read(self, name: str) -> Optional[dict[str, Any]]:
        fd = self._open(create=False)
        if fd is None:
            return None
        try:
            raw = safefs.read_small_file_at(fd, name)
        finally:
            os.close(fd)
        if raw is None:
            return None
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError(f"{self.directory}/{name} is not a JSON object")
        return data

    def _write(self, name: str, data: dict[str, Any]) -> None:
        fd = self._open(create=True)
        assert fd is not None
        try:
            safefs.write_file_atomic_at(fd, name, json.dumps(data, sort_keys=True).encode(),
                                        0o644, exact_mode=True)
        finally:
            os.close(fd)

    def write_job(self, usage: JobUsage) -> None:
        self._write(f"{usage.job_id}.json", usage.to_dict())

    def read_job(self, job_id: int) -> Optional[JobUsage]:
        """The job's figures; None when the sampler has none (yet, or any more)."""
        data = self._read(f"{job_id}.json")
        return None if data is None else JobUsage.from_dict(data)

    def job_ids(self) -> list[int]:
        fd = self._open(create=False)
        if fd is None:
            return []
        try:
            names = os.listdir(fd)
        finally:
            os.close(fd)
        return sorted(int(m.group(1)) for m in map(_JOB_FILE.match, names) if m)

    def read_all(self) -> dict[int, JobUsage]:
        """Every job's figures; a file that vanished between listing and reading (its job
        ended) is skipped."""
        found = {}
        for job_id in self.job_ids():
            usage = self.read_job(job_id)
            if usage is not None:
                found[job_id] = usage
        return found

    def remove_job(self, job_id: int) -> bool:
        fd = self._open(create=False)
        if fd is None:
            return False
        try:
            return safefs.remove_file_at(fd, f"{job_id}.json")
        finally:
            os.close(fd)

    def write_node(self, node: NodeUsage) -> None:
        self._write(NODE_FILE, node.to_dict())

    def read_node(self) -> Optional[NodeUsage]:
        data = self._read(NODE_FILE)
        return None if data is None else NodeUsage.from_dict(data)
