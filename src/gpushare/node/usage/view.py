# SPDX-License-Identifier: GPL-2.0-or-later
"""How a job's GPU use reads, wherever it is shown: ``gpushare job``, ``gpushare mps``,
the metrics and the line the epilog leaves in the job's AdminComment.

A sample older than two intervals is stale: the sampler stopped, or the job's processes
left the GPU. Views drop stale figures rather than show them as current.
"""

from __future__ import annotations

from typing import Optional

from gpushare.node.usage.store import DeviceUsage, JobUsage, NodeUsage

__all__ = ["NOT_SAMPLED", "compact", "fresh", "hog_lines", "job_rows", "short",
           "summary_line"]

NOT_SAMPLED = ("not sampled: the node runs no usage sampler (systemctl enable --now "
               "gpushare-usage.service, docs/admin.md)")
STALE_INTERVALS = 2.0
SUMMARY_LIMIT = 240  # characters of AdminComment the summary may take


def fresh(updated: float, interval: float, now: float) -> bool:
    """Whether a sample taken at ``updated`` is still current at ``now``."""
    return now - updated <= STALE_INTERVALS * max(interval, 1.0)


def _size(value: Optional[float]) -> str:
    if value is None:
        return "?"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def _pct(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.0f} %"


def _figure(value: str, quality: str) -> str:
    return "unavailable (the driver does not report it)" if quality == "unavailable" \
        else f"{value} ({quality})"


def job_rows(usage: Optional[JobUsage], now: float) -> list[tuple[str, str]]:
    """``(name, value)`` rows of a job's use: now (unless stale), peak and means."""
    if usage is None:
        return [("GPU use", NOT_SAMPLED)]
    age = max(0.0, now - usage.updated)
    q = usage.quality
    rows = []
    if fresh(usage.updated, usage.interval, now):
        rows.append(("GPU use now", f"SM {_figure(_pct(usage.now.sm_pct), q['sm'])}, "
                     f"memory {_figure(_size(usage.now.mem_bytes), q['mem'])}, "
                     f"bandwidth share {_figure(_pct(usage.now.bw_pct), q['bw'])}; "
                     f"sampled {age:.0f} s ago"))
    else:
        rows.append(("GPU use now", f"stale: last sampled {age:.0f} s ago, every "
                     f"{usage.interval:g} s (is gpushare-usage.service running?)"))
    rows.append(("GPU use so far", f"peak memory {_size(usage.peak_mem_bytes)}, mean SM "
                 f"{_pct(usage.mean_sm_pct)}, mean bandwidth share {_pct(usage.mean_bw_pct)} "
                 f"over {usage.samples} sample(s)"))
    if usage.unsupported:
        rows.append(("not reported", "the driver does not support "
                     + ", ".join(sorted(set(usage.unsupported)))))
    return rows


def compact(value: Optional[float], percent: bool = False) -> str:
    """A size (or, with ``percent``, a percentage) for a table cell, without spaces."""
    return (_pct(value) if percent else _size(value)).replace(" ", "")


def short(usage: Optional[JobUsage], now: float) -> str:
    """A table cell: ``SM 40% 2.1GiB bw 12%``, or ``-`` without a current sample."""
    if usage is None or not fresh(usage.updated, usage.interval, now):
        return "-"
    return (f"SM {compact(usage.now.sm_pct, True)} {compact(usage.now.mem_bytes)} "
            f"bw {compact(usage.now.bw_pct, True)}")


def summary_line(usage: JobUsage) -> str:
    """The job's use at its end, one bounded line for AdminComment and slurmd's log."""
    line = (f"gpushare: GPU peak memory {_size(usage.peak_mem_bytes)}, mean SM "
            f"{_pct(usage.mean_sm_pct)} ({usage.quality['sm']}), mean bandwidth share "
            f"{_pct(usage.mean_bw_pct)} ({usage.quality['bw']}), {usage.samples} samples")
    return line[:SUMMARY_LIMIT]


def _device_name(device: DeviceUsage) -> str:
    return f"GPU {device.gpu}" + (f" MIG {device.mig_profile}" if device.mig_profile else "")


def hog_lines(node: Optional[NodeUsage], now: float) -> list[str]:
    """One line per device whose bandwidth hog the sampler names now."""
    if node is None or not fresh(node.updated, node.interval, now):
        return []
    lines = []
    for device in node.devices:
        hog = device.hog
        if not hog:
            continue
        since = hog.get("since")
        held = f" for {now - float(since):.0f} s" if isinstance(since, (int, float)) else ""
        lines.append(f"{_device_name(device)}: job {hog.get('job_id')} of "
                     f"{hog.get('user') or '?'} takes the largest share of its DRAM bandwidth "
                     f"({_pct(device.bw_util_pct)} used{held}); {hog.get('advice', '')}".rstrip(
                         "; "))
    return lines
