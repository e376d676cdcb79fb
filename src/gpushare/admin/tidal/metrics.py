# SPDX-License-Identifier: GPL-2.0-or-later
"""What ``gpushare tidal --apply`` has done, in Prometheus' text exposition format: GPU-hours
lent each way, reclaim latency, and moves refused by reason.

Label values are bounded: two directions and the fixed reason set below (the free-text
reason of each refusal goes to the log, not to a label).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from gpushare.admin.metrics import Family, Sample, render
from gpushare.admin.tidal.moves import K8S, SLURM

__all__ = ["REFUSALS", "TidalCounters", "families", "render_counters"]

PREFIX = "gpushare_tidal_"
# Why a move was refused: outside or near the end of its window, the home side's demand,
# the most lent at once, the device busy on the home side, or a step that failed.
REFUSALS = ("window", "demand", "max_lent", "busy", "failed")


@dataclass
class TidalCounters:
    """Totals kept across runs (the caller stores them beside the tidal state)."""

    lent_seconds: dict[str, float] = field(default_factory=lambda: {K8S: 0.0, SLURM: 0.0})
    reclaims: int = 0
    reclaim_seconds: float = 0.0
    reclaim_seconds_max: float = 0.0
    refused: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REFUSALS, 0))

    def lent(self, to: str, device_seconds: float) -> None:
        """``device_seconds`` more of devices lent to ``to`` (kubernetes or slurm)."""
        if to not in (K8S, SLURM):
            raise ValueError(f"lent to {to!r}: not {K8S} or {SLURM}")
        self.lent_seconds[to] += device_seconds

    def reclaimed(self, seconds: float) -> None:
        """One reclaim that took ``seconds`` from its decision to the device home."""
        self.reclaims += 1
        self.reclaim_seconds += seconds
        self.reclaim_seconds_max = max(self.reclaim_seconds_max, seconds)

    def refuse(self, reason: str) -> None:
        if reason not in REFUSALS:
            raise ValueError(f"refusal {reason!r}: not one of {', '.join(REFUSALS)}")
        self.refused[reason] += 1


def families(counters: TidalCounters, lent_now: Optional[dict[str, int]] = None
             ) -> list[Family]:
    lent = [Sample("", (("to", to),), counters.lent_seconds.get(to, 0.0) / 3600.0)
            for to in (K8S, SLURM)]
    return [
        Family(PREFIX + "lent_gpu_hours_total", "counter",
               "GPU-hours (a MIG slice counts as one device) lent to each scheduler", lent),
        Family(PREFIX + "reclaims_total", "counter", "Lent devices taken back home",
               [Sample("", (), counters.reclaims)]),
        Family(PREFIX + "reclaim_seconds_total", "counter",
               "Seconds from each reclaim's decision to the device being home, summed",
               [Sample("", (), counters.reclaim_seconds)]),
        Family(PREFIX + "reclaim_seconds_max", "gauge", "The longest reclaim so far",
               [Sample("", (), counters.reclaim_seconds_max)]),
        Family(PREFIX + "refused_moves_total", "counter", "Moves not made, by reason",
               [Sample("", (("reason", r),), counters.refused.get(r, 0)) for r in REFUSALS]),
    ] + ([Family(PREFIX + "lent_devices", "gauge", "Devices lent to each scheduler now",
                 [Sample("", (("to", to),), lent_now.get(to, 0)) for to in (K8S, SLURM)])]
         if lent_now is not None else [])


def render_counters(counters: TidalCounters, lent_now: Optional[dict[str, int]] = None) -> str:
    return render(families(counters, lent_now))
