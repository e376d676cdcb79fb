# SPDX-License-Identifier: GPL-2.0-or-later
"""The floors under MIG and MPS capacity: what their jobs held at once in the last hours,
read from sacct, which no relayout change crosses (``keep``)."""

from __future__ import annotations

import datetime
import json
import shlex

import pytest
from tests.unit.admin.relayout_site import (
    SACCT_HEADER,
    TRACKED,
    config_stub,
    long_job,
    make_site,
    sacct_stub,
)
from tests.unit.admin.test_relayout import PLAN, gpus, layout, menu_of

from gpushare.admin.relayout.decide import GpuState, Request, decide
from gpushare.admin.relayout.history import parse_spans, parse_window, started_before
from gpushare.admin.relayout.keep import Floors, Span, capacity, floors, reaches, short, unknown
from gpushare.admin.relayout.sim import Job, default_cluster, simulate
from gpushare.admin.tres import plan_tres, untracked

HOUR = 3600.0


def test_a_floor_is_the_most_units_held_at_once_within_the_window():
    spans = [Span(-5 * HOUR, -3 * HOUR, "1g.10gb", 4),   # overlaps the next for an hour
             Span(-4 * HOUR, -2 * HOUR, "1g.10gb", 3),
             Span(-2 * HOUR, -1 * HOUR, "1g.10gb", 6),   # begins as the one before ends
             Span(-30 * HOUR, -26 * HOUR, "1g.10gb", 50),  # before the window
             Span(-1 * HOUR, None, "3g.40gb", 2),         # still running
             Span(-2 * HOUR, -1 * HOUR, "whole", 8),      # whole GPUs have no floor
             Span(-2 * HOUR, -1 * HOUR, "mps", 150)]
    assert floors(spans, 0.0, 24 * HOUR) == {"1g.10gb": 7, "3g.40gb": 2, "mps": 150}
    # A span that began before the window counts for what it held within it.
    assert floors([Span(-30 * HOUR, -1 * HOUR, "2g.20gb", 3)], 0.0, 24 * HOUR) == {
        "2g.20gb": 3}
    assert floors(spans, 0.0, 1.5 * HOUR) == {"1g.10gb": 6, "3g.40gb": 2, "mps": 150}
    # Never more than the plan's own layouts give a kind: what it has beyond that, relayout
    # gave it, and may take back.
    assert floors(spans, 0.0, 24 * HOUR, {"1g.10gb": 5, "mps": 200}) == {
        "1g.10gb": 5, "3g.40gb": 0, "mps": 150}


def test_a_kind_falls_to_its_floor_never_under_it():
    before = {"1g.10gb": 14, "3g.40gb": 2}
    assert short(before, {"1g.10gb": 7, "3g.40gb": 4}, {"1g.10gb": 7}) == []
    assert short(before, {"1g.10gb": 0, "3g.40gb": 6}, {"1g.10gb": 7}) == [
        "1g.10gb would keep 0 of its 14, under its floor 7"]
    # Where a kind has less than its floor already it keeps that, and may grow.
    assert short({"1g.10gb": 7}, {"1g.10gb": 0}, {"1g.10gb": 10}) != []
    assert short({"1g.10gb": 7}, {"1g.10gb": 14}, {"1g.10gb": 10}) == []
    # Unknown history: every MIG profile and MPS keeps what the plan gives it.
    kept = unknown({"1g.10gb": 7, "whole": 4, "mps": 100})
    assert kept == {"1g.10gb": 7, "mps": 100}
    assert short({"1g.10gb": 14, "mps": 100}, {"1g.10gb": 7, "mps": 100}, kept) == []
    assert short({"1g.10gb": 7, "mps": 100}, {"1g.10gb": 6, "mps": 100}, kept) == [
        "1g.10gb would keep 6 of its 7, under its floor 7"]
    assert Floors(kept, "sacct: down", known=False).line() == (
        "kept: every MIG profile and MPS keeps what the plan's layouts give it (1g.10gb 7, "
        "mps 100): sacct: down")


