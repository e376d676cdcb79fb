# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --suggest``: sacct's history read as Slurm prints it, replayed on the
plan's node group, and the best static layout proposed."""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import replace

import pytest
from tests.unit.admin.relayout_plans import mig_plan
from tests.unit.admin.relayout_site import TRACKED_TRES, config_stub

from gpushare.admin.relayout.history import parse_sacct, sacct_argv, tres_request

HEADER = "JobID|Submit|Start|End|ReqTRES|User|State\n"
# As sacct --parsable2 --allocations prints them (22.05 and 24.11 alike).
CAPTURED = HEADER + "".join(line + "\n" for line in (
    "|".join(('101', '2026-11-20T08:00:00', '2026-11-20T08:00:05', '2026-11-20T08:30:05',
              'billing=4,cpu=4,gres/gpu:1g.10gb=1,gres/gpu=1,mem=16G,node=1',
              'alice', 'COMPLETED')),
    "|".join(('102', '2026-11-20T08:01:00', 'Unknown', '2026-11-20T08:05:00',
              'billing=2,cpu=2,gres/gpu:3g.40gb=1,gres/gpu=1,mem=8G,node=1',
              'bob', 'CANCELLED by 1001')),
    "|".join(('103', '2026-11-20T08:02:00', '2026-11-20T09:00:00', 'Unknown',
              'billing=8,cpu=8,gres/gpu:h100=4,gres/gpu=4,mem=64G,node=1',
              'carol', 'RUNNING')),
    "|".join(('104', '2026-11-20T08:03:00', '2026-11-20T08:03:01', '2026-11-20T08:04:01',
              'billing=1,cpu=1,mem=1G,node=1',
              'dave', 'COMPLETED')),
    "|".join(('105', '2026-11-20T08:04:00', '2026-11-20T08:10:00', '2026-11-20T10:10:00',
              'billing=32,cpu=32,gres/gpu:h100=16,gres/gpu=16,mem=512G,node=2',
              'erin', 'COMPLETED')),
    "|".join(('106_3', '2026-11-20T08:05:00', '2026-11-20T08:05:00', '2026-11-20T08:15:00',
              'billing=1,cpu=1,gres/mps=50,mem=4G,node=1',
              'frank', 'FAILED')),
    "|".join(('107', '2026-11-20T08:06:00', '2026-11-20T08:06:00', '2026-11-20T08:16:00',
              'billing=2,cpu=2,gres/gpu:1g.10gb=1,gres/gpu:3g.40gb=1,gres/gpu=2,node=1',
              'gina', 'COMPLETED')),
    "|".join(('108', '2026-11-20T07:59:00', 'None', 'None',
              'billing=1,cpu=1,gres/gpu=1,node=1',
              'hal', 'CANCELLED by 0')),
    "|".join(('109', '2026-11-20T08:07:00', '2026-11-20T08:07:10', '2026-11-20T08:37:10',
              'billing=2,cpu=2,gres/gpu=2,node=1',
              'ivy', 'TIMEOUT')),
))


def test_sacct_history_becomes_jobs_per_node_and_says_what_it_left_out():
    history = parse_sacct(CAPTURED)
    assert history.start == datetime.datetime(2026, 11, 20, 8, 0)
    assert [(j.submit, j.run, j.kind, j.count, j.user) for j in history.jobs] == [
        (0.0, 1800.0, "1g.10gb", 1, "alice"),
        (240.0, 7200.0, "whole", 8, "erin"),  # 16 GPUs over 2 nodes: 8 on each
        (300.0, 600.0, "mps", 50, "frank"),
        (420.0, 1800.0, "whole", 2, "ivy")]
    assert history.skipped == {"never started": 2, "has not ended": 1,
                               "asks for several GPU kinds at once": 1}


def test_tres_without_a_gpu_is_not_a_gpu_job():
    assert tres_request("billing=1,cpu=1,mem=1G,node=1") is None
    assert tres_request("cpu=1,gres/gpu:a100=0,node=1") is None
    assert tres_request("gres/gpu:2g.20gb=3,gres/gpu=3") == ("2g.20gb", 3)


def test_output_without_the_columns_is_refused_with_the_command_to_run():
    with pytest.raises(ValueError, match=r"no Start, End.*--format JobID,Submit"):
        parse_sacct("JobID|Submit|ReqTRES\n1|2026-01-01T00:00:00|gres/gpu=1\n")


