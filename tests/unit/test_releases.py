# SPDX-License-Identifier: GPL-2.0-or-later
"""What differs between Slurm releases: the plan's release rendered wherever it is and
compared with the running one by check and the hooks, 24.11's per-GPU MPS use,
topology/block rendering and --segment, and the plugin's job_desc fields."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import slurmbed
from gpushare.admin.cluster_status import used_indexes
from gpushare.admin.plan import PlanError, load_plan, release_tuple, with_slurm_version
from gpushare.admin.render import (
    RenderError,
    for_installed_slurm,
    render_slurm_conf,
    render_topology,
)
from gpushare.admin.render_facts import render_facts
from gpushare.admin.slurm_client import installed_release as host_release
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


def _plan_for(tmp_path, version: str, source: str = slurmbed.BED_PLAN) -> str:
    path = tmp_path / f"plan-{version}.yaml"
    with open(source) as handle:
        path.write_text(handle.read().replace("slurm:\n", f'slurm:\n  version: "{version}"\n',
                                              1))
    return str(path)


def _render(capsys, *argv: str) -> tuple[int, str, str]:
    from gpushare.cli import main

    rc = main(["render", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("wanted, installed, syntax", [("24.11", "22.05.8", "23.11"),
                                                       ("22.05", "24.11.5", "22.05")])
def test_render_takes_the_plans_release_not_the_installed_one(tmp_path, capsys, monkeypatch,
                                                              wanted, installed, syntax):
    """A site renders where another release runs (or none): every output is the plan's."""
    from gpushare.admin import slurm_client

    monkeypatch.setattr(slurm_client, "installed_release", lambda *args, **kwargs: installed)
    plan = _plan_for(tmp_path, wanted)
    rc, out, err = _render(capsys, "facts", "--plan", plan)
    assert (rc, err) == (0, "") and json.loads(out)["gres_syntax"] == syntax
    for target in ("gres", "topology", "plugstack", "slurm-conf", "mig-parted"):
        rc, out, err = _render(capsys, target, "--plan", plan)
        assert rc == 0 and out and err == "", (target, err)
    assert for_installed_slurm(load_plan(plan), installed) == (load_plan(plan), "")


def test_render_with_a_release_needs_no_slurm_here(tmp_path, capsys, monkeypatch):
    """No Slurm on the rendering host: the release is never even looked up."""
    from gpushare.admin import slurm_client

    def no_lookup(*args, **kwargs):
        raise AssertionError("a plan with slurm.version looked up the installed Slurm")

    monkeypatch.setattr(slurm_client, "installed_release", no_lookup)
    rc, out, err = _render(capsys, "facts", "--plan", _plan_for(tmp_path, "24.11", BLOCK_PLAN))
    assert (rc, err) == (0, "") and json.loads(out)["topology"] == "block"
    monkeypatch.setattr(slurm_client, "installed_release", lambda *args, **kwargs: None)
    rc, out, err = _render(capsys, "facts", "--plan", slurmbed.BED_PLAN)
    assert rc == 0 and "no Slurm is installed here: rendering for Slurm 22.05" in err
    assert json.loads(out)["gres_syntax"] == "22.05"


def test_render_on_this_host_for_the_other_release(tmp_path, capsys, monkeypatch):
    """The real lookup on this machine (22.05 on one test machine, 24.11 on the other): a
    plan for the other release renders all the same."""
    from gpushare.admin import slurm_client

    release = host_release()
    if release is None:
        pytest.skip("no Slurm installed here")
    monkeypatch.setattr(slurm_client, "installed_release", host_release)  # this host's
    other = "24.11" if release_tuple(release) < (23, 11) else "22.05"
    rc, out, err = _render(capsys, "facts", "--plan", _plan_for(tmp_path, other))
    assert (rc, err) == (0, ""), err
    assert json.loads(out)["gres_syntax"] == ("23.11" if other == "24.11" else "22.05")


@pytest.mark.parametrize("running, controller, expected", [
    ("22.05.8", True, ["error: the plan is for Slurm 24.11: the submit facts rendered from "
                       "it write requests as gres/gpu:1, which Slurm 22.05.8 running here "
                       "rejects (it takes gres:gpu:1)"]),
    ("22.05.8", False, ["warning: the plan is for Slurm 24.11: the submit facts rendered from "
                        "it write requests as gres/gpu:1, which Slurm 22.05.8 running here "
                        "rejects (it takes gres:gpu:1)"]),
    ("24.05.3", True, ["warning: the plan is for Slurm 24.11, Slurm 24.05.3 runs here"]),
    ("24.11.5", True, []),
    (None, True, []),
])
def test_check_compares_the_plans_release_with_the_running_one(tmp_path, running, controller,
                                                               expected):
    from gpushare.admin.check import check_release

    plan = load_plan(_plan_for(tmp_path, "24.11"))
    found = check_release(plan, running, controller)
    assert [f"{f.severity}: {f.what}" for f in found] == expected
    for finding in found:
        assert finding.fix == f'set slurm.version: "{running[:5]}" in {plan.path} and render again'
    # A plan without a release is rendered for the running one: nothing to compare.
    assert check_release(load_plan(slurmbed.BED_PLAN), "24.11.5", True) == []


