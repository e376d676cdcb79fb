# SPDX-License-Identifier: GPL-2.0-or-later
"""A tidal move crashed at any step is finished or undone, and no step opens the device to
both schedulers."""

from __future__ import annotations

import itertools

import pytest

from gpushare.admin.tidal.moves import K8S, SLURM, STEPS, new_work_on, recover

PAIRS = ((K8S, SLURM), (SLURM, K8S))


@pytest.mark.parametrize("source,target", PAIRS)
def test_no_step_opens_the_device_to_both(source: str, target: str) -> None:
    for step in STEPS:
        assert len(new_work_on(source, target, step)) <= 1


@pytest.mark.parametrize("source,target", PAIRS)
def test_the_target_gets_work_only_after_the_source_is_fenced(source: str, target: str) -> None:
    seen_empty = False
    for step in STEPS:
        owners = new_work_on(source, target, step)
        seen_empty = seen_empty or not owners
        if target in owners:
            assert seen_empty


def _run(step: str, reclaim: bool, started: str | None) -> str:
    """Where the device ends after a crash at ``step`` and the next run's recovery."""
    choice = recover(step, reclaim, started)
    if choice.action == "none":
        return "target"
    return "target" if choice.action == "finish" else "source"


@pytest.mark.parametrize("step,reclaim,started", list(itertools.product(
    STEPS, (False, True), (None, *STEPS))))
def test_every_crashed_move_is_finished_or_undone(step: str, reclaim: bool,
                                                  started: str | None) -> None:
    choice = recover(step, reclaim, started)
    assert choice.action in ("finish", "undo", "none")
    committed = STEPS.index(step) >= STEPS.index("given") or started == "given"
    if committed or reclaim:
        assert _run(step, reclaim, started) == "target"
    else:
        assert _run(step, reclaim, started) == "source"


def test_an_unknown_step_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown step"):
        recover("drained", reclaim=False)
