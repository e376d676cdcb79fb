# SPDX-License-Identifier: GPL-2.0-or-later
"""The examples in etc/ and the node profiles ``gpushare simulate`` generates from a plan.

A generated profile must be what the plan describes, so that every node of a plan checks
clean against the gres.conf rendered from it; tests/slurm/test_examples.py then runs jobs
on them in a real Slurm.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
from pathlib import Path

import pytest

from gpushare.admin.mig_profiles import GPU_MODELS
from gpushare.admin.plan import load_plan, parse_plan
from gpushare.cli import main
from gpushare.gpu.nvml_sim import ProfileError, load_profile
from gpushare.gpu.nvml_sim_plan import SIM_MODELS, profile_from_plan
from gpushare.node.config import parse_plugin_args

REPO = Path(__file__).resolve().parents[2]
ETC = REPO / "etc"
PLANS = sorted(glob.glob(str(ETC / "*plan*.yaml")))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_etc_has_an_example_plan():
    assert str(ETC / "plan.example.yaml") in PLANS


@pytest.mark.parametrize("plan_path", PLANS, ids=os.path.basename)
def test_every_node_of_an_example_plan_checks_clean_as_simulated(plan_path, tmp_path, capsys):
    rc, gres, err = run(capsys, "render", "gres", "--plan", plan_path)
    assert rc == 0, err
    (tmp_path / "gres.conf").write_text(gres)
    rc, _, err = run(capsys, "simulate", "--plan", plan_path, "--output-dir", str(tmp_path))
    assert rc == 0, err
    plan = load_plan(plan_path)
    assert sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(plan.nodes)
    for node in plan.nodes:
        rc, out, err = run(capsys, "check", "--plan", plan_path, "--node", node,
                           "--source", f"sim:{tmp_path}/{node}.json",
                           "--gres-conf", str(tmp_path / "gres.conf"))
        assert (rc, out.strip()) == (0, f"gpushare check: {node}: all well"), (node, out, err)


def test_every_slice_of_the_plan_is_simulated_whoever_owns_it():
    plan = load_plan(str(ETC / "plan.example.yaml"))
    group = plan.group_of("a100-01")
    profile = profile_from_plan(plan, "a100-01")
    for planned, simulated in zip(group.gpus, profile["gpus"]):
        assert simulated["mig"] == {"current": planned.mig, "pending": planned.mig}
        assert sorted(m["profile"] for m in simulated.get("mig_devices", [])) == \
            sorted(s.profile for s in planned.slices)
    # GPU 2 is split between Slurm and Kubernetes: 3g.20gb + 2g.10gb + 2 × 1g.5gb.
    assert group.gpus[2].owner == "mixed"
    assert {(m["gi_id"], m["profile"]) for m in profile["gpus"][2]["mig_devices"]} == {
        (2, "3g.20gb"), (3, "2g.10gb"), (9, "1g.5gb"), (10, "1g.5gb")}


def test_generated_profiles_are_stable_and_distinct_per_node():
    plan = load_plan(str(ETC / "plan.example.yaml"))
    assert profile_from_plan(plan, "h100-01") == profile_from_plan(plan, "h100-01")
    uuids = [g["uuid"] for node in plan.nodes for g in profile_from_plan(plan, node)["gpus"]]
    assert len(set(uuids)) == len(uuids)


def test_every_gpu_model_can_be_simulated():
    assert sorted(SIM_MODELS) == sorted(model.name for model in GPU_MODELS)


@pytest.mark.parametrize("model", GPU_MODELS, ids=lambda m: m.name)
def test_a_plan_of_each_model_checks_clean_as_simulated(model, tmp_path, capsys):
    """NVML name, memory and MIG layout of each model are what the plan's checks expect."""
    if model.mig_capable:
        small = min(model.profiles, key=lambda p: (p.memory_slices, "+" in p.name)).name
        layout = (f"      0:\n        owner: slurm\n        mig:\n"
                  f"          - {{profile: {small}, count: 2}}\n"
                  f"      1: {{owner: slurm, mps: 100}}\n")
    else:
        layout = "      all: {owner: slurm, mps: 100}\n"
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(f"version: 1\nnode_groups:\n  - name: g\n    nodes: x[1-2]\n"
                         f"    gpu_model: {model.name}\n    gpus: 2\n    layout:\n{layout}")
    rc, gres, err = run(capsys, "render", "gres", "--plan", str(plan_path))
    assert rc == 0, err
    (tmp_path / "gres.conf").write_text(gres)
    rc, out, err = run(capsys, "simulate", "--plan", str(plan_path), "--node", "x2",
                       "-o", str(tmp_path / "x2.json"))
    assert (rc, out, err) == (0, "", "")
    profile = load_profile(str(tmp_path / "x2.json"))
    assert all(model.matches_nvml_name(g["name"], g["memory_mib"] << 20)
               for g in profile["gpus"])
    rc, out, err = run(capsys, "check", "--plan", str(plan_path), "--node", "x2", "--source",
                       f"sim:{tmp_path}/x2.json", "--gres-conf", str(tmp_path / "gres.conf"))
    assert (rc, out.strip()) == (0, "gpushare check: x2: all well"), (out, err)


