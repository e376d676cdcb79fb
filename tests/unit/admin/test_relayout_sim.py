# SPDX-License-Identifier: GPL-2.0-or-later
"""The relayout simulator takes its cluster from the plan: the GPU model, the menu and the
node shape (nodes, Slurm GPUs per node) are the plan's node group's, not the benchmark's."""

from __future__ import annotations

import pytest

from gpushare.admin.plan import parse_plan
from gpushare.admin.relayout.sim import Job, cluster_from_plan, default_cluster, simulate
from gpushare.admin.relayout.static import best_static, even_split, spread

H200_PLAN = """\
version: 1
node_groups:
  - name: small
    nodes: a[1-3]
    gpu_model: h200-141gb
    gpus: 2
    layout:
      all: {owner: slurm, mig: [{profile: 1g.18gb, count: 7}]}
    relayout:
      menu:
        - {layout: 7x1g.18gb}
        - {layout: whole}
"""


def _jobs(*rows: tuple[float, float, str, int]) -> list[Job]:
    return [Job(n, s, r, kind, count, "u") for n, (s, r, kind, count) in enumerate(rows)]


def test_the_cluster_is_the_plans_group_model_menu_and_node_shape():
    cluster = cluster_from_plan(parse_plan(H200_PLAN))
    assert (cluster.model.name, cluster.nodes, cluster.gpus_per_node, cluster.name) == \
        ("h200-141gb", 3, 2, "small")
    assert cluster.names == ["7x1g.18gb", "whole"]
    assert cluster_from_plan(parse_plan(H200_PLAN), nodes=8).nodes == 8
    # Only the Slurm GPUs of a node take part: the shared plan's nodes have 2 of 4.
    from tests.unit.admin.relayout_plans import mig_plan

    shared = cluster_from_plan(parse_plan(mig_plan(["{layout: 7x1g.10gb}",
                                                    "{layout: whole}"])))
    assert (shared.model.name, shared.nodes, shared.gpus_per_node) == ("h100-80gb", 2, 2)


def test_a_history_replays_on_the_plans_cluster_not_the_default_one():
    # H200 slices: the plan's menu offers 1g.18gb, the default H100 menu does not.
    jobs = _jobs((0, 600, "1g.18gb", 1), (10, 600, "1g.18gb", 2), (20, 900, "whole", 2))
    cluster = cluster_from_plan(parse_plan(H200_PLAN))
    counts, result = best_static(jobs, cluster)
    assert result.unfinished == 0 and sum(counts.values()) == 6
    assert counts["whole"] >= 2 and counts["7x1g.18gb"] >= 1
    default = default_cluster(3, 2)
    stuck = simulate(jobs, spread(even_split(default), default), False, default)
    assert "1g.18gb" not in stuck.waits and stuck.unfinished >= 2  # none on H100s


def test_a_request_must_fit_one_node_of_the_plans_shape():
    cluster = cluster_from_plan(parse_plan(H200_PLAN))  # 2 GPUs a node
    layouts = spread({"whole": 6}, cluster)
    assert [len(row) for row in layouts] == [2, 2, 2]
    assert simulate(_jobs((0, 60, "whole", 2)), layouts, False, cluster).unfinished == 0
    assert simulate(_jobs((0, 60, "whole", 3)), layouts, False, cluster).unfinished == 1


def test_shares_follow_the_model():
    from gpushare.admin.mig_profiles import find_model
    from gpushare.admin.relayout.sim import Cluster, _menu

    model = find_model("a30")
    assert model is not None
    cluster = Cluster(model, _menu(model, ("4g.24gb", "2x2g.12gb", "mps:50")), 1, 1)
    assert cluster.share("2g.12gb") == pytest.approx(0.5)
    assert cluster.share("mps") == pytest.approx(1 / 50)
    assert default_cluster().share("3g.40gb") == pytest.approx(3 / 7)


def test_a_plan_without_one_menu_to_replay_is_refused_with_what_to_do():
    no_menu = H200_PLAN.split("    relayout:")[0]
    with pytest.raises(ValueError, match="no node group has a relayout menu"):
        cluster_from_plan(parse_plan(no_menu))
    two = H200_PLAN + H200_PLAN.split("node_groups:\n")[1].replace("small", "other") \
        .replace("a[1-3]", "b[1-2]")
    with pytest.raises(ValueError, match="name one with --group"):
        cluster_from_plan(parse_plan(two))
    assert cluster_from_plan(parse_plan(two), "other").nodes == 2
    with pytest.raises(ValueError, match="no node group 'nope'"):
        cluster_from_plan(parse_plan(two), "nope")


