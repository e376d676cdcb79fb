# SPDX-License-Identifier: GPL-2.0-or-later
"""Naming the job that hogs a shared device's memory bandwidth, and saying what to do.

An MPS thread percentage caps SMs, not DRAM bandwidth: one bandwidth-bound client slows
every neighbour. When a device that several jobs share stays above ``threshold`` % of its
DRAM bandwidth (GPM) for ``hold`` seconds, the job with the largest share is named, in
the node's usage file and in a log line, with the one remedy the hardware offers: a MIG
slice, whose memory bandwidth is its own. It is cleared once use drops below the
threshold. Nothing is ever stopped or killed here.
"""

from __future__ import annotations

from typing import Optional

from gpushare.node.usage.store import DeviceUsage

__all__ = ["advice", "judge"]


def advice(mig_profiles: list[str]) -> str:
    """What to tell the hog's user: a MIG slice, by the profiles this node has."""
    if mig_profiles:
        asks = " or ".join(f"--gres=gpu:{profile}:1" for profile in sorted(set(mig_profiles)))
        return (f"an MPS share does not limit memory bandwidth; a MIG slice has its own: "
                f"submit it with {asks}")
    return ("an MPS share does not limit memory bandwidth; a MIG slice has its own: submit "
            "it with --gres=gpu:<MIG profile>:1 to a node with MIG slices, or alone on a GPU "
            "with --gres=gpu:1")


def judge(device: DeviceUsage, previous: Optional[DeviceUsage], shares: dict[int, float],
          users: dict[int, str], now: float, threshold: float, hold: float,
          remedy: str) -> Optional[str]:
    """Set ``device.above_since`` and ``device.hog`` from this round and the last; the
    log line to write when a hog is named or cleared, else None."""
    before = previous.hog if previous is not None else None
    shared = len(device.job_ids) >= 2
    if not shared or device.bw_util_pct is None or device.bw_util_pct < threshold:
        device.above_since, device.hog = None, None
        if before is None:
            return None
        return (f"gpushare: usage: {_where(device)}: job {before.get('job_id')} no longer "
                f"named as bandwidth hog (DRAM bandwidth "
                f"{_pct(device.bw_util_pct)} < {threshold:g}% or no longer shared)")
    since = previous.above_since if previous is not None and previous.above_since else now
    device.above_since = since
    if now - since < hold or not shares:
        device.hog = None
        return None
    job_id = max(sorted(shares), key=lambda job: shares[job])
    keep = before is not None and before.get("job_id") == job_id
    device.hog = {"job_id": job_id, "user": users.get(job_id, ""),
                  "since": before.get("since", now) if keep and before else now,
                  "bw_pct": round(shares[job_id], 1), "advice": remedy}
    if keep:
        return None
    return (f"gpushare: usage: {_where(device)}: job {job_id} ({users.get(job_id, '?')}) "
            f"is the bandwidth hog: {shares[job_id]:.0f}% of the device's DRAM bandwidth, "
            f"which has stayed at or above {threshold:g}% for {now - since:.0f}s; {remedy}")


def _where(device: DeviceUsage) -> str:
    slice_ = f" MIG {device.mig_profile}" if device.mig_profile else ""
    return f"GPU {device.gpu}{slice_} ({device.uuid})"


def _pct(value: Optional[float]) -> str:
    return "unknown" if value is None else f"{value:.0f}%"
