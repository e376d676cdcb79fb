# SPDX-License-Identifier: GPL-2.0-or-later
"""The journal of ``gpushare tidal --apply``'s moves, so a run killed midway leaves each
move at a known step for the next run to finish or undo (``moves.recover``).

It lies beside the tidal state file as ``<state>.journal``, written in one rename after
every step and removed once every move is done; it is opened the way relayout's journal is
(no symlink followed, a root-owned directory for root, a plain file of the caller's own).

Format (version 1)::

    {"version": 1, "moves": [{"node": "n1", "gpu": 0, "slice": -1, "rule": "night",
      "source": "kubernetes", "target": "slurm", "reclaim": false,
      "step": "fenced", "started": "released"}]}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from gpushare.admin.plan.lending import Device
from gpushare.admin.relayout.journal import (
    JournalError,
    read_beside,
    typed_field,
    write_beside,
)
from gpushare.admin.tidal.moves import K8S, SLURM, STEPS
from gpushare.common.versioned import versioned_json

__all__ = ["JOURNAL_VERSION", "MoveEntry", "TidalJournal", "load_journal", "parse_journal",
           "save_journal"]

JOURNAL_VERSION = 1


@dataclass
class MoveEntry:
    device: Device
    rule: str
    source: str
    target: str
    reclaim: bool
    step: str = "planned"
    started: Optional[str] = None  # a step that began and has not reported


@dataclass
class TidalJournal:
    path: str
    moves: list[MoveEntry] = field(default_factory=list)

    def mark(self, move: MoveEntry, step: Optional[str] = None,
             started: Optional[str] = None) -> None:
        """Record that ``started`` began, or that ``step`` ended, before going on."""
        if step is not None:
            move.step, move.started = step, None
        if started is not None:
            move.started = started
        save_journal(self)

    @property
    def open_moves(self) -> list[MoveEntry]:
        return [move for move in self.moves if move.step != "done"]


def _dump(journal: TidalJournal) -> str:
    return json.dumps({"version": JOURNAL_VERSION, "moves": [
        {"node": m.device.node, "gpu": m.device.gpu, "slice": m.device.slice, "rule": m.rule,
         "source": m.source, "target": m.target, "reclaim": m.reclaim, "step": m.step,
         "started": m.started} for m in journal.moves]}, indent=1) + "\n"


def save_journal(journal: TidalJournal) -> None:
    """Write the journal in one rename; once every move is done, remove it."""
    write_beside(journal.path, _dump(journal) if journal.open_moves else None)


def _move(item: Any, where: str) -> MoveEntry:
    if not isinstance(item, dict):
        raise JournalError(f"{where}: each move must be a mapping")
    step = typed_field(item, "step", str, where)
    started = item.get("started")
    for value in (step, started):
        if value is not None and value not in STEPS:
            raise JournalError(f"{where}: step {value!r} is not one of {', '.join(STEPS)}")
    source = typed_field(item, "source", str, where)
    target = typed_field(item, "target", str, where)
    if {source, target} != {K8S, SLURM}:
        raise JournalError(f"{where}: a move goes between {K8S} and {SLURM}")
    device = Device(typed_field(item, "node", str, where), typed_field(item, "gpu", int, where),
                    typed_field(item, "slice", int, where))
    return MoveEntry(device, typed_field(item, "rule", str, where), source, target,
                     typed_field(item, "reclaim", bool, where), step, started)


def parse_journal(text: str, path: str) -> TidalJournal:
    raw = versioned_json(text, path, "tidal journal", JOURNAL_VERSION, JournalError)
    moves = raw.get("moves")
    if not isinstance(moves, list):
        raise JournalError(f"{path}: moves must be a list")
    return TidalJournal(path, [_move(item, f"{path}: move {n + 1}")
                               for n, item in enumerate(moves)])


def load_journal(state_path: str) -> Optional[TidalJournal]:
    """The journal an earlier run left, or None."""
    path = state_path + ".journal"
    text = read_beside(path)
    return None if text is None else parse_journal(text, path)
