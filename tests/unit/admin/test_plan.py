# SPDX-License-Identifier: GPL-2.0-or-later
"""The ownership plan parser: valid plans parse, every mistake names its line."""

from __future__ import annotations

import os
import textwrap

import pytest

from gpushare.admin.mig_profiles import caps_minors, find_model, gi_id_for_placement, place_slices
from gpushare.admin.plan import PlanError, check_mig_change, load_plan, parse_plan
from gpushare.gpu.inventory import Gpu, Inventory

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "etc", "plan.example.yaml")


def plan_text(layout: str, model: str = "a100-40gb", gpus: int = 4, nodes: str = "n[1-4]",
              extra: str = "") -> str:
    body = textwrap.indent(textwrap.dedent(layout).strip("\n"), " " * 6)
    return (f"version: 1\n{extra}node_groups:\n  - name: g\n    nodes: {nodes}\n"
            f"    gpu_model: {model}\n    gpus: {gpus}\n    layout:\n{body}\n")


def problems(text: str) -> list[str]:
    with pytest.raises(PlanError) as info:
        parse_plan(text, "plan.yaml")
    return info.value.problems


def test_example_plan_parses_with_expected_groups():
    plan = load_plan(EXAMPLE)
    assert [g.name for g in plan.groups] == ["train", "infer", "shared"]
    assert plan.group_of("h100-03").model.name == "h100-80gb"
    infer = plan.group_of("a100-02")
    gpu2 = infer.gpus[2]
    assert gpu2.owner == "mixed"
    assert [s.profile for s in gpu2.slices_of("slurm")] == ["1g.5gb", "1g.5gb"]
    assert plan.group_of("l40s-16").gpus[3].mps == 100
    assert [d.name for d in plan.domains] == ["nvl0", "nvl1"]
    assert plan.group_of("nope") is None


def test_slice_owned_twice_names_both_lines():
    text = plan_text("""
        all: {owner: slurm}
        2:
          mig:
            - {profile: 3g.20gb, owner: slurm}
            - {profile: 3g.20gb, owner: kubernetes}
        """)
    (problem,) = problems(text)
    assert problem.startswith("plan.yaml:12: nodes n[1-4] GPU 2: slice 3g.20gb owned twice")
    assert "(slurm at line 11, kubernetes at line 12)" in problem


@pytest.mark.parametrize("slices, reason", [
    ("[{profile: 3g.20gb, placement: 0}, {profile: 4g.20gb}]", "no placement fits"),
    ("[{profile: 3g.20gb, count: 2}, {profile: 1g.5gb}]", "9 memory slices"),
    ("[{profile: 4g.20gb}, {profile: 4g.20gb}]", "at most 1 × 4g.20gb"),
    ("[{profile: 1g.5gb, count: 7}, {profile: 2g.10gb}]", "9 compute slices"),
    ("[{profile: 1g.10gb, count: 4}, {profile: 1g.10gb}]", "at most"),
])
def test_layout_the_gpu_cannot_hold(slices, reason):
    text = plan_text(f"all: {{owner: slurm, mig: {slices}}}")
    (problem,) = problems(text)
    assert "an a100-40gb cannot hold" in problem and reason in problem
    assert problem.startswith("plan.yaml:8:")


@pytest.mark.parametrize("model, slices", [
    ("a100-40gb", ["4g.20gb", "3g.20gb"]),
    ("a100-40gb", ["2g.10gb", "2g.10gb", "3g.20gb"]),
    ("a100-40gb", ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]),
    ("a100-40gb", ["1g.5gb"] * 7),
    ("a100-80gb", ["1g.20gb"] * 4),
    ("h100-80gb", ["3g.40gb", "3g.40gb"]),
    ("h200-141gb", ["4g.71gb", "2g.35gb", "1g.18gb"]),
    ("gb200-186gb", ["7g.186gb"]),
    ("a30-24gb", ["2g.12gb", "1g.6gb", "1g.6gb"]),
])
def test_real_layouts_fit(model, slices):
    assert place_slices(find_model(model), slices) is not None


