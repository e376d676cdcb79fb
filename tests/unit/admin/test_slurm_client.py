# SPDX-License-Identifier: GPL-2.0-or-later
"""slurmctld's view: sinfo --json and scontrol show -o parsing, and command failures."""

from __future__ import annotations

import json

import pytest

from gpushare.admin.slurm_client import (
    ScontrolClient,
    SinfoClient,
    SlurmClientError,
    open_client,
    parse_node_gres,
    parse_scontrol_nodes,
    parse_sinfo_json,
)

# Shaped like Slurm 22.05's `sinfo --json` (openapi/v0.0.38): one entry per node and partition.
SINFO_2205 = {
    "meta": {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
             "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5},
                       "release": "22.05.8"}},
    "errors": [],
    "nodes": [
        {"architecture": "x86_64", "name": "n1", "hostname": "n1", "state": "idle",
         "state_flags": [], "reason": "", "gres": "gpu:a100:4(S:0-1),mps:400",
         "gres_used": "gpu:a100:0(IDX:N/A),mps:0(IDX:N/A)", "cpus": 64, "features": ""},
        {"architecture": "x86_64", "name": "n2", "hostname": "n2", "state": "idle",
         "state_flags": ["DRAIN"], "reason": "gpushare: GPU 1: MIG is off",
         "gres": "gpu:3g.20gb:2", "gres_used": "gpu:3g.20gb:1(IDX:0)", "cpus": 64},
        {"name": "n1", "state": "idle", "gres": "gpu:a100:4(S:0-1),mps:400"},
    ],
}

SCONTROL = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=16 CPUAlloc=0 CPUTot=64 CPULoad=0.01 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8(S:0-1) NodeAddr=n1 "
    "NodeHostName=n1 Version=22.05.8 OS=Linux RealMemory=1000 State=IDLE+DRAIN "
    "ThreadsPerCore=1 Partitions=gpu BootTime=2024-01-01T00:00:00 "
    "Reason=gpushare: gres.conf gives Slurm GPU 1 slice 2g.10gb [root@2024-05-01T10:00:00]\n"
    "NodeName=n2 Arch=x86_64 Gres=(null) State=DOWN* BootTime=None "
    "Reason=Not responding [slurm@2024-05-01]\n"
)


def test_gres_strings():
    assert parse_node_gres("gpu:a100:4(S:0-1),mps:400") == {("gpu", "a100"): 4,
                                                            ("mps", ""): 400}
    assert parse_node_gres("gpu:3g.20gb:2,gpu:3g.20gb:1,shard:2K") == {
        ("gpu", "3g.20gb"): 3, ("shard", ""): 2048}
    assert parse_node_gres("gpu:nvidia_a100_3g.20gb:1(IDX:0,2)") == {
        ("gpu", "nvidia_a100_3g.20gb"): 1}
    assert parse_node_gres("(null)") == {} and parse_node_gres("gpu") == {("gpu", ""): 1}


def test_sinfo_json_2205():
    nodes = parse_sinfo_json(json.dumps(SINFO_2205))
    assert [n.name for n in nodes] == ["n1", "n2"]
    assert nodes[0].states == ("IDLE",) and not nodes[0].draining
    assert nodes[1].states == ("IDLE", "DRAIN") and nodes[1].draining
    assert nodes[1].reason == "gpushare: GPU 1: MIG is off"
    assert nodes[0].gres_used.startswith("gpu:a100:0")


def test_sinfo_json_later_state_list_and_errors():
    data = {"nodes": [{"name": "x", "state": ["IDLE", "DRAIN"], "gres": ""}], "errors": []}
    assert parse_sinfo_json(json.dumps(data))[0].states == ("IDLE", "DRAIN")
    with pytest.raises(SlurmClientError, match="Unable to contact"):
        parse_sinfo_json(json.dumps({"nodes": [], "errors": [
            {"error": "Unable to contact slurm controller", "errno": 1}]}))
    with pytest.raises(SlurmClientError, match="no JSON"):
        parse_sinfo_json("sinfo: unrecognized option '--json'")


def test_scontrol_one_liners():
    nodes = parse_scontrol_nodes(SCONTROL)
    assert nodes[0].name == "n1" and nodes[0].gres == "gpu:h100:8(S:0-1)"
    assert nodes[0].states == ("IDLE", "DRAIN")
    assert nodes[0].reason == "gpushare: gres.conf gives Slurm GPU 1 slice 2g.10gb"
    assert nodes[1].gres == "" and nodes[1].states == ("DOWN*",)
    assert nodes[1].reason == "Not responding"
    # BootTime=None: slurmd has not registered since slurmctld started.
    assert nodes[0].registered and not nodes[1].registered


def _script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_commands_missing_failing_or_hanging(tmp_path):
    with pytest.raises(SlurmClientError, match="not found"):
        SinfoClient(str(tmp_path / "sinfo")).nodes()
    down = _script(tmp_path, "down", "echo 'sinfo: error: Unable to contact slurm controller' >&2"
                   "\nexit 1\n")
    with pytest.raises(SlurmClientError, match="Unable to contact slurm controller"):
        SinfoClient(down).nodes()
    hang = _script(tmp_path, "hang", "sleep 5\n")
    with pytest.raises(SlurmClientError, match="did not answer"):
        ScontrolClient(hang, timeout=0.2).nodes()
    with pytest.raises(SlurmClientError, match="absolute path"):
        open_client("sinfo", sinfo="sinfo")


def test_auto_falls_back_to_scontrol_when_sinfo_has_no_json(tmp_path):
    sinfo = _script(tmp_path, "sinfo", "echo not json\n")
    scontrol = _script(tmp_path, "scontrol", f"cat <<'EOF'\n{SCONTROL}EOF\n")
    client = open_client("auto", sinfo=sinfo, scontrol=scontrol)
    if client.backend == "pyslurm":
        pytest.skip("a pyslurm for this Slurm is installed")
    assert [n.name for n in client.nodes()] == ["n1", "n2"]
    assert client.backend == "scontrol"
    good = _script(tmp_path, "sinfo2", f"cat <<'EOF'\n{json.dumps(SINFO_2205)}\nEOF\n")
    assert [n.name for n in open_client("sinfo", sinfo=good).nodes()] == ["n1", "n2"]