def test_capacity_counts_what_slurm_gets_from_each_gpu():
    assert capacity([layout("7x1g.10gb"), layout("2x3g.40gb"), layout("whole")]) == {
        "1g.10gb": 7, "3g.40gb": 2, "whole": 1}


def test_no_change_takes_slices_a_kinds_jobs_held():
    menu = menu_of("7x1g.10gb", "whole")
    queue = [Request(str(j), "whole", 1, 3000) for j in range(4)]
    free = decide(queue, gpus("7x1g.10gb", 4), {"g": menu})
    assert [c.new for c in free.changes] == ["whole"] * 4
    # 1g jobs held 14 slices at once: two of the four GPUs stay 7x1g.10gb.
    kept = decide(queue, gpus("7x1g.10gb", 4), {"g": menu}, floors={"1g.10gb": 14})
    assert len(kept.changes) == 2
    held = decide(queue, gpus("7x1g.10gb", 4), {"g": menu}, floors={"1g.10gb": 28})
    assert held.changes == []
    assert any("kept: 1g.10gb would keep 21 of its 28, under its floor 28" in line
               for line in held.why), held.why
    # A kind that held nothing has no floor, and changes towards a kept kind are free.
    assert len(decide(queue, gpus("7x1g.10gb", 4), {"g": menu},
                      floors={"3g.40gb": 99}).changes) == 4
    small = [Request(str(j), "1g.10gb", 1, 3000) for j in range(20)]
    assert decide(small, gpus("whole", 4), {"g": menu}, floors={"1g.10gb": 99}).changes


def test_no_whole_gpu_is_added_beside_mps_gpus_while_mps_jobs_held_units():
    """Slurm gives an idle GPU with MPS units whole to a whole-GPU job: a node that gains
    whole GPUs beside its MPS GPUs lets requests of several GPUs take them."""
    menu = menu_of("7x1g.10gb", "whole", "mps:100")
    queue = [Request(str(j), "whole", 2, 3000) for j in range(4)]
    beside = [*gpus("7x1g.10gb", 3),
              GpuState("n1", 3, "g", layout("mps:100"), False, True, None, {})]
    apart = gpus("7x1g.10gb", 3, node="n2")
    assert decide(queue, beside, {"g": menu}).changes  # no floor: made
    assert decide(queue, beside, {"g": menu}, floors={"1g.10gb": 0, "mps": 0}).changes
    held = decide(queue, beside, {"g": menu}, floors={"1g.10gb": 0, "mps": 50})
    assert held.changes == []
    assert any("kept: no whole GPU beside n1's MPS GPUs" in line for line in held.why), held.why
    # A node without MPS GPUs takes them.
    changes = decide(queue, beside + apart, {"g": menu},
                     floors={"1g.10gb": 0, "mps": 50}).changes
    assert changes and {c.node for c in changes} == {"n2"}