@pytest.mark.parametrize("model, slices", [
    ("a100-40gb", ["3g.20gb", "3g.20gb", "1g.5gb"]),  # sums fit, placements do not
    ("a100-40gb", ["4g.20gb", "4g.20gb"]),
    ("h100-80gb", ["7g.80gb", "1g.10gb"]),
    ("h100-80gb", ["1g.20gb", "1g.20gb", "1g.20gb", "2g.20gb", "1g.10gb"]),
    ("a30-24gb", ["4g.24gb", "1g.6gb"]),
    ("h200-141gb", ["1g.10gb"]),  # profile of another model
])
def test_impossible_layouts_rejected(model, slices):
    assert place_slices(find_model(model), slices) is None


def test_fixed_placement_is_respected_and_clash_rejected():
    model = find_model("a100-40gb")
    assert place_slices(model, ["3g.20gb", "2g.10gb"], [4, 0]) == [4, 0]
    assert place_slices(model, ["3g.20gb", "2g.10gb"], [4, 4]) is None
    assert place_slices(model, ["2g.10gb"], [1]) is None  # not an allowed start


def test_gi_ids_and_caps_minors_follow_driver_numbering():
    model = find_model("a100-40gb")
    assert gi_id_for_placement(model, 0, 8) == 0
    assert gi_id_for_placement(model, 4, 4) == 2
    assert gi_id_for_placement(model, 2, 2) == 4
    assert gi_id_for_placement(model, 6, 1) == 13
    # mig-minors: gpu0/gi0/access 3, gpu0/gi1/access 12, gpu1/gi0/access 138
    assert caps_minors(0, 0, 0) == (3, 4)
    assert caps_minors(0, 1, 0) == (12, 13)
    assert caps_minors(1, 0, 0) == (138, 139)
    assert caps_minors(2, 2, 0) == (291, 292)
    with pytest.raises(ValueError):
        caps_minors(0, 15, 0)


def test_unknown_keys_and_wrong_types_point_at_lines():
    text = plan_text("all: {owner: slurm, colour: red}", extra="polcy: {}\n")
    found = problems(text)
    assert any(p.startswith("plan.yaml:2:") and "unknown key 'polcy'" in p for p in found)
    assert any(p.startswith("plan.yaml:9:") and "unknown key 'colour'" in p for p in found)
    found = problems(plan_text("all: {owner: slurm}", gpus="eight"))
    assert any("gpus must be a whole number" in p and p.startswith("plan.yaml:6:")
               for p in found)


def test_node_in_two_groups_and_two_domains():
    group = ("  - {{name: {}, nodes: '{}', gpu_model: h100, gpus: 1, "
             "layout: {{all: {{owner: slurm}}}}}}\n")
    text = ("version: 1\ndomains:\n  d0: n[1-2]\n  d1: n[2-3]\nnode_groups:\n"
            + group.format("a", "n[1-3]") + group.format("b", "n[3-4]"))
    found = problems(text)
    assert any("node n3 is in two node groups (a at line 6, b at line 7)" in p for p in found)
    assert any(p.startswith("plan.yaml:4:") and "node n2 is in two NVLink domains" in p
               for p in found)


def test_gpu_laid_out_twice_and_missing_gpu():
    found = problems(plan_text("0-2: {owner: slurm}\n2-3: {owner: kubernetes}"))
    assert any("GPU 2: laid out twice (line 8 and line 9)" in p for p in found)
    found = problems(plan_text("0-2: {owner: slurm}"))
    assert any("GPU 3: not in the layout" in p for p in found)


def test_sharing_rules():
    found = problems(plan_text("all: {owner: kubernetes, mps: 50}", model="l40s"))
    assert any("mps/shard are Slurm's sharing" in p for p in found)
    found = problems(plan_text("all: {owner: slurm, mps: 50, shard: 4}", model="l40s"))
    assert any("mps or shard, not both" in p for p in found)
    found = problems(plan_text("all: {owner: slurm, mig: [{profile: 1g.5gb}]}", model="l40s"))
    assert any("an l40s has no MIG" in p for p in found)
    plan = parse_plan(plan_text("all: {owner: slurm, mps: true}", model="l40s"))
    assert plan.groups[0].gpus[0].mps == 100


