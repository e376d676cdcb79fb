# SPDX-License-Identifier: GPL-2.0-or-later
"""Where a job's GPU use is read: gpushare job, gpushare mps, the metrics, and the line the
epilog appends to the job's AdminComment. The figures are written as the sampler writes
them, through UsageStore."""

from __future__ import annotations

import os
import shlex

import pytest

from gpushare.admin import metrics
from gpushare.admin.metrics_usage import usage_families
from gpushare.admin.mps_report import DaemonView
from gpushare.cli import main
from gpushare.cli.mps import format_views
from gpushare.node.usage import summary, view
from gpushare.node.usage.store import DeviceUsage, Figures, JobUsage, NodeUsage, UsageStore

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the usage directory is root's")
NOW = 1_000_000.0
GIB = 1 << 30


def usage(job_id: int = 41, user: str = "alice", updated: float = NOW - 3,
          share: int = 25) -> JobUsage:
    sample = JobUsage(job_id, 1001, user, [{"uuid": "GPU-a", "gpu": 0, "mig_profile": "",
                                            "share": share}], NOW - 60, NOW - 60, 10.0)
    sample.add(Figures(40.0, 3 * GIB, 20.0), NOW - 13)
    sample.add(Figures(20.0, 1 * GIB, 10.0), updated)
    sample.quality = {"sm": "measured", "mem": "measured", "bw": "estimated"}
    return sample


def hogged() -> NodeUsage:
    return NodeUsage(NOW - 3, 10.0, [DeviceUsage(
        "GPU-a", 0, "", 91.0, "measured", [41, 42],
        {"job_id": 42, "user": "bob", "since": NOW - 63, "bw_pct": 70.0,
         "advice": "a MIG slice isolates bandwidth: ask --gres=gpu:1g.10gb:1"})])


def test_a_jobs_rows_say_now_peak_means_and_how_each_was_obtained():
    rows = dict(view.job_rows(usage(), NOW))
    assert rows["GPU use now"] == ("SM 20 % (measured), memory 1.0 GiB (measured), "
                                   "bandwidth share 10 % (estimated); sampled 3 s ago")
    assert rows["GPU use so far"] == ("peak memory 3.0 GiB, mean SM 30 %, mean bandwidth "
                                      "share 15 % over 2 sample(s)")
    stale = dict(view.job_rows(usage(updated=NOW - 25), NOW))
    assert stale["GPU use now"].startswith("stale: last sampled 25 s ago, every 10 s")
    assert view.job_rows(None, NOW) == [("GPU use", view.NOT_SAMPLED)]
    blind = usage()
    blind.quality["bw"] = "unavailable"
    blind.unsupported = ["nvmlGpmSampleGet"]
    rows = dict(view.job_rows(blind, NOW))
    assert "bandwidth share unavailable (the driver does not report it)" in rows["GPU use now"]
    assert rows["not reported"] == "the driver does not support nvmlGpmSampleGet"


def test_the_summary_line_is_one_bounded_line():
    line = view.summary_line(usage())
    assert line == ("gpushare: GPU peak memory 3.0 GiB, mean SM 30 % (measured), mean "
                    "bandwidth share 15 % (estimated), 2 samples")
    assert "\n" not in line and len(line) <= view.SUMMARY_LIMIT


def test_mps_shows_each_daemons_jobs_use_and_names_the_hog():
    daemon = DaemonView("u1001-GPU-a", "running", "shared", 1001, "alice", ("GPU 0",),
                        ("GPU-a",), (("41", 25), ("43", 25)))
    text = format_views([daemon], "/var/lib/gpushare", "plugstack", now=NOW,
                        usages={41: usage()}, node_usage=hogged())
    lines = text.splitlines()
    assert "GPU use of the daemons' jobs:" in lines
    row = next(line for line in lines if line.startswith("u1001-GPU-a  41"))
    assert row.split() == ["u1001-GPU-a", "41", "alice", "25%", "SM", "20%", "1.0GiB", "bw",
                           "10%", "3.0GiB", "30%", "15%"]
    assert not any(line.startswith("u1001-GPU-a  43") for line in lines)  # not sampled
    assert ("GPU 0: job 42 of bob takes the largest share of its DRAM bandwidth (91 % used "
            "for 63 s); a MIG slice isolates bandwidth: ask --gres=gpu:1g.10gb:1") in lines
    # Without a sampler the table is as before.
    assert "GPU use" not in format_views([daemon], "/s", "p", now=NOW)


def test_metrics_carry_running_jobs_only_and_drop_stale_ones():
    families = usage_families({41: usage(), 42: usage(42, "bob", updated=NOW - 30)},
                              hogged(), "n1", NOW)
    text = metrics.render(families)
    assert ('gpushare_job_sm_percent{node="n1",job="41",user="alice",gpu="0",uuid="GPU-a",'
            'mig_profile="",share="25",quality="measured"} 20') in text
    assert 'gpushare_job_memory_peak_bytes{node="n1",job="41"' in text
    assert 'gpushare_job_dram_bw_share_percent{node="n1",job="41"' in text
    assert 'quality="estimated"} 10' in text
    assert 'job="42"' not in text.split("gpushare_hog")[0]  # stale: no per-job series
    assert ('gpushare_hog{node="n1",gpu="0",uuid="GPU-a",mig_profile="",job="42",'
            'user="bob"} 1') in text
    assert 'gpushare_device_dram_bw_percent{node="n1",gpu="0"' in text
    # No sampler, or a stale node file: the families are empty, never stale values.
    empty = metrics.render(usage_families({}, None, "n1", NOW))
    assert "gpushare_job_sm_percent" in empty and 'job="' not in empty


