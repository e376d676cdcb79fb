# SPDX-License-Identifier: GPL-2.0-or-later
"""Per-job GPU use in ``gpushare metrics``, from the node's usage sampler.

These are the only series labelled by job. The label values stay bounded: a series exists
only for a job the sampler saw running within two intervals (its file goes when the job
ends, and a stale one is dropped here), so a node shows at most its running jobs, and each
series is gone within one interval of the job's end. The labels are the job, its user, the
GPUs or MIG slices it uses and its share, plus how the figure was obtained.
"""

from __future__ import annotations

from typing import Optional

from gpushare.admin.metrics import PREFIX, Family, Sample
from gpushare.node.usage.store import JobUsage, NodeUsage
from gpushare.node.usage.view import fresh

__all__ = ["usage_families"]


def _job_labels(node: str, usage: JobUsage) -> tuple[tuple[str, str], ...]:
    devices = usage.devices
    shares = {d.get("share") for d in devices}
    share = next(iter(shares)) if len(shares) == 1 else None
    return (("node", node), ("job", str(usage.job_id)), ("user", usage.user),
            ("gpu", ",".join(str(d.get("gpu", "")) for d in devices)),
            ("uuid", ",".join(str(d.get("uuid", "")) for d in devices)),
            ("mig_profile", ",".join(sorted({str(d.get("mig_profile") or "")
                                             for d in devices}))),
            ("share", "" if share is None else str(share)))


def usage_families(usages: dict[int, JobUsage], node_usage: Optional[NodeUsage], node: str,
                   now: float) -> list[Family]:
    """The per-job and per-device families; empty when the sampler does not run."""
    jobs = [u for _job, u in sorted(usages.items()) if fresh(u.updated, u.interval, now)]
    samples: dict[str, list[Sample]] = {"sm": [], "mem": [], "peak": [], "bw": []}
    for usage in jobs:
        labels = _job_labels(node, usage)
        q = usage.quality
        if usage.now.sm_pct is not None:
            samples["sm"].append(Sample("", (*labels, ("quality", q["sm"])), usage.now.sm_pct))
        if usage.now.mem_bytes is not None:
            samples["mem"].append(Sample("", (*labels, ("quality", q["mem"])),
                                         float(usage.now.mem_bytes)))
        samples["peak"].append(Sample("", labels, float(usage.peak_mem_bytes)))
        if usage.now.bw_pct is not None:
            samples["bw"].append(Sample("", (*labels, ("quality", q["bw"])), usage.now.bw_pct))
    families = [
        Family(PREFIX + "job_sm_percent", "gauge", "SM use of a running job's processes on "
               "its GPUs or MIG slices, in percent", samples["sm"]),
        Family(PREFIX + "job_memory_bytes", "gauge", "Device memory a running job's "
               "processes hold", samples["mem"]),
        Family(PREFIX + "job_memory_peak_bytes", "gauge", "The most device memory a running "
               "job's processes held since it started", samples["peak"]),
        Family(PREFIX + "job_dram_bw_share_percent", "gauge", "A running job's share of its "
               "GPU's or MIG slice's DRAM bandwidth, in percent of the device's peak "
               "(estimated under MPS: the device's GPM figure split by memory-controller "
               "time)", samples["bw"]),
    ]
    device_bw: list[Sample] = []
    hogs: list[Sample] = []
    if node_usage is not None and fresh(node_usage.updated, node_usage.interval, now):
        for device in node_usage.devices:
            labels = (("node", node), ("gpu", str(device.gpu)), ("uuid", device.uuid),
                      ("mig_profile", device.mig_profile))
            if device.bw_util_pct is not None:
                device_bw.append(Sample("", (*labels, ("quality", device.bw_quality)),
                                        device.bw_util_pct))
            if device.hog:
                hogs.append(Sample("", (*labels, ("job", str(device.hog.get("job_id", ""))),
                                        ("user", str(device.hog.get("user", "")))), 1.0))
    families.append(Family(PREFIX + "device_dram_bw_percent", "gauge", "DRAM bandwidth use "
                           "of a GPU or MIG slice (GPM), in percent of its peak", device_bw))
    families.append(Family(PREFIX + "hog", "gauge", "1 for the job named as a shared "
                           "device's bandwidth hog: its bandwidth stayed above hog_bw_pct= for "
                           "hog_seconds=, and this job takes the largest share", hogs))
    return families
