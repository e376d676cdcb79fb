# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --trial``: the site's own history cut in two, its second half replayed
from the plan's layouts and from the first half's best static layout, left alone and with
relayout, each job known to the forecast by its own sacct time limit."""

from __future__ import annotations

import datetime
import json
import math

import pytest
from tests.unit.admin.relayout_plans import mig_plan

from gpushare.admin.relayout import trial as trial_module
from gpushare.admin.relayout.history import parse_sacct
from gpushare.admin.relayout.keep import Span
from gpushare.admin.relayout.predict import DEFAULT_LIMIT_S
from gpushare.admin.relayout.sim import Job, Result, default_cluster
from gpushare.admin.relayout.static import even_split, spread
from gpushare.admin.relayout.trial import (
    Start,
    Trial,
    halves,
    own_limit,
    past_holds,
    shifted,
    trial,
)

HEADER = "JobID|Submit|Start|End|ReqTRES|User|State|Timelimit\n"


def test_a_history_is_cut_at_half_its_last_submission_and_keeps_each_jobs_limit():
    jobs = [Job(n, float(s), 60.0, "whole", 1, "u", limit=600.0 + n)
            for n, s in enumerate((0, 50, 100))]
    first, second = halves(jobs)
    assert [j.submit for j in first] == [0.0] and [j.submit for j in second] == [0.0, 50.0]
    assert [j.limit for j in second] == [601.0, 602.0]
    assert [j.submit for j in shifted(first, 50.0)] == [-50.0]


def test_the_first_half_is_relayouts_history_on_the_second_halfs_clock():
    """What the first half's jobs held, before time 0 of the second half's replay: a job
    still running at the middle ends there, one started after it (waited past it) is not
    history."""
    cluster = default_cluster(1, 1, ("7x1g.10gb",))
    start = spread(even_split(cluster), cluster)
    first = [Job(1, 0.0, 600.0, "1g.10gb", 7, "u"),     # 0-600: all 7 slices
             Job(2, 100.0, 900.0, "1g.10gb", 2, "u"),   # waits for job 1: 600-1500
             Job(3, 900.0, 60.0, "1g.10gb", 7, "u")]    # waits for job 2: 1500-1560
    assert past_holds(first, 1000.0, start, cluster) == [
        Span(-1000.0, -400.0, "1g.10gb", 7), Span(-400.0, 0.0, "1g.10gb", 2)]


@pytest.mark.parametrize("limit, seconds", [
    ("02:00:00", 7200.0), ("1-00:30:00", 88200.0), ("45:00", 2700.0),
    ("UNLIMITED", None), ("Partition_Limit", None), ("", None)])
def test_sacct_time_limits_become_each_jobs_own(limit, seconds):
    history = parse_sacct(HEADER + "1|2026-11-20T08:00:00|2026-11-20T08:00:00|"
                          f"2026-11-20T08:10:00|gres/gpu:3g.40gb=1,node=1|u|COMPLETED|{limit}\n")
    (job,) = history.jobs
    assert job.limit == seconds
    assert own_limit(job) == (seconds if seconds is not None else DEFAULT_LIMIT_S)


def _result(waits: list[tuple[str, float]], unstarted: int = 0) -> Result:
    return Result(waits={}, jct=[], used_gpu_h=0.0, idle_waiting_gpu_h=0.0, changes=0,
                  gpu_hours=1.0, landed_during_change=0, disturbed=0, unfinished=0,
                  finished=[(n, kind, wait, wait + 600.0) for n, (kind, wait) in
                            enumerate(waits)],
                  unstarted=[(100 + n, "whole", 9999.0, 10599.0) for n in range(unstarted)])


def test_a_start_is_no_worse_only_when_no_mean_grows_and_no_more_jobs_never_start():
    still = _result([("1g.10gb", 60.0), ("whole", 600.0)])
    better = _result([("1g.10gb", 30.0), ("whole", 600.0)])
    assert Start("s", still, better).no_worse()
    assert Start("s", still, still).ratios() == {"mig_wait": 1.0, "wait": 1.0,
                                                      "completion": 1.0}
    # The whole-GPU jobs pay for the MIG jobs' gain: every job's mean grows.
    traded = _result([("1g.10gb", 30.0), ("whole", 700.0)])
    assert Start("s", still, traded).ratios()["wait"] > 1.0
    assert not Start("s", still, traded).no_worse()
    # A loss of a thousandth never reads as 1.000.
    slight = _result([("1g.10gb", 60.0), ("whole", 600.1)])
    assert Start("s", still, slight).ratios()["wait"] == 1.001
    # From no wait at all to some: infinitely worse, never "no worse".
    idle = _result([("1g.10gb", 0.0)])
    from_none = Start("s", idle, _result([("1g.10gb", 5.0)]))
    assert math.isinf(from_none.ratios()["mig_wait"]) and not from_none.no_worse()


def test_a_start_that_leaves_more_jobs_unstarted_is_worse():
    still = _result([("1g.10gb", 60.0)] * 10)
    moved = _result([("1g.10gb", 0.0)] * 10, unstarted=1)
    start = Start("s", still, moved)
    assert len(moved.unstarted) > len(still.unstarted)
    assert not start.no_worse()


def _shifting_history() -> list[Job]:
    """Slices in the first half, whole GPUs in the second: the plan's 7x1g.10gb and the
    first half's best layout never start a whole-GPU job, and relayout gives them GPUs."""
    jobs = [Job(n, 360.0 * n, 1200.0, "1g.10gb", 4, "u", limit=2400.0) for n in range(40)]
    jobs += [Job(100 + n, 30000.0 + 600.0 * n, 1200.0, "whole", 1, "w", limit=3600.0)
             for n in range(20)]
    return jobs


