# SPDX-License-Identifier: GPL-2.0-or-later
"""Rendering from the plan: gres.conf, topology.conf, mig-parted, plugstack, facts."""

from __future__ import annotations

import os

import pytest
import yaml

from gpushare.admin.plan import load_plan, parse_plan
from gpushare.admin.render import (
    RenderError,
    _mig_layouts,
    expected_gres,
    for_installed_slurm,
    render_gres_conf,
    render_mig_parted,
    render_plugstack,
    render_slurm_conf,
    render_topology,
    slurm_node_gres,
    whole_gpu_nodes,
)
from gpushare.admin.render_facts import render_facts
from gpushare.gpu.gresconf import parse_gres_conf
from gpushare.gpu.inventory import Gpu, Inventory, MigDevice
from gpushare.submit.facts import facts_from_dict

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "etc", "plan.example.yaml")

MIXED = """\
version: 1
slurm: {version: "23.11", device_root: /tmp/x/dev, plugin_args: {verify: warn}}
node_groups:
  - name: a100
    nodes: a[1-2]
    gpu_model: a100-80gb
    gpus: 3
    layout:
      0: {owner: slurm, mig: [{profile: 1g.10gb, count: 2}, {profile: 3g.40gb}]}
      1:
        mig:
          - {profile: 3g.40gb, owner: slurm}
          - {profile: 2g.20gb, owner: kubernetes}
      2: {owner: slurm, shard: 8}
"""


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_gres_conf_of_example_plan():
    text = render_gres_conf(load_plan(EXAMPLE))
    body = lines(text)
    assert body[0] == "AutoDetect=off"
    assert "NodeName=h100-[01-08] Name=gpu Type=h100 File=/dev/nvidia[0-7]" in body
    assert ("NodeName=a100-[01-04] Name=gpu Type=1g.5gb MultipleFiles=/dev/nvidia2,"
            "/dev/nvidia-caps/nvidia-cap354,/dev/nvidia-caps/nvidia-cap355") in body
    assert sum("Type=1g.5gb" in ln for ln in body) == 9
    assert not any("3g.20gb" in ln for ln in body)  # GPU 2's 3g.20gb is Kubernetes'

    assert not any("2g.10gb" in ln for ln in body)  # Kubernetes' slices stay out
    assert "NodeName=l40s-[01-16] Name=mps Count=100 File=/dev/nvidia3 Flags=all_sharing" in body


def test_rendered_gres_conf_reads_back_as_the_plan_devices():
    plan = parse_plan(MIXED)
    conf = parse_gres_conf(render_gres_conf(plan), "gres.conf")
    group = plan.groups[0]
    want = [tuple(d.files) for d in expected_gres(plan, group) if d.name == "gpu"]
    got = [tuple(d.files) for d in conf.devices("a2", "gpu")]
    assert sorted(got) == sorted(want) and len(got) == 5
    assert all(f.startswith("/tmp/x/dev/") for files in got for f in files)
    shards = conf.devices("a1", "shard")
    assert [(d.files, d.gres_count) for d in shards] == [(["/tmp/x/dev/nvidia2"], 8)]
    assert slurm_node_gres(group) == "gpu:a100:1,gpu:1g.10gb:2,gpu:3g.40gb:2,shard:8"


def _inventory() -> Inventory:
    def mig(gpu: int, gi: int, profile: str, caps: tuple[int, int]) -> MigDevice:
        return MigDevice(gpu_index=gpu, gi_id=gi, ci_id=0, profile=profile, uuid=f"MIG-{gpu}-{gi}",
                         memory_total=1, caps_files=[f"/dev/nvidia-caps/nvidia-cap{n}"
                                                     for n in caps])
    gpus = [
        Gpu(0, 4, "GPU-0", "NVIDIA A100-SXM4-80GB", 80 << 30, "0:1", "default", True, True,
            [mig(0, 9, "1g.10gb", (600, 601)), mig(0, 10, "1g.10gb", (610, 611)),
             mig(0, 1, "3g.40gb", (550, 551))]),
        Gpu(1, 5, "GPU-1", "NVIDIA A100-SXM4-80GB", 80 << 30, "0:2", "default", True, True,
            [mig(1, 2, "3g.40gb", (700, 701)), mig(1, 3, "2g.20gb", (710, 711))]),
        Gpu(2, 6, "GPU-2", "NVIDIA A100-SXM4-80GB", 80 << 30, "0:3", "default", False, False),
    ]
    return Inventory("a1", "550", "12.4", "test", gpus)


