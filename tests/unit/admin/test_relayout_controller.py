# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply``'s orchestration against a fake slurmctld and the real node's
step (the simulated NVML): drain, wait for idle, change, record, Gres=, reconfigure, resume;
and what is left behind when a step fails, hangs or Slurm does not follow."""

from __future__ import annotations

import json
import os
import shlex
import sys

import pytest
from tests.unit.admin.relayout_site import (
    SLURM_CONF,
    TRACKED,
    decision,
    layout_of,
    make_site,
    run,
    sacct_stub,
)

from gpushare.admin.relayout.controller import (
    REASON_PREFIX,
    SetGresError,
    command_argv,
    set_node_gres,
)
from gpushare.admin.relayout.decide import Decision
from gpushare.admin.relayout.state import load_state


@pytest.fixture
def site(tmp_path):
    return make_site(tmp_path)


def test_a_node_drains_changes_and_comes_back_with_its_new_gres(site):
    plan, settings, profile, slurm = site
    slurm.busy["h1"] = 3  # a job on GPU 1 runs on: the node waits for it
    neighbour = layout_of(profile, 0)
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb"),
                                                    ("h1", 3, "2x3g.40gb")))
    assert outcome.failed is None and not outcome.skipped and outcome.resumed, outcome.log
    assert [c.index for c in outcome.applied] == [2, 3]
    assert layout_of(profile, 2) == layout_of(profile, 3) == ["3g.40gb", "3g.40gb"]
    assert layout_of(profile, 0) == neighbour  # Kubernetes' GPU
    assert slurm.busy["h1"] == 0  # the job ended before anything changed
    assert slurm.calls == ["drain h1", "reconfigure", "resume h1"]
    assert slurm.gres["h1"] == "gpu:1g.10gb:1,gpu:3g.40gb:4" and slurm.state["h1"] == set()
    with open(settings.slurm_conf) as handle:
        lines = handle.read().splitlines()
    assert lines[1:3] == [
        "NodeName=h2 CPUs=2 RealMemory=1000 Gres=gpu:1g.10gb:15 State=UNKNOWN",
        "NodeName=h1 CPUs=2 RealMemory=1000 State=UNKNOWN Gres=gpu:1g.10gb:1,gpu:3g.40gb:4"]
    state = load_state(settings.state_path)
    assert {k: (v.layout, v.at, v.decision) for k, v in state.gpus.items()} == {
        ("h1", 2): ("2x3g.40gb", 5000.0, "r1"), ("h1", 3): ("2x3g.40gb", 5000.0, "r1")}
    assert state.counters == {"decisions": 1, "applied": 2, "restored": 0, "failed": 0}


def test_a_step_that_lays_the_old_layout_back_resumes_the_node_unchanged(site):
    plan, settings, profile, slurm = site
    raw = json.loads(profile.read_text())
    raw["error_on_call"] = {"nvmlDeviceCreateGpuInstanceWithPlacement": [2, "IN_USE"]}
    profile.write_text(json.dumps(raw))
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed is None and outcome.applied == [] and outcome.resumed
    [(change, why)] = outcome.restored
    assert change.index == 2 and "restored the old layout 7x1g.10gb" in why
    assert layout_of(profile, 2) == ["1g.10gb"] * 7
    assert slurm.calls == ["drain h1", "resume h1"]  # no reconfigure: nothing changed
    with open(settings.slurm_conf) as handle:
        assert handle.read() == SLURM_CONF
    assert load_state(settings.state_path).counters == {
        "decisions": 1, "applied": 0, "restored": 1, "failed": 0}


def test_a_step_that_cannot_restore_leaves_the_node_drained_with_the_cause(site):
    plan, settings, profile, slurm = site
    raw = json.loads(profile.read_text())
    raw["errors"] = {"nvmlGpuInstanceCreateComputeInstance": "UNKNOWN"}
    profile.write_text(json.dumps(raw))
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "layout is not known" in outcome.failed
    assert "DRAIN" in slurm.state["h1"] and slurm.calls == ["drain h1", "drain h1"]
    assert slurm.reason["h1"].startswith(f"{REASON_PREFIX}: GPU 2 -> 2x3g.40gb failed")
    assert load_state(settings.state_path).counters["failed"] == 1


def test_a_step_that_hangs_is_killed_and_the_node_stays_drained(site):
    plan, settings, _profile, slurm = site
    settings.node_command = "sleep 60"
    settings.step_timeout_s, settings.step_grace_s = 0.1, 0.3
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "did not end within" in outcome.failed
    assert "DRAIN" in slurm.state["h1"] and "layout is unknown" in slurm.reason["h1"]


def test_jobs_that_outlast_the_drain_timeout_leave_the_node_unchanged(site):
    plan, settings, profile, slurm = site
    slurm.busy["h1"] = 1000
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert "--drain-timeout" in outcome.skipped and outcome.failed is None
    assert slurm.calls == ["drain h1", "resume h1"]
    assert layout_of(profile, 2) == ["1g.10gb"] * 7


def test_a_node_someone_else_drained_is_left_alone(site):
    plan, settings, _profile, slurm = site
    slurm.state["h1"].add("DRAIN")
    slurm.reason["h1"] = "bad fan"
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert "bad fan" in outcome.skipped and slurm.calls == []
    # ... also when the admin's drain comes while gpushare waits for the node's jobs.
    slurm.state["h1"].clear()
    slurm.busy["h1"] = 5
    original = slurm.node

    def admin_drains(name):
        if slurm.calls == ["drain h1"]:
            slurm.reason["h1"] = "admin: maintenance"
        return original(name)

    slurm.node = admin_drains
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert "someone else" in outcome.skipped
    assert slurm.calls == ["drain h1"] and slurm.reason["h1"] == "admin: maintenance"


def test_slurm_that_does_not_show_the_new_gres_leaves_the_node_drained(site):
    plan, settings, profile, slurm = site
    slurm.stale = True
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "slurmctld still shows Gres=gpu:1g.10gb:15" in outcome.failed
    assert "DRAIN" in slurm.state["h1"]
    # The GPU did change, and the state file says so: the node is not half-applied unsaid.
    assert layout_of(profile, 2) == ["3g.40gb", "3g.40gb"]
    assert load_state(settings.state_path).gpus[("h1", 2)].layout == "2x3g.40gb"


def test_a_reconfigure_that_fails_leaves_the_node_drained(site):
    plan, settings, _profile, slurm = site
    slurm.down_on = "reconfigure"
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "scontrol reconfigure failed" in outcome.failed
    assert "DRAIN" in slurm.state["h1"]


def test_slurm_before_23_11_sees_a_new_gpu_count_once_slurmctld_restarts(site, tmp_path):
    plan, settings, profile, slurm = site
    slurm.stale = True
    slurm.restarted_by = str(tmp_path / "restarted")
    settings.slurmctld_restart = shlex.join(
        [sys.executable, "-c", f"open({slurm.restarted_by!r}, 'w').close()"])
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed is None, outcome
    # slurmctld restarted once slurmd had read the new gres.conf (the reconfigure), and the
    # node came back once slurmd had registered with the new slurmctld.
    assert slurm.calls == ["drain h1", "reconfigure", "restarted", "unregistered",
                           "unregistered", "resume h1"]
    assert slurm.gres["h1"] == "gpu:1g.10gb:8,gpu:3g.40gb:2"
    assert "h1: restarted slurmctld" in outcome.log
    # Nothing changed for Slurm: no restart.
    slurm.calls.clear()
    [again] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert again.failed is None and "restarted" not in slurm.calls, (again, slurm.calls)
    assert layout_of(profile, 2) == ["3g.40gb", "3g.40gb"]


def test_a_restart_that_met_slurmds_old_gres_conf_is_done_once_more(site, tmp_path):
    plan, settings, _profile, slurm = site
    slurm.stale, slurm.stale_restarts = True, 1
    slurm.restarted_by = str(tmp_path / "restarted")
    settings.slurmctld_restart = shlex.join(
        [sys.executable, "-c", f"open({slurm.restarted_by!r}, 'w').close()"])
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed is None, outcome
    assert slurm.calls.count("restarted") == 2 and slurm.calls[-1] == "resume h1", slurm.calls
    assert slurm.gres["h1"] == "gpu:1g.10gb:8,gpu:3g.40gb:2"
    # Twice stale: the node stays drained, saying what slurmctld shows.
    slurm.calls.clear()
    slurm.stale_restarts = 2
    [again] = run(plan, settings, slurm, decision(("h1", 3, "2x3g.40gb")))
    assert again.failed and again.failed.startswith("slurmctld still shows Gres="), again
    assert slurm.calls.count("restarted") == 2 and "DRAIN" in slurm.state["h1"]


def test_a_slurmctld_restart_that_fails_leaves_the_node_drained(site):
    plan, settings, _profile, slurm = site
    slurm.stale = True
    settings.slurmctld_restart = "/bin/false"
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "restarting slurmctld failed (exit 1)" in outcome.failed
    assert "DRAIN" in slurm.state["h1"] and "resume h1" not in slurm.calls


def test_an_empty_decision_changes_nothing_and_counts_no_round(site):
    plan, settings, _profile, slurm = site
    assert run(plan, settings, slurm, Decision()) == []
    assert slurm.calls == [] and load_state(settings.state_path).counters == {}


def test_gres_is_set_on_the_nodes_own_line():
    text = "NodeName=a[1-3] CPUs=4 Gres=gpu:2\nNodeName=b1 CPUs=2\n"
    assert set_node_gres(text, "b1", "gpu:3g.40gb:2") == (
        "NodeName=a[1-3] CPUs=4 Gres=gpu:2\nNodeName=b1 CPUs=2 Gres=gpu:3g.40gb:2\n")
    assert set_node_gres(text, "a2", "gpu:1") == (
        "NodeName=a[1,3] CPUs=4 Gres=gpu:2\nNodeName=a2 CPUs=4 Gres=gpu:1\nNodeName=b1 CPUs=2\n")
    assert set_node_gres(text, "a2", "") == (
        "NodeName=a[1,3] CPUs=4 Gres=gpu:2\nNodeName=a2 CPUs=4\nNodeName=b1 CPUs=2\n")
    with pytest.raises(SetGresError, match="no NodeName line names c1"):
        set_node_gres(text, "c1", "gpu:1")
    with pytest.raises(SetGresError, match="several lines"):
        set_node_gres("NodeName=c1 CPUs=2 \\\n  Gres=gpu:1\n", "c1", "gpu:1")


def test_the_sites_command_gets_each_value_as_one_word():
    argv = command_argv("pdsh -N -w {node} gpushare relayout node --gpu {gpu} "
                        "--layout={layout} --apply", node="n1", gpu="2", layout="a b;rm")
    assert argv == ["pdsh", "-N", "-w", "n1", "gpushare", "relayout", "node",
                    "--gpu", "2", "--layout=a b;rm", "--apply"]
    # ssh joins the words after the destination for the remote shell: they go as one word,
    # each quoted, so the remote shell splits them back into the same words.
    remote = ["gpushare", "relayout", "node", "--gpu", "2", "--layout=a b;rm", "--apply"]
    for template, local in (
            ("ssh -o BatchMode=yes {node} gpushare relayout node --gpu {gpu} "
             "--layout={layout} --apply", ["ssh", "-o", "BatchMode=yes", "n1"]),
            ("/usr/bin/ssh -p 22 -tt -oBatchMode=yes -i /root/.ssh/k {node} 'gpushare relayout "
             "node --gpu {gpu} --layout={layout} --apply'",
             ["/usr/bin/ssh", "-p", "22", "-tt", "-oBatchMode=yes", "-i", "/root/.ssh/k", "n1"]),
            ("ssh -- {node} gpushare relayout node --gpu {gpu} --layout={layout} --apply",
             ["ssh", "--", "n1"])):
        argv = command_argv(template, node="n1", gpu="2", layout="a b;rm")
        assert argv[:-1] == local and shlex.split(argv[-1]) == remote, template
    with pytest.raises(ValueError, match=r"unknown placeholder \{host\}"):
        command_argv("ssh {host} true")
    with pytest.raises(ValueError, match="empty"):
        command_argv("  ")


FAKE_SCONTROL = r'''#!{python}
"""scontrol for one test: nodes in a JSON file; reconfigure re-reads slurm.conf's Gres=."""
import json, sys
db, conf = {db!r}, {conf!r}
nodes = json.load(open(db))
args = sys.argv[1:]
if args and args[0] == "-d":
    args = args[1:]
