# SPDX-License-Identifier: GPL-2.0-or-later
"""Would relayout have helped this site? Its own history, replayed as the benchmark replays
its corpus (``gpushare relayout --trial``, bench/bench_relayout.py).

The benchmark's "never worse" is a claim about workloads that were not this site's. A site
can check it on its own: the history is cut in two at its middle submission; the second half
is replayed from a start layout left alone and with relayout's rounds every 5 minutes (the
decision ``gpushare relayout`` makes, the first half as its past: its submissions in the
first rounds' lookback, what its jobs held for the floors), and the two are compared on
every job of that half. The starts: the plan's layouts, and the best static layout for the
first half (what ``--suggest`` would have proposed then, so it never sees the half it is
judged on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Optional, Sequence

from gpushare.admin.relayout.keep import Span
from gpushare.admin.relayout.menu import Layout
from gpushare.admin.relayout.predict import DEFAULT_LIMIT_S
from gpushare.admin.relayout.sim import Cluster, Job, Result, simulate
from gpushare.admin.relayout.static import best_static, even_split, spread

__all__ = ["Start", "Trial", "halves", "middle", "own_limit", "past_holds", "ratio",
           "replay_halves", "shifted", "times", "trial"]


def middle(jobs: Sequence[Job]) -> float:
    """Where a history is cut in two: half its last submission's time (its first is 0)."""
    return max((j.submit for j in jobs), default=0.0) / 2


def shifted(jobs: Sequence[Job], at: float) -> list[Job]:
    """``jobs`` on the clock of the half that starts at ``at`` (earlier ones before 0)."""
    return [replace(j, submit=j.submit - at, start=None, node=-1, held=[]) for j in jobs]


def halves(jobs: Sequence[Job]) -> tuple[list[Job], list[Job]]:
    """The jobs submitted in the first and in the second half of the history; the second
    half's times start at 0."""
    cut = middle(jobs)
    return ([j for j in jobs if j.submit < cut],
            shifted([j for j in jobs if j.submit >= cut], cut))


def past_holds(first: list[Job], cut: float, start: list[list[Layout]], cluster: Cluster
               ) -> list[Span]:
    """What the first half's jobs held, replayed with no change from ``start``, on the
    second half's clock (before 0): the site's sacct when the second half begins."""
    replay = simulate(first, start, False, cluster)
    by_id = {job.id: job for job in first}
    spans = []
    for ident, kind, wait, _ in replay.finished:
        job = by_id[ident]
        begin = job.submit + wait - cut
        if begin < 0:
            spans.append(Span(begin, min(begin + job.run, 0.0), kind, job.count))
    return spans


def own_limit(job: Job) -> float:
    """A job's own time limit (sacct's Timelimit), all that relayout's forecast knows of its
    run; one without (UNLIMITED) runs ``DEFAULT_LIMIT_S`` there, as in a live round."""
    return job.limit if job.limit is not None else DEFAULT_LIMIT_S


def replay_halves(jobs: list[Job], cluster: Cluster, keep_s: float,
                  start: Optional[list[list[Layout]]] = None,
                  limit: Callable[[Job], float] = own_limit, max_changes: int = 4,
                  hysteresis: float = 0.5) -> tuple[list[Job], list[Job], Result, Result]:
    """(first half, second half, left alone, relayout): the second half replayed from
    ``start`` (default: the even split of the menu), relayout with the first half as its
    past (``keep_s``: how far back its floors look; 0: none); ``limit``, each job's time
    limit as the rounds see it."""
    first, second = halves(jobs)
    cut = middle(jobs)
    start = start or spread(even_split(cluster), cluster)
    still = simulate(second, start, False, cluster)
    before = past_holds(first, cut, start, cluster) if keep_s else []
    moved = simulate(second, start, True, cluster, max_changes=max_changes,
                     hysteresis=hysteresis, keep_s=keep_s, history=before,
                     earlier=shifted(first, cut), limit=limit)
    return first, second, still, moved


def ratio(after: float, before: float) -> float:
    """after / before, rounded up to a thousandth so that a loss never reads as 1.000;
    1.0 where both are 0, infinity where only ``after`` is."""
    if not before:
        return 1.0 if not after else math.inf
    return math.ceil(after / before * 1000) / 1000


def times(value: float) -> str:
    """A :func:`ratio` as the trial and the benchmark print it: ``x0.954``."""
    return "more (from 0)" if math.isinf(value) else f"x{value:.3f}"


@dataclass(frozen=True)
class Start:
    """One start layout's replays: ``still`` left alone, ``moved`` with relayout."""

    label: str
    still: Result
    moved: Result

    def ratios(self) -> dict[str, float]:
        """Relayout over left alone: MIG and MPS jobs' mean wait, every job's, and the mean
        completion time (a job not started by the replay's cut counted with its wait until
        then, so starving a kind shows)."""
        return {"mig_wait": ratio(self.moved.censored_wait("mig"),
                                   self.still.censored_wait("mig")),
                "wait": ratio(self.moved.censored_wait(), self.still.censored_wait()),
                "completion": ratio(self.moved.censored_jct(), self.still.censored_jct())}

    def no_worse(self) -> bool:
        """The benchmark's goal: no ratio above 1 and no more jobs left unstarted."""
        return all(value <= 1.0 for value in self.ratios().values()) \
            and len(self.moved.unstarted) <= len(self.still.unstarted)


@dataclass(frozen=True)
class Trial:
    first: int  # jobs the static layout was learned on
    second: int  # jobs replayed
    hours: float  # the replayed half's span of submissions
    learned: dict[str, int]  # the first half's best static layout, GPUs per layout
    starts: tuple[Start, ...]

    def no_harm(self) -> bool:
        return all(start.no_worse() for start in self.starts)


def trial(jobs: list[Job], cluster: Cluster, plan_layouts: Optional[list[list[Layout]]],
          keep_s: float, max_changes: int = 4, hysteresis: float = 0.5,
          limit: Callable[[Job], float] = own_limit) -> Trial:
    """Relayout on the second half of ``jobs`` from the plan's layouts (where the plan gives
    the group's GPUs one) and from the first half's best static layout, each against the
    same start left alone. ValueError where a half has no job."""
    first, second = halves(jobs)
    if not first or not second:
        raise ValueError("the history needs GPU jobs in both of its halves (the first to "
                         "learn from, the second to replay); give a longer one")
    learned, _ = best_static(first, cluster)
    candidates = [("the plan's layouts", plan_layouts)] if plan_layouts else []
    candidates.append(("the first half's best static layout", spread(learned, cluster)))
    starts = []
    for label, layouts in candidates:
        assert layouts is not None
        _, _, still, moved = replay_halves(jobs, cluster, keep_s, layouts, limit,
                                           max_changes, hysteresis)
        starts.append(Start(label, still, moved))
    return Trial(len(first), len(second), max((j.submit for j in second), default=0.0) / 3600,
                 {name: n for name, n in learned.items() if n}, tuple(starts))