def test_gres_conf_from_inventory_uses_real_minors_and_caps():
    plan = parse_plan(MIXED)
    text = render_gres_conf(plan, {"a1": _inventory()}, device_root="/dev", node="a1")
    body = lines(text)
    # Whole GPUs first, then the slices (Slurm's index order; see render._fold).
    assert body[1] == "NodeName=a1 Name=gpu Type=a100 File=/dev/nvidia6"
    assert body[2] == ("NodeName=a1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia4,"
                       "/dev/nvidia-caps/nvidia-cap550,/dev/nvidia-caps/nvidia-cap551")
    assert "nvidia-cap710" not in text  # the Kubernetes 2g.20gb slice
    assert "NodeName=a1 Name=gpu Type=a100 File=/dev/nvidia6" in body
    assert "NodeName=a1 Name=shard Count=8 File=/dev/nvidia6" in body


def test_topology_leaves_and_spine():
    body = lines(render_topology(load_plan(EXAMPLE)))
    assert body == [
        "SwitchName=nvl0 Nodes=h100-[01-04]",
        "SwitchName=nvl1 Nodes=h100-[05-08]",
        "SwitchName=infer-nonvl Nodes=a100-[01-04]",
        "SwitchName=shared-nonvl Nodes=l40s-[01-16]",
        "SwitchName=spine Switches=nvl0,nvl1,infer-nonvl,shared-nonvl",
    ]


def mig_parted_config(plan):
    """The mig-parted v1 config as data (what ``render_mig_parted`` writes as YAML)."""
    configs = {name: [{key: value for key, value in entry.items() if not key.startswith("_")}
                      for entry in entries]
               for name, _group, entries in _mig_layouts(plan)}
    return {"version": "v1", "mig-configs": configs}


def test_mig_parted_config_is_valid_v1_and_matches_data():
    plan = load_plan(EXAMPLE)
    text = render_mig_parted(plan)
    data = yaml.safe_load(text)
    assert data == mig_parted_config(plan)
    entries = data["mig-configs"]["gpushare-infer"]
    assert entries[0] == {"devices": [0, 1], "mig-enabled": True,
                          "mig-devices": {"2g.10gb": 3, "1g.5gb": 1}}
    assert entries[2]["mig-devices"] == {"1g.5gb": 7}
    assert "gpushare-train" not in data["mig-configs"]  # all whole, all Slurm's


def test_mig_parted_config_without_mig_is_an_empty_mapping():
    """A plan whose GPUs are all whole and Slurm's gives the MIG manager nothing: an empty
    mapping, which mig-parted reads, not a null."""
    plan = load_plan(os.path.join(os.path.dirname(EXAMPLE), "plan.nvl72.example.yaml"))
    text = render_mig_parted(plan)
    assert yaml.safe_load(text) == {"version": "v1", "mig-configs": {}} == \
        mig_parted_config(plan)
    assert "nothing to lay out" in text


def test_plugstack_line():
    text = render_plugstack(parse_plan(MIXED))
    assert lines(text) == ["required /usr/lib64/slurm/spank_gpushare.so verify=warn"]


def test_facts_follow_the_documented_format():
    facts = render_facts(load_plan(EXAMPLE))
    parsed = facts_from_dict(facts)
    assert parsed.gres_syntax == "22.05"
    assert facts["gpu_types"] == ["h100", "l40s"]
    assert facts["mig_types"] == ["1g.5gb"]
    assert facts["gpus_per_node"]["h100-05"] == 8 and facts["gpus_per_node"]["a100-01"] == 0
    assert facts["domains"]["nvl1"] == ["h100-05", "h100-06", "h100-07", "h100-08"]


def test_slurm_2205_gets_at_most_one_mig_profile_per_node():
    # Measured on 22.05.8 with AutoDetect=off: slurmd splits MultipleFiles lines into one
    # GPU per file, so a second MIG profile is allocated under the first one's indices.
    plan = parse_plan(MIXED.replace('version: "23.11", ', 'version: "22.05", '))
    with pytest.raises(RenderError, match="indexes only one MIG profile per node"):
        render_gres_conf(plan)


def test_facts_carry_domain_sizes_and_counts_per_type():
    """NVLink domains belong to a GPU type: PCIe L40S and the A100 slices have none."""
    facts = render_facts(load_plan(EXAMPLE))
    assert facts["version"] == 2
    assert facts["types"] == {
        "1g.5gb": {"nodes": 4, "per_node": 9, "domain_sizes": []},
        "h100": {"nodes": 8, "per_node": 8, "domain_sizes": [4, 4]},
        "l40s": {"nodes": 16, "per_node": 4, "domain_sizes": []},
    }
    assert facts["policy"]["untyped_gpu"] == "whole"


def test_plugstack_line_of_an_imex_cluster_checks_each_gpu_tasks_channel():
    plan = load_plan(os.path.join(os.path.dirname(__file__), "..", "..", "plans", "block.yaml"))
    assert plan.slurm.imex
    line = lines(render_plugstack(plan))[0]
    assert line.endswith(" imex_channels=/dev/nvidia-caps-imex-channels")
    assert "imex_channels" not in render_plugstack(parse_plan(MIXED))


