# SPDX-License-Identifier: GPL-2.0-or-later
"""One sampling round: what each running job uses of its GPUs and MIG slices, written
through ``UsageStore``, then the hog check and dcgm-exporter's mapping files.

A job's figures sum its processes on each device (processes are charged by
``attribution``) and average over its devices: SM % and memory-controller time from NVML's
per-process utilisation (measured; not given on MIG devices), device memory from the
process lists (measured), and its bandwidth share, the device's GPM DRAM bandwidth split by
the processes' memory-controller time: measured where the job is alone on the device,
estimated where it shares it. Under MPS the compute list holds the MPS server, whose
figures are its clients'; where a device lists MPS clients, only they count.
"""

from __future__ import annotations

import pwd
import time
from typing import Any, Callable, NamedTuple, Optional

from gpushare.common import log
from gpushare.node.state import JobStore, StateError
from gpushare.node.usage import hog
from gpushare.node.usage.attribution import Attributor, JobInfo
from gpushare.node.usage.dcgm import mapping_files, write_mapping
from gpushare.node.usage.nvmlread import DeviceSample, NvmlReader
from gpushare.node.usage.store import DeviceUsage, Figures, JobUsage, NodeUsage, UsageStore

__all__ = ["Sampler", "UsageSettings", "bandwidth_shares", "known_jobs"]

_log = log.get_logger("gpushare.usage")


class UsageSettings(NamedTuple):
    """The sampler's plugstack settings (``usage_*``, ``hog_*``, ``dcgm_*``)."""

    interval: float = 10.0
    hog_bw_pct: float = 80.0
    hog_seconds: float = 60.0
    dcgm_mapping_dir: str = ""
    dcgm_mapping_names: str = "index"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def known_jobs(store: JobStore) -> dict[int, JobInfo]:
    """The jobs with a gpushare record on this node (shared or MPS over whole GPUs)."""
    jobs = {}
    for job_id in store.job_ids():
        try:
            record = store.read(job_id)
        except (StateError, KeyError, TypeError, ValueError) as err:  # one bad record
            _log.warning("gpushare: usage: job %s: its record cannot be read: %s", job_id, err)
            continue
        if record is None or record.mode == "error":
            continue
        share = record.share_percent if record.mode == "shared" else None
        devices = [{"uuid": str(d.get("uuid", "")), "gpu": int(d.get("gpu_index", 0)),
                    "mig_profile": str(d.get("profile", "")), "share": share}
                   for d in record.devices]
        pipe = str((record.mps or {}).get("pipe_dir", ""))
        jobs[job_id] = JobInfo(job_id, record.uid, _user(record.uid), devices, pipe)
    return jobs


def bandwidth_shares(sample: DeviceSample, mem_util: dict[int, float],
                     alone: bool = False) -> Optional[dict[int, float]]:
    """Key (job, or pid) -> its share of the device's DRAM bandwidth in % of peak: the
    GPM figure split by memory-controller time, all of it to a key ``alone`` on the
    device; None when there is nothing to split, or nothing to split it by."""
    if sample.bw_util is None or not mem_util:
        return None
    if alone:
        return {key: sample.bw_util for key in mem_util}
    total = sum(p.mem_util or 0.0 for p in sample.counted())
    if total <= 0 or not sample.util_measured:
        return None
    return {key: sample.bw_util * util / total for key, util in mem_util.items()}


class _Tally:
    """One job's processes on one device."""

    __slots__ = ("mem", "mem_util", "procs", "sm")

    def __init__(self) -> None:
        self.mem: Optional[int] = None
        self.sm: Optional[float] = None
        self.mem_util = 0.0
        self.procs = 0


