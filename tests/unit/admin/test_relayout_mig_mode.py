# SPDX-License-Identifier: GPL-2.0-or-later
"""An A100 or A30 applies a MIG mode change only at a GPU reset, which gpushare never does:
its relayout menu keeps one MIG mode, the decision never switches one, and the node's step
refuses such a change in its dry run already."""

from __future__ import annotations

import json

import pytest

from gpushare.admin.mig_profiles import find_model
from gpushare.admin.plan import PlanError, parse_plan
from gpushare.admin.relayout.apply import ApplyError, apply_layout
from gpushare.admin.relayout.decide import GpuState, Request, decide
from gpushare.admin.relayout.demand import supply
from gpushare.admin.relayout.menu import Menu, MenuItem, parse_layout
from gpushare.admin.slurm_client import SlurmNode
from gpushare.gpu.nvml_sim import SimNvml, load_profile
from gpushare.gpu.nvml_sim_plan import profile_from_plan

PLAN = """\
version: 1
slurm: {{version: '24.11'}}
node_groups:
  - name: infer
    nodes: a[1-2]
    gpu_model: {model}
    gpus: 2
    layout:
      0: {{owner: kubernetes}}
      1: {gpu1}
    relayout:
      menu:
{menu}"""

MIG_GPU = "{owner: slurm, mig: [{profile: 1g.10gb, count: 7}]}"


def plan_text(menu, model="a100-80gb", gpu1=MIG_GPU):
    items = "".join(f"        - {item}\n" for item in menu)
    return PLAN.format(model=model, gpu1=gpu1, menu=items)


def problems(text):
    with pytest.raises(PlanError) as err:
        parse_plan(text, "p.yaml")
    return err.value.problems


@pytest.mark.parametrize("model, mig, gpu1", [
    ("a100-80gb", "7x1g.10gb", MIG_GPU),
    ("a100-40gb", "7x1g.5gb", "{owner: slurm, mig: [{profile: 1g.5gb, count: 7}]}"),
    ("a30", "4x1g.6gb", "{owner: slurm, mig: [{profile: 1g.6gb, count: 4}]}"),
])
def test_a_menu_mixing_mig_modes_is_refused_where_a_mode_change_needs_a_reset(model, mig,
                                                                             gpu1):
    found = problems(plan_text([mig, "whole", '"mps:100"'], model, gpu1))
    assert len(found) == 1
    assert found[0].startswith(f"p.yaml:12: nodes a[1-2]: relayout.menu mixes MIG layouts "
                               f"({mig}) with MIG-off ones (whole, mps:100); an ")
    assert "switches MIG mode only after a GPU reset, which gpushare does not do" in found[0]


def test_hopper_switches_mig_mode_at_once_so_its_menu_may_mix():
    plan = parse_plan(plan_text(["7x1g.10gb", "whole", '"mps:100"'], "h100-80gb"))
    menu = plan.groups[0].relayout
    assert menu is not None and [i.layout.name for i in menu.items] == \
        ["7x1g.10gb", "whole", "mps:100"]


def test_an_a100_menu_keeps_the_mode_its_slurm_gpus_have_in_the_plan():
    assert parse_plan(plan_text(["7x1g.10gb", "2x3g.40gb"])).groups[0].relayout is not None
    assert parse_plan(plan_text(["whole", '"mps:100"'], gpu1="{owner: slurm}")) \
        .groups[0].relayout is not None
    found = problems(plan_text(["whole", '"mps:100"']))
    assert found == ["p.yaml:12: nodes a[1-2]: relayout.menu holds MIG-off layouts only, but "
                     "the plan gives Slurm's GPU 1 (line 10) MIG on; an a100-80gb switches "
                     "MIG mode only after a GPU reset, which gpushare does not do: lay it out "
                     "whole in the plan, or keep MIG layouts on the menu"]
    found = problems(plan_text(["7x1g.10gb"], gpu1="{owner: slurm}"))
    assert found[0].startswith("p.yaml:12: nodes a[1-2]: relayout.menu holds MIG layouts only, "
                               "but the plan gives Slurm's GPU 1 (line 10) MIG off;")


def _layout(text, model):
    parsed, why = parse_layout(text, model)
    assert parsed is not None, why
    return parsed


@pytest.mark.parametrize("fixed, changes", [(True, []), (False, [("whole", "7x1g.10gb")])])
def test_the_decision_never_switches_the_mode_of_a_gpu_that_needs_a_reset(fixed, changes):
    model = find_model("a100-80gb")
    menu = Menu(tuple(MenuItem(_layout(name, model), 0, 4, 1)
                      for name in ("7x1g.10gb", "whole")), 0, 1)
    gpus = [GpuState("a1", 0, "g", _layout("whole", model), False, True, mode_fixed=fixed)]
    requests = [Request(str(n), "1g.10gb", 1, 600.0) for n in range(7)]
    decision = decide(requests, gpus, {"g": menu}, hysteresis=0.1)
    assert [(c.old, c.new) for c in decision.changes] == changes


def test_supply_marks_the_gpus_whose_mode_needs_a_reset():
    a100 = parse_plan(plan_text(["7x1g.10gb", "2x3g.40gb"]))
    h100 = parse_plan(plan_text(["7x1g.10gb", "whole"], "h100-80gb"))
    node = SlurmNode("a1", ("IDLE",))
    assert [gpu.mode_fixed for gpu in supply(a100, [node])] == [True, True]
    assert [gpu.mode_fixed for gpu in supply(h100, [node])] == [False, False]


def _profile(tmp_path, plan):
    """The plan's node a1 with GPU 1 still MIG off (its MIG layout not yet applied)."""
    raw = profile_from_plan(plan, "a1")
    raw["gpus"][1]["mig"] = {"current": False, "pending": False}
    raw["gpus"][1].pop("mig_devices", None)
    path = tmp_path / "a1.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("dry_run, says", [(True, "--apply would refuse it"),
                                           (False, "it is refused")])
def test_the_nodes_step_refuses_a_mode_change_before_touching_the_gpu(tmp_path, dry_run, says):
    plan = parse_plan(plan_text(["7x1g.10gb", "2x3g.40gb"]))
    path = _profile(tmp_path, plan)
    with pytest.raises(ApplyError) as err:
        apply_layout(SimNvml(load_profile(path)), plan, "a1", 1, "2x3g.40gb", dry_run=dry_run)
    assert str(err.value).startswith("GPU 1 of node a1: whole -> 2x3g.40gb switches MIG on, "
                                     "which an a100-80gb applies only after a GPU reset; "
                                     f"gpushare does not reset GPUs, so {says}")
    with open(path, encoding="utf-8") as f:
        assert json.load(f)["gpus"][1]["mig"] == {"current": False, "pending": False}


def test_the_dry_run_command_says_apply_would_refuse(tmp_path, capsys):
    from gpushare.cli import main

    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(plan_text(["7x1g.10gb", "2x3g.40gb"]))
    path = _profile(tmp_path, parse_plan(plan_file.read_text()))
    assert main(["relayout", "node", "--plan", str(plan_file), "--node", "a1", "--gpu", "1",
                 "--layout", "2x3g.40gb", "--source", "sim:" + path, "--state", "none"]) == 2
    assert "--apply would refuse it" in capsys.readouterr().err
