# SPDX-License-Identifier: GPL-2.0-or-later
"""What MIG and MPS jobs used: the floor under each kind that no change may cross.

The forecast that guards a change (``predict``) sees the live queue and the last hour's
submissions; it cannot see a kind's demand that comes back later (an inference peak the
next morning), and a GPU changed to whole for the jobs waiting now may be held by them for
hours when it does. So a change may not leave a MIG profile or MPS with fewer slices (MPS:
units) than its floor: what its jobs held at once at any time in the last ``--keep-hours``
(``sacct``'s Start and End of every job, running ones too), but never more than the plan's
own layouts give it (what it would have with no relayout), nor fewer than it has where it
has fewer than that already. Demand no larger than the last hours saw finds as many slices
of its kind as it needs, up to what it would have without relayout (slices on a node
drained for a change aside); relayout still takes what a kind left idle all that time,
gives any kind more, and takes back what it gave. Whole GPUs have no
floor: whole-GPU jobs are guarded by the forecast's rule that they wait no longer on
average.

MPS units have a second floor. Slurm gives an idle GPU with MPS units whole to a whole-GPU
job, so a node that gains whole GPUs beside its MPS GPUs lets requests of several whole
GPUs fit there and hold its MPS GPUs for hours: while MPS jobs held units within the window,
no change adds a whole GPU to a node with MPS GPUs (:func:`exposes_mps`).

Where the history cannot be read, each MIG profile and MPS keeps what the plan gives it
(:func:`unknown`): no kind is left with less than it would have without relayout. So does a
kind the history cannot show (its jobs are not in sacct's ``ReqTRES``: ``tres.untracked``),
beside the others' floors from the history. And so does every kind while the history does
not reach back to the window's start (:func:`reaches`: no job started before it): on a
cluster whose accounting is younger than the window, a kind whose jobs come once a day (a
night of inference, an evening of sweeps) has not shown its demand yet, and an empty hour
of history is no evidence that a kind's slices may go. Whole GPUs may still go to any kind
meanwhile, and the slices a change gave a kind beyond the plan's may come back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from gpushare.admin.relayout import DEFAULT_KEEP_H
from gpushare.admin.relayout.menu import Layout

__all__ = ["DEFAULT_KEEP_H", "Floors", "Span", "capacity", "exposes_mps", "floors", "reaches",
           "short", "unknown"]


@dataclass(frozen=True)
class Span:
    """One job's hold on one kind: ``units`` from ``start`` to ``end`` (seconds on any one
    clock; ``end`` None while it runs)."""

    start: float
    end: Optional[float]
    kind: str
    units: int


@dataclass(frozen=True)
class Floors:
    """Each kind's floor and where it came from, for the decision's explanation."""

    by_kind: Mapping[str, int]
    source: str  # "the last 24 h of sacct", or why it could not be read
    known: bool = True  # False: the history could not be read; the floors are the plan's
    unseen: tuple[str, ...] = ()  # kinds the history cannot show: they keep the plan's
    unseen_why: str = ""
    # Each kind's floor with whole GPUs' too, what a change back to the plan aims at
    # (``restore``); None: ``by_kind`` and no whole GPU.
    wanted: Optional[Mapping[str, int]] = None

    def line(self) -> str:
        """The floors in words: one line of the decision's why."""
        if not self.known:
            return ("kept: every MIG profile and MPS keeps what the plan's layouts give it "
                    f"({_listed(self.by_kind) or 'none'}): {self.source}")
        seen = {kind: n for kind, n in self.by_kind.items() if kind not in self.unseen}
        line = ("kept: no change leaves a MIG profile or MPS with fewer than its jobs held "
                f"at once in {self.source}, up to what the plan's layouts give it "
                f"({_listed(seen) or 'none held'})")
        if self.unseen:
            unseen = {kind: self.by_kind.get(kind, 0) for kind in self.unseen}
            line += (f"; {_listed(unseen) or ', '.join(self.unseen)} as the plan gives them: "
                     f"{self.unseen_why}")
        return line


def _listed(by_kind: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(by_kind.items()) if n)


def _kept(kind: str) -> bool:
    return kind != "whole"


def floors(spans: Iterable[Span], now: float, window_s: float,
           baseline: Optional[Mapping[str, int]] = None, whole: bool = False
           ) -> dict[str, int]:
    """The most units of each MIG profile and of MPS (``whole``: and of whole GPUs, what a
    change back to the plan aims at, ``restore``) that ``spans`` held at once between
    ``now - window_s`` and ``now`` (a span that began before the window counts for what it
    held within it; one still running, until now), each at most what ``baseline`` gives
    it."""
    since = now - window_s
    marks: dict[str, list[tuple[float, int]]] = {}
    for span in spans:
        end = now if span.end is None else min(span.end, now)
        if not (whole or _kept(span.kind)) or span.units <= 0 or end <= since or span.start >= now \
                or end <= span.start:
            continue
        kind_marks = marks.setdefault(span.kind, [])
        kind_marks.append((max(span.start, since), span.units))
        kind_marks.append((end, -span.units))
    peaks: dict[str, int] = {}
    for kind, kind_marks in marks.items():
        kind_marks.sort()  # at one instant an end (negative) comes before a start
        level = peak = 0
        for _, delta in kind_marks:
            level += delta
            peak = max(peak, level)
        peaks[kind] = peak if baseline is None else min(peak, baseline.get(kind, 0))
    return peaks


def capacity(layouts: Iterable[Layout]) -> dict[str, int]:
    """The slices (MPS: units) of each kind that GPUs in ``layouts`` offer Slurm."""
    total: dict[str, int] = {}
    for layout in layouts:
        for kind, count in layout.offers().items():
            total[kind] = total.get(kind, 0) + count
    return total


def short(before: Mapping[str, int], after: Mapping[str, int], floor: Mapping[str, int]
          ) -> list[str]:
    """Why ``after`` crosses a floor that ``before`` kept, kind by kind ([] for none): a
    kind may fall to its floor, never under it, nor under what it has where that is less."""
    problems = []
    for kind, kept in sorted(floor.items()):
        has, would = before.get(kind, 0), after.get(kind, 0)
        if would < min(has, kept):
            problems.append(f"{kind} would keep {would} of its {has}, under its floor {kept}")
    return problems


def exposes_mps(floor: Mapping[str, int], layout: Layout, beside: Iterable[Layout]) -> bool:
    """Whether changing a GPU to ``layout`` on a node whose GPUs are laid out as ``beside``
    adds a whole GPU next to MPS GPUs while MPS has a floor."""
    return floor.get("mps", 0) > 0 and "whole" in layout.offers() and \
        any(other.mps for other in beside)


def reaches(spans: Iterable[Span], since: float) -> bool:
    """Whether the history reaches back to ``since``: a job in it started at or before."""
    return any(span.start <= since for span in spans)


def unknown(baseline: Mapping[str, int]) -> dict[str, int]:
    """Floors where the history could not be read: each MIG profile and MPS keeps what the
    plan's layouts give it (``baseline``)."""
    return {kind: n for kind, n in baseline.items() if _kept(kind)}
