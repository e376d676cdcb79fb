# SPDX-License-Identifier: GPL-2.0-or-later
"""The prediction that guards each relayout round: a change is made only where the model of
Slurm, run forward from the live state, says it shortens both the MIG jobs' wait and the
completion time by more than the change takes."""

from __future__ import annotations

import datetime

from gpushare.admin.relayout.decide import Change, Decision, GpuState, Request, decide
from gpushare.admin.relayout.demand import parse_submitted, read_queue
from gpushare.admin.relayout.predict import (
    HORIZON_S,
    TAIL_CAP_S,
    change_seconds,
    decide_guarded,
    expected_arrivals,
    forecast,
    guard,
)
from gpushare.admin.relayout.sim import Job, default_cluster, simulate
from gpushare.admin.relayout.static import spread

CLUSTER = default_cluster(2, 2)
MENU = CLUSTER.menu
MENUS = {"g": MENU}


def _layout(name: str):
    item = MENU.item(name)
    assert item is not None
    return item.layout


def _gpu(node: str, index: int, layout: str, used: dict[str, int] | None = None,
         ends_in_s: float | None = None) -> GpuState:
    return GpuState(node, index, "g", _layout(layout), bool(used), True, None, used or {},
                    ends_in_s if used else None)


def _jobs(kind: str, count: int, limit_s: float = 1800.0, wait_s: float = 600.0
          ) -> list[Request]:
    return [Request(f"{kind}-{n}", kind, 1, wait_s + n, limit_s=limit_s) for n in range(count)]


def test_a_change_that_lets_waiting_jobs_start_is_made():
    # Every GPU is busy with 3g jobs (n0's for two hours, n1's for one) but one idle 2x3g
    # GPU on n1; twelve 1g jobs wait, for which no layout offers a slice.
    gpus = [_gpu("n0", 0, "2x3g.40gb", {"3g.40gb": 2}, 7200.0),
            _gpu("n0", 1, "2x3g.40gb", {"3g.40gb": 2}, 7200.0),
            _gpu("n1", 0, "2x3g.40gb"), _gpu("n1", 1, "2x3g.40gb", {"3g.40gb": 2}, 3600.0)]
    queue = _jobs("1g.10gb", 12)
    decision, [verdict] = decide_guarded(queue, gpus, MENUS)
    assert [(c.node, c.index, c.new) for c in decision.changes] == [("n1", 0, "7x1g.10gb")]
    assert verdict.made
    # The prediction it rests on: without the change no 1g job starts within the horizon
    # (none of its kind does: each counts as waiting a day past it); with it they start
    # once n1's last job ends and the change is done.
    assert verdict.without.started == 0
    assert verdict.without.mig_wait_s == HORIZON_S + TAIL_CAP_S
    assert verdict.with_it.started == 12
    assert verdict.with_it.mig_wait_s < verdict.without.mig_wait_s - verdict.cost_s
    assert verdict.with_it.completion_s < verdict.without.completion_s - verdict.cost_s
    assert any("made" in line for line in decision.why)


def test_a_change_that_would_hurt_is_refused():
    # An idle 2x3g GPU where two 3g jobs are about to start; turning it to 7x1g for one 1g
    # job would leave both 3g jobs waiting for the other node's hour-long jobs.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "7x1g.10gb", {"1g.10gb": 7}, 3600.0),
            _gpu("n1", 0, "2x3g.40gb", {"3g.40gb": 2}, 3600.0),
            _gpu("n1", 1, "2x3g.40gb", {"3g.40gb": 2}, 3600.0)]
    queue = _jobs("3g.40gb", 2) + _jobs("1g.10gb", 1, wait_s=0.0)
    proposed = Decision([Change("n0", 0, "2x3g.40gb", "7x1g.10gb", 1.0, True)],
                        ["n0 GPU 0: 2x3g.40gb -> 7x1g.10gb: lets 1.00 GPUs' worth of "
                         "wait-weighted queued work start"])
    guarded, [verdict] = guard(proposed, queue, gpus, MENUS)
    assert not verdict.made and guarded.changes == []
    assert verdict.with_it.mig_wait_s > verdict.without.mig_wait_s
    assert not any("wait-weighted" in line for line in guarded.why)
    assert any("refused" in line for line in guarded.why)