def test_gb200_nodes_of_one_domain_share_a_fabric_clique():
    plan = parse_plan("version: 1\ndomains:\n  rack0: t[1-2]\n  rack1: t3\nnode_groups:\n"
                      "  - name: g\n    nodes: t[1-3]\n    gpu_model: gb200\n    gpus: 4\n"
                      "    layout:\n      all: {owner: slurm}\n")
    fabric = {node: {json.dumps(g["fabric"], sort_keys=True)
                     for g in profile_from_plan(plan, node)["gpus"]} for node in plan.nodes}
    assert all(len(cliques) == 1 for cliques in fabric.values())
    assert fabric["t1"] == fabric["t2"] != fabric["t3"]


def test_simulate_stdout_is_the_profile(capsys):
    plan_path = str(ETC / "plan.example.yaml")
    rc, out, _ = run(capsys, "simulate", "--plan", plan_path, "--node", "l40s-03")
    assert rc == 0
    assert json.loads(out) == profile_from_plan(load_plan(plan_path), "l40s-03")


def test_simulate_makes_its_output_directory(capsys, tmp_path):
    """As admin.md types it on a fresh machine: /tmp/nodes need not exist yet."""
    nodes = tmp_path / "new" / "nodes"
    rc, _, err = run(capsys, "simulate", "--plan", str(ETC / "plan.example.yaml"),
                     "--output-dir", str(nodes))
    assert rc == 0, err
    assert json.loads((nodes / "l40s-03.json").read_text()) == profile_from_plan(
        load_plan(str(ETC / "plan.example.yaml")), "l40s-03")


@pytest.mark.parametrize("argv, message", [
    (("--node", "nowhere-01"), "node nowhere-01 is in no node group"),
    (("--output-dir", "/etc/hostname"), "--output-dir /etc/hostname: cannot make the "
     "directory (File exists)"),
    (("--output-dir", "/tmp", "--output", "/tmp/x.json"), "--output goes with --node"),
])
def test_simulate_says_what_is_wrong(capsys, argv, message):
    rc, out, err = run(capsys, "simulate", "--plan", str(ETC / "plan.example.yaml"), *argv)
    assert rc == 2 and out == ""
    assert message in err


def test_unknown_model_is_a_profile_error(monkeypatch):
    plan = load_plan(str(ETC / "plan.example.yaml"))
    monkeypatch.delitem(SIM_MODELS, "l40s")
    with pytest.raises(ProfileError, match="cannot simulate GPU model l40s"):
        profile_from_plan(plan, "l40s-01")


# ---- the plugstack examples ----------------------------------------------------------------


