# SPDX-License-Identifier: GPL-2.0-or-later
"""No Slurm job outlives what a rule promised its home side: a maintenance reservation.

While a node holds a device lent to Slurm, the node carries a reservation
``gpushare_tidal_<node>`` that starts at the earliest time borrowed work must be gone by:
the end of a rule's window, and for a rule with a demand ``reclaim_minutes`` from now (set
again each round, so it moves with the clock: a job started now must end within the
promise, and a reclaim on demand finds the node's jobs gone within it). Slurm then starts
on the node only jobs whose time limit ends before it (the main scheduler and backfill both
honour a future reservation), so the reclaim drains an idle node and ends no job. Without a
time limit a job takes its partition's ``DefaultTime``/``MaxTime``; with neither it never
starts there while something is lent.

The reservation covers the whole node, not one GPU: Slurm has no per-GPU drain, so the
reclaim waits for every job of the node and every one must fit. It is removed once nothing
is lent to Slurm on the node.
"""

from __future__ import annotations

import datetime
import re
from typing import Optional, Protocol

from gpushare.admin.plan.lending import LendingRule
from gpushare.admin.slurm_client import SlurmClientError, run_slurm

__all__ = ["Reservations", "Scontrol", "borrowed_until", "reservation_name", "window_end"]

_NAME = re.compile(r"[^A-Za-z0-9_]")


class Reservations(Protocol):
    def set(self, name: str, node: str, start: datetime.datetime, minutes: int) -> None: ...

    def clear(self, name: str) -> None: ...


def reservation_name(node: str) -> str:
    return "gpushare_tidal_" + _NAME.sub("_", node)


def window_end(when: datetime.datetime, end_minute: int) -> datetime.datetime:
    """The next time of day ``end_minute`` at or after ``when`` (local time)."""
    end = when.replace(hour=end_minute // 60, minute=end_minute % 60, second=0,
                       microsecond=0)
    return end if end >= when else end + datetime.timedelta(days=1)


def borrowed_until(rule: LendingRule, when: datetime.datetime) -> Optional[datetime.datetime]:
    """When work Slurm borrowed under ``rule`` must be gone by, seen at ``when``: the
    window's end, or ``reclaim_minutes`` on for a demand, whichever comes first."""
    bounds = []
    if rule.window is not None:
        bounds.append(window_end(when, rule.window.end))
    if rule.demand is not None:
        bounds.append(when.replace(second=0, microsecond=0)
                      + datetime.timedelta(minutes=rule.reclaim_minutes))
    return min(bounds) if bounds else None


class Scontrol:
    """The reservation through scontrol (root, on the controller)."""

    def __init__(self, scontrol: str, timeout: float = 10.0) -> None:
        self.scontrol, self.timeout = scontrol, timeout

    def _show(self, name: str) -> Optional[str]:
        try:
            return run_slurm([self.scontrol, "-o", "show", "reservation", name], self.timeout)
        except SlurmClientError as err:
            if "not found" in str(err).lower() or "invalid reservation" in str(err).lower():
                return None
            raise

    def set(self, name: str, node: str, start: datetime.datetime, minutes: int) -> None:
        fields = [f"StartTime={start:%Y-%m-%dT%H:%M:%S}", f"Duration={max(1, minutes)}",
                  f"Nodes={node}"]
        shown = self._show(name)
        if shown is not None and f"StartTime={start:%Y-%m-%dT%H:%M:%S}" in shown:
            return
        if shown is None:
            run_slurm([self.scontrol, "create", "reservation", f"ReservationName={name}", *fields,
                  "Users=root", "Flags=MAINT,IGNORE_JOBS"], self.timeout)
        else:
            run_slurm([self.scontrol, "update", f"ReservationName={name}", *fields], self.timeout)

    def clear(self, name: str) -> None:
        if self._show(name) is not None:
            run_slurm([self.scontrol, "delete", f"ReservationName={name}"], self.timeout)
