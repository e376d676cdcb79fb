# SPDX-License-Identifier: GPL-2.0-or-later
"""The relayout menu in the plan and the pure decision of which idle GPUs change layout."""

from __future__ import annotations

import pytest
from tests.unit.admin.relayout_plans import mig_plan
from tests.unit.admin.relayout_site import TRACKED, sacct_stub

from gpushare.admin.mig_profiles import find_model
from gpushare.admin.plan import PlanError, parse_plan
from gpushare.admin.relayout.decide import GpuState, Request, decide
from gpushare.admin.relayout.menu import Menu, MenuItem, parse_layout

H100 = find_model("h100-80gb")

PLAN = mig_plan(["{layout: 7x1g.10gb, min: 1}", "3g.40gb+2g.20gb+1g.10gb",
                 "{layout: 2x3g.40gb, max: 2}", "whole"], min_interval_s=1800, slurm=None)


def layout(text):
    parsed, why = parse_layout(text, H100)
    assert parsed is not None, why
    return parsed


def test_a_group_names_its_menu_and_only_slurms_gpus_count_toward_its_bounds():
    plan = parse_plan(PLAN)
    menu = plan.groups[0].relayout
    assert menu is not None and menu.min_interval_s == 1800
    assert [item.layout.name for item in menu.items] == [
        "7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "2x3g.40gb", "whole"]
    # GPU 0 is Kubernetes', GPU 1 mixed: 2 GPUs x 2 nodes may change.
    assert [gpu.changeable for gpu in plan.groups[0].gpus] == [False, False, True, True]
    assert menu.items[0].low == 1 and menu.items[1].high == 4


def test_every_menu_problem_is_reported_with_its_line():
    bad = PLAN.replace("{layout: 2x3g.40gb, max: 2}", "{layout: 2x3g.40gb, max: 9}") \
        .replace("- whole", "- 4g.40gb+4g.40gb\n        - 7x1g.10gb\n        - {layout: "
                 "\"mps:5\", min: 3, max: 2}")
    with pytest.raises(PlanError) as err:
        parse_plan(bad, "p.yaml")
    assert err.value.problems == [
        "p.yaml:19: nodes h[1-2]: relayout.menu[2]: max must be between 0 and 4, not 9",
        "p.yaml:20: nodes h[1-2]: relayout.menu[3]: layout '4g.40gb+4g.40gb': an h100-80gb "
        "cannot hold 4g.40gb + 4g.40gb under NVIDIA's placement rules",
        "p.yaml:21: nodes h[1-2]: relayout.menu[4]: layout 7x1g.10gb is on the menu twice "
        "(line 17 and line 21)",
        "p.yaml:22: nodes h[1-2]: relayout.menu[5]: min (3) is more than max (2)",
    ]


def test_a_menu_on_a_group_without_slurm_only_gpus_is_refused():
    text = PLAN.replace("all: {owner: slurm,", "all: {owner: kubernetes,").replace(
        "{layout: 7x1g.10gb, min: 1}", "7x1g.10gb")
    with pytest.raises(PlanError) as err:
        parse_plan(text, "p.yaml")
    assert err.value.problems[0].startswith("p.yaml:16: nodes h[1-2]: relayout.menu: no GPU "
                                            "of this group is Slurm's alone")


def test_minimums_beyond_the_changeable_gpus_are_refused():
    text = PLAN.replace("{layout: 7x1g.10gb, min: 1}", "{layout: 7x1g.10gb, min: 3}").replace(
        "- whole", "- {layout: whole, min: 2}")
    with pytest.raises(PlanError) as err:
        parse_plan(text, "p.yaml")
    assert err.value.problems == ["p.yaml:16: nodes h[1-2]: relayout.menu: the minimums add "
                                  "up to 5 GPUs but the group has 4 that may change"]


def test_layout_names_are_canonical():
    assert layout("1g.10gb+3g.40gb+2g.20gb").name == "3g.40gb+2g.20gb+1g.10gb"
    assert layout("7x1g.10gb").offers() == {"1g.10gb": 7}
    assert layout("whole").offers() == {"whole": 1}
    assert layout("mps:100").offers() == {"mps": 100}
    assert parse_layout("mps:x", H100)[0] is None


def menu_of(*names, interval=0, bounds=None):
    bounds = bounds or {}
    return Menu(tuple(MenuItem(layout(n), *bounds.get(n, (0, 99)), 1) for n in names),
                interval, 1)


def gpus(layout_name, count, node="n1", busy=(), last=None, changeable=True):
    return [GpuState(node, i, "g", layout(layout_name), i in busy, changeable, last,
                     {k: v for k, v in layout(layout_name).offers().items()} if i in busy
                     else {})
            for i in range(count)]


def test_idle_gpus_follow_a_queue_of_large_slices():
    menu = menu_of("7x1g.10gb", "2x3g.40gb")
    queue = [Request(str(j), "3g.40gb", 1, 1200) for j in range(4)]
    decision = decide(queue, gpus("7x1g.10gb", 4), {"g": menu}, max_changes=4)
    assert [(c.index, c.new) for c in decision.changes] == [(0, "2x3g.40gb"), (1, "2x3g.40gb")]
    assert decision.drain == ["n1"]
    assert decision.demand == {"3g.40gb": 4} and decision.supply == {"1g.10gb": 28}


def test_busy_kubernetes_and_recent_gpus_never_change():
    menu = menu_of("7x1g.10gb", "2x3g.40gb", interval=3600)
    queue = [Request(str(j), "3g.40gb", 1, 1200) for j in range(8)]
    state = (gpus("7x1g.10gb", 1, node="busy", busy=(0,))
             + gpus("7x1g.10gb", 1, node="k8s", changeable=False)
             + gpus("7x1g.10gb", 1, node="recent", last=600.0))
    decision = decide(queue, state, {"g": menu})
    assert decision.changes == []
    assert "recent GPU 0 held: changed 600 s ago, under the menu's min_interval_s 3600" \
        in decision.why


def test_no_change_without_demand_and_hysteresis_keeps_a_small_gain_out():
    menu = menu_of("7x1g.10gb", "2x3g.40gb")
    assert decide([], gpus("7x1g.10gb", 2), {"g": menu}).changes == []
    # One fresh 3g request would gain 3/7 of a GPU's work: under the default 0.5.
    one = [Request("1", "3g.40gb", 1, 0)]
    assert decide(one, gpus("7x1g.10gb", 2), {"g": menu}).changes == []
    assert len(decide(one, gpus("7x1g.10gb", 2), {"g": menu}, hysteresis=0.2).changes) == 1


def test_a_second_round_on_the_new_layout_changes_nothing():
    menu = menu_of("7x1g.10gb", "2x3g.40gb")
    queue = [Request(str(j), "3g.40gb", 1, 1200) for j in range(2)]
    state = [*gpus("2x3g.40gb", 1), GpuState("n1", 1, "g", layout("7x1g.10gb"), False, True)]
    assert decide(queue, state, {"g": menu}).changes == []


def test_bounds_and_the_round_limit_hold():
    menu = menu_of("7x1g.10gb", "2x3g.40gb", bounds={"7x1g.10gb": (3, 99),
                                                     "2x3g.40gb": (0, 99)})
    queue = [Request(str(j), "3g.40gb", 1, 3000) for j in range(20)]
    assert len(decide(queue, gpus("7x1g.10gb", 5), {"g": menu}).changes) == 2
    decision = decide(queue, gpus("7x1g.10gb", 9), {"g": menu}, max_changes=3)
    assert len(decision.changes) == 3
    assert decision.why[-1] == "stopped at 3 changes this round (--max-changes)"
    # Where a bound alone stops every change, the decision names it.
    stopped = decide(queue, gpus("7x1g.10gb", 3), {"g": menu})
    assert stopped.changes == [] and stopped.why[-1].endswith(
        "short: 3g.40gb 20; bounds in the way: 7x1g.10gb at its min 3"), stopped.why
    capped = menu_of("7x1g.10gb", "2x3g.40gb", bounds={"2x3g.40gb": (0, 1)})
    full = gpus("2x3g.40gb", 1) + gpus("7x1g.10gb", 3)[1:]
    assert decide(queue, full, {"g": capped}).why[-1].endswith(
        "bounds in the way: 2x3g.40gb at its max 1")
    # A bound on a layout that would not serve the short kind is not named.
    no_whole = menu_of("7x1g.10gb", "2x3g.40gb", "whole", bounds={"whole": (0, 0)})
    held_back = decide(queue[:1], gpus("7x1g.10gb", 1), {"g": no_whole}, hysteresis=5)
    assert held_back.changes == [] and "bounds in the way" not in held_back.why[-1], \
        held_back.why


def test_longer_waits_win_a_contested_gpu():
    menu = menu_of("whole", "7x1g.10gb", "2x3g.40gb")
    queue = [Request("old", "3g.40gb", 2, 7200), Request("new", "whole", 1, 0)]
    decision = decide(queue, gpus("7x1g.10gb", 1), {"g": menu}, max_changes=1)
    assert [c.new for c in decision.changes] == ["2x3g.40gb"]


def test_a_kind_no_menu_offers_is_named():
    decision = decide([Request("1", "4g.40gb", 1, 60)], gpus("7x1g.10gb", 1),
                      {"g": menu_of("7x1g.10gb")})
    assert decision.why[0].startswith("4g.40gb: 1 waiting, but no menu offers it")


def test_pending_requests_read_the_same_from_both_releases():
    from datetime import datetime

    from gpushare.admin.relayout.demand import parse_squeue

    now = datetime(2026, 1, 1, 12, 0, 0)
    rest = "|debug|alice|(null)|Resources"
    old = (f"17|gres:gpu:3g.40gb:2|2026-01-01T11:50:00{rest}\n"
           f"18|gres:mps:25|2026-01-01T12:00:00{rest}\n")
    new = (f"17|gres/gpu:3g.40gb:2|2026-01-01T11:50:00{rest}\n"
           f"18|gres/mps:25|2026-01-01T12:00:00{rest}\n"
           f"19|gres/gpu:h100:1,gres/gpu:1g.10gb:1|2026-01-01T11:59:00{rest}\n"
           f"20|N/A|2026-01-01{rest}\n")
    expected = [Request("17", "3g.40gb", 2, 600.0, user="alice"),
                Request("18", "mps", 25, 0.0, user="alice")]
    assert parse_squeue(old, now) == expected
    assert parse_squeue(new, now) == [*expected, Request("19", "whole", 1, 60.0, user="alice"),
                                      Request("19", "1g.10gb", 1, 60.0, user="alice")]


def test_supply_maps_gres_used_to_gpus_and_keeps_kubernetes_gpus_unchangeable():
    from gpushare.admin.relayout.demand import supply
    from gpushare.admin.slurm_client import SlurmNode

    plan = parse_plan(PLAN)
    # gres.conf lists GPU 1's one Slurm slice, then 7 slices of GPU 2, then 7 of GPU 3:
    # device 1 is GPU 2's first slice.
    node = SlurmNode("h1", ("MIXED",), gres="gpu:1g.10gb:15",
                     gres_used="gpu:1g.10gb:1(IDX:1)")
    state = {gpu.index: gpu for gpu in supply(plan, [node])}
    assert [state[i].changeable for i in range(4)] == [False, False, True, True]
    assert state[2].busy and state[2].idle() == {"1g.10gb": 6}
    assert not state[3].busy and state[3].layout.name == "7x1g.10gb"
    assert state[1].layout.name == "1g.10gb" and state[0].layout.offers() == {}


def test_a_node_whose_jobs_run_long_is_left_alone():
    menu = menu_of("7x1g.10gb", "2x3g.40gb")
    queue = [Request(str(j), "3g.40gb", 1, 3000) for j in range(4)]
    state = [GpuState("n1", 0, "g", layout("7x1g.10gb"), True, True, None,
                      {"1g.10gb": 1}, ends_in)
             for ends_in in (7200.0,)] + gpus("7x1g.10gb", 4)[1:]
    decision = decide(queue, state, {"g": menu}, max_drain_s=5400)
    assert decision.changes == []
    assert any("may run longer than --max-drain 5400 s" in why for why in decision.why)
    soon = [GpuState("n1", 0, "g", layout("7x1g.10gb"), True, True, None, {"1g.10gb": 1},
                     600.0), *gpus("7x1g.10gb", 4)[1:]]
    changes = decide(queue, soon, {"g": menu}, max_drain_s=5400).changes
    assert changes and all(c.node_busy for c in changes)


def test_time_left_and_running_nodes_read_from_squeue():
    from gpushare.admin.relayout.demand import parse_running, parse_time_left

    assert parse_time_left("1-02:03:04") == 93784.0
    assert parse_time_left("03:04") == 184.0
    assert parse_time_left("UNLIMITED") is None
    assert parse_running("h[1-2]|10:00\nh2|1:00:00\nh3|UNLIMITED\nh3|05:00\n") == {
        "h1": 600.0, "h2": 3600.0, "h3": None}


def test_the_command_prints_the_decision_from_squeue_and_scontrol(tmp_path, capsys):
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("- {layout: 2x3g.40gb, max: 2}", "- 2x3g.40gb").replace(
        "version: 1\n", "version: 1\nslurm: {version: '24.11'}\n"))
    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\ncase \"$*\" in\n"
                      "*PD*) echo '41|gres/gpu:3g.40gb:1|2026-01-01T00:00:00|debug|a|x|Priority'\n"
                      "      echo '42|gres/gpu:3g.40gb:1|2026-01-01T00:00:00|debug|b|x|Resources'"
                      " ;;\n"
                      "*) echo 'h1|00:10:00' ;;\nesac\n")
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        f"[ \"$*\" = 'show config' ] && echo '{TRACKED}' && exit 0\n"
        "echo 'NodeName=h1 State=MIXED Gres=gpu:1g.10gb:15 GresUsed=gpu:1g.10gb:1(IDX:1)'\n"
        "echo 'NodeName=h2 State=IDLE Gres=gpu:1g.10gb:15 GresUsed=gpu:1g.10gb:0(IDX:N/A)'\n")
    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\necho 'debug|h1'\necho 'debug|h2'\necho 'other|h3'\n")
    for stub in (squeue, scontrol, sinfo):
        stub.chmod(0o755)
    code = main(["relayout", "--plan", str(plan), "--backend", "scontrol", "--scontrol",
                 str(scontrol), "--squeue", str(squeue), "--sinfo", str(sinfo), "--json",
                 "--sacct", sacct_stub(str(tmp_path))])
    out = capsys.readouterr().out
    assert code == 0, out
    import json

    decision = json.loads(out)
    assert decision["demand"] == {"3g.40gb": 2}
    # h2 is idle: its GPU 2 takes 2x3g.40gb; h1's job is busy on GPU 2.
    assert [(c["node"], c["gpu"], c["to"]) for c in decision["changes"]] == [
        ("h2", 2, "2x3g.40gb")]
    assert decision["drain"] == ["h2"]


