# SPDX-License-Identifier: GPL-2.0-or-later
"""A lending rule's choice each round: lend inside its window or after the home side's
idle time, never what the home side needs, reclaim at the window's end or on demand."""

from __future__ import annotations

from gpushare.admin.plan import parse_plan
from gpushare.admin.tidal.decide import (
    HomeUse,
    RuleState,
    decide,
    decide_why,
    fits,
    lend_until,
)

PLAN = """version: 1
slurm: {version: "24.11"}
node_groups:
  - name: infer
    nodes: k[1-2]
    gpu_model: a100-40gb
    gpus: 4
    layout:
      all: {owner: kubernetes}
lending:
  - name: night
    home: kubernetes
    nodes: k[1-2]
    gpus: all
    window: {from: "20:00", to: "08:00"}
    max_lent: 6
    reclaim_minutes: 30
    borrowers: [batch]
  - name: idle
    home: kubernetes
    nodes: k1
    gpus: 0
    demand: {idle_below_percent: 50, for_minutes: 30}
    reclaim_minutes: 10
    borrowers: [batch]
"""


def rules():
    plan = parse_plan(PLAN.replace("    gpus: all\n    window", "    gpus: 1-3\n    window"))
    return plan.lending


def test_a_window_lends_what_the_home_side_does_not_need_up_to_max_lent():
    night = rules()[0]
    moves = decide(night, 22 * 60, 0.0, HomeUse(needs=1), frozenset(), RuleState())
    assert len(moves) == 5  # 6 devices, the home side needs 1: 5 lent (max_lent 6)
    assert all(m.to == "slurm" and m.why.startswith("lent: in its window 20:00-08:00")
               for m in moves)
    busy = frozenset(night.devices[:2])
    moves = decide(night, 22 * 60, 0.0, HomeUse(needs=2, busy=busy), frozenset(), RuleState())
    assert {m.device for m in moves}.isdisjoint(busy) and len(moves) == 4
    assert decide(night, 12 * 60, 0.0, HomeUse(needs=0), frozenset(), RuleState()) == []


def test_no_new_lending_within_the_reclaim_time_of_the_windows_end():
    night = rules()[0]
    assert lend_until(night, 7 * 60 + 40) == 20
    assert decide(night, 7 * 60 + 40, 0.0, HomeUse(needs=0), frozenset(), RuleState()) == []
    assert len(decide(night, 7 * 60, 0.0, HomeUse(needs=0), frozenset(), RuleState())) == 6


def test_the_windows_end_reclaims_all_and_a_rising_demand_its_shortfall():
    night = rules()[0]
    lent = frozenset(night.devices[:4])
    moves = decide(night, 8 * 60, 0.0, HomeUse(needs=0), lent, RuleState())
    assert {m.device for m in moves} == lent and all(m.to == "kubernetes" for m in moves)
    assert moves[0].why.startswith("reclaimed: outside its window")
    # A window's devices stay lent until it ends, whatever the home side needs meanwhile.
    assert decide(night, 23 * 60, 0.0, HomeUse(needs=4), lent, RuleState()) == []


def test_demand_lends_only_after_the_home_side_stayed_idle_long_enough():
    idle = rules()[1]
    state = RuleState()
    assert decide(idle, 0, 0.0, HomeUse(needs=0), frozenset(), state) == []
    assert state.idle_since == 0.0
    assert decide(idle, 0, 29.0, HomeUse(needs=0), frozenset(), state) == []
    (move,) = decide(idle, 0, 30.0, HomeUse(needs=0), frozenset(), state)
    assert move.why == "lent: kubernetes under 50 % for 30+ min"
    # Busy again: the timer restarts, and what is lent comes back.
    (back,) = decide(idle, 0, 31.0, HomeUse(needs=1), frozenset({move.device}), state)
    assert back.to == "kubernetes" and state.idle_since is None


def test_lent_devices_take_only_work_that_is_gone_by_the_reclaim():
    night, idle = rules()
    assert fits(night, 22 * 60, 10 * 60) and not fits(night, 22 * 60, 10 * 60 + 1)
    assert fits(idle, 0, 10) and not fits(idle, 0, 11)  # demand: within reclaim_minutes


def test_no_move_comes_with_the_reason_of_the_same_choice():
    night = rules()[0]
    lent = frozenset(night.devices)

    def why(minute, use, lent_now=frozenset()):
        moves, reason = decide_why(night, minute, 0.0, use, lent_now, RuleState())
        assert moves == [] and reason
        return reason

    assert why(12 * 60, HomeUse(needs=0)) == "outside its window 20:00-08:00"
    assert "ends in 20 min" in why(7 * 60 + 40, HomeUse(needs=0))
    assert why(22 * 60, HomeUse(needs=0), lent) == "6 lent, its max_lent"
    assert why(22 * 60, HomeUse(needs=6)) == "kubernetes needs 6 of the 6 at home: none to spare"
    # Room to lend, but every device it could spare holds the home side's work.
    assert why(22 * 60, HomeUse(needs=2, busy=frozenset(night.devices))) == \
        "the 4 kubernetes could spare hold its work"
    moves, reason = decide_why(night, 22 * 60, 0.0, HomeUse(needs=1), frozenset(), RuleState())
    assert len(moves) == 5 and reason == ""