def test_with_no_queue_nothing_changes():
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "whole"),
            _gpu("n1", 0, "7x1g.10gb"), _gpu("n1", 1, "whole")]
    recent = [(600.0, r) for r in _jobs("1g.10gb", 20)]
    decision, verdicts = decide_guarded([], gpus, MENUS, recent=recent)
    assert decision.changes == [] and verdicts == []
    # And a change proposed anyway gains nothing for no one waiting: refused.
    proposed = Decision([Change("n0", 0, "2x3g.40gb", "7x1g.10gb", 1.0, False)])
    guarded, [verdict] = guard(proposed, [], gpus, MENUS)
    assert guarded.changes == [] and not verdict.made


def test_a_drained_node_comes_back_after_its_jobs_and_the_change():
    gpus = [_gpu("n0", 0, "2x3g.40gb", {"3g.40gb": 1}, 1000.0), _gpu("n0", 1, "2x3g.40gb")]
    [job] = _jobs("1g.10gb", 1)
    new = {("n0", 1): _layout("7x1g.10gb")}
    after = forecast([job], gpus, new)
    assert after.started == 1
    assert after.mig_wait_s == 1000.0 + change_seconds(1)
    assert after.completion_s == after.mig_wait_s + job.limit_s
    # A node whose jobs outlast the horizon never comes back within it.
    stuck = [_gpu("n0", 0, "2x3g.40gb", {"3g.40gb": 1}, HORIZON_S + 1), gpus[1]]
    assert forecast([job], stuck, new).started == 0


def test_the_recent_past_stands_for_the_next_submissions_and_weighs_on_a_change():
    [late] = _jobs("3g.40gb", 1, wait_s=0.0)
    arrivals = expected_arrivals([(600.0, late), (7200.0, late)], horizon_s=4 * 3600.0,
                                 lookback_s=3600.0)
    assert [at for at, _ in arrivals] == [3000.0, 6600.0, 10200.0, 13800.0]
    # Two idle 2x3g GPUs, one 1g job waiting, 3g jobs submitted all along: taking a 3g GPU
    # for the 1g job is worth less once the 3g jobs to come are counted.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb")]
    queue = _jobs("1g.10gb", 1)
    recent = [(ago, r) for ago, r in zip(range(0, 3600, 300), _jobs("3g.40gb", 12, 3600.0))]
    new = {("n0", 0): _layout("7x1g.10gb"), ("n0", 1): _layout("7x1g.10gb")}
    alone = forecast(queue, gpus, new)
    counted = forecast(queue, gpus, new, arrivals=expected_arrivals(recent))
    assert alone.mig_wait_s < forecast(queue, gpus).mig_wait_s
    assert counted.mig_wait_s > forecast(queue, gpus,
                                         arrivals=expected_arrivals(recent)).mig_wait_s


def test_the_guard_keeps_what_decide_would_drop_nothing_of():
    gpus = [_gpu("n0", 0, "whole"), _gpu("n0", 1, "whole"), _gpu("n1", 0, "whole"),
            _gpu("n1", 1, "whole")]
    queue = _jobs("1g.10gb", 10)
    plain = decide(queue, gpus, MENUS)
    guarded, verdicts = decide_guarded(queue, gpus, MENUS)
    assert plain.changes and guarded.changes
    assert set(guarded.changes) <= set(plain.changes)
    assert {c.node for c in guarded.changes} == {v.node for v in verdicts if v.made}


def test_squeue_time_limits_and_recent_submissions_are_read():
    now = datetime.datetime(2026, 1, 1, 12, 0, 0)
    text = ("7|gres/gpu:1g.10gb:2|2026-01-01T11:50:00|debug|alice|lab|1:00:00|Resources\n"
            "8|gres/gpu:3g.40gb:1|2026-01-01T09:00:00|debug|bob|lab|Priority\n")
    queue = read_queue(text, now)
    assert [(r.job, r.limit_s) for r in queue.requests] == [("7", 3600.0), ("8", None)]
    assert [(ago, r.job) for ago, r in queue.recent] == [(600.0, "7")]
    running = ("9|gres/gpu:whole:1|2026-01-01T11:30:00|debug|c|lab|2:00:00|None\n"
               "10|gres/gpu:1g.10gb:1|2026-01-01T10:00:00|debug|c|lab|UNLIMITED|None\n")
    assert [(ago, r.job, r.limit_s) for ago, r in parse_submitted(running, now)] == \
        [(1800.0, "9", 7200.0)]