def test_check_block_plan_on_a_release_without_blocks(tmp_path):
    from gpushare.admin.check import check_release

    plan = load_plan(_plan_for(tmp_path, "24.11", BLOCK_PLAN))
    (found,) = check_release(plan, "23.02.7", True)
    assert found.severity == "error" and "24.05 or later" in found.what
    assert found.fix.startswith("upgrade Slurm, or set slurm.version")


def test_gpushare_check_says_the_release(tmp_path, capsys, monkeypatch):
    """`gpushare check --all-nodes` on a controller whose Slurm is not the plan's: exit 2."""
    from gpushare.admin import slurm_client
    from gpushare.admin.render import render_gres_conf
    from gpushare.cli import main

    monkeypatch.setattr(slurm_client, "installed_release", lambda *args, **kwargs: "22.05.8")
    plan = _plan_for(tmp_path, "24.11")
    gres = tmp_path / "gres.conf"
    gres.write_text(render_gres_conf(load_plan(plan)))
    rc = main(["check", "--plan", plan, "--all-nodes", "--gres-conf", str(gres)])
    out = capsys.readouterr().out
    assert rc == 2 and "the plan is for Slurm 24.11" in out, out
    monkeypatch.setattr(slurm_client, "installed_release", lambda *args, **kwargs: "24.11.5")
    assert main(["check", "--plan", plan, "--all-nodes", "--gres-conf", str(gres)]) == 0


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
    keys = [line for line in render_slurm_conf(plan).splitlines() if not line.startswith("#")]
    assert keys == ["TopologyPlugin=topology/tree"]


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


def test_plugin_refuses_facts_for_another_release_and_says_why(monkeypatch, tmp_path):
    log = _Log()
    errors = log.errors
    monkeypatch.setattr(submit_hook, "log", log)
    job = {"spank_job_env": ["_SLURM_SPANK_OPTION_gpushare_gpu_share=25"], "user_id": 1000}
    try:
        submit_hook.init(BED_FACTS, 0x180B05)  # 24.11.5, facts written for 22.05
        assert submit_hook.current_facts() is None
        (error,) = errors
        assert error == (
            f"submit hook: refusing the facts: {BED_FACTS} was rendered for Slurm before "
            "23.11 (requests as gres:gpu:1), but this slurmctld is Slurm 24.11.5 (requests as "
            "gres/gpu:1): set slurm.version in the plan to this Slurm's release and render "
            "the facts again (gpushare render facts), then scontrol reconfigure; jobs pass "
            "unchanged until then")
        assert submit_hook.job_submit(job, 1000) == (0, {}, "")  # unchanged: never rejected
        errors.clear()
        submit_hook.init(BED_FACTS, 0x160508)  # 22.05.8: as written, nothing to say
        assert submit_hook.current_facts().gres_syntax == "22.05" and errors == []
        rc, changes, _message = submit_hook.job_submit(job, 1000)
        assert (rc, changes["tres_per_node"]) == (0, "gres:mps:25")
        # Facts for another release on reconfigure: the ones loaded before stay.
        other = tmp_path / "facts.json"
        with open(BED_FACTS) as handle:
            other.write_text(handle.read().replace('"gres_syntax": "22.05"',
                                                   '"gres_syntax": "23.11"'))
        submit_hook._facts_path = str(other)
        submit_hook.reload()
        assert submit_hook.current_facts().gres_syntax == "22.05"
        assert "keeping the facts loaded before until then" in errors[0]
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
    import bedfiles  # slurmbed.slurm_release is bedfiles'

    monkeypatch.setattr(bedfiles, "_RELEASE", [(24, 11)])
    assert slurmbed.stored("gres:gpu:h100:1,gres:mps:25") == "gres/gpu:h100:1,gres/mps:25"
    assert slurmbed.stored("x -> gres:gpu:h100:1 (y)", per_task=True) == "x -> gres/gpu:h100=1 (y)"
    monkeypatch.setattr(bedfiles, "_RELEASE", [(22, 5)])
    assert slurmbed.stored("gres:gpu:h100:1") == "gres:gpu:h100:1"


