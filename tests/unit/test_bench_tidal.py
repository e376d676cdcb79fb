# SPDX-License-Identifier: GPL-2.0-or-later
"""bench_tidal's replay: lending shortens the batch queue's wait, every reclaim keeps its
promise with no job ended, and the static arm lends nothing."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

bench = pytest.importorskip("bench_tidal")


@pytest.mark.parametrize("seed", [1, 2])
def test_lending_keeps_its_promises_and_shortens_the_wait(seed):
    static = bench.simulate("static", seed, 2, 2, 2, 1.3)
    assert static.lent_gpu_h == 0 and static.within_promise == 1.0
    for arm in ("window", "window-sized", "demand-4h", "demand-1h"):
        lent = bench.simulate(arm, seed, 2, 2, 2, 1.3)
        assert lent.lent_gpu_h > 0, arm
        assert lent.wait < static.wait, (arm, lent, static)
        assert lent.within_promise == 1.0 and lent.short_gpu_min == 0, (arm, lent)
        assert lent.idle_reclaim_p95_s <= 60, (arm, lent)
    window = bench.simulate("window", seed, 2, 2, 2, 1.3)
    assert window.trough_share >= 0.8, window
    # A window sized to inference's busiest night minute starves it less than one that
    # lends all that is idle; a tighter promise less than a looser one.
    sized = bench.simulate("window-sized", seed, 2, 2, 2, 1.3)
    assert sized.starved_gpu_min < window.starved_gpu_min, (sized, window)
    tight, loose = (bench.simulate(arm, seed, 2, 2, 2, 1.3) for arm in ("demand-1h",
                                                                           "demand-4h"))
    assert tight.starved_gpu_min < loose.starved_gpu_min, (tight, loose)


def test_a_job_runs_on_a_lent_gpu_only_when_it_ends_before_the_reclaim():
    """The replay's placement uses the rule's own ``fits``: a job whose time limit passes
    the window's end stays on Slurm's own GPUs."""
    from gpushare.admin.tidal.decide import fits

    plan = bench.parse_plan(bench.PLAN.format(lending=bench.ARMS["window"](1), k_nodes=1,
                                              s_nodes=1))
    (rule,) = plan.lending
    assert fits(rule, 7 * 60, 60) and not fits(rule, 7 * 60, 61)
