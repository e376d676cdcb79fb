# SPDX-License-Identifier: GPL-2.0-or-later
"""Changes back to the plan's layouts: a GPU a change took from a kind comes back to it
once its node is idle, where the kind has less than its jobs held, and where the forecast
finds no job waiting longer for it."""

from __future__ import annotations

from typing import Optional

import pytest
from tests.unit.admin.relayout_site import make_site, sacct_stub
from tests.unit.admin.test_relayout_keep import _dry_run, _ran_at_once
from tests.unit.admin.test_relayout_state import state_with

from gpushare.admin.relayout.decide import Decision, GpuState, Request
from gpushare.admin.relayout.predict import decide_guarded, guard_back
from gpushare.admin.relayout.restore import Back, each_node
from gpushare.admin.relayout.sim import Job, default_cluster, simulate
from gpushare.admin.relayout.state import save_state

CLUSTER = default_cluster(2, 3)
MENUS = {"g": CLUSTER.menu}


def candidates(*args, **kwargs) -> list:
    """Every node's changes back at once (``each_node`` weighs them as asked for)."""
    return list(each_node(*args, **kwargs))


def _layout(name: str):
    item = CLUSTER.menu.item(name)
    assert item is not None
    return item.layout


def _gpu(node: str, index: int, layout: str, used: Optional[dict[str, int]] = None,
         ends_in_s: Optional[float] = None, last_change_s: Optional[float] = None
         ) -> GpuState:
    return GpuState(node, index, "g", _layout(layout), bool(used), True, last_change_s,
                    used or {}, ends_in_s if used else None)


def _back(plan: dict[tuple[str, int], str], wanted: dict[str, int]) -> Back:
    return Back({key: _layout(name) for key, name in plan.items()}, wanted)


PLAN = {("n0", 0): "2x3g.40gb", ("n0", 1): "whole", ("n0", 2): "whole",
        ("n1", 0): "whole", ("n1", 1): "whole", ("n1", 2): "whole"}


def _layouts(gpus: list[GpuState]) -> dict[tuple[str, int], object]:
    return {(gpu.node, gpu.index): gpu.layout for gpu in gpus}


def test_an_idle_node_goes_back_to_the_plans_mix_by_the_fewest_changes():
    # n0 was planned 2x3g + 2 whole; a burst turned GPUs 0 and 1 ... and 2 to 2x3g except
    # one: 3 x 2x3g now. Whole GPUs are short of what their jobs held (6): two come back,
    # GPUs 1 and 2, whose own plan layout is whole; GPU 0 stays as planned.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"), _gpu("n0", 2, "2x3g.40gb"),
            _gpu("n1", 0, "whole"), _gpu("n1", 1, "whole"), _gpu("n1", 2, "whole")]
    found = candidates(gpus, _layouts(gpus), MENUS, _back(PLAN, {"whole": 6, "3g.40gb": 2}))
    assert [[(c.node, c.index, c.old, c.new) for c in node] for node in found] == [
        [("n0", 1, "2x3g.40gb", "whole"), ("n0", 2, "2x3g.40gb", "whole")]]


def test_nothing_goes_back_while_no_kind_is_short_of_what_its_jobs_held():
    # Whole-GPU jobs held at most 4 at once: the 4 left are enough.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"), _gpu("n0", 2, "2x3g.40gb"),
            _gpu("n1", 0, "whole"), _gpu("n1", 1, "whole"), _gpu("n1", 2, "whole")]
    assert candidates(gpus, _layouts(gpus), MENUS, _back(PLAN, {"whole": 3})) == []


def test_only_as_much_comes_back_as_the_short_kind_needs_and_never_under_a_floor():
    # Whole short by one: one GPU back. With a 3g floor of 6 (what 3g jobs held), none.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"), _gpu("n0", 2, "2x3g.40gb"),
            _gpu("n1", 0, "whole"), _gpu("n1", 1, "whole"), _gpu("n1", 2, "whole")]
    back = _back(PLAN, {"whole": 4})
    found = candidates(gpus, _layouts(gpus), MENUS, back)
    assert [(c.index, c.new) for node in found for c in node] == [(1, "whole")]
    assert candidates(gpus, _layouts(gpus), MENUS, back, floors={"3g.40gb": 6}) == []


