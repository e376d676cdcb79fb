# SPDX-License-Identifier: GPL-2.0-or-later
"""When work Slurm borrowed must be gone by (``admin/tidal/reservation.py``): a window's
end, a demand's promise from now, whichever comes first; and the reservation's name."""

from __future__ import annotations

import datetime

from gpushare.admin.plan.lending import Demand, Device, LendingRule, Window
from gpushare.admin.tidal.reservation import borrowed_until, reservation_name, window_end


def rule(window=None, demand=None, reclaim: int = 30) -> LendingRule:
    return LendingRule("r", "kubernetes", "slurm", (Device("h1", 0),), window, demand, 1,
                       reclaim, ("batch",), "", 1)


AT = datetime.datetime(2026, 12, 5, 22, 10, 42)
NIGHT = Window(20 * 60, 8 * 60)


def test_a_window_ends_the_next_morning():
    assert window_end(AT, 8 * 60) == datetime.datetime(2026, 12, 6, 8, 0)
    assert window_end(AT, 23 * 60) == datetime.datetime(2026, 12, 5, 23, 0)
    assert borrowed_until(rule(window=NIGHT), AT) == datetime.datetime(2026, 12, 6, 8, 0)


def test_a_demand_bounds_borrowed_work_by_its_promise_from_now():
    assert borrowed_until(rule(demand=Demand(10, 30), reclaim=45), AT) == \
        datetime.datetime(2026, 12, 5, 22, 55)
    # with both, whichever comes first: the promise at night, the window's end near it
    both = rule(window=NIGHT, demand=Demand(10, 30), reclaim=45)
    assert borrowed_until(both, AT) == datetime.datetime(2026, 12, 5, 22, 55)
    assert borrowed_until(both, datetime.datetime(2026, 12, 6, 7, 50)) == \
        datetime.datetime(2026, 12, 6, 8, 0)


def test_names_are_slurm_reservation_names():
    assert reservation_name("gpu-node.3") == "gpushare_tidal_gpu_node_3"