def test_spans_are_read_from_sacct_running_jobs_too():
    now = datetime.datetime(2026, 1, 2, 12, 0, 0)
    text = "\n".join([
        "JobID|Submit|Start|End|ReqTRES|User|State",
        "1|2026-01-02T09:00:00|2026-01-02T10:00:00|2026-01-02T11:00:00|"
        "cpu=1,gres/gpu:1g.10gb=2,node=1|a|COMPLETED",
        "2|2026-01-02T11:00:00|2026-01-02T11:30:00|Unknown|"
        "gres/gpu:3g.40gb=4,node=2|b|RUNNING",
        "3|2026-01-02T11:50:00|Unknown|Unknown|gres/gpu:1g.10gb=1|c|PENDING",
        "4|2026-01-02T10:00:00|2026-01-02T10:00:00|2026-01-02T10:30:00|"
        "gres/gpu:1g.10gb=1,gres/gpu:3g.40gb=1|d|COMPLETED",
        "5|2026-01-02T10:00:00|2026-01-02T10:00:00|2026-01-02T10:30:00|gres/mps=50|e|FAILED",
        "6|2026-01-02T10:00:00|2026-01-02T10:00:00|2026-01-02T10:30:00|cpu=4|f|COMPLETED",
    ])
    # sacct's whole seconds: each job held its units until at most a second past its End
    assert parse_spans(text, now) == [
        Span(-2 * HOUR, -HOUR + 1, "1g.10gb", 2),
        Span(-0.5 * HOUR, None, "3g.40gb", 4),  # 2 a node on 2 nodes
        Span(-2 * HOUR, -1.5 * HOUR + 1, "mps", 50)]
    with pytest.raises(ValueError, match="no Start"):
        parse_spans("JobID|Submit|End|ReqTRES\n", now)
    # Accounting reaches back to a moment a job (any job: the CPU job 6 too) started by.
    assert started_before(text, datetime.datetime(2026, 1, 2, 10, 0, 0))
    assert not started_before(text, datetime.datetime(2026, 1, 2, 9, 59, 59))
    pending = "\n".join(text.splitlines()[:1] + text.splitlines()[3:4])  # never started
    assert not started_before(pending, now)


def test_the_lookback_s_started_jobs_are_read_from_the_same_sacct_output():
    """The forecast's recurring submissions: every GPU job submitted within the lookback that
    started, ended in any state or running, each for its Timelimit; pending ones are left to
    squeue (it knows which can start), older ones and CPU jobs are not counted."""
    now = datetime.datetime(2026, 1, 2, 12, 0, 0)
    rows = [  # JobID, Submit, Start, End (on 2026-01-02), ReqTRES, User, State, Timelimit
        ("1", "11:30:00", "11:31:00", "11:35:00", "gres/gpu:1g.10gb=2,node=1", "a",
         "COMPLETED", "00:30:00"),
        ("2", "11:10:00", "11:10:00", "11:11:00", "gres/gpu:3g.40gb=4,node=2", "b", "FAILED",
         "1-00:00:00"),
        ("3", "11:50:00", "Unknown", "Unknown", "gres/gpu:1g.10gb=1", "c", "PENDING",
         "01:00:00"),
        ("4", "10:59:59", "11:00:00", "Unknown", "gres/gpu=1", "d", "RUNNING", "01:00:00"),
        ("5", "11:40:00", "11:40:00", "Unknown", "gres/mps=50", "e", "RUNNING", "UNLIMITED"),
        ("6", "11:40:00", "11:40:00", "11:41:00", "cpu=4", "f", "COMPLETED", "00:10:00"),
    ]
    text = "\n".join(["JobID|Submit|Start|End|ReqTRES|User|State|Timelimit"] + [
        "|".join(f"2026-01-02T{v}" if v[:1].isdigit() and ":" in v and n in (1, 2, 3) else v
                 for n, v in enumerate(row)) for row in rows])
    window = parse_window(text, now, hours=24.0, lookback_s=HOUR)
    assert window.recent == [
        (1800.0, Request("1", "1g.10gb", 2, 0.0, user="a", limit_s=1800.0)),
        (3000.0, Request("2", "3g.40gb", 2, 0.0, user="b", limit_s=86400.0)),  # per node
        (1200.0, Request("5", "mps", 50, 0.0, user="e", limit_s=None))]
    assert window.spans == parse_spans(text, now) and len(window.spans) == 4
    assert not window.reaches  # nothing started 24 h before
    # The lookback is at most the window; without a Timelimit column, no limit is known.
    assert [r.job for _, r in parse_window(text, now, 0.5, HOUR).recent] == ["5"]
    plain = text.replace("|Timelimit", "").replace("|00:30:00", "")
    assert parse_window(plain, now, 24.0, HOUR).recent[0][1].limit_s is None


