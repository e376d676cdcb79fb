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
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from gpushare.admin.plan.lending import Device
from gpushare.admin.relayout.journal import MAX_BYTES, JournalError, _dir_fd, open_beside
from gpushare.admin.tidal.moves import K8S, SLURM, STEPS
from gpushare.common import safefs

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
    directory, name = os.path.split(os.path.abspath(journal.path))
    dir_fd = _dir_fd(directory)
    try:
        if not journal.open_moves:
            safefs.remove_file_at(dir_fd, name)
            return
        safefs.write_file_atomic_at(dir_fd, name, _dump(journal).encode(), 0o600,
                                    exact_mode=True)
    finally:
        os.close(dir_fd)


def _get(raw: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = raw.get(key)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise JournalError(f"{where}: {key} must be {kind.__name__}")
    return value


def _move(item: Any, where: str) -> MoveEntry:
    if not isinstance(item, dict):
        raise JournalError(f"{where}: each move must be a mapping")
    step = _get(item, "step", str, where)
    started = item.get("started")
    for value in (step, started):
        if value is not None and value not in STEPS:
            raise JournalError(f"{where}: step {value!r} is not one of {', '.join(STEPS)}")
    source, target = _get(item, "source", str, where), _get(item, "target", str, where)
    if {source, target} != {K8S, SLURM}:
        raise JournalError(f"{where}: a move goes between {K8S} and {SLURM}")
    device = Device(_get(item, "node", str, where), _get(item, "gpu", int, where),
                    _get(item, "slice", int, where))
    return MoveEntry(device, _get(item, "rule", str, where), source, target,
                     _get(item, "reclaim", bool, where), step, started)


def parse_journal(text: str, path: str) -> TidalJournal:
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise JournalError(f"{path}: not JSON: {err}") from None
    if not isinstance(raw, dict) or raw.get("version") != JOURNAL_VERSION:
        raise JournalError(f"{path}: not a tidal journal of version {JOURNAL_VERSION}")
    moves = raw.get("moves")
    if not isinstance(moves, list):
        raise JournalError(f"{path}: moves must be a list")
    return TidalJournal(path, [_move(item, f"{path}: move {n + 1}")
                               for n, item in enumerate(moves)])


def load_journal(state_path: str) -> Optional[TidalJournal]:
    """The journal an earlier run left, or None."""
    path = state_path + ".journal"
    try:
        fd = open_beside(path, os.O_RDONLY, create=False)
    except FileNotFoundError:
        return None
    try:
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        raise JournalError(f"{path}: larger than {MAX_BYTES} bytes")
    return parse_journal(data.decode("utf-8", "replace"), path)