if args[:3] == ["show", "-o", "node"]:
    for name, node in nodes.items():
        if len(args) < 4 or args[3] == name:
            print(f"NodeName={{name}} State={{node['state']}} Gres={{node['gres']}} "
                  f"GresUsed={{node['used']}} Reason={{node['reason'] or '(null)'}}")
elif args[0] == "update":
    fields = dict(a.split("=", 1) for a in args[1:])
    node = nodes[fields["NodeName"]]
    if fields["State"] == "DRAIN":
        node["state"], node["reason"] = "IDLE+DRAIN", fields["Reason"]
    else:
        node["state"], node["reason"] = "IDLE", ""
elif args[:2] == ["show", "config"]:
    print("SlurmctldParameters     = (null)")
    print({tracked!r})
elif args[0] == "reconfigure":
    for line in open(conf):
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if words.get("NodeName") in nodes:
            nodes[words["NodeName"]]["gres"] = words.get("Gres", "(null)")
json.dump(nodes, open(db, "w"))
'''


def _command(plan, settings, tmp_path, tracked=TRACKED):
    """``gpushare relayout --apply`` against stubs of scontrol, squeue and sinfo; the
    nodes' slurmctld state in a JSON file."""
    db = tmp_path / "nodes.json"
    db.write_text(json.dumps({name: {"state": "IDLE", "reason": "", "gres": "gpu:1g.10gb:15",
                                     "used": "gpu:1g.10gb:0(IDX:N/A)"}
                              for name in ("h1", "h2")}))
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(FAKE_SCONTROL.format(python=sys.executable, db=str(db),
                                             conf=settings.slurm_conf, tracked=tracked))
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\ncase \"$*\" in\n"
                      "*PD*) echo '41|gres/gpu:3g.40gb:2|2026-01-01T00:00:00|debug|a|b|Resources'"
                      " ;;\nesac\n")
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\necho 'debug|h[1-2]'\n")
    for stub in (scontrol, squeue, sinfo):
        stub.chmod(0o755)
    argv = ["relayout", "--plan", plan.path, "--backend", "scontrol", "--scontrol",
            str(scontrol), "--squeue", str(squeue), "--sinfo", str(sinfo), "--max-changes", "1",
            "--node-command", settings.node_command, "--slurm-conf", settings.slurm_conf,
            "--settle-timeout", "5", "--sacct", sacct_stub(str(tmp_path)), "--apply", "--json"]
    return argv, db


def test_a_second_run_says_who_runs_and_changes_nothing(site, tmp_path, capsys):
    from gpushare.admin.relayout.journal import run_lock
    from gpushare.cli import main

    plan, settings, _profile, _slurm = site
    argv, db = _command(plan, settings, tmp_path)
    before = db.read_text()
    with run_lock(os.path.join(os.path.dirname(plan.path), "relayout-state.json")):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "another gpushare relayout or tidal --apply runs" in err
    assert f'"pid": {os.getpid()}' in err
    assert db.read_text() == before  # nothing drained


def test_the_command_applies_a_decision_and_a_second_run_changes_nothing(site, tmp_path,
                                                                          capsys):
    from gpushare.cli import main

    plan, settings, profile, _slurm = site
    argv, db = _command(plan, settings, tmp_path)
    assert main(argv) == 0, capsys.readouterr()
    out = json.loads(capsys.readouterr().out)
    [node] = out["nodes"]
    assert node["applied"] == [[2, "2x3g.40gb"]] and node["failed"] is None
    assert out["decision_id"].startswith("r")
    nodes = json.loads(db.read_text())
    changed = node["node"]
    assert nodes[changed]["state"] == "IDLE" and "3g.40gb:2" in nodes[changed]["gres"]
    if changed == "h1":
        assert layout_of(profile, 2) == ["3g.40gb", "3g.40gb"]
    state = load_state(os.path.join(os.path.dirname(plan.path), "relayout-state.json"))
    assert state.gpus[(changed, 2)].decision == out["decision_id"]
    # The job now fits what is idle: no second change, and the GPU is held by min_interval_s.
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["changes"] == [] and again["nodes"] == []
    assert load_state(state.path).counters["decisions"] == 1
    # gpushare metrics shows the record, without a plugstack line on this host.
    assert main(["metrics", "--relayout-state", state.path,
                 "--plugstack", str(tmp_path / "none.conf")]) == 0
    metrics = capsys.readouterr().out
    assert "gpushare_relayout_decisions_total 1" in metrics
    assert 'gpushare_relayout_changes_total{result="applied"} 1' in metrics
    assert (f'gpushare_relayout_gpu_layout_info{{node="{changed}",gpu="2",'
            'layout="2x3g.40gb"} 1') in metrics


def test_a_gres_conf_every_node_shares_is_rendered_again(site, tmp_path):
    plan, settings, _profile, slurm = site
    shared = tmp_path / "shared-gres.conf"
    shared.write_text("old\n")
    settings.cluster_gres_conf = str(shared)
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed is None, outcome.log
    from gpushare.gpu.gresconf import parse_gres_conf

    gres = parse_gres_conf(shared.read_text())
    assert sorted(d.type for d in gres.devices("h1")) == ["1g.10gb"] * 8 + ["3g.40gb"] * 2
    assert sorted(d.type for d in gres.devices("h2")) == ["1g.10gb"] * 15


def test_a_round_half_done_on_a_one_profile_slurm_is_laid_back(site):
    plan, settings, profile, slurm = site
    settings.one_profile_per_node = True  # Slurm 22.05 with AutoDetect=off
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed is None and outcome.resumed, outcome.log
    assert [c.index for c, why in outcome.restored if why.startswith("laid back")] == [2]
    assert "DRAIN" not in slurm.state["h1"] and "reconfigure" not in slurm.calls
    assert layout_of(profile, 2) == ["1g.10gb"] * 7
    assert ("h1", 2) not in load_state(settings.state_path).gpus


def test_a_round_half_done_that_cannot_be_laid_back_leaves_the_node_drained(site, tmp_path):
    plan, settings, profile, slurm = site
    settings.one_profile_per_node = True
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import os, sys\nif sys.argv[1] == '7x1g.10gb':\n"
                       "    print('NVML broke'); sys.exit(3)\n"
                       "os.execv(sys.argv[2], sys.argv[2:])\n")
    settings.node_command = shlex.join([sys.executable, str(wrapper), "{layout}"]) + " " + \
        settings.node_command
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "failed and its layout is not known: NVML broke" in \
        outcome.failed
    assert "DRAIN" in slurm.state["h1"] and "reconfigure" not in slurm.calls
    assert layout_of(profile, 2) == ["3g.40gb", "3g.40gb"]  # said, not hidden


def test_slurm_22_05s_count_of_mig_files_is_the_new_gres_too(site):
    """22.05 counts the three files of each MIG slice's MultipleFiles= line once a reconfigure
    took the node's count: the same types, more of each, is the new layout; fewer is not."""
    plan, settings, _profile, slurm = site
    reconfigure = slurm.reconfigure

    def counted_per_file() -> None:
        reconfigure()
        slurm.gres["h1"] = "gpu:1g.10gb:24,gpu:3g.40gb:6"

    slurm.reconfigure = counted_per_file
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed is None and outcome.resumed, outcome.log

    def too_few() -> None:
        reconfigure()
        slurm.gres["h1"] = "gpu:1g.10gb:8,gpu:3g.40gb:1"

    slurm.reconfigure = too_few
    [outcome] = run(plan, settings, slurm, decision(("h1", 3, "2x3g.40gb")))
    assert outcome.failed and "slurmctld still shows" in outcome.failed


def test_the_dry_run_shows_each_candidates_prediction_and_verdict(site, tmp_path, capsys):
    from gpushare.cli import main

    plan, settings, _profile, _slurm = site
    argv, db = _command(plan, settings, tmp_path)
    before = db.read_text()
    dry = [word for word in argv if word not in ("--apply", "--json")]
    assert main([*dry, "--explain"]) == 0
    out = capsys.readouterr().out
    # The 3g job starts only with the change: without it, none of its kind does, and it
    # counts as waiting the 4 hours and a day past them.
    assert "predicted over 4 h, wait 1680.0 -> " in out and "(MIG 1680.0 -> " in out
    assert ": made" in out
    assert "predictions (the next 4 h" in out and "without" in out and "made" in out
    assert main([*dry, "--json"]) == 0
    [prediction] = json.loads(capsys.readouterr().out)["predictions"]
    assert prediction["made"] and prediction["to"] == "2x3g.40gb"
    assert prediction["without"]["started"] == 0 and prediction["with"]["started"] == 1
    assert prediction["with"]["mig_wait_s"] < prediction["without"]["mig_wait_s"] - 60
    assert db.read_text() == before  # a dry run drains nothing


def test_explain_says_so_when_no_change_was_a_candidate():
    """--explain adds a line even when there is nothing to predict."""
    from types import SimpleNamespace

    from gpushare.cli.relayout import format_decision

    quiet = SimpleNamespace(demand={"1g.10gb": 2}, supply={"1g.10gb": 3}, changes=[], drain=[],
                            why=["the idle supply serves the queue"])
    assert "predictions: none" in format_decision(quiet, (), explain=True)
    assert "predictions" not in format_decision(quiet, (), explain=False)


def test_a_node_slurm_holds_invalid_says_where_to_look(site):
    """slurmctld shows the new Gres= (it is slurm.conf's) while slurmd registered its old
    gres.conf: INVAL, which the same Gres= on either side of the message does not explain."""
    plan, settings, _profile, slurm = site
    reconfigure = slurm.reconfigure

    def old_gres_conf_registers() -> None:
        reconfigure()
        slurm.state["h1"].add("INVALID_REG")

    slurm.reconfigure = old_gres_conf_registers
    [outcome] = run(plan, settings, slurm, decision(("h1", 2, "2x3g.40gb")))
    assert outcome.failed and "slurmctld still shows Gres=" in outcome.failed
    assert "INVALID_REG" in outcome.failed and "--cluster-gres-conf" in outcome.failed
    assert "DRAIN" in slurm.state["h1"] and "resume h1" not in slurm.calls