@pytest.mark.parametrize("text", ["", "\n \n"])
def test_empty_sacct_output_says_sacct_needs_slurmdbd(text):
    """sacct without slurmdbd prints nothing on stdout: the file an admin wrote is empty."""
    with pytest.raises(ValueError, match=r"sacct output is empty.*AccountingStorageType"):
        parse_sacct(text)


def test_sacct_is_asked_for_the_window_every_user_one_line_per_job():
    argv = sacct_argv("/usr/bin/sacct", 3, datetime.datetime(2026, 11, 20, 12, 0, 0))
    assert argv[0] == "/usr/bin/sacct" and "--allusers" in argv and "--allocations" in argv
    assert argv[argv.index("--starttime") + 1] == "2026-11-17T12:00:00"
    assert argv[argv.index("--endtime") + 1] == "2026-11-20T12:00:00"
    assert argv[argv.index("--format") + 1] == "JobID,Submit,Start,End,ReqTRES,User,State,Timelimit"


def _history_of_3g_jobs() -> str:
    rows = []
    start = datetime.datetime(2026, 11, 20, 8, 0)
    for n in range(12):
        submit = start + datetime.timedelta(minutes=5 * n)
        end = submit + datetime.timedelta(minutes=40)
        rows.append(f"{200 + n}|{submit.isoformat()}|{submit.isoformat()}|{end.isoformat()}|"
                    f"cpu=2,gres/gpu:3g.40gb=1,gres/gpu=1,node=1|u{n}|COMPLETED")
    return HEADER + "\n".join(rows) + "\n"


def _plan(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan(["{layout: 7x1g.10gb}", "{layout: 2x3g.40gb}",
                              "{layout: whole}"]))
    return str(plan)


def test_suggest_replays_sacct_on_the_plans_group_and_proposes_a_layout(tmp_path, capsys):
    from gpushare.cli import main

    args_file = tmp_path / "args"
    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs())
    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!/bin/sh\necho \"$@\" > {args_file}\ncat {history}\n")
    sacct.chmod(0o755)
    code = main(["relayout", "--plan", _plan(tmp_path), "--suggest", "--days", "3",
                 "--sacct", str(sacct), "--scontrol", config_stub(str(tmp_path), TRACKED_TRES),
                 "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    proposal = json.loads(out)
    assert "--starttime" in args_file.read_text() and "--allusers" in args_file.read_text()
    assert proposal["group"] == "mig" and proposal["jobs"] == 12
    # The plan's Slurm GPUs are all 7x1g.10gb: the 3g.40gb history never ran on them.
    assert proposal["plan_layout"]["unfinished"] == 12
    assert proposal["unfinished"] == 0 and proposal["layout"].get("2x3g.40gb", 0) >= 1
    assert set(proposal["nodes"]) == {"h1", "h2"}
    # By the plan's own indices: GPUs 0 and 1 are Kubernetes' or mixed, 2 and 3 Slurm's.
    assert all(set(gpus) == {"2", "3"} for gpus in proposal["nodes"].values())


def test_suggest_refuses_a_history_that_cannot_show_mig_jobs(tmp_path, capsys):
    """With only gres/gpu recorded, sacct shows a MIG job as a whole-GPU job: the layout
    learnt from it would be wrong, so --suggest says which TRES to record instead."""
    from gpushare.cli import main

    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs().replace("gres/gpu:3g.40gb", "gres/gpu"))
    sacct = tmp_path / "sacct"
    sacct.write_text(f"#!/bin/sh\ncat {history}\n")
    sacct.chmod(0o755)
    tres = "cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu"
    assert main(["relayout", "--plan", _plan(tmp_path), "--suggest", "--sacct", str(sacct),
                 "--scontrol", config_stub(str(tmp_path), tres)]) == 2
    err = capsys.readouterr().err
    assert ("slurmctld does not record gres/gpu:1g.10gb,gres/gpu:3g.40gb in accounting" in err
            and "AccountingStorageTRES" in err and "--history" in err), err


def test_suggest_reads_a_saved_history_and_prints_the_layout(tmp_path, capsys):
    from gpushare.cli import main

    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs())
    assert main(["relayout", "--plan", _plan(tmp_path), "--suggest", "--history",
                 str(history)]) == 0
    out = capsys.readouterr().out
    assert "12 GPU jobs" in out and "2x3g.40gb" in out
    assert re.search(r"h1: GPU 2 \S+ GPU 3 \S+$", out, re.MULTILINE), out
    assert "12 never ran" in out  # the plan's own layout