def test_the_trial_replays_the_second_half_from_both_starts_and_relayout_helps_there():
    cluster = default_cluster(1, 2, ("7x1g.10gb", "whole"))
    plan = [[cluster.menu.items[0].layout] * 2]
    result = trial(_shifting_history(), cluster, plan, keep_s=0.0)
    assert result.first == 40 and result.second == 20
    assert result.learned == {"7x1g.10gb": 2}
    assert [start.label for start in result.starts] == [
        "the plan's layouts", "the first half's best static layout"]
    for start in result.starts:
        assert len(start.still.unstarted) == 20  # no whole GPU, left alone
        assert start.moved.changes > 0 and start.moved.disturbed == 0
        assert start.ratios()["wait"] < 1.0 and start.no_worse()
    assert result.no_harm()


def test_a_history_with_an_empty_half_is_refused():
    cluster = default_cluster(1, 2, ("7x1g.10gb", "whole"))
    with pytest.raises(ValueError, match="both of its halves"):
        trial([Job(0, 0.0, 60.0, "whole", 1, "u")], cluster, None, keep_s=0.0)


# ------------------------------------------------------------------------- the command


def _plan(tmp_path) -> str:
    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan(["{layout: 7x1g.10gb}", "{layout: whole}"]))
    return str(plan)


def _sacct_text(jobs: list[Job]) -> str:
    start = datetime.datetime(2026, 11, 20, 8, 0)
    rows = []
    for job in jobs:
        submit = start + datetime.timedelta(seconds=job.submit)
        end = submit + datetime.timedelta(seconds=job.run)
        tres = (f"gres/gpu={job.count}" if job.kind == "whole"
                else f"gres/gpu:{job.kind}={job.count}")
        hours, seconds = divmod(int(job.limit or 0), 3600)
        limit = f"{hours:02d}:{seconds // 60:02d}:{seconds % 60:02d}"  # sacct's HH:MM:SS
        rows.append(f"{job.id}|{submit.isoformat()}|{submit.isoformat()}|{end.isoformat()}|"
                    f"cpu=1,{tres},node=1|{job.user}|COMPLETED|{limit}")
    return HEADER + "\n".join(rows) + "\n"