def test_each_recent_job_counts_once_sacct_s_record_first():
    from gpushare.admin.relayout.demand import merge_recent

    listed = [(60.0, Request("7", "1g.10gb", 1, 0.0)), (90.0, Request("8", "mps", 25, 0.0))]
    accounted = [(65.0, Request("7", "1g.10gb", 1, 0.0, limit_s=600.0)),
                 (2000.0, Request("9", "whole", 1, 0.0))]
    assert merge_recent(listed, accounted) == [*accounted, listed[1]]
    assert merge_recent(listed, []) == listed


def test_jobs_within_one_second_of_sacct_held_at_once():
    """Two jobs that started and ended within the same second (sacct's resolution) held
    their slices at once as far as anyone can tell: both count, and no job is too short."""
    now = datetime.datetime(2026, 1, 2, 12, 0, 0)
    text = "\n".join(["JobID|Submit|Start|End|ReqTRES|User|State"] + [
        f"{n}|2026-01-02T11:00:00|2026-01-02T11:00:05|2026-01-02T11:00:05|"
        "gres/gpu:1g.10gb=3,node=1|u|COMPLETED" for n in (1, 2)] + [
        # one that ended as the next began, in the same second: counted as at once too
        "3|2026-01-02T11:10:00|2026-01-02T11:10:00|2026-01-02T11:20:07|"
        "gres/gpu:1g.10gb=2|u|COMPLETED",
        "4|2026-01-02T11:10:00|2026-01-02T11:20:07|2026-01-02T11:30:00|"
        "gres/gpu:1g.10gb=2|u|COMPLETED"])
    assert floors(parse_spans(text, now), 0.0, 24 * HOUR) == {"1g.10gb": 6}
    assert floors(parse_spans(text.replace("1g.10gb=3", "1g.10gb=1"), now), 0.0,
                  24 * HOUR) == {"1g.10gb": 4}


def _one_node(history, keep_s=7 * 24 * HOUR):
    """A node of 4 GPUs of 7x1g.10gb beside one of 4 whole ones, whole-GPU jobs waiting,
    replayed with relayout: how many GPUs it changed, with ``history``'s 1g.10gb holds
    before time 0 and floors over ``keep_s`` (a week: the history stays in the window for
    the whole replay)."""
    cluster = default_cluster(2, 4, ("7x1g.10gb", "whole"))
    start = [[cluster.menu.items[0].layout] * 4, [cluster.menu.items[1].layout] * 4]
    jobs = [Job(n, 30.0 * n, 3 * HOUR, "whole", 1, "u") for n in range(48)]
    return simulate(jobs, start, True, cluster, history=history, keep_s=keep_s).changes


# A whole-GPU job eight days before the replay: the history reaches back past a week.
BACK = Span(-8 * 24 * HOUR, -8 * 24 * HOUR + HOUR, "whole", 1)


def test_a_replay_keeps_the_slices_its_history_held():
    assert _one_node([BACK]) == 4  # nothing held 1g.10gb: every such GPU goes whole
    assert _one_node([BACK, Span(-3 * HOUR, -2 * HOUR, "1g.10gb", 14)]) == 2
    assert _one_node([BACK, Span(-3 * HOUR, -2 * HOUR, "1g.10gb", 28)]) == 0
    assert _one_node([Span(-3 * HOUR, -2 * HOUR, "1g.10gb", 28)], keep_s=0) == 4  # no floor
    # Held more than the window ago: forgotten.
    assert _one_node([Span(-30 * HOUR, -25 * HOUR, "1g.10gb", 28)], keep_s=24 * HOUR) == 4