@pytest.mark.parametrize("argv,message", [
    (["--days", "0"], "--days must be more than 0"),
    (["--sacct", "sacct"], "absolute path"),
    (["--history", "/nonexistent/history"], "cannot read the history"),
])
def test_suggest_refuses_bad_input_with_what_to_do(tmp_path, capsys, argv, message):
    from gpushare.cli import main

    assert main(["relayout", "--plan", _plan(tmp_path), "--suggest", *argv]) == 2
    assert message in capsys.readouterr().err


def test_suggest_without_gpu_jobs_says_so(tmp_path, capsys):
    from gpushare.cli import main

    history = tmp_path / "history.txt"
    history.write_text(HEADER + "1|2026-11-20T08:00:00|2026-11-20T08:00:01|"
                       "2026-11-20T08:01:00|cpu=1,node=1|u|COMPLETED\n")
    assert main(["relayout", "--plan", _plan(tmp_path), "--suggest", "--history",
                 str(history)]) == 2
    err = capsys.readouterr().err
    assert "no GPU job ran" in err and "a longer history in --history" in err


def test_alloctres_serves_where_reqtres_was_not_asked_for():
    history = parse_sacct("Submit|Start|End|AllocTRES\n2026-11-20T08:00:00|"
                          "2026-11-20T08:00:00|2026-11-20T08:10:00|gres/gpu:3g.40gb=2,node=1\n")
    assert [(j.kind, j.count, j.run) for j in history.jobs] == [("3g.40gb", 2, 600.0)]


@pytest.mark.parametrize("argv", [["--days", "3"], ["--history", "h.txt"], ["--group", "g"]])
def test_suggest_options_without_suggest_are_refused(tmp_path, capsys, argv):
    """A dry run would ignore them: the admin meant --suggest."""
    from gpushare.cli import main

    assert main(["relayout", "--plan", _plan(tmp_path), *argv]) == 2
    assert f"{argv[0]} only with --suggest" in capsys.readouterr().err


def test_suggest_counts_in_words_one_node_one_gpu(tmp_path, capsys):
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"  # one node whose GPU 2 alone is Slurm's
    plan.write_text(mig_plan(["{layout: 7x1g.10gb}", "{layout: 2x3g.40gb}"])
                    .replace("nodes: h[1-2]", "nodes: h1").replace("gpus: 4", "gpus: 3"))
    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs())
    assert main(["relayout", "--plan", str(plan), "--suggest", "--history",
                 str(history)]) == 0
    out = capsys.readouterr().out
    assert "replayed on node group mig: 1 node with 1 Slurm GPU each (h100-80gb)" in out, out
    assert re.search(r"^best static layout: 1 GPU \S+$", out, re.MULTILINE), out


def test_the_replay_counts_slurms_slices_of_a_gpu_shared_with_kubernetes(tmp_path):
    """GPU 1 is mixed: Slurm's 1g.10gb on it serves jobs beside the GPUs a relayout may
    change, in every replay, and a relayout never changes it."""
    from gpushare.admin.plan import load_plan
    from gpushare.admin.relayout.sim import cluster_from_plan, simulate
    from gpushare.admin.relayout.static import spread

    cluster = cluster_from_plan(load_plan(_plan(tmp_path)))
    assert [layout.slices for layout in cluster.fixed] == [("1g.10gb",)]
    assert not cluster.one_profile and cluster.gpus_per_node == 2
    jobs = parse_sacct(HEADER + "".join(
        f"{300 + n}|2026-11-20T08:00:00|2026-11-20T08:00:00|2026-11-20T09:00:00|"
        f"cpu=1,gres/gpu:1g.10gb=1,gres/gpu=1,node=1|u{n}|COMPLETED\n"
        for n in range(2 * 15))).jobs  # 2 nodes x (2 x 7 + 1) 1g.10gb slices
    grid = spread({"whole": 4}, cluster)
    still = simulate(jobs, grid, False, cluster)  # whole GPUs: only the fixed slices serve
    assert still.unfinished == 0 and max(still.waits["1g.10gb"]) == 14 * 3600.0
    assert simulate(jobs, grid, False, replace(cluster, fixed=())).unfinished == 30
    # 3g.40gb jobs: a replayed relayout changes GPUs for them, but never the shared one
    # (index 2 of each node here), which it would change were it counted as its own.
    large = parse_sacct(HEADER + "".join(
        f"{400 + n}|2026-11-20T08:00:00|2026-11-20T08:00:00|2026-11-20T10:00:00|"
        f"cpu=1,gres/gpu:3g.40gb=1,gres/gpu=1,node=1|u{n}|COMPLETED\n"
        for n in range(12))).jobs
    moved = simulate(large, grid, True, cluster)
    assert moved.change_times and all(index < 2 for _node, index in moved.change_times), \
        moved.change_times