class Sampler:
    """Samples the node every round; keeps GPM samples between rounds of a loop."""

    def __init__(self, state_dir: str, nvml: Any, settings: UsageSettings,
                 proc_root: str = "/proc", clock: Callable[[], float] = time.time,
                 settle: float = 0.1, cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.jobs_store, self.store = JobStore(state_dir), UsageStore(state_dir)
        self.reader = NvmlReader(nvml, settle)
        self.settings, self.proc_root, self.clock = settings, proc_root, clock
        self.cgroup_root = cgroup_root

    def round(self) -> NodeUsage:
        jobs = known_jobs(self.jobs_store)
        running = set(jobs) | set(self.jobs_store.leftover_ids())
        samples = self.reader.read()
        now = self.clock()
        attributor = Attributor(jobs, self.proc_root, self.cgroup_root)
        tallies = self._attribute(samples, attributor, jobs)
        running |= {job for per_job in tallies.values() for job in per_job}
        previous = self.store.read_all()
        for job_id in sorted(set(previous) - running):
            self.store.remove_job(job_id)
        shares = self._shares(samples, tallies)
        for job_id, job in sorted(jobs.items()):
            usage = self._job_usage(job, previous.get(job_id), samples, tallies, shares, now)
            self.store.write_job(usage)
        node = self._node_usage(samples, tallies, jobs, shares, now)
        self.store.write_node(node)
        if self.settings.dcgm_mapping_dir:
            write_mapping(self.settings.dcgm_mapping_dir, mapping_files(
                [(s.uuid, s.gpu, s.gi_id, node_dev.job_ids)
                 for s, node_dev in zip(samples, node.devices)],
                self.settings.dcgm_mapping_names))
        return node

    def _attribute(self, samples: list[DeviceSample], attributor: Attributor,
                   jobs: dict[int, JobInfo]) -> dict[str, dict[int, _Tally]]:
        """Device UUID -> job -> its processes' figures; a job without a record that
        the kernel's cgroups show on a device joins ``jobs``."""
        tallies: dict[str, dict[int, _Tally]] = {}
        for sample in samples:
            per_job = tallies.setdefault(sample.uuid, {})
            for proc in sample.counted():
                job_id = attributor.job_of(proc.pid, sample.uuid)
                if job_id is None:
                    continue
                if job_id not in jobs:
                    uid = attributor.owner(proc.pid)
                    if uid is None:
                        continue
                    jobs[job_id] = JobInfo(job_id, uid, _user(uid), [], "")
                job = jobs[job_id]
                if not job.holds(sample.uuid):
                    job.devices.append({"uuid": sample.uuid, "gpu": sample.gpu,
                                        "mig_profile": sample.mig_profile, "share": None})
                tally = per_job.setdefault(job_id, _Tally())
                tally.procs += 1
                if proc.mem_bytes is not None:
                    tally.mem = (tally.mem or 0) + proc.mem_bytes
                if proc.sm is not None:
                    tally.sm = (tally.sm or 0.0) + proc.sm
                tally.mem_util += proc.mem_util or 0.0
        return tallies

    @staticmethod
    def _shares(samples: list[DeviceSample],
                tallies: dict[str, dict[int, _Tally]]) -> dict[str, dict[int, float]]:
        """Device UUID -> job -> its share of the device's DRAM bandwidth, in % of peak."""
        shares: dict[str, dict[int, float]] = {}
        for sample in samples:
            per_job = tallies.get(sample.uuid, {})
            alone = len(per_job) == 1 and \
                len(sample.counted()) == sum(t.procs for t in per_job.values())
            split = bandwidth_shares(sample, {job: t.mem_util for job, t in per_job.items()},
                                     alone)
            if split is not None:
                shares[sample.uuid] = split
        return shares

    def _job_usage(self, job: JobInfo, before: Optional[JobUsage], samples: list[DeviceSample],
                   tallies: dict[str, dict[int, _Tally]],
                   shares: dict[str, dict[int, float]], now: float) -> JobUsage:
        by_uuid = {s.uuid: s for s in samples}
        mine = [by_uuid[d["uuid"]] for d in job.devices if d["uuid"] in by_uuid]
        usage = before if before is not None and before.uid == job.uid else JobUsage(
            job.job_id, job.uid, job.user, job.devices, now, now, self.settings.interval)
        usage.devices, usage.interval = list(job.devices), self.settings.interval
        usage.unsupported = sorted(self.reader.unsupported)
        tallies_of = [tallies.get(s.uuid, {}).get(job.job_id) for s in mine]
        usage.processes = sum(t.procs for t in tallies_of if t)
        sm_ok = bool(mine) and all(s.util_measured for s in mine)
        sm = [(t.sm or 0.0) if t else 0.0 for t in tallies_of]
        mem = sum((t.mem or 0) for t in tallies_of if t)
        mem_ok = bool(mine) and "nvmlDeviceGetMPSComputeRunningProcesses_v3" not in \
            self.reader.unsupported
        bw: list[float] = []
        quality = "unavailable"
        for sample in mine:
            share = shares.get(sample.uuid)
            if sample.bw_util is None or (share is None and tallies.get(sample.uuid)):
                bw = []
                break
            bw.append(share.get(job.job_id, 0.0) if share else 0.0)
            alone = share is not None and len(share) == 1 and job.job_id in share
            quality = "measured" if alone and quality != "estimated" else "estimated"
        figures = Figures(sum(sm) / len(sm) if sm_ok and sm else None,
                          mem if mem_ok else None,
                          sum(bw) / len(bw) if bw else None)
        usage.quality = {"sm": "measured" if sm_ok else "unavailable",
                         "mem": "measured" if mem_ok else "unavailable",
                         "bw": quality if bw else "unavailable"}
        usage.add(figures, now)
        return usage

    def _node_usage(self, samples: list[DeviceSample], tallies: dict[str, dict[int, _Tally]],
                    jobs: dict[int, JobInfo], shares: dict[str, dict[int, float]],
                    now: float) -> NodeUsage:
        before = self.store.read_node()
        previous = {d.uuid: d for d in before.devices} if before else {}
        users = {job_id: job.user for job_id, job in jobs.items()}
        remedy = hog.advice([s.mig_profile for s in samples if s.mig_profile])
        devices = []
        for sample in samples:
            on = sorted({job_id for job_id, job in jobs.items() if job.holds(sample.uuid)}
                        | set(tallies.get(sample.uuid, {})))
            device = DeviceUsage(sample.uuid, sample.gpu, sample.mig_profile, sample.bw_util,
                                 "measured" if sample.bw_util is not None else "unavailable",
                                 on)
            line = hog.judge(device, previous.get(sample.uuid), shares.get(sample.uuid, {}),
                             users, now, self.settings.hog_bw_pct, self.settings.hog_seconds,
                             remedy)
            if line:
                _log.warning("%s", line)
            devices.append(device)
        return NodeUsage(now, self.settings.interval, devices, sorted(self.reader.unsupported))
