# SPDX-License-Identifier: GPL-2.0-or-later
"""The prolog's and epilog's timing line: where a worker's time went."""

import os
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


@pytest.fixture
def fresh_deadline(monkeypatch):
    monkeypatch.setattr(phases_mod, "_deadline", None)
    monkeypatch.setattr(phases_mod, "_board", None)
    yield
    if phases_mod._board is not None:
        os.close(phases_mod._board)


def test_a_worker_says_what_it_does_at_the_start_of_the_board(tmp_path, fresh_deadline):
    board = tmp_path / "7.lock"
    board.write_bytes(b"")
    phases_mod.start(30.0, str(board))
    phases_mod.doing("waiting for epilogs on GPU 0,1")
    phases_mod.doing("starting or joining the MPS daemon")
    text = board.read_bytes()
    assert len(text) == phases_mod.BOARD_SIZE
    assert text.rstrip(b" ") == b"starting or joining the MPS daemon"
    phases_mod.doing("x" * 500)  # cut, never past the board
    assert board.read_bytes() == b"x" * phases_mod.BOARD_SIZE


def test_a_board_that_is_a_link_or_not_a_file_is_never_written(tmp_path, fresh_deadline):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    link = tmp_path / "7.lock"
    link.symlink_to(target)
    phases_mod.start(30.0, str(link))
    phases_mod.doing("starting")
    assert target.read_bytes() == b"keep"
    phases_mod.start(30.0, str(tmp_path))  # a directory
    phases_mod.doing("starting")
    phases_mod.start(30.0, str(tmp_path / "missing"))
    phases_mod.doing("starting")


def test_waits_end_at_the_workers_deadline(clock, fresh_deadline):
    assert phases_mod.time_left(60.0) == 60.0  # no deadline: the wait's own bound
    phases_mod.start(10.0)
    clock.now += 4.0
    assert phases_mod.time_left(60.0) == pytest.approx(6.0)
    assert phases_mod.time_left(2.0) == 2.0
    clock.now += 7.0
    assert phases_mod.time_left(60.0) == 0.0