def test_a_history_younger_than_the_window_keeps_the_plans_slices():
    """Until the history reaches back to the window's start, an hour without 1g.10gb jobs
    is no evidence: every 1g.10gb slice the plan gives stays (whole GPUs may still go)."""
    assert reaches([BACK], -7 * 24 * HOUR) and not reaches([BACK], -9 * 24 * HOUR)
    assert _one_node([]) == 0
    assert _one_node([Span(-3 * HOUR, -2 * HOUR, "1g.10gb", 1)]) == 0
    # Within the replay, a day of its own history reaches back past a day's window.
    cluster = default_cluster(2, 4, ("7x1g.10gb", "whole"))
    start = [[cluster.menu.items[0].layout] * 4, [cluster.menu.items[1].layout] * 4]
    jobs = [Job(n, 25 * HOUR + 30.0 * n, 3 * HOUR, "whole", 1, "u") for n in range(48)]
    jobs.append(Job(48, 0.0, 60.0, "whole", 1, "u"))  # the day's first job
    assert simulate(jobs, start, True, cluster, keep_s=24 * HOUR).changes == 4


@pytest.fixture
def site(tmp_path):
    return make_site(tmp_path)


def _dry_run(site, tmp_path, capsys, *extra, tracked=TRACKED, squeue=None):
    """``gpushare relayout --json`` (a dry run) on the site; ``squeue``: another stub."""
    from tests.unit.admin.test_relayout_controller import _command

    from gpushare.cli import main

    plan, settings, _profile, _slurm = site
    argv, _db = _command(plan, settings, tmp_path, tracked)
    argv = [word for word in argv if word not in ("--apply", "--json")]
    if squeue:
        argv[argv.index("--squeue") + 1] = squeue
    sacct = argv.index("--sacct")
    del argv[sacct:sacct + 2]
    assert main([*argv, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _ran_at_once(tres: str, jobs: int = 6) -> list[str]:
    """sacct lines of ``jobs`` jobs asking ``tres``, all submitted 5 hours ago, started 4
    hours ago and ended 3 hours ago."""
    now = datetime.datetime.now().replace(microsecond=0)
    submit, start, end = (now - datetime.timedelta(hours=h) for h in (5, 4, 3))
    return [f"{n}|{submit.isoformat()}|{start.isoformat()}|{end.isoformat()}|{tres}|u|"
            "COMPLETED" for n in range(jobs)]


def test_the_command_reads_sacct_and_keeps_what_1g_jobs_held(site, tmp_path, capsys):
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    now = datetime.datetime.now().replace(microsecond=0)
    held = _ran_at_once("gres/gpu:1g.10gb=5")
    sacct = sacct_stub(str(stubs), tuple(held))
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct)
    assert decision["changes"] == [], decision["why"]
    assert decision["floors"] == {"by_kind": {"1g.10gb": 30}, "from_history": True,
                                  "source": "the last 24 h of sacct", "unseen": [],
                                  "wanted": {"1g.10gb": 30}}
    assert any("kept: no change leaves a MIG profile or MPS with fewer than its jobs held at "
               "once in the last 24 h of sacct, up to what the plan's layouts give it "
               "(1g.10gb 30)" in why for why in decision["why"]), decision["why"]
    with open(sacct + ".args", encoding="utf-8") as args:
        called = args.read().split()
    assert called[:4] == ["--parsable2", "--allocations", "--allusers", "--starttime"]
    since = datetime.datetime.fromisoformat(called[4])
    assert abs((now - since).total_seconds() - 24 * HOUR) < 120
    # Held 15 at most: one GPU's 7 slices of the 30 may go.
    sacct = sacct_stub(str(stubs), tuple(held[:3]))
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct)
    assert [c["to"] for c in decision["changes"]] == ["2x3g.40gb"]
    # A shorter window forgets them.
    sacct = sacct_stub(str(stubs), tuple(held))
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct, "--keep-hours", "2")
    assert [c["to"] for c in decision["changes"]] == ["2x3g.40gb"]