def test_a_busy_gpu_a_node_busy_past_the_drain_a_recent_change_and_the_rounds_nodes_stay():
    plan_gpus = [_gpu("n1", i, "whole") for i in range(3)]
    back = _back(PLAN, {"whole": 6})

    def found(n0: list[GpuState], **kwargs) -> list[tuple[int, str]]:
        gpus = [*n0, *plan_gpus]
        return [(c.index, c.new) for node in candidates(gpus, _layouts(gpus), MENUS, back,
                                                         **kwargs) for c in node]

    # GPU 1 holds a job ending in 10 minutes: GPUs 2 and 0 come back (the node drains);
    # with GPU 1 the node's one 2x3g GPU, its mix is the plan's.
    assert found([_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb", {"3g.40gb": 1}, 600),
                  _gpu("n0", 2, "2x3g.40gb")]) == [(2, "whole"), (0, "whole")]
    # ... ending in 3 hours, past --max-drain: nothing.
    assert found([_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb", {"3g.40gb": 1},
                                                     3 * 3600), _gpu("n0", 2, "2x3g.40gb")]) == []
    # GPU 2 changed 10 minutes ago, under the menu's min_interval_s: it stays, GPUs 1 and 0
    # come back.
    assert found([_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"),
                  _gpu("n0", 2, "2x3g.40gb", last_change_s=600)]) == [(1, "whole"), (0, "whole")]
    # A node this round already changes is left to that change.
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"),
            _gpu("n0", 2, "2x3g.40gb"), *plan_gpus]
    assert candidates(gpus, _layouts(gpus), MENUS, back, skip=frozenset({"n0"})) == []


def test_a_change_back_is_made_when_it_harms_no_job_and_refused_when_it_would():
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"), _gpu("n0", 2, "whole"),
            _gpu("n1", 0, "whole", {"whole": 1}, 7200), _gpu("n1", 1, "whole", {"whole": 1}, 7200),
            _gpu("n1", 2, "whole", {"whole": 1}, 7200)]
    back = _back(PLAN, {"whole": 5, "3g.40gb": 2})
    # No job waits: GPU 1 goes back to whole, and the why says on what prediction.
    decision, [verdict] = guard_back(Decision(), [], gpus, MENUS, back)
    assert [(c.node, c.index, c.new) for c in decision.changes] == [("n0", 1, "whole")]
    assert verdict.made and verdict.back
    assert "back to the plan's layouts" in decision.why[-1]
    # Four 3g jobs wait for the slices it would take, and none can start elsewhere.
    queue = [Request(f"j{n}", "3g.40gb", 1, 600.0, limit_s=3600.0) for n in range(4)]
    decision, [verdict] = guard_back(Decision(), queue, gpus, MENUS, back)
    assert decision.changes == [] and not verdict.made
    assert "MIG and MPS jobs would wait longer" in verdict.refusal


def test_where_slurm_keeps_one_mig_profile_per_node_a_node_goes_back_whole_or_not_at_all():
    """Before Slurm 23.11 a node has one MIG profile. 1g.10gb is short by one slice: one GPU
    back would do, but would leave the node 1g.10gb beside 3g.40gb, so both go back (the
    plan's mix has one profile); where the second is busy, neither goes."""
    plan = {("n0", index): "7x1g.10gb" for index in range(3)}
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"), _gpu("n0", 2, "7x1g.10gb")]
    back = _back(plan, {"1g.10gb": 8})
    changed = [[(c.index, c.new) for c in node] for node in candidates(
        gpus, _layouts(gpus), MENUS, back, one_profile_per_node=True)]
    assert changed == [[(0, "7x1g.10gb"), (1, "7x1g.10gb")]]
    # From 23.11 a node may mix them: the one GPU the shortage needs.
    assert [[c.index for c in node] for node in candidates(gpus, _layouts(gpus), MENUS,
                                                           back)] == [[0]]
    gpus[1] = _gpu("n0", 1, "2x3g.40gb", {"3g.40gb": 1}, 600)
    assert candidates(gpus, _layouts(gpus), MENUS, back, one_profile_per_node=True) == []


def test_a_refused_change_back_leaves_the_shortage_to_the_next_node():
    """Whole GPUs are one short. n0's idle 2x3g.40gb GPU would give it, but two 3g.40gb jobs
    wait for its slices: refused. n1's idle 7x1g.10gb GPU gives it with no job waiting for
    its slices: made, though weighed with n0's change counted as made, whole GPUs would not
    have looked short there."""
    plan = {(node, index): "whole" for node in ("n0", "n1") for index in range(3)}
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "whole"), _gpu("n0", 2, "whole"),
            _gpu("n1", 0, "7x1g.10gb"), _gpu("n1", 1, "whole"), _gpu("n1", 2, "whole")]
    back = _back(plan, {"whole": 5})
    queue = [Request(f"j{n}", "3g.40gb", 1, 600.0, limit_s=3600.0) for n in range(2)]
    decision, verdicts = guard_back(Decision(), queue, gpus, MENUS, back)
    assert [(v.node, v.made) for v in verdicts] == [("n0", False), ("n1", True)]
    assert [(c.node, c.index, c.old, c.new) for c in decision.changes] == [
        ("n1", 0, "7x1g.10gb", "whole")]
    # With no job waiting, n0's is made and nothing is short after it.
    decision, verdicts = guard_back(Decision(), [], gpus, MENUS, back)
    assert [(v.node, v.made) for v in verdicts] == [("n0", True)]