def fake_slurm(tmp_path, admin_comment: str, update_rc: int = 0,
               read_rc: int = 0) -> tuple[str, str, str]:
    """Root-owned sacct and sacctmgr that log their arguments (one call a line); sacct
    prints ``admin_comment`` as the job's AdminComment and exits ``read_rc``, sacctmgr
    exits ``update_rc``."""
    os.chmod(tmp_path, 0o755)
    log = tmp_path / "calls"
    programs = []
    for name, body in (("sacct", f"printf '%s\\n' {shlex.quote(admin_comment)}; "
                                 f"[ {read_rc} = 0 ] || echo 'sacct: error: no slurmdbd';"
                                 f" exit {read_rc}"),
                       ("sacctmgr", f"echo 'sacctmgr: error: no slurmdbd'; exit {update_rc}")):
        program = tmp_path / name
        program.write_text(
            "#!/bin/sh\n"
            f'printf "{name}|" >> {log}; for a in "$@"; do printf "%s|" "$a" >> {log}; done\n'
            f"echo >> {log}\n{body}\n")
        os.chmod(program, 0o755)
        programs.append(str(program))
    return programs[0], programs[1], str(log)


def calls_of(log: str) -> list[str]:
    with open(log) as handle:
        return handle.read().splitlines()


READ = "sacct|-X|-n|-P|-j|41|-o|AdminComment|"


@needs_root
@pytest.mark.parametrize("before, after", [
    ("", "{line}"),
    ("site budget 7", "site budget 7; {line}"),
])
def test_the_epilog_appends_the_summary_to_admin_comment_and_removes_the_figures(
        tmp_path, before, after):
    """slurmctld refuses updates of an ended job, so the line goes through sacctmgr (the
    accounting database), after what the site wrote there, which sacct reads: the only
    field asked for, so no text a user chose (a job named "x AdminComment=...", which
    ``scontrol show job -o`` prints first) can pass for it."""
    state = tmp_path / "state"
    UsageStore(str(state)).write_job(usage())
    sacct, sacctmgr, log = fake_slurm(tmp_path, before)
    line = summary.record_end(str(state), 41, sacct=sacct, sacctmgr=sacctmgr)
    assert line == view.summary_line(usage())
    assert calls_of(log) == [READ, "sacctmgr|-i|modify|job|where|jobid=41|set|"
                                   f"AdminComment={after.format(line=line)}|"]
    assert UsageStore(str(state)).read_job(41) is None
    # Nothing sampled: nothing asked of Slurm.
    assert summary.record_end(str(state), 41, sacct=sacct, sacctmgr=sacctmgr) is None
    assert len(calls_of(log)) == 2


@needs_root
@pytest.mark.parametrize("before", ['"quoted" note', "it's the site's"])
def test_a_comment_with_a_quote_is_left_as_it_is(tmp_path, caplog, before):
    """sacctmgr would cut the text at a closing quote, or turn quotes into backquotes: the
    earlier comment stays whole, and the line is in slurmd's log only."""
    state = tmp_path / "state"
    UsageStore(str(state)).write_job(usage())
    sacct, sacctmgr, log = fake_slurm(tmp_path, before)
    assert summary.record_end(str(state), 41, sacct=sacct, sacctmgr=sacctmgr)
    assert calls_of(log) == [READ]
    assert "its AdminComment holds a quote, which sacctmgr would alter" in caplog.text


@needs_root
def test_without_slurmdbd_the_line_is_logged_and_nothing_raises(tmp_path, caplog):
    state = tmp_path / "state"
    UsageStore(str(state)).write_job(usage())
    sacct, sacctmgr, log = fake_slurm(tmp_path, "", read_rc=1)
    assert summary.record_end(str(state), 41, sacct=sacct, sacctmgr=sacctmgr)
    assert calls_of(log) == [READ]  # nothing read: nothing written over
    assert ("its GPU use is not in AdminComment (it needs slurmdbd): sacct failed (exit "
            "1): sacct: error: no slurmdbd") in caplog.text
    caplog.clear()
    sacct, sacctmgr, _log = fake_slurm(tmp_path, "", update_rc=1)
    UsageStore(str(state)).write_job(usage())
    assert summary.record_end(str(state), 41, sacct=sacct, sacctmgr=sacctmgr)
    assert ("its GPU use is not in AdminComment (it needs slurmdbd): sacctmgr failed (exit "
            "1): sacctmgr: error: no slurmdbd") in caplog.text
    UsageStore(str(state)).write_job(usage())
    assert summary.record_end(str(state), 41, sacct="/nonexistent/sacct") is not None


@needs_root
def test_gpushare_job_with_an_id_shows_that_jobs_use(tmp_path, capsys, monkeypatch):
    state = tmp_path / "state"
    UsageStore(str(state)).write_job(usage(updated=NOW))
    monkeypatch.setattr(view, "fresh", lambda updated, interval, now: True)
    plugstack = tmp_path / "plugstack.conf"
    plugstack.write_text(f"required /usr/lib/spank_gpushare.so state_dir={state}\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["job", "41", "--plugstack", str(plugstack)]) == 0
    out = capsys.readouterr().out
    assert "GPU use now" in out and "peak memory 3.0 GiB" in out
    assert main(["job", "99", "--plugstack", str(plugstack)]) == 1
    assert "not sampled: the node runs no usage sampler" in capsys.readouterr().out
