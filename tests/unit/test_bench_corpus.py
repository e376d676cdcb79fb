# SPDX-License-Identifier: GPL-2.0-or-later
"""The benchmark corpus: the generator family is deterministic by seed and offers the load
and the swing it names; the PAI converter reads the published format and maps each request."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)

make_traces = pytest.importorskip("make_traces")
convert_pai = pytest.importorskip("convert_pai")
convert_openb = pytest.importorskip("convert_openb")
bench = pytest.importorskip("bench_relayout")


def _offered_gpu_h(rows):
    total = 0.0
    for _, run, flags, _ in rows:
        value = flags.split("=", 1)[1]
        kind, count = value.rsplit(":", 1)
        share = 1.0 if kind in ("gpu:h100", "gpu") else (
            0.01 if kind == "mps" else int(kind.split(":")[1].split("g.")[0]) / 7)
        total += share * int(count) * run / 3600
    return total


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    member = make_traces.FAMILY[1]
    assert make_traces.generate(member, 32) == make_traces.generate(member, 32)
    other = member._replace(seed=member.seed + 1)
    assert make_traces.generate(other, 32) != make_traces.generate(member, 32)


@pytest.mark.parametrize("member", make_traces.FAMILY, ids=lambda m: m.name)
def test_each_member_offers_its_load_of_the_cluster(member):
    rows = make_traces.generate(member, 64)
    offered = _offered_gpu_h(rows) / (64 * 24)
    assert member.load * 0.8 <= offered <= member.load * 1.2
    assert all(0 <= submit < 86400 and run > 0 for submit, run, _, _ in rows)


def test_the_family_spans_its_range():
    assert min(m.load for m in make_traces.FAMILY) == 0.5
    assert max(m.load for m in make_traces.FAMILY) == 1.2
    assert {m.period_h for m in make_traces.FAMILY} >= {4, 24}
    kinds = {flags.split("=")[1].rsplit(":", 1)[0] for m in make_traces.FAMILY
             for _, _, flags, _ in make_traces.generate(m, 32)}
    assert kinds == {"gpu:1g.10gb", "gpu:2g.20gb", "gpu:3g.40gb", "gpu:h100", "mps"}


def test_demand_swings_with_the_period():
    # inference <-> training every 8 h: whole-GPU jobs peak mid-period, vanish at its ends.
    member = next(m for m in make_traces.FAMILY if m.period_h == 8)
    rows = make_traces.generate(member, 64)

    def whole_share(low_h, high_h):
        picked = [f for s, _, f, _ in rows if low_h * 3600 <= s % (8 * 3600) < high_h * 3600]
        return sum("h100" in f for f in picked) / len(picked)

    assert whole_share(3, 5) > 0.3 and whole_share(0, 0.5) < 0.05


def _write_pai(tmp_path, jobs, tasks, header=False):
    job_file, task_file = tmp_path / "pai_job_table.csv", tmp_path / "pai_task_table.csv"
    job_file.write_text(("job_name,inst_id,user,status,start_time,end_time\n" if header
                         else "") + "".join(",".join(row) + "\n" for row in jobs))
    task_file.write_text("".join(",".join(row) + "\n" for row in tasks))
    return str(job_file), str(task_file)


def _task(job, inst, status, start, end, gpu):
    return (job, "worker", inst, status, start, end, "600.0", "29.3", gpu, "V100")


def test_the_converter_maps_pai_rows_to_requests(tmp_path):
    jobs = [("j1", "i1", "alice", "Terminated", "1000.0", "2000.0"),
            ("j2", "i2", "bob", "Terminated", "1100.0", "9000.0"),
            ("j3", "i3", "carol", "Failed", "1200.0", "1300.0"),
            ("j4", "i4", "dan", "Waiting", "1300.0", ""),
            ("j5", "i5", "eve", "Terminated", "1400.0", "1500.0"),
            ("j6", "i6", "fay", "Terminated", "999999.0", "1000999.0")]
    tasks = [_task("j1", "1.0", "Terminated", "1010.0", "1610.0", "12.5"),
             _task("j2", "2.0", "Terminated", "1200.0", "8400.0", "200.0"),
             _task("j3", "1.0", "Failed", "1200.0", "1250.0", "40.0"),
             _task("j4", "1.0", "Waiting", "", "", "100.0"),
             _task("j5", "1.0", "Terminated", "1400.0", "1450.0", "0.0"),
             _task("j6", "1.0", "Terminated", "999999.0", "1000999.0", "25.0")]
    job_file, task_file = _write_pai(tmp_path, jobs, tasks, header=True)
    rows = convert_pai.convert(job_file, task_file, hours=24)
    assert rows == [(0, 600, "--gres=gpu:1g.10gb:1", "alice"),
                    (100, 7200, "--gres=gpu:h100:2", "bob"),
                    (100, 7200, "--gres=gpu:h100:2", "bob"),
                    (200, 50, "--gres=gpu:3g.40gb:1", "carol")]
    mps = convert_pai.convert(job_file, task_file, "mps", hours=None)
    assert (998999, 1000, "--gres=mps:25", "fay") in mps and len(mps) == 5
    assert convert_pai.gpu_flags(50.0) == "--gres=gpu:h100:1"
    assert convert_pai.gpu_flags(2000.0) == "--gres=gpu:h100:8"


def test_a_file_not_in_the_pai_format_is_named(tmp_path):
    job_file, task_file = _write_pai(tmp_path, [("j1", "i1", "u", "Terminated", "1")], [])
    with pytest.raises(ValueError, match=r"pai_job_table\.csv:1: 5 columns"):
        convert_pai.convert(job_file, task_file)


OPENB_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                "creation_time,deletion_time,scheduled_time\n")


def _write_openb(tmp_path, rows):
    path = tmp_path / "openb_pod_list_default.csv"
    path.write_text(OPENB_HEADER + "".join(",".join(row) + "\n" for row in rows))
    return str(path)


def _pod(name, gpus, milli, phase, created, deleted, scheduled):
    return (name, "8000", "16384", gpus, milli, "", "LS", phase, created, deleted, scheduled)


def test_the_openb_converter_maps_each_scheduled_gpu_pod_to_a_request(tmp_path):
    """A shared GPU's gpu_milli is its share (the smallest MIG slice holding it, or MPS
    units); several GPUs are whole; CPU-only and never-scheduled pods are left out; the run
    is from scheduling to deletion, the submission the creation."""
    day = convert_openb.DAY_S
    path = _write_openb(tmp_path, [
        _pod("p-cpu", "0", "0", "Succeeded", "10", "500", "10"),
        _pod("p-1g", "1", "140", "Running", "100", "700", "130"),
        _pod("p-3g", "1", "400", "Failed", "200", "260", "200"),
        _pod("p-half", "1", "500", "Succeeded", "300", "900", "320"),
        _pod("p-whole", "1", "1000", "Running", "400", "4000", "400"),
        _pod("p-eight", "8", "1000", "Succeeded", str(day + 50), str(day + 3650), str(day + 60)),
        _pod("p-pending", "1", "220", "Pending", "500", "900", ""),
        _pod("p-2g-later", "2", "1000", "Running", str(3 * day), str(3 * day + 10),
             str(3 * day))])
    pods = convert_openb.read_pods(path)
    assert [row for _, row in pods] == [
        (0, 570, "--gres=gpu:1g.10gb:1", "p-1g"), (0, 60, "--gres=gpu:3g.40gb:1", "p-3g"),
        (0, 580, "--gres=gpu:h100:1", "p-half"), (0, 3600, "--gres=gpu:h100:1", "p-whole"),
        (0, 3590, "--gres=gpu:h100:8", "p-eight"), (0, 10, "--gres=gpu:h100:2", "p-2g-later")]
    assert convert_openb.window(pods, 0, 2) == [
        (100, 570, "--gres=gpu:1g.10gb:1", "p-1g"), (200, 60, "--gres=gpu:3g.40gb:1", "p-3g"),
        (300, 580, "--gres=gpu:h100:1", "p-half"), (400, 3600, "--gres=gpu:h100:1", "p-whole"),
        (day + 50, 3590, "--gres=gpu:h100:8", "p-eight")]
    mps = [row[2] for _, row in convert_openb.read_pods(path, "mps")]
    assert mps[:3] == ["--gres=mps:14", "--gres=mps:40", "--gres=mps:50"]
    # Windows start at each whole day that has at least min_jobs jobs in their span.
    assert [(d, len(rows)) for d, rows in convert_openb.windows(pods, 2, 1)] == \
        [(0, 5), (1, 1), (2, 1), (3, 1)]
    assert [d for d, _ in convert_openb.windows(pods, 2, 2)] == [0]
    assert convert_openb.windows([], 2, 1) == []


def test_an_openb_file_in_another_format_or_with_bad_cells_is_named(tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("name,num_gpu\np,1\n")
    with pytest.raises(ValueError, match=r"other\.csv: no column gpu_milli, .*not an "
                                         r"openb_pod_list file"):
        convert_openb.read_pods(str(other))
    bad = _write_openb(tmp_path, [_pod("p", "1", "x", "Running", "1", "2", "1")])
    with pytest.raises(ValueError, match=r":2: gpu_milli is 'x', not a number"):
        convert_openb.read_pods(bad)
    negative = _write_openb(tmp_path, [_pod("p", "1", "100", "Running", "-5", "2", "1")])
    with pytest.raises(ValueError, match=r"creation_time is '-5', not a time or count"):
        convert_openb.read_pods(negative)


def test_the_openb_command_writes_its_windows_and_refuses_what_it_cannot_read(tmp_path, capsys):
    path = _write_openb(tmp_path, [_pod(f"p{n}", "1", "1000", "Succeeded", str(600 * n),
                                        str(600 * n + 300), str(600 * n)) for n in range(5)])
    out = tmp_path / "windows"
    assert convert_openb.main(["--pods", path, "--windows", str(out), "--min-jobs", "5"]) == 0
    assert sorted(os.listdir(out)) == ["openb-day0.csv"]
    assert len(bench.read_trace(str(out / "openb-day0.csv"))) == 5
    one = tmp_path / "one.csv"
    assert convert_openb.main(["--pods", path, "--out", str(one), "--from-day", "0",
                               "--days", "0.01"]) == 0
    assert len(bench.read_trace(str(one))) == 2  # submitted within 864 s
    assert convert_openb.main(["--pods", str(tmp_path / "missing.csv"), "--windows",
                               str(out)]) == 2
    assert "convert_openb: " in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert_openb.main(["--pods", path, "--out", str(one)])  # no --from-day


def test_a_corpus_directory_gives_its_traces_tiled_for_the_size(tmp_path):
    (tmp_path / "b.csv").write_text("submit_s,run_s,gpu_flags,user\n0,60,--gres=gpu:h100:1,u\n")
    (tmp_path / "a.csv").write_text("submit_s,run_s,gpu_flags,user\n5,60,--gres=mps:20,u\n")
    (tmp_path / "notes.txt").write_text("not a trace")
    found = bench.corpus(8, directory=str(tmp_path))
    assert [name for name, _ in found] == ["a.csv", "b.csv"]
    assert [len(jobs) for _, jobs in found] == [2, 2]


def test_the_shipped_sample_is_what_the_writer_and_the_converter_give(tmp_path):
    here = os.path.join(BENCH, "traces")
    convert_pai.write_sample(str(tmp_path))
    for name in ("pai_job_table.csv", "pai_task_table.csv"):
        with open(os.path.join(here, "pai-sample", name), encoding="utf-8") as shipped:
            assert (tmp_path / name).read_text() == shipped.read()
    out = tmp_path / "trace.csv"
    convert_pai.write_trace(convert_pai.convert(
        os.path.join(here, "pai-sample", "pai_job_table.csv"),
        os.path.join(here, "pai-sample", "pai_task_table.csv")), str(out))
    with open(os.path.join(here, "pai-sample.csv"), encoding="utf-8") as shipped:
        assert out.read_text() == shipped.read()
    assert len(bench.read_trace(str(out))) > 500


def test_the_corpus_tiles_and_halves_a_trace():
    jobs = [bench.Job(n, float(s), 60.0, "whole", 1, "u") for n, s in enumerate((0, 50, 100))]
    tiled = bench.tile(jobs, 3)
    assert len(tiled) == 9 and len({j.id for j in tiled}) == 9
    assert [j.submit for j in tiled[:3]] == [0.0, 1.0, 2.0]
    first, second = bench.halves(jobs)  # gpushare.admin.relayout.trial's
    assert [j.submit for j in first] == [0.0] and [j.submit for j in second] == [0.0, 50.0]


def test_the_by_kind_table_splits_slices_mps_and_whole_and_counts_the_unstarted():
    from gpushare.admin.relayout.sim import Result

    result = Result(waits={}, jct=[], used_gpu_h=0.0, idle_waiting_gpu_h=0.0, changes=0,
                    gpu_hours=0.0, landed_during_change=0, disturbed=0, unfinished=0,
                    finished=[(1, "1g.10gb", 60.0, 0.0), (2, "3g.40gb", 180.0, 0.0),
                              (3, "whole", 600.0, 0.0)],
                    unstarted=[(4, "whole", 1800.0, 0.0)])
    assert bench._kind_wait(result, "slices") == "2.0"
    assert bench._kind_wait(result, "whole") == "20.0"
    assert bench._kind_wait(result, "mps") == "-"


def test_the_from_suggest_row_starts_both_replays_from_the_layout_learned_on_the_first_half(
        tmp_path, monkeypatch):
    """The first half asks for 1g slices only, so --suggest learns 7x1g.10gb GPUs; the
    second half asks for whole GPUs, which that layout left alone never starts, and
    relayout gives them GPUs: the whole-GPU class waits less, and the row says so."""
    from gpushare.admin.relayout.sim import default_cluster

    monkeypatch.setattr(bench, "CACHE", str(tmp_path / "best-static.json"))
    cluster = default_cluster(1, 2, ("7x1g.10gb", "whole"))
    jobs = [bench.Job(n, 360.0 * n, 1200.0, "1g.10gb", 4, "u") for n in range(40)]
    jobs += [bench.Job(100 + n, 30000.0 + 600.0 * n, 1200.0, "whole", 1, "w")
             for n in range(20)]
    learned, _ = bench.cached_best_static(bench.halves(jobs)[0], cluster)
    assert learned == {"7x1g.10gb": 2, "whole": 0}
    cells = [cell.strip() for cell in bench.suggest_row("t", jobs, cluster).split("|")[1:-1]]
    assert cells[:2] == ["t", "1"]
    left_alone, relayout = (float(v) for v in cells[5].split(" -> "))
    assert relayout < left_alone, cells
    assert int(cells[6]) > 0


def test_spread_limits_are_each_jobs_own_far_above_the_run_and_the_same_every_replay():
    """--limits spread: each job's limit its run times a factor from 1 to SPREAD_MAX, drawn
    for the job (the same in every replay), spread as users set them, not one factor."""
    import statistics

    jobs = [bench.Job(n, 0.0, 600.0, "1g.10gb", 1, "u") for n in range(2000)]
    factors = [bench.spread_limit(job) / job.run for job in jobs]
    assert all(1.0 <= f <= bench.SPREAD_MAX for f in factors)
    assert factors == [bench.spread_limit(job) / job.run for job in jobs]  # seeded by id
    # Log-uniform from 1 to 8: half the limits above 8 ** 0.5 (2.83) times the run.
    assert 2.5 < statistics.median(factors) < 3.2
    assert min(factors) < 1.1 and max(factors) > 7.0
    assert bench.twice_the_run(jobs[0]) == 1200.0