def test_trial_reads_a_saved_history_and_says_what_relayout_would_have_done(tmp_path,
                                                                            capsys):
    from gpushare.cli import main

    history = tmp_path / "history.txt"
    history.write_text(_sacct_text(_shifting_history()))
    assert main(["relayout", "--plan", _plan(tmp_path), "--trial", "--history",
                 str(history), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 60 and report["learned_on"] == 40 and report["replayed"] == 20
    assert [s["start"] for s in report["starts"]] == [
        "the plan's layouts", "the first half's best static layout"]
    plan_start = report["starts"][0]
    assert plan_start["left_alone"]["never_started"] == 20
    assert plan_start["relayout"]["never_started"] == 0
    assert plan_start["relayout"]["changes"] > 0 and plan_start["relayout"]["jobs_disturbed"] == 0
    assert plan_start["ratios"]["wait"] < 1.0 and plan_start["no_worse"]
    assert report["no_harm"] is True
    assert main(["relayout", "--plan", _plan(tmp_path), "--trial", "--history",
                 str(history)]) == 0
    out = capsys.readouterr().out
    assert "from the plan's layouts, left alone -> with relayout:" in out
    assert "never started: 20 -> 0" in out
    assert "relayout did no harm on this history" in out


def test_trial_says_where_relayout_would_have_made_the_history_worse(tmp_path, capsys,
                                                                     monkeypatch):
    """The verdict line names the start it lost from and what to do; the exit status stays
    0 (a replay, not a failure) and --json says it as no_harm."""
    from gpushare.cli import main

    still = _result([("1g.10gb", 60.0), ("whole", 600.0)])
    worse = _result([("1g.10gb", 30.0), ("whole", 700.0)])
    verdict = Trial(2, 2, 1.0, {"7x1g.10gb": 2}, (Start("the plan's layouts", still, worse),))
    monkeypatch.setattr(trial_module, "trial", lambda *args, **kwargs: verdict)
    history = tmp_path / "history.txt"
    history.write_text(_sacct_text(_shifting_history()))
    assert main(["relayout", "--plan", _plan(tmp_path), "--trial", "--history",
                 str(history)]) == 0
    out = capsys.readouterr().out
    assert ("relayout would have made this history worse than leaving the plan's layouts "
            "alone: keep the timer off for this group") in out, out
    assert main(["relayout", "--plan", _plan(tmp_path), "--trial", "--history",
                 str(history), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["no_harm"] is False and report["starts"][0]["no_worse"] is False


@pytest.mark.parametrize("argv, message", [
    (["--trial", "--suggest"], "--suggest and --trial each replay the history: give one"),
    (["--trial", "--apply"], "--trial replays the history and changes nothing: give it "
                             "without --apply"),
    (["--suggest", "--apply"], "--suggest replays the history and changes nothing"),
    (["--trial", "--days", "0"], "--days must be more than 0"),
    (["--trial", "--max-changes", "-1"], "--max-changes must be between 0 and 1000"),
    (["--trial", "--history", "/nonexistent/history"], "cannot read the history"),
    (["--days", "3"], "--days only with --suggest or --trial"),
])
def test_trial_refuses_bad_input_with_what_to_do(tmp_path, capsys, argv, message):
    from gpushare.cli import main

    assert main(["relayout", "--plan", _plan(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_trial_with_an_empty_second_half_says_to_give_a_longer_history(tmp_path, capsys):
    from gpushare.cli import main

    history = tmp_path / "history.txt"
    history.write_text(_sacct_text([Job(0, 0.0, 600.0, "1g.10gb", 1, "u", limit=900.0)]))
    assert main(["relayout", "--plan", _plan(tmp_path), "--trial", "--history",
                 str(history)]) == 2
    assert "needs GPU jobs in both of its halves" in capsys.readouterr().err