def test_a_sacct_younger_than_the_window_keeps_what_the_plan_gives_it(site, tmp_path,
                                                                        capsys):
    """A history that does not reach back to the window's start (a new slurmdbd) shows no
    demand for kinds whose jobs come once a day: the floors are the plan's until it does.
    sacct is asked a second time, for the window before, only where the first shows no job
    from before the window; any job there is enough."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    held = _ran_at_once("gres/gpu:1g.10gb=1", jobs=1)  # 3 slices held at most: 28 may go
    young = sacct_stub(str(stubs), tuple(held), reaches=False)
    decision = _dry_run(site, tmp_path, capsys, "--sacct", young)
    assert decision["changes"] == [], decision["why"]
    assert decision["floors"]["by_kind"] == {"1g.10gb": 30}
    assert decision["floors"]["from_history"] is False
    [line] = [why for why in decision["why"] if why.startswith("kept:")]
    assert "every MIG profile and MPS keeps what the plan's layouts give it" in line
    assert "sacct shows no job that started before the last 24 h" in line, line
    assert "--keep-hours 0" in line, line
    with open(young + ".args", encoding="utf-8") as args:
        calls = [call.split() for call in args.read().splitlines()]
    assert len(calls) == 2
    # The second call asks for the 24 h before the window.
    first_start, second_end = (datetime.datetime.fromisoformat(calls[0][4]),
                               datetime.datetime.fromisoformat(calls[1][6]))
    assert calls[1][5] == "--endtime" and abs((first_start - second_end).total_seconds()) < 2
    # A job in the window before is enough: the floors come from the history. (This sacct
    # shows the window's jobs at its first call, and an old job at its second.)
    before, asked = stubs / "before", stubs / "asked"
    before.write_text(f"#!/bin/sh\necho {shlex.quote(SACCT_HEADER)}\n"
                      f"if [ -e {asked} ]; then echo {shlex.quote(long_job())}; "
                      f"else touch {asked}; echo {shlex.quote(held[0])}; fi\n")
    before.chmod(0o755)
    decision = _dry_run(site, tmp_path, capsys, "--sacct", str(before))
    assert decision["floors"]["from_history"] is True, decision["why"]
    assert [c["to"] for c in decision["changes"]] == ["2x3g.40gb"]
    # With a job of the window that started before it, sacct is asked once.
    (stubs / "sacct.args").unlink()
    reaching = sacct_stub(str(stubs), tuple(held))
    decision = _dry_run(site, tmp_path, capsys, "--sacct", reaching)
    assert [c["to"] for c in decision["changes"]] == ["2x3g.40gb"]
    with open(reaching + ".args", encoding="utf-8") as args:
        assert len(args.read().splitlines()) == 1


def test_without_sacct_every_kind_keeps_what_the_plan_gives_it(site, tmp_path, capsys):
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    failing = sacct_stub(str(stubs), exit_code=1)
    decision = _dry_run(site, tmp_path, capsys, "--sacct", failing)
    assert decision["changes"] == []
    [line] = [why for why in decision["why"] if why.startswith("kept:")]
    assert "every MIG profile and MPS keeps what the plan's layouts give it" in line
    assert decision["floors"]["by_kind"] == {"1g.10gb": 30}
    assert decision["floors"]["from_history"] is False
    assert "accounting storage is disabled" in line and "--keep-hours 0" in line
    decision = _dry_run(site, tmp_path, capsys, "--sacct", failing, "--keep-hours", "0")
    assert [c["to"] for c in decision["changes"]] == ["2x3g.40gb"]
    assert not any(why.startswith("kept:") for why in decision["why"])
    assert decision["floors"] is None


def test_keep_hours_out_of_range_is_refused(tmp_path, capsys):
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    assert main(["relayout", "--plan", str(plan), "--keep-hours", "-1"]) == 2
    assert "--keep-hours must be between 0 and 8784" in capsys.readouterr().err


DEFAULT_TRES = "cpu,mem,energy,node,billing,fs/disk,vmem,pages"  # slurmctld's, unconfigured


def test_a_kind_is_seen_in_sacct_only_where_slurmctld_records_its_gres():
    kinds = ["1g.10gb", "3g.40gb", "mps", "whole"]
    # Slurm's default records no GRES: every GPU job reads as a CPU job.
    assert untracked(kinds, DEFAULT_TRES) == ["1g.10gb", "3g.40gb", "mps", "whole"]
    # gres/gpu alone: a MIG job reads as a whole-GPU job, so its profile is not seen.
    assert untracked(kinds, DEFAULT_TRES + ",gres/gpu") == ["1g.10gb", "3g.40gb", "mps"]
    # A whole GPU is seen through its model's type too; the names are case-insensitive.
    assert untracked(kinds, "gres/gpu:h100, gres/GPU:1g.10gb,gres/mps") == ["3g.40gb"]
    assert untracked(kinds, TRACKED.split("=", 1)[1]) == []


def test_without_the_gres_in_accounting_every_kind_keeps_what_the_plan_gives_it(
        site, tmp_path, capsys):
    """sacct shows no MIG job where slurmctld does not record its profile: the history
    would read as empty and let every slice go, so the floors are the plan's, and the
    decision says which TRES to add."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    cpu_only = _ran_at_once("billing=1,cpu=1,mem=1000M,node=1")
    sacct = sacct_stub(str(stubs), tuple(cpu_only))
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct,
                        tracked=f"AccountingStorageTRES   = {DEFAULT_TRES},gres/gpu")
    assert decision["changes"] == [], decision["why"]
    assert decision["floors"]["by_kind"] == {"1g.10gb": 30}
    assert decision["floors"]["from_history"] is False
    [line] = [why for why in decision["why"] if why.startswith("kept:")]
    assert "every MIG profile and MPS keeps what the plan's layouts give it" in line, line
    assert ("slurmctld does not record gres/gpu:1g.10gb in accounting" in line
            and "AccountingStorageTRES" in line and "--keep-hours 0" in line), line
    # With the profile recorded the same (empty) history lets the slices go.
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct)
    assert [c["to"] for c in decision["changes"]] == ["2x3g.40gb"]