def test_the_simulators_relayout_is_no_worse_than_no_change_on_a_shift():
    # Two hours of 3g jobs, then 1g jobs: the relayout arm runs decide_guarded.
    cluster = default_cluster(2, 2)
    jobs = [Job(n, 120.0 * n, 1500.0, "3g.40gb", 1, "u") for n in range(40)]
    jobs += [Job(100 + n, 5000.0 + 60.0 * n, 900.0, "1g.10gb", 1, "v") for n in range(80)]
    start = spread({"2x3g.40gb": 4}, cluster)
    still = simulate(jobs, start, False, cluster)
    moved = simulate(jobs, start, True, cluster)
    assert still.unfinished == 80  # no layout of the start offers 1g
    assert moved.unfinished == 0 and moved.disturbed == 0 and moved.changes >= 1
    among = still.ran()
    assert moved.mig_wait(among) <= still.mig_wait(among)
    assert moved.mean_jct(among) <= still.mean_jct(among)


def test_a_gain_that_draining_alone_would_give_is_not_the_changes():
    # n0's two 2g slots free at 1000 s and 2000 s; the oldest job wants both, and a job of
    # one slice passes it and holds a slot for 9000 s. Draining n0 frees both at once, so the
    # forecast with any change on n0 (here its idle whole GPU to 2x3g, which no job asks
    # for) gains: the drain's gain, not the change's.
    gpus = [_gpu("n0", 0, "3g.40gb+2g.20gb+1g.10gb", {"2g.20gb": 1}, 1000.0),
            _gpu("n0", 1, "3g.40gb+2g.20gb+1g.10gb", {"2g.20gb": 1}, 2000.0),
            _gpu("n0", 2, "whole")]
    queue = [Request("pair", "2g.20gb", 2, 900.0, limit_s=3600.0)]
    queue += [Request("one", "2g.20gb", 1, 600.0, limit_s=9000.0)]
    proposed = Decision([Change("n0", 2, "whole", "2x3g.40gb", 1.0, True)])
    guarded, [verdict] = guard(proposed, queue, gpus, MENUS)
    need = verdict.need_s
    assert verdict.without.mig_wait_s - verdict.with_it.mig_wait_s > need
    assert verdict.without.completion_s - verdict.with_it.completion_s > need
    assert verdict.drain_only is not None
    assert verdict.drain_only.mig_wait_s == verdict.with_it.mig_wait_s
    assert not verdict.made and guarded.changes == []


def test_a_change_that_pays_only_if_a_burst_goes_on_is_refused():
    # An idle 2x3g GPU that two waiting 3g jobs are about to take, one 1g job waiting, and a
    # burst of 1g submissions in the last hour. Were the burst to go on, turning the GPU to
    # 7x1g would shorten the waits; with no more submissions it makes the 3g jobs wait for
    # the other node's hour-long jobs. Both futures must gain: refused.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "7x1g.10gb", {"1g.10gb": 7}, 3600.0),
            _gpu("n1", 0, "2x3g.40gb", {"3g.40gb": 2}, 3600.0),
            _gpu("n1", 1, "2x3g.40gb", {"3g.40gb": 2}, 3600.0)]
    queue = _jobs("3g.40gb", 2) + _jobs("1g.10gb", 1, wait_s=0.0)
    recent = [(ago, r) for ago, r in zip(range(0, 3600, 100), _jobs("1g.10gb", 36, 1800.0, 0.0))]
    proposed = Decision([Change("n0", 0, "2x3g.40gb", "7x1g.10gb", 1.0, True)], [])
    guarded, [verdict] = guard(proposed, queue, gpus, MENUS, recent=recent)
    assert verdict.with_it.wait_s < verdict.without.wait_s - verdict.need_s  # burst goes on
    assert verdict.quiet_without is not None and verdict.quiet_with is not None
    assert verdict.quiet_without.wait_s == 1200.0  # the 3g jobs start now, the 1g in 1 h
    assert verdict.quiet_with.wait_s > verdict.quiet_without.wait_s  # no burst: a loss
    assert not verdict.made and guarded.changes == []
    assert any("with no submission 20.0 -> " in line for line in guarded.why)


