# SPDX-License-Identifier: GPL-2.0-or-later
"""What differs between Slurm releases: request syntax chosen for the installed Slurm, 24.11's
per-GPU MPS use, topology/block rendering and --segment, and the plugin's job_desc fields."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import slurmbed
from gpushare.admin.cluster_status import used_indexes
from gpushare.admin.plan import PlanError, load_plan, with_slurm_version
from gpushare.admin.render import (
    RenderError,
    for_installed_slurm,
    render_facts,
    render_slurm_conf,
    render_topology,
)
from gpushare.submit import hook as submit_hook
from gpushare.submit.facts import FactsError, facts_from_dict, load_facts
from gpushare.submit.rules import apply

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK_PLAN = os.path.join(REPO, "tests", "plans", "block.yaml")
BED_FACTS = os.path.join(REPO, "tests", "vectors", "facts", "bed.json")
NO_VAL = 4294967294
NO_VAL16 = 0xFFFE


def block_facts() -> dict:
    plan, _ = for_installed_slurm(load_plan(BLOCK_PLAN), "24.11.5")
    return render_facts(plan)


# ---- the plan rendered for the installed Slurm ---------------------------------------------

def test_a_plan_without_version_takes_the_installed_release():
    plan, note = for_installed_slurm(load_plan(slurmbed.BED_PLAN), "24.11.5")
    assert note == ""
    assert (plan.slurm.version, plan.slurm.gres_syntax) == ("24.11.5", "23.11")
    assert render_facts(plan)["gres_syntax"] == "23.11"
    plan, _ = for_installed_slurm(load_plan(slurmbed.BED_PLAN), "22.05.8")
    assert render_facts(plan)["gres_syntax"] == "22.05"


def test_no_installed_slurm_is_said():
    plan, note = for_installed_slurm(load_plan(slurmbed.BED_PLAN), None)
    assert plan.slurm.version == "22.05" and "no Slurm is installed here" in note


def test_a_plan_for_the_other_syntax_is_refused(tmp_path):
    path = tmp_path / "plan.yaml"
    with open(slurmbed.BED_PLAN) as handle:
        path.write_text(handle.read().replace("slurm:\n", 'slurm:\n  version: "22.05"\n', 1))
    plan = load_plan(str(path))
    assert plan.slurm.version_given
    with pytest.raises(RenderError, match=r'this machine runs Slurm 24\.11\.5.*"24\.11"'):
        for_installed_slurm(plan, "24.11.5")
    assert for_installed_slurm(plan, "22.05.8") == (plan, "")


def test_several_slurm_mig_profiles_render_on_24_11_only(tmp_path):
    """The bed's n5 with GPU 1's 3g.40gb, 2g.20gb and 1g.10gb slices Slurm's as well."""
    from gpushare.admin.render import render_gres_conf

    with open(slurmbed.BED_PLAN) as handle:
        text = handle.read()
    kubernetes_gpu1 = "      1:\n        owner: kubernetes\n"
    assert kubernetes_gpu1 in text
    path = tmp_path / "plan.yaml"
    path.write_text(text.replace(kubernetes_gpu1, "      1:\n        owner: slurm\n"))
    plan = load_plan(str(path))
    with pytest.raises(RenderError, match="indexes only one MIG profile per node"):
        render_gres_conf(with_slurm_version(plan, "22.05"))
    gres = render_gres_conf(with_slurm_version(plan, "24.11"))
    for profile in ("1g.10gb", "2g.20gb", "3g.40gb"):
        assert f"Type={profile}" in gres


# ---- 24.11's GresUsed ----------------------------------------------------------------------

def test_mps_use_per_gpu_names_the_busy_gpus():
    assert used_indexes("0/100,25/100,0/100,60/100") == {1, 3}
    assert used_indexes("0/100,0/100") == set()
    assert used_indexes("IDX:0-1,3") == {0, 1, 3}
    assert used_indexes("IDX:N/A") == set()


# ---- topology/block ------------------------------------------------------------------------

def test_block_plan_renders_blocks_and_imex():
    plan, _ = for_installed_slurm(load_plan(BLOCK_PLAN), "24.11.5")
    lines = [line for line in render_topology(plan).splitlines()
             if line and not line.startswith("#")]
    assert lines == ["BlockName=rack0 Nodes=blk[1-2]", "BlockName=rack1 Nodes=blk[3-4]",
                     "BlockName=rack2 Nodes=blk[5-6]", "BlockSizes=2,4"]
    conf = [line for line in render_slurm_conf(plan).splitlines() if not line.startswith("#")]
    assert conf == ["TopologyPlugin=topology/block", "SwitchType=switch/nvidia_imex"]
    assert render_facts(plan)["topology"] == "block"


def test_block_needs_24_05():
    with pytest.raises(RenderError, match=r"24\.05 or later"):
        for_installed_slurm(load_plan(BLOCK_PLAN), "22.05.8")


def test_block_with_a_22_05_version_is_a_plan_error(tmp_path):
    path = tmp_path / "plan.yaml"
    with open(BLOCK_PLAN) as handle:
        path.write_text(handle.read().replace("slurm:\n", 'slurm:\n  version: "22.05"\n', 1))
    with pytest.raises(PlanError, match=r"slurm\.topology: block needs Slurm 24\.05"):
        load_plan(str(path))


def test_tree_plan_keeps_switches_and_no_topology_key():
    plan, _ = for_installed_slurm(load_plan(slurmbed.BED_PLAN), "24.11.5")
    assert "SwitchName=nvl0 Nodes=n[1-2]" in render_topology(plan)
    assert "topology" not in render_facts(plan)
    assert render_slurm_conf(plan).splitlines()[1:] == ["TopologyPlugin=topology/tree"]