def test_the_default_menu_rejects_a_layout_its_model_cannot_hold():
    with pytest.raises(ValueError, match="no MIG profile"):
        default_cluster(1, 1, ("7x1g.5gb",))


def test_a_job_never_started_counts_with_its_wait_until_the_replays_end():
    cluster = default_cluster(1, 1)
    layouts = spread({"7x1g.10gb": 1}, cluster)
    jobs = [Job(0, 0.0, 600.0, "1g.10gb", 1, "u"), Job(1, 100.0, 600.0, "whole", 1, "u"),
            Job(2, 900.0, 600.0, "1g.10gb", 1, "u")]
    result = simulate(jobs, layouts, False, cluster)
    assert result.ran() == {0, 2}
    # It waits until two days after the last submission, as long in every replay.
    waited = 900.0 + 2 * 86400 - 100.0
    assert result.unstarted == [(1, "whole", waited, waited + 600.0)]
    assert result.censored_wait("whole") == waited
    assert result.censored_wait("mig") == 0.0
    assert result.censored_wait() == waited / 3
    assert result.censored_jct() == (600.0 + waited + 600.0 + 600.0) / 3


def test_a_job_started_after_the_cut_counts_as_one_never_started():
    """Every replay is cut two days after the last submission: a job that starts only after
    a job running for days ends counts its wait until the cut, as it would had it never
    started; its full wait would make the replay that starts it look worse than one that
    never does."""
    cluster = default_cluster(1, 1)
    layouts = spread({"whole": 1}, cluster)
    jobs = [Job(0, 0.0, 5 * 86400.0, "whole", 1, "u"), Job(1, 100.0, 600.0, "whole", 1, "u")]
    result = simulate(jobs, layouts, False, cluster)
    waited = 100.0 + 2 * 86400 - 100.0
    assert result.unstarted == [(1, "whole", waited, waited + 600.0)]
    assert result.late == {1} and result.ran() == {0, 1}  # it did run, after the cut
    assert result.censored_wait() == waited / 2
    assert result.censored_jct() == (5 * 86400.0 + waited + 600.0) / 2
    # The raw waits stay what the replay saw (the whole-trace report's percentiles).
    assert sorted(result.waits["whole"]) == [0.0, 5 * 86400.0 - 100.0]


def test_a_gpu_with_mps_units_is_given_whole_or_in_units_never_both():
    """Slurm allocates a GPU with MPS units as gres/gpu or as gres/mps, not both at once: a
    whole-GPU job starts on it when no unit is held, and MPS jobs wait while it runs."""
    cluster = default_cluster(1, 1, ("mps:100", "whole"))
    layouts = spread({"mps:100": 1}, cluster)
    jobs = [Job(0, 0.0, 600.0, "whole", 1, "u"), Job(1, 10.0, 600.0, "mps", 25, "u"),
            Job(2, 20.0, 600.0, "mps", 25, "u"), Job(3, 30.0, 600.0, "whole", 1, "u")]
    result = simulate(jobs, layouts, False, cluster)
    waits = {job: wait for job, _kind, wait, _ in result.finished}
    assert waits[0] == 0.0
    # The second whole-GPU job takes the GPU when the first ends (kinds are served in the
    # order the replay met them); both MPS jobs wait for it, then run side by side.
    assert waits[3] == 600.0 - 30.0
    assert waits[1] == 1200.0 - 10.0 and waits[2] == 1200.0 - 20.0
    assert result.unfinished == 0


def test_an_idle_mps_gpu_is_counted_idle_once():
    """An idle GPU with MPS units is free both whole and in units, and idle once."""
    cluster = default_cluster(1, 2, ("whole", "mps:100"))
    layouts = spread({"whole": 1, "mps:100": 1}, cluster)
    # A whole-GPU job holds the whole GPU for 600 s; a job of two whole GPUs waits for it,
    # beside the idle MPS GPU: one GPU idle for 600 s.
    jobs = [Job(0, 0.0, 600.0, "whole", 1, "u"), Job(1, 0.0, 600.0, "whole", 2, "u")]
    result = simulate(jobs, layouts, False, cluster)
    assert sorted(w for _, _, w, _ in result.finished) == [0.0, 600.0]
    assert abs(result.idle_waiting_gpu_h - 600.0 / 3600.0) < 1e-9