def test_status_shows_the_queue_beside_what_is_free(tmp_path, capsys):
    from gpushare.cli import main

    squeue = tmp_path / "squeue"
    squeue.write_text("#!/bin/sh\n"
                      "[ \"$1\" = --json ] && { echo '{\"jobs\": []}'; exit 0; }\n"
                      "echo '41|gres/gpu:3g.40gb:2|2026-01-01T00:00:00|debug|a|(null)|"
                      "Resources'\n"
                      "echo '42|gres:gpu:1g.10gb:1|2026-01-01T00:00:00|debug|a|(null)|Priority'\n"
                      "echo '43|gres:gpu:1g.10gb:1|2026-01-01T00:00:00|debug|a|(null)|"
                      "JobHeldUser'\n")
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        "echo 'NodeName=h1 State=MIXED Gres=gpu:1g.10gb:14 GresUsed=gpu:1g.10gb:1(IDX:1)'\n")
    for stub in (squeue, scontrol):
        stub.chmod(0o755)
    assert main(["status", "--cluster", "--demand", "--backend", "scontrol", "--scontrol",
                 str(scontrol), "--squeue", str(squeue)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index("TYPE     WAITING  FREE"):]
    assert [line.split() for line in table[1:]] == [["1g.10gb", "1", "13"],
                                                    ["3g.40gb", "2", "0"]]


def test_slurm_22_05_keeps_one_mig_profile_per_node():
    text = PLAN.replace("version: 1\n", "version: 1\nslurm: {version: '22.05'}\n")
    with pytest.raises(PlanError) as err:
        parse_plan(text, "p.yaml")
    assert err.value.problems == [
        "p.yaml:19: nodes h[1-2]: relayout.menu: 3g.40gb+2g.20gb+1g.10gb mixes MIG profiles; "
        "Slurm 22.05 with AutoDetect=off indexes only one MIG profile per node: keep one "
        "profile per layout, or upgrade Slurm"]
    # The decision changes a node's GPUs together or not at all.
    menu = menu_of("7x1g.10gb", "2x3g.40gb")
    queue = [Request(str(j), "3g.40gb", 1, 3000) for j in range(3)]
    assert len(decide(queue, gpus("7x1g.10gb", 4), {"g": menu}).changes) == 2
    changes = decide(queue, gpus("7x1g.10gb", 4), {"g": menu}, one_profile_per_node=True).changes
    assert [c.index for c in changes] == [0, 1, 2, 3]


def test_a_menu_changes_nothing_rendered_for_either_scheduler():
    from gpushare.admin.render import render_gres_conf, render_mig_parted

    plain = parse_plan(PLAN[:PLAN.index("    relayout:")])
    with_menu = parse_plan(PLAN)
    assert with_menu.groups[0].relayout is not None and plain.groups[0].relayout is None
    assert render_mig_parted(with_menu) == render_mig_parted(plain)
    assert render_gres_conf(with_menu) == render_gres_conf(plain)


@pytest.mark.parametrize("value", ["-1", "604801"])
def test_a_lookback_out_of_range_is_refused(tmp_path, capsys, value):
    from gpushare.cli import main

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    assert main(["relayout", "--plan", str(plan), "--lookback", value]) != 0
    assert "--lookback must be between 0 and 604800 seconds" in capsys.readouterr().err


MIXED_NODE_PLAN = """\
version: 1
slurm: {version: '24.11'}
node_groups:
  - name: infer
    nodes: a[1-2]
    gpu_model: a100-80gb
    gpus: 4
    layout:
      0-1: {owner: kubernetes}
      2: {owner: slurm, mig: [{profile: 1g.10gb, count: 2, owner: slurm},
                              {profile: 2g.20gb, count: 2, owner: kubernetes}]}
      3: {owner: slurm}
    relayout:
      menu:
        - {layout: whole}
        - {layout: "mps:100"}
"""


def test_supply_numbers_a_nodes_gpus_type_after_type_as_its_gres_says():
    """Slurm numbers a node's gpu devices type after type in its Gres= order (render puts
    whole GPUs first): two 1g.10gb jobs on IDX 1-2 hold GPU 2's slices, not GPU 3."""
    from gpushare.admin.relayout.demand import supply
    from gpushare.admin.slurm_client import SlurmNode

    plan = parse_plan(MIXED_NODE_PLAN)
    node = SlurmNode("a1", ("MIXED",), gres="gpu:a100:1,gpu:1g.10gb:2",
                     gres_used="gpu:a100:0(IDX:N/A),gpu:1g.10gb:2(IDX:1-2)")
    state = {gpu.index: gpu for gpu in supply(plan, [node])}
    assert state[2].busy and state[2].used == {"1g.10gb": 2} and state[2].idle() == {}
    assert not state[3].busy and state[3].idle() == {"whole": 1}
    # The whole GPU in use: IDX 0.
    node = SlurmNode("a1", ("MIXED",), gres="gpu:a100:1,gpu:1g.10gb:2",
                     gres_used="gpu:a100:1(IDX:0),gpu:1g.10gb:0(IDX:N/A)")
    state = {gpu.index: gpu for gpu in supply(plan, [node])}
    assert state[3].busy and not state[2].busy


def test_supply_leaves_out_nodes_out_of_service():
    from gpushare.admin.relayout.demand import supply
    from gpushare.admin.slurm_client import SlurmNode

    plan = parse_plan(MIXED_NODE_PLAN)
    nodes = [SlurmNode("a1", ("IDLE", "DRAIN")), SlurmNode("a2", ("DOWN",))]
    assert supply(plan, nodes) == []
    assert {gpu.node for gpu in supply(plan, [SlurmNode("a2", ("IDLE",))])} == {"a2"}
