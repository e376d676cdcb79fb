# SPDX-License-Identifier: GPL-2.0-or-later
"""A site's GPU job history from ``sacct``, as jobs the simulator (``sim``) replays.

``gpushare relayout --suggest`` replays it to propose the best static layout, and the
benchmark's converter writes it as a trace. Only what a replay needs is kept: when each job
was submitted, how long it ran, and what one node of it asked for (a MIG profile, whole
GPUs or MPS units); jobs that never started, and jobs asking for several GPU kinds at once,
are left out and counted. The guard's floors (``keep``) read what each started job held
from the same output, running jobs too, and whether accounting reaches back to the start of
their window, and the forecast (``predict``) the GPU jobs submitted in its lookback that
started: squeue forgets a job ``MinJobAge`` (300 s by default) after it ends, sacct does not.

sacct shows a job's GPUs only where slurmctld records them (``gpushare.admin.tres``).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Iterator, Optional

from gpushare.admin.relayout.decide import Request
from gpushare.admin.relayout.demand import parse_time_left
from gpushare.admin.relayout.keep import Span
from gpushare.admin.relayout.sim import Job
from gpushare.admin.tres import is_mig_profile

__all__ = ["SACCT_FIELDS", "History", "Window", "parse_sacct", "parse_spans",
           "parse_window", "read_sacct", "read_window", "sacct_argv", "started_before",
           "tres_request"]

SACCT_FIELDS = ("JobID", "Submit", "Start", "End", "ReqTRES", "User", "State", "Timelimit")
SACCT_RESOLUTION_S = 1.0  # sacct's times are whole seconds


@dataclass
class History:
    jobs: list[Job] = field(default_factory=list)
    start: Optional[datetime.datetime] = None  # the first submit: time 0 of the jobs
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many GPU jobs

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def sacct_argv(sacct: str, days: float, now: datetime.datetime) -> list[str]:
    """The sacct command for the last ``days`` days: every user's allocations, one line
    each, ``|``-separated with a header (absolute path: root never follows PATH)."""
    start = (now - datetime.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S")
    return [sacct, "--parsable2", "--allocations", "--allusers", "--starttime", start,
            "--endtime", now.strftime("%Y-%m-%dT%H:%M:%S"), "--format", ",".join(SACCT_FIELDS)]


def tres_request(tres: str) -> Optional[tuple[str, int]]:
    """``billing=2,cpu=2,gres/gpu:1g.10gb=4,gres/gpu=4,node=2`` -> ("1g.10gb", 2): the
    kind and units one node asks for; None without a GPU request; ValueError for several
    kinds at once."""
    nodes, untyped, mps = 1, 0, 0
    typed: dict[str, int] = {}
    for item in tres.split(","):
        name, _, value = item.strip().partition("=")
        count = _count(value)
        if count is None:
            continue
        if name == "node":
            nodes = max(count, 1)
        elif name == "gres/gpu":
            untyped = count
        elif name.startswith("gres/gpu:"):
            kind = name[len("gres/gpu:"):].lower()
            kind = kind if is_mig_profile(kind) else "whole"
            typed[kind] = typed.get(kind, 0) + count
        elif name == "gres/mps":
            mps = count
    kinds = dict(typed) or ({"whole": untyped} if untyped else {})
    if mps:
        kinds["mps"] = mps
    kinds = {kind: n for kind, n in kinds.items() if n > 0}
    if not kinds:
        return None
    if len(kinds) > 1:
        raise ValueError("several GPU kinds at once")
    kind, count = next(iter(kinds.items()))
    return kind, max(count // nodes, 1)


def _count(value: str) -> Optional[int]:
    value = value.strip()
    return int(value) if value.isdigit() else None


def _time(value: str) -> Optional[datetime.datetime]:
    try:
        return datetime.datetime.fromisoformat(value.strip())
    except ValueError:  # Unknown, None, empty: the job never started or has not ended
        return None


def _rows(text: str) -> Iterator[tuple[dict[str, str], Optional[tuple[str, int]], int]]:
    """Each line of ``sacct --parsable2`` output with a header naming at least Submit,
    Start, End and ReqTRES (or AllocTRES): its fields, its GPU request (kind, units on one
    node; None without one) and its node count (-1 where it asks for several GPU kinds at
    once); ValueError when the header lacks them."""
    lines = text.splitlines()
    if not any(line.strip() for line in lines):
        raise ValueError("the sacct output is empty: sacct printed not even its header, as it "
                         "does without slurmdbd (slurm.conf AccountingStorageType="
                         "accounting_storage/slurmdbd); sacct's own error went to stderr")
    header = lines[0].strip().split("|") if lines else []
    tres_field = "AllocTRES" if "AllocTRES" in header and "ReqTRES" not in header else "ReqTRES"
    missing = [f for f in ("Submit", "Start", "End", tres_field) if f not in header]
    if missing:
        raise ValueError("the sacct output has no " + ", ".join(missing) + " column; run "
                         "sacct --parsable2 --format " + ",".join(SACCT_FIELDS))
    for line in lines[1:]:
        if not line.strip():
            continue
        fields = dict(zip(header, line.rstrip("\n").split("|")))
        tres = fields.get(tres_field, "")
        try:
            yield fields, tres_request(tres), _nodes(tres)
        except ValueError:
            yield fields, None, -1


def _nodes(tres: str) -> int:
    for item in tres.split(","):
        name, _, value = item.strip().partition("=")
        if name == "node" and _count(value):
            return int(value)
    return 1


def parse_sacct(text: str) -> History:
    """Jobs from ``sacct --parsable2`` output with a header naming at least Submit, Start,
    End and ReqTRES (or AllocTRES), each with its Timelimit where the output has one;
    ValueError when the header lacks them."""
    history = History()
    rows = []
    for fields, request, nodes in _rows(text):
        if nodes < 0:
            history.skip("asks for several GPU kinds at once")
            continue
        if request is None:
            continue
        submit, start, end = (_time(fields.get(f, "")) for f in ("Submit", "Start", "End"))
        if submit is None or start is None:
            history.skip("never started")
            continue
        if end is None or end < start:
            history.skip("has not ended")
            continue
        rows.append((submit, (end - start).total_seconds(), request, fields.get("User", ""),
                     parse_time_left(fields.get("Timelimit", ""))))
    rows.sort(key=lambda row: row[0])
    if rows:
        history.start = rows[0][0]
    for number, (submit, run, (kind, count), user, limit) in enumerate(rows):
        assert history.start is not None
        history.jobs.append(Job(number, (submit - history.start).total_seconds(), run, kind,
                                count, user, limit=limit))
    return history


def _sacct_text(sacct: str, days: float, timeout: float, now: datetime.datetime) -> str:
    from gpushare.admin.slurm_client import SlurmClientError, run_slurm

    if not sacct.startswith("/"):
        raise SlurmClientError(f"{sacct}: give the Slurm command as an absolute path")
    return run_slurm(sacct_argv(sacct, days, now), timeout)


def read_sacct(sacct: str, days: float, timeout: float = 120.0,
               now: Optional[datetime.datetime] = None) -> History:
    """The last ``days`` days of GPU jobs, asked of slurmdbd through ``sacct`` (an absolute
    path); SlurmClientError says why it could not be read."""
    from gpushare.admin.slurm_client import SlurmClientError

    text = _sacct_text(sacct, days, timeout, now or datetime.datetime.now())
    try:
        return parse_sacct(text)
    except ValueError as err:
        raise SlurmClientError(f"{sacct}: {err}") from None


@dataclass
class Window:
    """sacct's last hours as a round of ``gpushare relayout`` reads them."""

    spans: list[Span]  # what each GPU job held (:func:`parse_spans`)
    reaches: bool  # a job (any, GPU or not) started at or before the window's start
    recent: list[tuple[float, Request]]  # the lookback's started GPU jobs (parse_window)