def test_facts_topology_must_be_known():
    data = block_facts()
    assert facts_from_dict(data).topology == "block"
    data["topology"] = "torus"
    with pytest.raises(FactsError, match='"topology" must be one of tree, block'):
        facts_from_dict(data)


@pytest.mark.parametrize("nodes, segment, note", [
    (2, 2, "--segment=2 (2 nodes fit in one NVLink domain)"),
    (4, 2, "--segment=2 (4 nodes in segments of 2, each in one NVLink domain of 2 nodes)"),
    (6, 2, "--segment=2 (6 nodes in segments of 2, each in one NVLink domain of 2 nodes)"),
])
def test_multi_node_job_on_blocks_gets_a_segment(nodes, segment, note):
    facts = facts_from_dict(block_facts())
    job = {"tres_per_node": "gres/gpu:h100:1", "min_nodes": nodes, "max_nodes": nodes,
           "req_switch": NO_VAL, "wait4switch": NO_VAL, "segment_size": NO_VAL16}
    decision = apply(job, facts)
    assert decision.changes == {"segment_size": segment}
    assert decision.messages == [f"gpushare: {note}"]


def test_a_job_that_does_not_split_evenly_gets_no_segment():
    facts = facts_from_dict(block_facts())
    job = {"tres_per_node": "gres/gpu:h100:1", "min_nodes": 3, "max_nodes": 3,
           "req_switch": NO_VAL, "wait4switch": NO_VAL, "segment_size": NO_VAL16}
    decision = apply(job, facts)
    assert decision.changes == {}
    assert "no --segment: 3 nodes do not split evenly" in decision.messages[0]


def test_users_segment_is_kept_and_lua_fields_get_none():
    facts = facts_from_dict(block_facts())
    job = {"tres_per_node": "gres/gpu:h100:1", "min_nodes": 2, "max_nodes": 2,
           "req_switch": NO_VAL, "wait4switch": NO_VAL, "segment_size": 1}
    assert apply(job, facts).changes == {}
    del job["segment_size"]  # job_submit.lua before 25.11 has no segment_size
    decision = apply(job, facts)
    assert decision.changes == {} and decision.messages == []


def test_lua_hook_leaves_block_placement_to_slurm(tmp_path):
    luahook = pytest.importorskip("luahook")
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(block_facts()))
    hook = luahook.LuaHook(str(path))
    result = hook.submit({"tres_per_node": "gres/gpu:h100:1", "min_nodes": 2, "max_nodes": 2,
                          "req_switch": NO_VAL, "wait4switch": NO_VAL})
    assert result["changes"] == {} and result["reject"] is None
    path.write_text(json.dumps(dict(block_facts(), topology="torus")))
    hook = luahook.LuaHook(str(path))
    assert any('"topology" must be one of tree, block' in line for line in hook.log("error"))


# ---- the Python plugin in the running slurmctld --------------------------------------------

class _Log:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def error(self, fmt: str, *args: object) -> None:
        self.errors.append(fmt % args)

    def info(self, fmt: str, *args: object) -> None:
        pass

    exception = error


def test_plugin_uses_the_running_slurms_syntax_and_says_so(monkeypatch):
    log = _Log()
    errors = log.errors
    monkeypatch.setattr(submit_hook, "log", log)
    try:
        submit_hook.init(BED_FACTS, 0x180B05)  # 24.11.5, facts written for 22.05
        facts = submit_hook.current_facts()
        assert facts is not None and facts.gres_syntax == "23.11"
        assert "says gres_syntax 22.05" in errors[0] and "Render the facts again" in errors[0]
        rc, changes, message = submit_hook.job_submit(
            {"spank_job_env": ["_SLURM_SPANK_OPTION_gpushare_gpu_share=25"], "user_id": 1000},
            1000)
        assert (rc, changes["tres_per_node"]) == (0, "gres/mps:25"), message
        errors.clear()
        submit_hook.init(BED_FACTS, 0x160508)  # 22.05.8: as written, nothing to say
        assert submit_hook.current_facts().gres_syntax == "22.05" and errors == []
    finally:
        submit_hook.init(BED_FACTS, None)


def test_plugin_struct_has_segment_size_from_24_11():
    """submit_hooks/build.py (run by the system python3 with its cffi, as make build does)."""
    probe = ("import importlib.util as u; s = u.spec_from_file_location('hb', "
             "'submit_hooks/build.py'); b = u.module_from_spec(s); s.loader.exec_module(b); "
             "print('segment_size' in b.cdef_for(0x180B05), "
             "'segment_size' in b.cdef_for(0x160508), '@SEGMENT@' in b.cdef_for(0))")
    done = subprocess.run(["/usr/bin/python3", "-c", probe], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert done.stdout.split() == ["True", "False", "False"], done.stderr


def test_bed_facts_load():
    assert load_facts(BED_FACTS).topology == "tree"


# ---- the test beds' release-aware strings --------------------------------------------------

def test_stored_strings_follow_the_release(monkeypatch):
    monkeypatch.setattr(slurmbed, "_RELEASE", [(24, 11)])
    assert slurmbed.stored("gres:gpu:h100:1,gres:mps:25") == "gres/gpu:h100:1,gres/mps:25"
    assert slurmbed.stored("x -> gres:gpu:h100:1 (y)", per_task=True) == "x -> gres/gpu:h100=1 (y)"
    monkeypatch.setattr(slurmbed, "_RELEASE", [(22, 5)])
    assert slurmbed.stored("gres:gpu:h100:1") == "gres:gpu:h100:1"
