# SPDX-License-Identifier: GPL-2.0-or-later
"""The tidal journal keeps each move's step across a crash and refuses what it cannot use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpushare.admin.plan.lending import Device
from gpushare.admin.relayout.journal import JournalError
from gpushare.admin.tidal.journal import MoveEntry, TidalJournal, load_journal, parse_journal
from gpushare.admin.tidal.moves import K8S, SLURM, recover


def test_a_move_survives_a_crash_and_the_journal_goes_once_done(tmp_path: Path) -> None:
    state = str(tmp_path / "tidal-state.json")
    journal = TidalJournal(state + ".journal")
    move = MoveEntry(Device("n1", 0, 2), "night", K8S, SLURM, reclaim=False)
    journal.moves.append(move)
    journal.mark(move, step="fenced")
    journal.mark(move, started="released")
    again = load_journal(state)
    assert again is not None and again.moves == [move]
    left = again.moves[0]
    assert recover(left.step, left.reclaim, left.started).action == "undo"
    again.mark(left, step="done")
    assert load_journal(state) is None
    assert not os.path.exists(state + ".journal")


@pytest.mark.parametrize("text,message", [
    ("{", "not JSON"),
    ('{"version": 2, "moves": []}', "version 1"),
    ('{"version": 1, "moves": {}}', "moves must be a list"),
    ('{"version": 1, "moves": [{"node": "n1", "gpu": 0, "slice": -1, "rule": "r", '
     '"source": "slurm", "target": "slurm", "reclaim": false, "step": "planned"}]}',
     "between"),
    ('{"version": 1, "moves": [{"node": "n1", "gpu": 0, "slice": -1, "rule": "r", '
     '"source": "slurm", "target": "kubernetes", "reclaim": false, "step": "drained"}]}',
     "not one of"),
    ('{"version": 1, "moves": [{"node": "n1", "gpu": true, "slice": -1, "rule": "r", '
     '"source": "slurm", "target": "kubernetes", "reclaim": false, "step": "planned"}]}',
     "gpu must be int"),
])
def test_a_bad_journal_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(JournalError, match=message):
        parse_journal(text, "j")


def test_a_symlinked_journal_is_refused(tmp_path: Path) -> None:
    state = str(tmp_path / "tidal-state.json")
    os.symlink(str(tmp_path / "elsewhere"), state + ".journal")
    with pytest.raises(JournalError, match="symbolic link"):
        load_journal(state)
