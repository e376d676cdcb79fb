# SPDX-License-Identifier: GPL-2.0-or-later
"""bench_relayout's simulated Slurm: the trace format, a relayout that lets a job start that
the static layout never runs, and no running job touched by a change."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

bench = pytest.importorskip("bench_relayout")


def write_trace(tmp_path, rows):
    path = tmp_path / "trace.csv"
    path.write_text("submit_s,run_s,gpu_flags,user\n"
                    + "".join(f"{s},{r},{f},u\n" for s, r, f in rows))
    return str(path)


def test_the_trace_format_reads_both_flag_forms_and_skips_jobs_without_gpus(tmp_path):
    jobs = bench.read_trace(write_trace(tmp_path, [
        (10, 60, "--gres=gpu:3g.40gb:2", ), (0, 30, "--gpus-per-node=h100:4"),
        (5, 30, "--mem=1G")]))
    assert [(j.submit, j.kind, j.count) for j in jobs] == [(0.0, "whole", 4),
                                                           (10.0, "3g.40gb", 2)]


def test_relayout_runs_what_the_layout_cannot_and_never_touches_a_running_job(tmp_path):
    # One node of 8 GPUs cut into 1g.10gb; a long 1g job keeps GPU 0 busy while 3g.40gb
    # jobs queue: only a change of the idle GPUs lets them run, after the node drains.
    rows = [(0, 7200, "--gres=gpu:1g.10gb:1")]
    rows += [(60 + i, 1800, "--gres=gpu:3g.40gb:1") for i in range(6)]
    jobs = bench.read_trace(write_trace(tmp_path, rows))
    layouts = bench.spread({"7x1g.10gb": 8}, bench.default_cluster(1, 8))
    static = bench.simulate(jobs, layouts, False)
    assert static.unfinished == 6
    moved = bench.simulate(jobs, layouts, True)
    assert moved.unfinished == 0 and moved.disturbed == 0 and moved.changes >= 3
    waits = moved.waits["3g.40gb"]
    # The node drains until the 1g job ends at 7200 s, then changes: no 3g job starts before.
    assert min(waits) >= 7200 - 66