def plugstack_lines() -> list[tuple[str, str]]:
    """Every gpushare line of etc/, commented-out examples included."""
    found = []
    for name in ("plugstack.conf.example", "gpushare.conf"):
        for line in (ETC / name).read_text().splitlines():
            text = line.lstrip("# ").strip()
            if text.startswith(("required ", "optional ")) and "spank_gpushare.so" in text:
                found.append((name, text))
    return found


def test_etc_has_plugstack_lines():
    assert {name for name, _ in plugstack_lines()} == {"plugstack.conf.example",
                                                       "gpushare.conf"}


@pytest.mark.parametrize("name, line", plugstack_lines())
def test_plugstack_lines_in_etc_are_valid(name, line, capsys):
    args = shlex.split(line)[2:]
    parse_plugin_args(args)  # raises ConfigError on an unknown key or a bad value
    rc, _, err = run(capsys, "plugstack-args", *args)
    assert rc == 0, (name, err)


def test_the_full_example_line_spells_out_every_default():
    """plugstack.conf.example says its line holds the defaults but pythonpath, plan, debug_log."""
    from gpushare.node.config import ARG_SPECS

    (line,) = [text for name, text in plugstack_lines() if name == "plugstack.conf.example"]
    args = dict(arg.split("=", 1) for arg in shlex.split(line)[2:])
    for spec in ARG_SPECS:
        if spec.key in ("pythonpath", "plan", "debug_log"):
            continue
        assert spec.key in args, spec.key
        assert spec.check(args[spec.key]) == spec.check(spec.default), spec.key  # none is ""


def _uncommented_menu(text: str) -> str:
    """plan.example.yaml with its commented ``# relayout:`` block taken in, one ``# `` off
    each of its lines, as an admin uncomments it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == "# relayout:")
    end = start
    while end < len(lines) and lines[end].startswith("    #"):
        end += 1
    block = [line.replace("# ", "", 1) for line in lines[start:end]]
    return "".join(lines[:start] + block + lines[end:])


@pytest.mark.parametrize("release, extra", [("22.05", False), ("24.11", False),
                                            ("24.11", True)])
def test_the_example_plans_relayout_menu_holds_once_uncommented(tmp_path, capsys, release,
                                                                extra):
    """As shipped (22.05, the RPM's) and as the .deb renders it (its Slurm release), and
    there with the menu's second-level comment, the 23.11+ layout, taken in too."""
    text = (ETC / "plan.example.yaml").read_text()
    assert '  version: "22.05" ' in text
    text = _uncommented_menu(text.replace('  version: "22.05" ', f'  version: "{release}" '))
    if extra:
        text = text.replace("    # - {layout: 3g.20gb+2g.10gb+1g.5gb}",
                            "    - {layout: 3g.20gb+2g.10gb+1g.5gb}")
    plan = parse_plan(text)
    menu = plan.group_of("a100-01").relayout
    assert menu is not None
    assert [item.layout.name for item in menu.items] == \
        ["7x1g.5gb", "2x3g.20gb", "7g.40gb"] + (["3g.20gb+2g.10gb+1g.5gb"] if extra else [])
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    for target in ("gres", "slurm-conf", "facts"):
        rc, out, err = run(capsys, "render", target, "--plan", str(path))
        assert rc == 0 and out, (target, err)


def test_admin_md_shows_the_example_plans_menu():
    """docs/admin.md's menu is etc/plan.example.yaml's, so that it holds as shipped."""
    import re

    doc = (REPO / "docs" / "admin.md").read_text()
    section = doc.split("### MIG layouts that follow the queue", 1)[1].split("```", 2)[1]
    example = _uncommented_menu((ETC / "plan.example.yaml").read_text())

    def items(text: str) -> list[str]:
        return re.findall(r"^\s*(#? ?- \{layout: [^}]*\})", text, re.MULTILINE)

    assert items(section) == items(example.split("    relayout:", 1)[1].split("\n\n", 1)[0])
    assert len(items(section)) == 4
