# SPDX-License-Identifier: GPL-2.0-or-later
"""The prolog's and epilog's timing line: where a worker's time went."""

import re

import pytest

from gpushare.node import phases as phases_mod
from gpushare.node.phases import Phases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(phases_mod.time, "monotonic", fake)
    return fake


def test_phases_charge_the_time_since_the_last_checkpoint(clock):
    phases = Phases(imports=0.004)
    clock.now += 0.010
    phases.done("verify")
    clock.now += 0.002
    phases.done("mps")
    clock.now += 0.003
    phases.done("verify")  # a repeated name adds up
    assert phases.spent == pytest.approx({"imports": 0.004, "verify": 0.013, "mps": 0.002})
    assert phases.line() == "timing imports=4.0 verify=13.0 mps=2.0 total=15.0"


def test_phases_without_imports_report_only_what_was_timed(clock):
    phases = Phases()
    clock.now += 0.0005
    phases.done("record")
    assert phases.line() == "timing record=0.5 total=0.5"


def test_the_line_is_what_bench_prolog_parses():
    line = Phases(imports=0.001).line()
    assert re.fullmatch(r"timing( [a-z.-]+=\d+\.\d)+", line)