def test_nodes_with_only_whole_gpus_get_the_feature_where_slices_are_elsewhere():
    """etc/plan.example.yaml: whole H100 and L40S nodes, Slurm's 1g.5gb slices on the A100
    nodes alone: the whole nodes get gpushare_whole, and the facts say so."""
    plan = load_plan(EXAMPLE)
    assert whole_gpu_nodes(plan) == [f"h100-{i:02d}" for i in range(1, 9)] + [
        f"l40s-{i:02d}" for i in range(1, 17)]
    assert render_facts(plan)["whole_gpu_feature"] == "gpushare_whole"
    assert facts_from_dict(render_facts(plan)).whole_gpu_feature == "gpushare_whole"
    conf = render_slurm_conf(plan)
    assert "#   NodeName=h100-[01-08],l40s-[01-16] ... Features=gpushare_whole" in conf
    # Each group's Gres= for its NodeName lines, as `check --cluster` wants it.
    assert "(GresTypes= must name gpu,mps)" in conf
    for group in plan.groups:
        assert f"#   NodeName={group.nodes_expr} ... Gres={slurm_node_gres(group)}\n" in conf
    assert "#   NodeName=l40s-[01-16] ... Gres=gpu:l40s:4,mps:400\n" in conf
    # The rendered lines other than comments are still only slurm.conf keys.
    assert lines(conf) == ["TopologyPlugin=topology/tree"]


def test_no_feature_where_a_node_has_both_or_there_are_no_slices():
    """MIXED's a-nodes hold whole GPUs and slices for Slurm: a feature cannot keep an
    untyped job off their slices, so none is rendered (the hooks refuse instead)."""
    whole_only = parse_plan("version: 1\nslurm: {version: \"22.05\"}\nnode_groups:\n"
                            "  - {name: l, nodes: 'l[1-2]', gpu_model: l40s, gpus: 4,\n"
                            "     layout: {all: {owner: slurm}}}\n")
    for plan in (parse_plan(MIXED), whole_only):
        assert whole_gpu_nodes(plan) == []
        assert "whole_gpu_feature" not in render_facts(plan)
        assert "Features=" not in render_slurm_conf(plan)


def test_env_uuid_flags_every_gpu_line_from_26_05_on():
    """Slurm 26.05 reads Flags=env_uuid on gpu lines (not mps/shard, whose jobs it names
    by index); the gres.conf says where slurmd learns the UUIDs."""
    plan = parse_plan(MIXED.replace('version: "23.11", ',
                                    'version: "26.05", env_uuid: true, '))
    text = render_gres_conf(plan)
    body = lines(text)
    gpu_lines = [ln for ln in body if "Name=gpu" in ln]
    assert gpu_lines and all(ln.endswith(" Flags=env_uuid") for ln in gpu_lines), gpu_lines
    assert any("MultipleFiles=" in ln for ln in gpu_lines)
    assert not any("env_uuid" in ln for ln in body if "Name=gpu" not in ln)
    assert "fake_gpus.conf" in text
    devices = parse_gres_conf(text).devices("a1")
    assert [d.flags for d in devices] == [["env_uuid"]] * len(devices)
    # the indices are those of the same plan without the flag
    plain = parse_gres_conf(render_gres_conf(parse_plan(MIXED))).devices("a1")
    assert [(d.type, d.files) for d in devices] == [(d.type, d.files) for d in plain]


def test_env_uuid_is_rendered_only_for_a_release_that_has_it():
    plan = parse_plan(MIXED.replace('version: "23.11", ', 'env_uuid: true, '))
    assert plan.slurm.env_uuid and not plan.slurm.version_given
    for installed, rendered in (("24.11.5", False), ("26.05.5", True)):
        text = render_gres_conf(for_installed_slurm(plan, installed)[0])
        assert any("Flags=env_uuid" in ln for ln in lines(text)) == rendered, installed
        if not rendered:
            assert f"Slurm {installed} has no gres.conf Flags=env_uuid" in text
    assert "env_uuid" not in render_gres_conf(parse_plan(MIXED))


@pytest.mark.parametrize("target", ["slurm-conf", "mig-parted", "plugstack", "topology",
                                    "facts"])
def test_node_is_refused_where_it_would_be_ignored(capsys, target):
    from gpushare.cli import main

    assert main(["render", target, "--plan", EXAMPLE, "--node", "h100-01"]) == 2
    err = capsys.readouterr().err
    assert "--node renders one node's lines of gres only" in err
    assert f"{target} is rendered for the whole plan: drop --node" in err
    assert main(["render", "gres", "--plan", EXAMPLE, "--node", "h100-01"]) == 0
    assert "h100-01" in capsys.readouterr().out
