# SPDX-License-Identifier: GPL-2.0-or-later
"""bench_prolog reads the plugin's debug log: the workers' spans and their phases."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))

bench_prolog = pytest.importorskip("bench_prolog")

LOG = """\
100.000000 pid=10 uid=0 ctx=job_script job=7 cb=job_prolog begin
100.001000 pid=10 uid=0 ctx=job_script job=7 cb=job_prolog detached
100.020000 pid=12 uid=0 ctx=job_script job=7 python=start
100.050000 pid=12 uid=0 py job=7 debug timing imports=12.0 gpu-imports=5.0 nvml=2.0 \
verify=9.0 mps=3.0 daemon-start=4.0 total=30.0
100.051000 pid=12 uid=0 ctx=job_script job=7 cb=job_prolog python rc=0
101.000000 pid=20 uid=0 ctx=job_script job=7 cb=job_epilog detached
101.010000 pid=21 uid=0 ctx=job_script job=7 python=start
101.030000 pid=21 uid=0 py job=7 debug timing imports=6.0 record=1.0 mps=12.0 total=15.0
101.031000 pid=21 uid=0 ctx=job_script job=7 cb=job_epilog python rc=0
"""


def test_workers_and_their_phases_are_read_from_the_debug_log():
    lines = LOG.splitlines()
    spans = bench_prolog.workers_from_debug_log(lines)
    assert spans[7]["prolog"] == pytest.approx(0.050)
    assert spans[7]["epilog"] == pytest.approx(0.031)
    phases = bench_prolog.phases_from_debug_log(lines)
    prolog, epilog = phases[(7, "prolog")], phases[(7, "epilog")]
    assert prolog["interpreter"] == pytest.approx(19.0)
    assert prolog["daemon-start"] == 4.0 and prolog["total"] == 30.0
    assert epilog["interpreter"] == pytest.approx(10.0)
    assert epilog["mps"] == 12.0


def test_the_phase_table_prints_every_phase_once(capsys):
    phases = bench_prolog.phases_from_debug_log(LOG.splitlines())
    bench_prolog.print_phases(("gpushare",), {"gpushare": [(7, 0.1)]}, phases)
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert rows["interpreter"] == ["19.0", "10.0"]
    assert rows["daemon-start"] == ["4.0", "-"]  # no epilog starts a daemon
    assert list(rows)[-1] == "total"


def test_epilogs_done_without_a_worker_are_counted_not_timed():
    lines = [
        *LOG.splitlines(),
        "102.000000 pid=30 uid=0 ctx=job_script job=8 cb=job_epilog python=skip "
        "reason=left-daemon daemon=u1001-GPU-1 share=25",
        "103.000000 pid=31 uid=0 ctx=job_script job=9 cb=job_epilog fast=no "
        "reason=last-job daemon=u1001-GPU-1",
    ]
    lines.append("104.000000 pid=32 uid=0 ctx=job_script job=10 cb=job_prolog python=skip "
                 "reason=joined daemon=u1001-GPU-1 share=25")
    assert bench_prolog.fast_epilogs_from_debug_log(lines) == {8}
    assert bench_prolog.fast_prologs_from_debug_log(lines) == {10}
    assert set(bench_prolog.workers_from_debug_log(lines)) == {7}