def test_an_mps_request_is_served_by_one_gpu_of_its_node():
    """Slurm satisfies a job's MPS units from one GPU per node: 60 units do not start on
    two GPUs with 50 free each."""
    cluster = default_cluster(1, 2, ("mps:100", "whole"))
    layouts = spread({"mps:100": 2}, cluster)
    jobs = [Job(0, 0.0, 600.0, "mps", 50, "u"), Job(1, 0.0, 600.0, "mps", 50, "u"),
            Job(2, 10.0, 600.0, "mps", 60, "u")]
    result = simulate(jobs, layouts, False, cluster)
    waits = {job: wait for job, _kind, wait, _ in result.finished}
    # The two 50-unit jobs share the first GPU; the 60-unit job takes the second at once.
    assert waits == {0: 0.0, 1: 0.0, 2: 0.0}
    jobs = [Job(0, 0.0, 600.0, "mps", 50, "u"), Job(1, 0.0, 600.0, "mps", 60, "u"),
            Job(2, 10.0, 600.0, "mps", 60, "u")]
    waits = {job: wait for job, _kind, wait, _ in simulate(jobs, layouts, False,
                                                           cluster).finished}
    # 50 free on one GPU and 40 on the other: the last 60-unit job waits for a GPU.
    assert waits[0] == 0.0 and waits[1] == 0.0 and waits[2] == 590.0


def test_the_best_static_layout_is_ranked_by_jobs_never_run_then_completion():
    """Requests of two whole GPUs cannot start on a node of one GPU whatever its layout:
    the search still finds the layout that runs the rest, not the first one it tried."""
    cluster = default_cluster(2, 1, ("mps:100", "7x1g.10gb", "whole"))
    jobs = [Job(0, 0.0, 600.0, "whole", 2, "u")]
    jobs += [Job(n, 10.0 * n, 600.0, "1g.10gb", 1, "u") for n in range(1, 15)]
    counts, best = best_static(jobs, cluster)
    assert best.unfinished == 1  # the two-GPU request, on any layout
    assert counts["7x1g.10gb"] == 2, counts


def test_a_menu_of_mig_layouts_only_replays():
    """An A100's menu holds MIG layouts only: with no kind "whole" anywhere the replay still
    counts the idle GPUs while jobs wait."""
    cluster = default_cluster(1, 1, ("7x1g.10gb", "2x3g.40gb"))
    jobs = _jobs((0, 600, "3g.40gb", 1), (10, 600, "1g.10gb", 1))
    result = simulate(jobs, spread({"2x3g.40gb": 1}, cluster), False, cluster)
    # The 1g.10gb job never starts, while the second 3g.40gb slice stays idle.
    assert result.unfinished == 1 and result.idle_waiting_gpu_h > 0


def _one_profile(nodes: int, per_node: int):
    from dataclasses import replace

    return replace(default_cluster(nodes, per_node, ("7x1g.10gb", "2x3g.40gb", "whole")),
                   one_profile=True)


@pytest.mark.parametrize("nodes, per_node, counts", [
    (3, 2, {"7x1g.10gb": 1, "2x3g.40gb": 3, "whole": 2}),
    (3, 4, {"7x1g.10gb": 1, "2x3g.40gb": 3, "whole": 8}),
    (3, 4, {"7x1g.10gb": 4, "2x3g.40gb": 4, "whole": 4}),
    (2, 3, {"7x1g.10gb": 2, "2x3g.40gb": 1, "whole": 3})])
def test_one_profile_per_node_spreads_each_profile_on_nodes_of_its_own(nodes, per_node, counts):
    """Slurm before 23.11: each profile's layouts go to nodes of their own and the whole GPUs
    fill the rest, so every count that can be laid out so is (nodes and GPUs coprime too)."""
    cluster = _one_profile(nodes, per_node)
    grid = spread(counts, cluster)
    assert all(cluster.fits(row) for row in grid), grid
    assert sorted(lay.name for row in grid for lay in row) == sorted(
        name for name, n in counts.items() for _ in range(n))