def test_whole_gpu_jobs_count_and_a_change_that_lets_them_start_is_made():
    # Every GPU is 7x1g and two whole-GPU jobs have waited an hour, with no MIG job waiting:
    # the MIG wait cannot fall, but the wait of all jobs does, so GPUs go back to whole.
    gpus = [_gpu("n0", 0, "7x1g.10gb"), _gpu("n0", 1, "7x1g.10gb"),
            _gpu("n1", 0, "7x1g.10gb", {"1g.10gb": 7}, 3600.0),
            _gpu("n1", 1, "7x1g.10gb", {"1g.10gb": 7}, 3600.0)]
    queue = _jobs("whole", 2, wait_s=3600.0)
    decision, [verdict] = decide_guarded(queue, gpus, MENUS)
    assert [(c.node, c.index, c.new) for c in decision.changes] == [
        ("n0", 0, "whole"), ("n0", 1, "whole")]
    assert verdict.made
    # Without the change neither starts: each counts with its wait until the horizon.
    assert verdict.without.started == 0 and verdict.without.wait_s == HORIZON_S
    assert verdict.without.mig_wait_s == 0.0
    assert verdict.with_it.started == 2 and verdict.with_it.wait_s == change_seconds(2)


def test_a_refusal_says_what_fell_short():
    # The only whole GPU in service, idle, and four 3g jobs waiting; a whole-GPU job was
    # submitted ten minutes ago. Turning the whole GPU into 3g slices starts the 3g jobs at
    # once, but the whole-GPU job of the next hour would find none: refused, and the verdict
    # names the class that would wait longer.
    gpus = [_gpu("n0", 0, "whole"), _gpu("n0", 1, "7x1g.10gb"),
            _gpu("n1", 0, "7x1g.10gb"), _gpu("n1", 1, "7x1g.10gb")]
    queue = _jobs("3g.40gb", 2, limit_s=600.0)
    recent = [(600.0, _jobs("whole", 1, limit_s=600.0, wait_s=0.0)[0])]
    proposed = Decision([Change("n0", 0, "whole", "2x3g.40gb", 1.0, False)], [])
    guarded, [verdict] = guard(proposed, queue, gpus, MENUS, recent=recent)
    assert not verdict.made and guarded.changes == []
    assert verdict.with_it.whole_wait_s > verdict.without.whole_wait_s
    assert verdict.refusal.startswith("whole-GPU jobs would wait longer ("), verdict.refusal
    assert any("refused, whole-GPU jobs would wait longer" in line for line in guarded.why)
    # The waiting jobs alone (no lookback): nothing else is expected, and the change is made.
    alone, [made] = guard(proposed, queue, gpus, MENUS, recent=recent, lookback_s=0.0)
    assert made.made and made.refusal == "" and alone.changes == proposed.changes
    assert made.quiet_without is None  # one future only: no submission
    # A change refused for too small a gain says by how much the wait fell.
    _short, [small] = guard(proposed, queue, gpus, MENUS, safety=10000.0, lookback_s=0.0)
    assert not small.made and small.refusal.startswith("the wait falls by "), small.refusal


def test_the_lookback_bounds_the_recent_submissions_read():
    now = datetime.datetime(2026, 1, 1, 12, 0, 0)
    text = ("7|gres/gpu:1g.10gb:2|2026-01-01T11:50:00|debug|alice|lab|1:00:00|Resources\n"
            "8|gres/gpu:3g.40gb:1|2026-01-01T10:30:00|debug|bob|lab|1:00:00|Priority\n")
    assert [r.job for _ago, r in read_queue(text, now).recent] == ["7"]
    assert [r.job for _ago, r in read_queue(text, now, lookback_s=7200.0).recent] == ["7", "8"]
    assert read_queue(text, now, lookback_s=0.0).recent == []
    assert len(read_queue(text, now, lookback_s=0.0).requests) == 2  # both still wait
    running = text.replace("Resources", "None").replace("Priority", "None")
    assert [r.job for _ago, r in parse_submitted(running, now, 7200.0)] == ["7", "8"]


def test_an_idle_mps_gpu_takes_a_whole_gpu_job_in_the_forecast():
    """No change to whole GPUs is needed for a whole-GPU job where a GPU with MPS units
    is idle: Slurm gives it that GPU as gres/gpu (and no MPS job beside it)."""
    cluster = default_cluster(1, 2, ("mps:100", "whole", "7x1g.10gb"))
    mps, whole = (cluster.menu.item(name) for name in ("mps:100", "whole"))
    assert mps is not None and whole is not None
    gpus = [GpuState("n0", 0, "g", mps.layout, False, True),
            GpuState("n0", 1, "g", whole.layout, True, True, None, {"whole": 1}, 3600.0)]
    queue = [Request("w", "whole", 1, 600.0, limit_s=1800.0),
             Request("m", "mps", 25, 0.0, limit_s=1800.0)]
    ahead = forecast(queue, gpus)
    assert ahead.started == 2
    assert ahead.whole_wait_s == 0.0
    # The MPS job waits for the whole-GPU job on the MPS GPU, not for the busy whole GPU.
    assert ahead.mig_wait_s == 1800.0