def test_a_kind_sacct_cannot_show_keeps_the_plans_floor_beside_the_others(tmp_path):
    import argparse

    from gpushare.cli.relayout import _floors

    now = datetime.datetime.now().replace(microsecond=0)
    rows = (f"1|{(now - datetime.timedelta(hours=2)).isoformat()}|"
            f"{(now - datetime.timedelta(hours=2)).isoformat()}|"
            f"{(now - datetime.timedelta(hours=1)).isoformat()}|gres/gpu:1g.10gb=4,node=1|u|"
            "COMPLETED",
            f"2|{(now - datetime.timedelta(hours=3)).isoformat()}|"
            f"{(now - datetime.timedelta(hours=3)).isoformat()}|"
            f"{(now - datetime.timedelta(hours=2)).isoformat()}|gres/gpu=5,node=1|u|"
            "COMPLETED")
    args = argparse.Namespace(keep_hours=24.0, timeout=10.0, sacct=sacct_stub(str(tmp_path), rows),
                              scontrol=config_stub(str(tmp_path), "gres/gpu,gres/gpu:1g.10gb"),
                              lookback=3600.0)
    kept, accounted = _floors(args, {"1g.10gb": 14, "mps": 200, "whole": 3})
    assert accounted == []  # both submitted before the last hour
    assert dict(kept.by_kind) == {"1g.10gb": 4, "mps": 200}
    assert kept.known and kept.unseen == ("mps",)
    # What a change back aims at counts whole GPUs too, up to the plan's (5 held, 3 planned).
    assert dict(kept.wanted) == {"1g.10gb": 4, "mps": 200, "whole": 3}
    line = kept.line()
    assert "up to what the plan's layouts give it (1g.10gb 4); mps 200 as the plan gives " \
           "them: slurmctld does not record gres/mps in accounting" in line, line
    # scontrol cannot say what is recorded: the plan's floors, and why.
    args.lookback = 4 * 3600.0
    _, accounted = _floors(args, {"1g.10gb": 14, "mps": 200, "whole": 3})
    assert sorted((r.job, r.kind, r.count) for _, r in accounted) == [
        ("1", "1g.10gb", 4), ("2", "whole", 5)]
    args.scontrol = "/nonexistent/scontrol"
    kept, accounted = _floors(args, {"1g.10gb": 14, "mps": 200, "whole": 3})
    assert accounted == []  # sacct not read
    assert not kept.known and dict(kept.by_kind) == {"1g.10gb": 14, "mps": 200}
    assert dict(kept.wanted) == {"1g.10gb": 14, "mps": 200, "whole": 3}
    assert "/nonexistent/scontrol" in kept.line(), kept.line()