def parse_window(text: str, now: datetime.datetime, hours: float = 0.0,
                 lookback_s: float = 0.0) -> Window:
    """One pass over ``sacct --parsable2`` output (as :func:`parse_sacct` reads it) of the
    last ``hours`` before ``now``:

    - ``spans``: what each started GPU job held, its units on all its nodes, from Start to
      End in seconds before ``now`` (negative), End None while it runs. sacct gives whole
      seconds, so a job held its units until at most a second past its End: two jobs whose
      records share a second count as holding at once, and a job shorter than a second
      still counts. A line asking for several kinds at once holds none of them alone;
    - ``reaches``: whether a job started at or before the window's start;
    - ``recent``: (seconds ago, request per node) of the GPU jobs submitted within
      ``lookback_s`` (at most the window) that have started, running or ended in any state,
      each for its ``Timelimit``. Those still pending are squeue's to tell
      (``demand.read_queue`` knows which can start)."""
    since = now - datetime.timedelta(hours=hours)
    lookback_s = min(lookback_s, hours * 3600.0)
    window = Window([], False, [])
    for fields, request, nodes in _rows(text):
        submit, start, end = (_time(fields.get(f, "")) for f in ("Submit", "Start", "End"))
        if start is None:
            continue
        window.reaches = window.reaches or start <= since
        if request is None:
            continue
        kind, units = request
        window.spans.append(Span((start - now).total_seconds(), None if end is None else
                                 (end - now).total_seconds() + SACCT_RESOLUTION_S, kind,
                                 units * max(nodes, 1)))
        ago = None if submit is None or start > now else (now - submit).total_seconds()
        if ago is not None and 0.0 <= ago < lookback_s:
            window.recent.append((ago, Request(
                fields.get("JobID", ""), kind, units, 0.0, user=fields.get("User", ""),
                limit_s=parse_time_left(fields.get("Timelimit", "")))))
    return window


def parse_spans(text: str, now: datetime.datetime) -> list[Span]:
    """What each started GPU job held (:func:`parse_window`)."""
    return parse_window(text, now).spans


def started_before(text: str, since: datetime.datetime) -> bool:
    """Whether ``sacct --parsable2`` output shows a job (any job, GPU or not) that started
    at or before ``since``: accounting reaches back that far."""
    return parse_window(text, since).reaches


def read_window(sacct: str, hours: float, timeout: float = 120.0,
                now: Optional[datetime.datetime] = None, lookback_s: float = 0.0) -> Window:
    """The last ``hours`` of sacct (:func:`parse_window`). Where no job of the window started
    before it, a second query asks whether one ran in the ``hours`` before the window: a
    slurmdbd younger than the window shows neither, and the window cannot show what a
    kind's jobs hold over a whole period. SlurmClientError says why sacct could not be
    read."""
    from gpushare.admin.slurm_client import SlurmClientError

    now = now or datetime.datetime.now()
    since = now - datetime.timedelta(hours=hours)
    text = _sacct_text(sacct, hours / 24.0, timeout, now)
    try:
        window = parse_window(text, now, hours, lookback_s)
        if not window.reaches:
            window.reaches = started_before(_sacct_text(sacct, hours / 24.0, timeout, since),
                                            since)
        return window
    except ValueError as err:
        raise SlurmClientError(f"{sacct}: {err}") from None