def test_the_round_weighs_changes_back_after_its_own_changes():
    gpus = [_gpu("n0", 0, "2x3g.40gb"), _gpu("n0", 1, "2x3g.40gb"), _gpu("n0", 2, "whole"),
            _gpu("n1", 0, "whole"), _gpu("n1", 1, "whole"), _gpu("n1", 2, "whole")]
    back = _back(PLAN, {"whole": 5})
    decision, verdicts = decide_guarded([], gpus, MENUS, back=back)
    assert [(c.node, c.index, c.new) for c in decision.changes] == [("n0", 1, "whole")]
    # Without a Back, as with --keep-hours 0, the round makes no change back.
    decision, verdicts = decide_guarded([], gpus, MENUS)
    assert decision.changes == [] and verdicts == []


def test_the_replay_gives_back_a_gpu_a_burst_took_once_its_node_is_idle():
    # One node, two whole GPUs. A burst of 3g jobs at the start turns them into 2x3g
    # slices; once the burst is over and an hour has passed (min_interval_s), they come back
    # whole, before any whole-GPU job asks for them.
    cluster = default_cluster(1, 2)
    whole = _layout("whole")
    burst = [Job(n, 60.0 * n, 1800.0, "3g.40gb", 1, f"u{n}") for n in range(12)]
    later = [Job(100 + n, 6 * 3600.0 + 3600.0 * n, 1200.0, "whole", 2, "w") for n in range(4)]
    result = simulate(burst + later, [[whole, whole]], True, cluster)
    times = sorted(t for changes in result.change_times.values() for t in changes)
    assert len(times) == 4 and times[0] == times[1] and times[2] == times[3], times
    assert cluster.menu.min_interval_s <= times[2] - times[0] and times[2] < later[0].submit
    # The two-GPU whole jobs that came later started as they came: the GPU was back.
    assert max(w for _, kind, w, _ in result.finished if kind == "whole") < 300.0


@pytest.fixture
def site(tmp_path):
    return make_site(tmp_path)


def test_the_command_gives_back_what_a_change_took_when_no_job_needs_it(site, tmp_path,
                                                                        capsys):
    # The plan gives h1's GPU 2 seven 1g slices; an earlier change made it 2x3g. 1g jobs
    # held 30 slices at once today, all the plan gives them: 1g is short by 7.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    save_state(state_with(tmp_path, h1_2="2x3g.40gb"))
    sacct = sacct_stub(str(stubs), tuple(_ran_at_once("gres/gpu:1g.10gb=5")))
    # A 3g job waits for the slices: the change back would leave it waiting; refused.
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct)
    assert decision["changes"] == []
    [back] = [p for p in decision["predictions"] if p["to"] == "7x1g.10gb"]
    assert (back["node"], back["gpus"], back["made"], back["back"]) == ("h1", [2], False, True)
    assert decision["floors"]["wanted"] == {"1g.10gb": 30}
    assert back["refusal"].startswith("MIG and MPS jobs would wait longer"), back
    # Nothing waits: it goes back, and the why says on what.
    empty = stubs / "squeue"
    empty.write_text("#!/bin/sh\nexit 0\n")
    empty.chmod(0o755)
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct, squeue=str(empty))
    assert [(c["node"], c["gpu"], c["from"], c["to"]) for c in decision["changes"]] == [
        ("h1", 2, "2x3g.40gb", "7x1g.10gb")], decision["why"]
    assert any("h1 GPU 2: 2x3g.40gb -> 7x1g.10gb" in why and "made (back to the plan's "
               "layouts" in why for why in decision["why"]), decision["why"]
    # 1g jobs held 15 at most: the 23 left are enough, nothing goes back.
    sacct = sacct_stub(str(stubs), tuple(_ran_at_once("gres/gpu:1g.10gb=5", jobs=3)))
    decision = _dry_run(site, tmp_path, capsys, "--sacct", sacct, squeue=str(empty))
    assert decision["changes"] == [] and decision["predictions"] == [], decision["why"]


def test_the_forecast_of_a_change_back_runs_the_layout_it_makes():
    # n0's GPU 0 is planned whole but changed 10 minutes ago; GPU 1, planned 2x3g like GPU 2,
    # becomes the node's whole GPU instead. n1's whole GPUs are busy for two hours, and a
    # whole-GPU job came in the last hour: its like next hour starts on n0's GPU 1, once whole.
    plan = {("n0", 0): "whole", ("n0", 1): "2x3g.40gb", ("n0", 2): "2x3g.40gb",
            ("n1", 0): "whole", ("n1", 1): "whole", ("n1", 2): "whole"}
    gpus = [_gpu("n0", 0, "2x3g.40gb", last_change_s=600), _gpu("n0", 1, "2x3g.40gb"),
            _gpu("n0", 2, "2x3g.40gb")] + [
        _gpu("n1", i, "whole", {"whole": 1}, 7200) for i in range(3)]
    recent = [(600.0, Request("w", "whole", 1, 0.0, limit_s=1800.0))]
    decision, [verdict] = guard_back(Decision(), [], gpus, MENUS, _back(plan, {"whole": 4}),
                                     recent=recent)
    assert [(c.node, c.index, c.old, c.new) for c in decision.changes] == [
        ("n0", 1, "2x3g.40gb", "whole")]
    assert verdict.with_it.whole_wait_s < verdict.without.whole_wait_s
