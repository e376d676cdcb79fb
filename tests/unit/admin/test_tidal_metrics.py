# SPDX-License-Identifier: GPL-2.0-or-later
"""The tidal metrics: GPU-hours each way, reclaim latency and refusals by a bounded reason."""

from __future__ import annotations

import pytest

from gpushare.admin.tidal.metrics import TidalCounters, render_counters


def test_the_exposition_carries_each_measure() -> None:
    counters = TidalCounters()
    counters.lent("slurm", 2 * 3600)
    counters.lent("kubernetes", 1800)
    counters.reclaimed(12)
    counters.reclaimed(30)
    counters.refuse("window")
    text = render_counters(counters)
    assert 'gpushare_tidal_lent_gpu_hours_total{to="slurm"} 2\n' in text
    assert 'gpushare_tidal_lent_gpu_hours_total{to="kubernetes"} 0.5\n' in text
    assert "gpushare_tidal_reclaims_total 2\n" in text
    assert "gpushare_tidal_reclaim_seconds_total 42\n" in text
    assert "gpushare_tidal_reclaim_seconds_max 30\n" in text
    assert 'gpushare_tidal_refused_moves_total{reason="window"} 1\n' in text
    assert 'gpushare_tidal_refused_moves_total{reason="demand"} 0\n' in text


def test_unbounded_labels_are_refused() -> None:
    counters = TidalCounters()
    with pytest.raises(ValueError, match="not one of"):
        counters.refuse("kubernetes needs 3 of its 4")
    with pytest.raises(ValueError, match="not kubernetes or slurm"):
        counters.lent("nomad", 1.0)