def test_one_profile_per_node_finds_a_layout_that_runs_every_kind():
    """A steady mix of 1g, 3g and whole-GPU jobs on 3 nodes of 4 GPUs: a node of each runs
    them all; the search reaches it (node-sized moves), not a layout that starves a kind."""
    cluster = _one_profile(3, 4)
    jobs = [Job(n, 600.0 * n, 3000.0, kind, 1, "u")
            for n, kind in enumerate(["1g.10gb", "3g.40gb", "whole"] * 24)]
    counts, best = best_static(jobs, cluster)
    assert best.unfinished == 0, (counts, best.unfinished)
    assert all(cluster.fits(row) for row in spread(counts, cluster))
    assert counts["7x1g.10gb"] >= 1 and counts["2x3g.40gb"] >= 1 and counts["whole"] >= 1


def test_nodes_alike_changed_in_one_round_each_come_back():
    """Two nodes in the same state drained for the same change: each finishes its own
    change and serves again (a node found by equality would leave the other changing for
    the rest of the replay, its GPUs lost)."""
    cluster = default_cluster(2, 1, ("7x1g.10gb", "whole"))
    layouts = spread({"7x1g.10gb": 2}, cluster)
    jobs = [Job(0, 0.0, 3600.0, "whole", 1, "u"), Job(1, 0.0, 3600.0, "whole", 1, "u")]
    result = simulate(jobs, layouts, True, cluster, keep_s=0.0)
    assert result.unfinished == 0 and result.ran() == {0, 1}
    assert result.changes == 2 and len(result.change_times) == 2
    assert max(result.waits["whole"]) < 3600.0  # both ran after one change, not one after


def test_the_first_rounds_forecast_sees_the_jobs_submitted_before_the_replay(monkeypatch):
    """A replay that begins mid-day (the corpus's second half) starts where a live site
    has an hour of submissions behind it: ``earlier`` stand in the first rounds' lookback,
    as sacct shows them to ``gpushare relayout``; without them the forecast would repeat
    the first minutes' submissions alone and see a fraction of the demand that comes."""
    from gpushare.admin.relayout import sim

    seen = []
    real = sim.decide_guarded

    def spy(*args, **kwargs):
        seen.append(sorted(request.job for _, request in kwargs["recent"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(sim, "decide_guarded", spy)
    cluster = default_cluster(1, 2, ("7x1g.10gb", "whole"))
    layouts = spread({"7x1g.10gb": 2}, cluster)
    jobs = [Job(0, 100.0, 600.0, "1g.10gb", 1, "u")]
    earlier = [Job(10, -4000.0, 600.0, "whole", 1, "u"), Job(11, -3000.0, 600.0, "whole", 1, "u"),
               Job(12, -100.0, 600.0, "1g.10gb", 1, "u"), Job(13, 50.0, 60.0, "whole", 1, "u")]
    simulate(jobs, layouts, True, cluster, keep_s=0.0, earlier=earlier)
    # At 300 s: 11 (3300 s ago) and 12 within the hour, 10 before it; 13 is not "earlier".
    assert seen[0] == ["0", "11", "12"]
    seen.clear()
    simulate(jobs, layouts, True, cluster, keep_s=0.0)
    assert seen[0] == ["0"]


def test_the_rounds_know_each_job_by_the_time_limit_the_replay_gives_it(monkeypatch):
    """slurmctld knows a job's run only from its time limit: the rounds' waiting jobs, the
    busy GPUs' ends and the recent submissions all carry ``limit``'s, not the run."""
    from gpushare.admin.relayout import sim

    seen = []
    real = sim.decide_guarded

    def spy(requests, states, *args, **kwargs):
        seen.append(([r.limit_s for r in requests], [s.ends_in_s for s in states if s.busy],
                     [r.limit_s for _, r in kwargs["recent"]]))
        return real(requests, states, *args, **kwargs)

    monkeypatch.setattr(sim, "decide_guarded", spy)
    cluster = default_cluster(1, 1, ("7x1g.10gb", "whole"))
    layouts = spread({"whole": 1}, cluster)
    jobs = [Job(0, 0.0, 1000.0, "whole", 1, "u"), Job(1, 10.0, 600.0, "whole", 1, "u")]
    simulate(jobs, layouts, True, cluster, keep_s=0.0, limit=lambda job: job.run * 5)
    # At 300 s: job 0 runs (5000 s limit, 4700 s left: it started at 0.0, a start like any
    # other), job 1 waits (3000 s limit).
    assert seen[0] == ([3000.0], [4700.0], [5000.0, 3000.0])
    seen.clear()
    simulate(jobs, layouts, True, cluster, keep_s=0.0)
    assert seen[0] == ([1200.0], [1700.0], [2000.0, 1200.0])  # twice the run by default
