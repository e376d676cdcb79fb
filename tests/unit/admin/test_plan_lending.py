# SPDX-License-Identifier: GPL-2.0-or-later
"""The plan's lending rules: what they may name, and the proof that no state of them gives
a GPU or a GPU instance to both schedulers."""

from __future__ import annotations

import pytest

from gpushare.admin import check, render
from gpushare.admin.plan import PlanError, parse_plan
from gpushare.admin.plan.lending import Device, Window
from gpushare.admin.plan.lent import plan_with_lent, states_owned_once

GROUPS = """version: 1
slurm: {version: "24.11"}
node_groups:
  - name: infer
    nodes: a100-[01-04]
    gpu_model: a100-40gb
    gpus: 4
    layout:
      0-1: {owner: kubernetes}
      2:
        mig:
          - {profile: 3g.20gb, owner: kubernetes}
          - {profile: 2g.10gb, owner: kubernetes}
          - {profile: 1g.5gb, count: 2, owner: slurm}
      3: {owner: slurm}
  - name: batch
    nodes: b[1-2]
    gpu_model: a100-40gb
    gpus: 2
    layout:
      all: {owner: slurm}
"""

NIGHT = """  - name: night
    home: kubernetes
    nodes: a100-[01-04]
    gpus: 0-1
    window: {from: "20:00", to: "08:00"}
    max_lent: 6
    reclaim_minutes: 30
    borrowers: [batch]
"""
SLICES = """  - name: slices
    home: kubernetes
    nodes: a100-[01-02]
    gpus: 2
    profile: 2g.10gb
    demand: {idle_below_percent: 10, for_minutes: 30}
    reclaim_minutes: 10
    borrowers: [short]
"""
DAY = """  - name: day
    home: slurm
    nodes: b1
    gpus: all
    window: {from: "08:00", to: "20:00"}
    demand: {idle_below_percent: 5, for_minutes: 60}
    reclaim_minutes: 60
    borrowers: [inference]
"""


def plan_with(*rules: str):
    return parse_plan(GROUPS + "lending:\n" + "".join(rules))


def problems(*rules: str) -> str:
    with pytest.raises(PlanError) as caught:
        plan_with(*rules)
    return str(caught.value)


def test_rules_name_their_devices_and_bounds():
    plan = plan_with(NIGHT, SLICES, DAY)
    night, slices, day = plan.lending
    assert (night.home, night.borrower, night.max_lent) == ("kubernetes", "slurm", 6)
    assert night.devices == tuple(Device(f"a100-0{n}", g) for n in range(1, 5) for g in (0, 1))
    assert night.window == Window(20 * 60, 8 * 60) and night.demand is None
    assert slices.devices == (Device("a100-01", 2, 1), Device("a100-02", 2, 1))
    assert slices.max_lent == 2 and slices.borrowers == ("short",)
    assert day.borrower == "kubernetes" and day.devices == (Device("b1", 0), Device("b1", 1))
    assert parse_plan(GROUPS).lending == ()


def test_a_window_may_wrap_midnight():
    night = Window(20 * 60, 8 * 60)
    assert night.active(23 * 60) and night.active(0) and night.active(8 * 60 - 1)
    assert not night.active(8 * 60) and not night.active(12 * 60)
    day = Window(8 * 60, 20 * 60)
    assert day.active(8 * 60) and not day.active(20 * 60) and not day.active(0)


@pytest.mark.parametrize("rule, message", [
    (NIGHT.replace("gpus: 0-1", "gpus: 0-3"),
     "a100-01 GPU 2 is mixed's in the plan (group infer), not kubernetes's"),
    (NIGHT.replace("home: kubernetes", "home: slurm"),
     "a100-01 GPU 0 is kubernetes's in the plan (group infer), not slurm's"),
    (SLICES.replace("2g.10gb", "1g.5gb"), "a100-01 GPU 2 has no 1g.5gb slice of kubernetes's"),
    (NIGHT.replace('    window: {from: "20:00", to: "08:00"}\n', ""),
     "say when it lends: a window (from, to), a demand"),
    (NIGHT.replace('"08:00"', "8:00"), "window.to must be a time of day as \"HH:MM\""),
    (NIGHT.replace('"08:00"', '"20:00"'), "window from and to are both 20:00"),
    (NIGHT.replace("max_lent: 6", "max_lent: 9"), "max_lent must be between 1 and 8, not 9"),
    (NIGHT.replace("a100-[01-04]", "a100-[01-05]"), "node a100-05 is in no node group"),
    (NIGHT.replace("borrowers: [batch]", "borrowers: []"), "borrowers must be a non-empty list"),
    (NIGHT.replace("    reclaim_minutes: 30\n", ""), "missing key 'reclaim_minutes'"),
    (NIGHT.replace("name: night", "name: 'night shift'"), "name 'night shift' must be letters"),
    (NIGHT + "    colour: blue\n", "unknown key 'colour'"),
])
def test_a_bad_rule_is_refused_with_its_line_and_what_to_do(rule, message):
    text = problems(rule)
    assert message in text, text
    assert "plan.yaml:" in text