def test_sharing_flag_accepted_on_22_05_and_checked():
    # Measured on Slurm 22.05.8: Flags=all_sharing on the mps lines lets mps jobs use every
    # GPU of a node instead of only the first.
    plan = parse_plan(plan_text("all: {owner: slurm, mps: 100}",
                                extra="slurm: {version: '22.05', sharing_flag: all_sharing}\n"))
    assert plan.slurm.gres_syntax == "22.05" and plan.slurm.sharing_flag == "all_sharing"
    found = problems(plan_text("all: {owner: slurm}",
                               extra="slurm: {version: '22.05', sharing_flag: every_sharing}\n"))
    assert any("slurm.sharing_flag" in p for p in found)
    plan = parse_plan(plan_text("all: {owner: slurm}",
                                extra="slurm: {version: 23.11, sharing_flag: all_sharing}\n"))
    assert plan.slurm.gres_syntax == "23.11" and plan.slurm.sharing_flag == "all_sharing"


def test_yaml_errors_and_duplicates_are_plan_errors():
    assert problems("version: 1\nnode_groups: [\n")[0].startswith("plan.yaml:3:")
    found = problems("version: 1\nversion: 1\nnode_groups: []\n")
    assert found[0].startswith("plan.yaml:2:") and "given twice" in found[0]
    assert "empty" in problems("")[0]
    assert "version 2 is not supported" in problems("version: 2\nnode_groups: []\n")[0]


def test_missing_file_is_plan_error(tmp_path):
    with pytest.raises(PlanError, match="cannot read the plan"):
        load_plan(str(tmp_path / "absent.yaml"))


def _inventory(host: str, modes: list[bool]) -> Inventory:
    gpus = [Gpu(nvml_index=i, minor=i, uuid=f"GPU-{i}", name="NVIDIA A100-SXM4-40GB",
                memory_total=40 << 30, pci_bus_id=f"0000:{i:02x}:00.0", compute_mode="default",
                mig_current=mode, mig_pending=mode) for i, mode in enumerate(modes)]
    return Inventory(hostname=host, driver_version="550", cuda_driver_version="12.4",
                     source="test", gpus=gpus)


def test_mig_mode_change_on_busy_node_is_an_error_naming_gpus():
    plan = parse_plan(plan_text("""
        0-2: {owner: slurm}
        3: {owner: kubernetes, mig: [{profile: 7g.40gb}]}
        """))
    inventory = _inventory("n2", [False, False, False, False])
    assert check_mig_change(plan, inventory, []) == [3]
    with pytest.raises(PlanError) as info:
        check_mig_change(plan, inventory, [0, 2])
    message = info.value.problems[0]
    assert message.startswith("plan.yaml:9: node n2")
    assert "GPU 3 to MIG on" in message and "Slurm is using GPU 0, 2" in message
    assert check_mig_change(plan, _inventory("n2", [False] * 3 + [True]), [0, 2]) == []


@pytest.mark.parametrize("value, problem", [
    ("whole", None), ("any", None), ("h100", None),
    ("a100", "policy.untyped_gpu 'a100' must be whole, any, or a type of whole GPUs Slurm "
             "owns here (h100)"),
])
def test_untyped_gpu_policy(value, problem):
    text = ("version: 1\npolicy:\n  untyped_gpu: " + value + "\nnode_groups:\n"
            "  - {name: t, nodes: 'n[1-2]', gpu_model: h100-80gb, gpus: 8,\n"
            "     layout: {all: {owner: slurm}}}\n")
    if problem is None:
        assert parse_plan(text).policy.untyped_gpu == value
    else:
        with pytest.raises(PlanError) as info:
            parse_plan(text)
        assert any(problem in p for p in info.value.problems), info.value.problems


def test_env_uuid_needs_a_release_that_has_the_flag():
    plan = parse_plan(plan_text("all: {owner: slurm}",
                                extra="slurm: {version: '26.05', env_uuid: true}\n"))
    assert plan.slurm.env_uuid
    found = problems(plan_text("all: {owner: slurm}",
                               extra="slurm: {version: '24.11', env_uuid: true}\n"))
    assert any("slurm.env_uuid needs Slurm 26.05 or later" in p for p in found)
    found = problems(plan_text("all: {owner: slurm}", extra="slurm: {env_uuid: yes please}\n"))
    assert any("slurm.env_uuid must be true or false" in p for p in found)
    assert not parse_plan(plan_text("all: {owner: slurm}")).slurm.env_uuid
