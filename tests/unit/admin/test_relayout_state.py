# SPDX-License-Identifier: GPL-2.0-or-later
"""The applied layouts' state file: what render, check and the next decision read after a
relayout, still held to the plan's menu."""

from __future__ import annotations

import json

import pytest
from tests.unit.admin.relayout_plans import mig_plan

from gpushare.admin.check import ERROR, check_cluster, check_node
from gpushare.admin.plan import parse_plan
from gpushare.admin.relayout.apply import apply_layout
from gpushare.admin.relayout.state import (
    Applied,
    AppliedState,
    StateError,
    applied_plan,
    as_applied,
    default_path,
    last_changes,
    load_state,
    locked,
    save_state,
)
from gpushare.admin.render import render_gres_conf, render_mig_parted, slurm_node_gres
from gpushare.admin.slurm_client import SlurmNode
from gpushare.gpu.gresconf import parse_gres_conf
from gpushare.gpu.inventory import collect
from gpushare.gpu.nvml_sim import SimNvml, load_profile
from gpushare.gpu.nvml_sim_plan import profile_from_plan

PLAN = mig_plan(["7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "2x3g.40gb", "whole"])


@pytest.fixture
def plan():
    return parse_plan(PLAN, "/etc/gpushare/plan.yaml")


def state_with(tmp_path, **gpus):
    state = AppliedState(str(tmp_path / "relayout-state.json"))
    for key, layout in gpus.items():
        node, index = key.split("_")
        state.gpus[(node, int(index))] = Applied(layout, 1000.0, "r1")
    return state


def test_the_file_lives_beside_the_plan_and_reads_back(tmp_path):
    assert default_path("/etc/gpushare/plan.yaml") == "/etc/gpushare/relayout-state.json"
    path = str(tmp_path / "relayout-state.json")
    assert load_state(path).gpus == {}  # nothing applied yet
    state = state_with(tmp_path, h1_2="2x3g.40gb")
    state.count("applied")
    save_state(state)
    raw = json.loads((tmp_path / "relayout-state.json").read_text())
    assert raw["version"] == 1
    assert raw["gpus"] == {"h1": {"2": {"layout": "2x3g.40gb", "at": 1000.0,
                                        "decision": "r1"}}}
    again = load_state(path)
    assert again.gpus == state.gpus and again.counters == {"applied": 1}
    assert last_changes(again, 1600.0) == {("h1", 2): 600.0}
    with locked(path) as locked_state:
        locked_state.gpus[("h2", 3)] = Applied("whole", 1200.0, "r2")
    assert set(load_state(path).gpus) == {("h1", 2), ("h2", 3)}


@pytest.mark.parametrize("text, why", [
    ("{", "not JSON"),
    ('{"version": 2}', "version 1"),
    ('{"version": 1, "gpus": {"h1": {"x": {"layout": "whole", "at": 1}}}}', "needs layout"),
    ('{"version": 1, "gpus": {"h1": {"2": {"layout": 7, "at": 1}}}}', "needs layout"),
])
def test_a_broken_file_is_refused(tmp_path, text, why):
    path = tmp_path / "relayout-state.json"
    path.write_text(text)
    with pytest.raises(StateError, match=why):
        load_state(str(path))


@pytest.mark.parametrize("node, index, layout, why", [
    ("h1", 2, "4g.40gb", "not on the relayout menu"),
    ("h1", 0, "whole", "wholly to Slurm"),  # Kubernetes' GPU
    ("h1", 1, "whole", "wholly to Slurm"),  # a mixed GPU
    ("h9", 2, "whole", "in no node group"),
    ("h1", 7, "whole", "has no GPU 7"),
    ("h1", 2, "9x1g.10gb", "cannot fit"),
])
def test_every_applied_layout_is_held_to_the_menu(tmp_path, plan, node, index, layout, why):
    state = AppliedState(str(tmp_path / "s.json"))
    state.gpus[(node, index)] = Applied(layout, 1.0)
    with pytest.raises(StateError, match=why):
        applied_plan(plan, state)


def test_a_changed_node_renders_its_new_gres_and_kubernetes_side_stays(tmp_path, plan):
    state = state_with(tmp_path, h1_2="2x3g.40gb", h1_3="whole")
    now = applied_plan(plan, state)
    assert now.group_of("h2").gpus == plan.group_of("h2").gpus  # as the plan says
    changed = now.group_of("h1")
    assert changed.name == "mig" and changed.nodes == ("h1",)
    assert slurm_node_gres(plan.group_of("h1")) == "gpu:1g.10gb:15"
    assert slurm_node_gres(changed) == "gpu:h100:1,gpu:1g.10gb:1,gpu:3g.40gb:2"
    gres = parse_gres_conf(render_gres_conf(now))
    assert sorted(d.type for d in gres.devices("h1")) == sorted(
        ["h100", "1g.10gb", "3g.40gb", "3g.40gb"])
    assert sorted(d.type for d in gres.devices("h2")) == ["1g.10gb"] * 15
    # The MIG manager's config is the plan's: render renders it from the plan alone.
    assert render_mig_parted(plan) == render_mig_parted(parse_plan(PLAN, plan.path))
    assert as_applied(plan, "none") is plan
    assert as_applied(plan, state.path) is plan  # the file does not exist: nothing applied
    save_state(state)
    assert as_applied(plan, state.path).group_of("h1").gpus == changed.gpus


def test_a_layout_equal_to_the_plans_keeps_the_plans_gpu(tmp_path, plan):
    state = state_with(tmp_path, h1_2="7x1g.10gb")
    assert applied_plan(plan, state).group_of("h1").gpus == plan.group_of("h1").gpus


def fresh(path):
    return SimNvml(load_profile(path))


def test_check_agrees_with_a_node_that_a_relayout_changed(tmp_path, plan):
    raw = profile_from_plan(plan, "h1")
    path = tmp_path / "h1.json"
    path.write_text(json.dumps(raw))
    apply_layout(fresh(str(path)), plan, "h1", 2, "2x3g.40gb", dry_run=False)
    nvml = fresh(str(path))
    inventory = collect(nvml, "sim:" + str(path), nvml.mig_minors_text, nvml.device_dir, "h1")
    state = state_with(tmp_path, h1_2="2x3g.40gb")
    now = applied_plan(plan, state)
    gres = parse_gres_conf(render_gres_conf(now, {"h1": inventory}, node="h1"), "gres.conf")
    before = [f for f in check_node(plan, "h1", gres, inventory) if f.severity == ERROR]
    assert any("GPU 2: MIG slices are 2 × 3g.40gb" in f.what for f in before), before
    after = check_node(now, "h1", gres, inventory)
    assert [f for f in after if f.severity == ERROR] == []
    # slurmctld's view: h1 with the new Gres is right only against the applied layouts.
    nodes = [SlurmNode("h1", ("IDLE",), gres="gpu:1g.10gb:1,gpu:3g.40gb:2,gpu:1g.10gb:7"),
             SlurmNode("h2", ("IDLE",), gres="gpu:1g.10gb:15")]
    assert [f.what for f in check_cluster(now, nodes) if f.severity == ERROR] == []
    assert [f.what for f in check_cluster(plan, nodes) if f.severity == ERROR] == [
        "node h1: slurmctld has Gres=gpu:1g.10gb:1,gpu:3g.40gb:2,gpu:1g.10gb:7, the plan "
        "gives Slurm gpu:1g.10gb:15"]


def test_render_and_check_read_the_file_beside_the_plan(tmp_path, capsys):
    from gpushare.cli import main

    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    base = ["render", "--plan", str(plan_file)]
    assert main([*base, "gres"]) == 0
    planned = capsys.readouterr().out
    assert main([*base, "mig-parted"]) == 0
    mig_parted = capsys.readouterr().out
    save_state(state_with(tmp_path, h2_3="2x3g.40gb"))  # relayout-state.json beside it
    assert main([*base, "gres"]) == 0
    applied = capsys.readouterr().out
    assert "NodeName=h2 Name=gpu Type=3g.40gb" in applied and "Type=3g.40gb" not in planned
    assert main([*base, "gres", "--state", "none"]) == 0
    assert capsys.readouterr().out == planned
    assert main([*base, "mig-parted"]) == 0
    assert capsys.readouterr().out == mig_parted
    (tmp_path / "relayout-state.json").write_text(json.dumps({"version": 1, "gpus": {
        "h2": {"0": {"layout": "whole", "at": 1.0}}}}))
    assert main([*base, "gres"]) == 2
    assert "wholly to Slurm" in capsys.readouterr().err
    assert main(["check", "--plan", str(plan_file), "--node", "h2", "--source", "none",
                 "--gres-conf", "none", "--json"]) == 2
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [f["severity"] for f in findings] == ["error"]
    assert findings[0]["where"] == str(tmp_path / "relayout-state.json")
    assert findings[0]["what"].startswith("node h2 GPU 0: the plan does not give this GPU "
                                          "wholly to Slurm")