def test_an_mps_gpu_held_whole_has_no_units_free_until_its_job_ends():
    cluster = default_cluster(1, 1, ("mps:100", "whole"))
    mps = cluster.menu.item("mps:100")
    assert mps is not None
    held = GpuState("n0", 0, "g", mps.layout, True, True, None, {"whole": 1}, 1000.0)
    assert held.idle() == {}
    ahead = forecast([Request("m", "mps", 25, 0.0, limit_s=600.0)], [held])
    assert ahead.started == 1 and ahead.mig_wait_s == 1000.0


def test_the_forecast_serves_an_mps_request_from_one_gpu():
    cluster = default_cluster(1, 2, ("mps:100", "whole"))
    mps = cluster.menu.item("mps:100")
    assert mps is not None
    gpus = [GpuState("n0", i, "g", mps.layout, True, True, None, {"mps": 50}, 1200.0)
            for i in range(2)]
    ahead = forecast([Request("m", "mps", 60, 0.0, limit_s=600.0)], gpus)
    assert ahead.started == 1 and ahead.mig_wait_s == 1200.0  # not 0: 50 + 50 is not one GPU


def test_a_backlog_longer_than_the_horizon_shows_what_a_change_gains(monkeypatch):
    # n1 serves 2g.20gb jobs, a hundred of half an hour wait: a backlog of most of a day.
    # Changing n0's idle GPU to a layout with a 2g slice drains n0 until its other GPU's
    # job ends in 3.5 hours: within the horizon the new slices serve half an hour. Counted
    # until the horizon only, that reads as 17 s less wait, under twice the change's
    # duration, and the change was refused; with the jobs left waiting told at
    # their kind's pace past the horizon, the day's backlog drains faster, and it is made.
    gpus = [_gpu("n0", 0, "7x1g.10gb", {"1g.10gb": 7}, 3.5 * 3600.0),
            _gpu("n0", 1, "7x1g.10gb"),
            _gpu("n1", 0, "3g.40gb+2g.20gb+1g.10gb"), _gpu("n1", 1, "7x1g.10gb")]
    queue = _jobs("2g.20gb", 100, limit_s=1800.0)
    proposed = Decision([Change("n0", 1, "7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", 1.0,
                                True)], [])
    _kept, [verdict] = guard(proposed, queue, gpus, MENUS, lookback_s=0.0)
    without, with_it = verdict.without, verdict.with_it
    assert 0 < without.started < with_it.started < 100
    assert without.mig_wait_s > HORIZON_S  # most of them wait past the horizon
    within = forecast(queue, gpus, horizon_s=HORIZON_S)
    assert within.started == without.started
    assert verdict.made, verdict.refusal
    assert without.mig_wait_s - with_it.mig_wait_s > 1800.0
    # Every job left waiting counted until the horizon only: refused for a small gain.
    from gpushare.admin.relayout import predict

    monkeypatch.setattr(predict, "_waits", lambda starts, submitted, jobs, horizon_s: [
        (horizon_s if start is None else start) - at for start, at in zip(starts, submitted)])
    _kept, [censored] = guard(proposed, queue, gpus, MENUS, lookback_s=0.0)
    assert not censored.made and censored.refusal.startswith("the wait falls by "), \
        censored.refusal


def test_a_job_left_waiting_is_told_at_its_kinds_pace_and_a_whole_gpu_one_until_the_horizon():
    from gpushare.admin.relayout.predict import _waits

    jobs = [Request(str(n), kind, 1, 0.0) for n, kind in enumerate(
        ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb", "whole"])]
    starts = [0.0, 3600.0, None, None, None, None]
    waits = _waits(starts, [0.0, 0.0, 0.0, 600.0, 0.0, 0.0], jobs, HORIZON_S)
    # two 1g jobs started within the horizon: each left waits half a horizon more per place
    assert waits == [0.0, 3600.0, HORIZON_S * 1.5, HORIZON_S * 2 - 600.0,
                     HORIZON_S + TAIL_CAP_S, HORIZON_S]