def test_a_device_has_one_rule():
    twice = problems(NIGHT, NIGHT.replace("name: night", "name: again"))
    assert "a100-01 GPU 0 is lent by two rules (night at line" in twice
    assert twice.count("lent by two rules") == 1  # one problem per pair of rules
    # Two rules lending the same slices of one GPU collide; other slices of it do not.
    same = problems(SLICES, SLICES.replace("name: slices", "name: more"))
    assert "a100-01 GPU 2 slice 2 is lent by two rules (slices" in same
    plan_with(SLICES, SLICES.replace("name: slices", "name: big").replace("2g.10gb", "3g.20gb"))
    names = problems(SLICES, SLICES)
    assert "lending rule name 'slices' used twice" in names


def test_a_gpu_is_lent_or_relaid_out_not_both():
    text = GROUPS.replace("      all: {owner: slurm}\n", "      all: {owner: slurm}\n"
                          "    relayout:\n      menu:\n        - {layout: whole}\n"
                          "        - {layout: \"mps:100\"}\n")
    with pytest.raises(PlanError, match="b1 GPU 0 may be relaid out"):
        parse_plan(text + "lending:\n" + DAY)


def test_a_lent_plan_gives_each_device_to_its_borrower():
    plan = plan_with(NIGHT, SLICES, DAY)
    night, slices, day = plan.lending
    lent = plan_with_lent(plan, [(night.devices[0], "slurm"), (slices.devices[0], "slurm"),
                                 (day.devices[1], "kubernetes")])
    by_name = {group.name: group for group in lent.groups}
    assert sorted(by_name) == ["batch", "batch.lent0", "infer", "infer.lent0"]
    first = lent.group_of("a100-01")
    assert first is not None and first.nodes == ("a100-01",)
    assert first.gpus[0].owner == "slurm" and first.gpus[1].owner == "kubernetes"
    assert [s.owner for s in first.gpus[2].slices] == ["kubernetes", "slurm", "slurm", "slurm"]
    assert lent.group_of("a100-02").gpus[0].owner == "kubernetes"
    assert [g.owner for g in lent.group_of("b1").gpus] == ["slurm", "kubernetes"]
    slurm = render.expected_gres(lent, first, owner="slurm")
    assert {(d.gpu_index, d.type) for d in slurm if d.name == "gpu"} == {
        (0, "a100"), (2, "2g.10gb"), (2, "1g.5gb"), (3, "a100")}
    assert "a100-01" in render.render_gres_conf(lent)
    # Nothing lent: the plan itself.
    assert plan_with_lent(plan, []).groups == plan.groups


def test_no_state_of_the_rules_gives_a_device_to_both():
    plan = plan_with(NIGHT, SLICES, DAY)
    assert states_owned_once(plan) == []
    assert check.check_lending(plan) == []


def test_a_state_slurm_cannot_be_given_is_found():
    """Slurm 22.05 takes one MIG profile per node: lending a 2g.10gb slice beside Slurm's
    own 1g.5gb slices would leave gres.conf unrenderable, and the check says so."""
    plan = parse_plan(GROUPS.replace('"24.11"', '"22.05"') + "lending:\n" + SLICES)
    found = states_owned_once(plan)
    assert found and all("gres.conf cannot be rendered" in f and "one MIG profile per node"
                         in f and f.endswith("when lent by slices") for f in found), found


def test_the_proof_finds_a_renderer_that_gives_a_device_to_both(monkeypatch):
    """A rendering that keeps a lent whole GPU on its home side too is caught, with the
    node, the GPU and the rule."""
    plan = plan_with(NIGHT)
    real = render.expected_gres

    def leaky(plan, group, inventory=None, device_root=None, owner="slurm"):
        devices = real(plan, group, inventory, device_root, owner)
        if owner == "kubernetes":  # Kubernetes keeps GPU 0 whatever the plan says
            devices += [d for d in real(plan, group, inventory, device_root, "slurm")
                        if d.gpu_index == 0 and d.name == "gpu"]
        return devices

    monkeypatch.setattr(render, "expected_gres", leaky)
    found = states_owned_once(plan)
    assert "a100-01: GPU 0 is Slurm's whole and Kubernetes uses it when lent by night" in found
    assert all(f.startswith("a100-01: GPU 0 ") and f.endswith("lent by night") for f in found)
    findings = check.check_lending(plan)
    assert findings and all(f.severity == check.ERROR and "lending" in f.where
                            for f in findings)