def test_a_shared_gpus_profile_off_the_menu_serves_its_jobs(tmp_path):
    """Slurm's slice on the shared GPU may be a profile no menu layout and no job has: the
    replay still knows its share (it failed with a KeyError once a job waited), and the jobs
    of the other kinds run."""
    from gpushare.admin.plan import load_plan
    from gpushare.admin.relayout.sim import cluster_from_plan, simulate
    from gpushare.admin.relayout.static import best_static

    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan(["{layout: 2x3g.40gb}", "{layout: whole}"]))
    cluster = cluster_from_plan(load_plan(str(plan)))
    history = parse_sacct(_history_of_3g_jobs())
    counts, best = best_static(history.jobs, cluster)
    assert best.unfinished == 0 and sum(counts.values()) == 4, (counts, best.unfinished)
    assert simulate(history.jobs, [[cluster.menu.items[1].layout] * 2] * 2, False,
                    cluster).unfinished == 12  # whole GPUs: the 3g jobs never run


def test_suggest_takes_the_installed_release_where_the_plan_names_none(tmp_path, capsys,
                                                                       monkeypatch):
    """As render and the controller do: an unversioned plan on 24.11 is not held to 22.05's
    one profile per node, and on 22.05 it is."""
    from gpushare.admin import slurm_client
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan(["{layout: 7x1g.10gb}", "{layout: 2x3g.40gb}", "{layout: whole}"],
                             slurm=None))
    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs())
    for release, one_profile in (("24.11.5", False), ("22.05.8", True)):
        monkeypatch.setattr(slurm_client, "installed_release", lambda *a, r=release, **k: r)
        assert main(["relayout", "--plan", str(plan), "--suggest", "--history",
                     str(history)]) == 0
        out = capsys.readouterr().out
        assert ("one MIG profile per node" in out) == one_profile, out
        assert ("2x3g.40gb" in out.split("best static layout:")[1].split("\n")[0]) == (
            not one_profile), out


def test_suggest_on_slurm_22_05_keeps_one_mig_profile_per_node(tmp_path, capsys):
    """Slurm 22.05 indexes one MIG profile per node: with Slurm's 1g.10gb slice on the mixed
    GPU 1, no node may take 2x3g.40gb, however much the history asks for 3g.40gb (render
    would refuse that layout)."""
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan(["{layout: 7x1g.10gb}", "{layout: 2x3g.40gb}", "{layout: whole}"],
                             slurm="22.05"))
    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs())
    assert main(["relayout", "--plan", str(plan), "--suggest", "--history", str(history),
                 "--json"]) == 0
    proposal = json.loads(capsys.readouterr().out)
    assert proposal["layout"].get("2x3g.40gb", 0) == 0, proposal
    assert all("3g" not in layout for gpus in proposal["nodes"].values()
               for layout in gpus.values()), proposal["nodes"]
    # Without the shared GPU's slice, the same history on 22.05 gets 3g.40gb nodes whole.
    plan.write_text(plan.read_text().replace("- {profile: 1g.10gb, owner: slurm}",
                                             "- {profile: 1g.10gb, owner: kubernetes}"))
    assert main(["relayout", "--plan", str(plan), "--suggest", "--history", str(history),
                 "--json"]) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert any(set(gpus.values()) == {"2x3g.40gb"} for gpus in nodes.values()), nodes
    assert all(len({layout for layout in gpus.values() if "x" in layout}) <= 1
               for gpus in nodes.values()), nodes


def test_suggest_on_slurm_22_05_without_a_layout_of_the_shared_gpus_profile_says_so(tmp_path,
                                                                                     capsys):
    """Every MIG layout of this menu is 3g.40gb, and Slurm's slice of the mixed GPU 1 is
    1g.10gb: on 22.05 no static layout can be rendered, and the refusal says what to add."""
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(mig_plan(["{layout: 2x3g.40gb}"], slurm="22.05").replace(
        "all: {owner: slurm, mig: [{profile: 1g.10gb, count: 7}]}",
        "all: {owner: slurm, mig: [{profile: 3g.40gb, count: 2}]}"))
    history = tmp_path / "history.txt"
    history.write_text(_history_of_3g_jobs())
    assert main(["relayout", "--plan", str(plan), "--suggest", "--history",
                 str(history)]) == 2
    err = capsys.readouterr().err
    assert "no static layout of the menu gives each node of mig one Slurm MIG profile" in err
    assert "Traceback" not in err