_LUA_DRIVER = """
slurm = {SUCCESS = 0, ERROR = -1, FAILURE = -1}
local function say(kind)
   return function(fmt, ...) print(kind .. ": " .. string.format(fmt, ...)) end
end
slurm.log_user, slurm.log_info, slurm.log_error = say("user"), say("info"), say("error")
dofile(arg[1])
local job = {tres_per_node = "gres:gpu:H100:1"}
slurm_job_submit(job, nil, 1000)
print("job: " .. job.tres_per_node)
"""


@pytest.mark.parametrize("release, loaded", [("slurm-wlm 24.11.5", False),
                                             ("slurm 23.11.0", False),
                                             ("slurm-wlm 22.05.8", True),
                                             ("", True)])  # -V says nothing: not refused
def test_lua_hook_refuses_facts_for_another_release(tmp_path, release, loaded):
    """job_submit.lua asks its slurmctld's -V at load (job_submit/gpushare is told the
    release it was built for) and refuses facts rendered for the other request syntax. Run
    by the distribution's Lua 5.1, as slurmctld's job_submit/lua embeds it: lupa's has no
    io.popen."""
    lua = shutil.which("lua5.1")
    if lua is None:
        pytest.skip("no lua5.1 here (Debian's lua5.1 package)")
    slurmctld = tmp_path / "slurmctld"
    slurmctld.write_text(f"#!/bin/sh\n[ \"$1\" = -V ] && echo '{release}'\n")
    slurmctld.chmod(0o755)
    driver = tmp_path / "driver.lua"
    driver.write_text(_LUA_DRIVER)
    env = dict(os.environ, GPUSHARE_SLURMCTLD=str(slurmctld), GPUSHARE_FACTS=BED_FACTS)
    done = subprocess.run([lua, str(driver), os.path.join(REPO, "submit_hooks", "job_submit.lua")],
                          env=env, capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    if loaded:
        assert lines == [f"info: gpushare: loaded cluster facts from {BED_FACTS}",
                         "user: gpushare: --gres=gpu:H100:1 -> gres:gpu:h100:1",
                         "job: gres:gpu:h100:1"], done.stdout
        return
    version = release.split()[1]
    assert lines == [
        f"error: gpushare: refusing the facts: {BED_FACTS} was rendered for Slurm before 23.11 "
        f"(requests as gres:gpu:1), but this slurmctld is Slurm {version} (requests as "
        "gres/gpu:1): set slurm.version in the plan to this Slurm's release and render the "
        "facts again (gpushare render facts), then touch this script; jobs pass unchanged "
        "until then", "job: gres:gpu:H100:1"], done.stdout


def test_slurm_version_is_given_whatever_follows_it(tmp_path):
    """slurm.version counts as the plan's own with any other slurm keys beside it (a
    plugin: line once hid it, and the plan was rendered for the installed Slurm)."""
    path = tmp_path / "plan.yaml"
    path.write_text('version: 1\nslurm:\n  version: "24.11"\n  plugin: /usr/lib64/slurm/x.so\n'
                    "node_groups:\n  - {name: g, nodes: x1, gpu_model: h100-80gb, gpus: 1,"
                    " layout: {all: {owner: slurm}}}\n")
    plan = load_plan(str(path))
    assert (plan.slurm.version, plan.slurm.version_given) == ("24.11", True)
    assert load_plan(os.path.join(REPO, "etc", "plan.example.yaml")).slurm.version_given


def test_check_env_uuid_plan_on_a_release_without_the_flag(tmp_path):
    """A gres.conf with Flags=env_uuid on its gpu lines leaves an older slurmd's gpu jobs
    without CUDA_VISIBLE_DEVICES: an error on the controller (a warning on a node)."""
    from gpushare.admin.check import check_release

    path = tmp_path / "uuid.yaml"
    with open(_plan_for(tmp_path, "26.05")) as handle:
        path.write_text(handle.read().replace('version: "26.05"\n',
                                              'version: "26.05"\n  env_uuid: true\n', 1))
    plan = load_plan(str(path))
    (found,) = check_release(plan, "24.11.5", True)
    assert found.severity == "error" and "leaves its jobs no CUDA_VISIBLE_DEVICES" in found.what
    assert found.fix.startswith("upgrade Slurm to 26.05, or set slurm.version")
    assert check_release(plan, "24.11.5", False)[0].severity == "warning"
    assert check_release(plan, "26.05.5", True) == []
    assert check_release(plan, "26.11.0", True)[0].severity == "warning"