def test_the_rendered_accounting_tres_shows_every_kind_relayout_reads(tmp_path):
    """`gpushare render slurm-conf` gives the AccountingStorageTRES that lets sacct show
    every kind the floors and --suggest read: the plan's slices, the menu's, MPS, whole."""
    from tests.unit.admin.relayout_plans import mig_plan

    from gpushare.admin.plan import parse_plan
    from gpushare.admin.relayout.sim import cluster_from_plan
    from gpushare.admin.render import render_slurm_conf

    plan = parse_plan(mig_plan(["7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "whole", "mps:100"]))
    cluster = cluster_from_plan(plan, None)
    kinds = {kind for item in cluster.menu.items for kind in item.layout.serves()}
    kinds |= {kind for layout in cluster.fixed for kind in layout.offers()}
    assert kinds >= {"1g.10gb", "2g.20gb", "3g.40gb", "mps", "whole"}
    tres = plan_tres(plan)
    assert untracked(kinds, ",".join(tres)) == []
    assert f"#   AccountingStorageTRES={','.join(tres)}" in render_slurm_conf(plan)
    # Without the menu's profiles the history would not show those jobs.
    assert untracked(kinds, "gres/gpu,gres/gpu:1g.10gb") == ["2g.20gb", "3g.40gb", "mps"]


def test_the_forecast_repeats_the_jobs_sacct_shows_ended_within_the_lookback(site, tmp_path,
                                                                             capsys):
    """squeue forgets a job MinJobAge after it ends; the forecast's recurring submissions
    come from the sacct output the floors read, and the decision says where they came from."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    now = datetime.datetime.now().replace(microsecond=0)
    ended = []
    for n, minutes in enumerate((50, 40, 30, 20)):
        submit = now - datetime.timedelta(minutes=minutes)
        end = submit + datetime.timedelta(minutes=5)
        ended.append(f"{100 + n}|{submit.isoformat()}|{submit.isoformat()}|{end.isoformat()}|"
                     "gres/gpu:1g.10gb=1,node=1|u|COMPLETED|00:10:00")
    quiet = _dry_run(site, tmp_path, capsys, "--sacct", sacct_stub(str(stubs)))
    assert ("forecast: the last 1 h's 0 GPU requests recur (0 still waiting, 0 started per "
            "sacct, 0 per squeue)") in quiet["why"], quiet["why"]
    busy = _dry_run(site, tmp_path, capsys, "--sacct", sacct_stub(str(stubs), tuple(ended)))
    assert ("forecast: the last 1 h's 4 GPU requests recur (0 still waiting, 4 started per "
            "sacct, 0 per squeue)") in busy["why"], busy["why"]
    # Each recurs every hour of the 4-hour forecast: 16 jobs beside the waiting one.
    assert [p["without"]["jobs"] for p in quiet["predictions"]] == [1]
    assert [p["without"]["jobs"] for p in busy["predictions"]] == [17]
    # Without sacct (--keep-hours 0), squeue's alone, and the decision says what it misses.
    alone = _dry_run(site, tmp_path, capsys, "--sacct", sacct_stub(str(stubs), tuple(ended)),
                     "--keep-hours", "0")
    line = next(why for why in alone["why"] if why.startswith("forecast:"))
    assert "0 started per sacct" in line and "--keep-hours reads sacct" in line, line
