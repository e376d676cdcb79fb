# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare status --cluster: slurmctld's GRES and GresUsed in the shapes of Slurm 22.05
(openapi v0.0.38, captured from the test Slurm) and 24.11 (data_parser v0.0.42), and the
jobs' GRES (``squeue --json``'s ``gres_detail``, captured from each release's test Slurm)
that MPS use is counted from."""

from __future__ import annotations

import json
import os

import pytest

from gpushare.admin.cluster_status import node_sharing, summary, totals, used_indexes
from gpushare.admin.slurm_client import (
    SlurmClientError,
    SlurmNode,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_jobs,
)
from gpushare.cli import main as cli_main

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm_json")


def fixture(name: str) -> str:
    with open(os.path.join(DATA, name)) as handle:
        return handle.read()


def by_name(nodes):
    return {node.name: node for node in nodes}


def test_slurm_22_05_sinfo_json():
    """Captured from the test Slurm: an MPS job and a 2-GPU job on n1, two MIG slices on
    n5, n3 drained by hand with a gpushare reason."""
    nodes = by_name(parse_sinfo_json(fixture("sinfo-22.05.json")))
    assert sorted(nodes) == ["n1", "n2", "n3", "n4", "n5"]
    assert nodes["n3"].states == ("IDLE", "DRAIN") and nodes["n3"].draining
    assert nodes["n3"].reason == "gpushare: test reason"
    assert nodes["n1"].gres_used.startswith("gpu:h100:2(IDX:1-2),mps:h100:")
    sharing = by_name(summary(list(nodes.values())))
    (h100,) = sharing["n1"].types
    mps_used = int(nodes["n1"].gres_used.split("mps:h100:")[1].split("(")[0])
    # GPU 0 serves the MPS job, GPUs 1-2 the whole-GPU job: 5 of 8 free.
    assert (h100.gpu_type, h100.total, h100.used, h100.mps_busy, h100.free) == (
        "h100", 8, 2, 1, 5)
    assert (h100.mps_used, h100.mps_total) == (mps_used, 800)
    a100, slices = sharing["n5"].types
    assert (a100.gpu_type, a100.free, a100.mps_total) == ("a100", 1, 0)
    assert (slices.mig_profile, slices.total, slices.used, slices.free) == ("1g.10gb", 7, 2, 5)
    assert sharing["n3"].drained_by_gpushare and not sharing["n2"].drained


@pytest.mark.parametrize("name", ["sinfo-24.11.json", "scontrol-nodes-24.11.json"])
def test_slurm_24_11_shapes(name):
    """sinfo's grouped entries and scontrol's node list give the same nodes."""
    nodes = by_name(parse_sinfo_json(fixture(name)))
    assert sorted(nodes) == ["n1", "n2", "n3", "n4", "n5"]  # n2 once, though in two partitions
    assert nodes["n3"].states == ("IDLE", "DRAIN")
    assert nodes["n3"].reason.startswith("gpushare: MPS control daemon")
    assert nodes["n4"].states == ("DOWN", "DRAIN", "NOT_RESPONDING") and nodes["n4"].down
    sharing = by_name(summary(list(nodes.values())))
    (h100,) = sharing["n1"].types
    assert (h100.total, h100.used, h100.mps_busy, h100.free) == (8, 2, 1, 5)
    assert (h100.mps_used, h100.mps_total) == (25, 800)
    assert [(t.mig_profile, t.free) for t in sharing["n5"].types] == [("", 1), ("1g.10gb", 5)]
    assert sharing["n3"].drained_by_gpushare and not sharing["n4"].drained_by_gpushare
    sums = totals(list(sharing.values()))
    # Drained n3 and n4 offer nothing: n1 5 + n2 8.
    assert sums["gpus"]["h100"] == {"total": 32, "free": 13, "mps_used": 25, "mps_total": 3200}
    assert sums["mig"]["1g.10gb"] == {"total": 7, "free": 5}
    assert (sums["drained_nodes"], sums["drained_by_gpushare"]) == (2, 1)


def test_sinfo_groups_naming_several_nodes_are_expanded():
    data = json.loads(fixture("sinfo-24.11.json"))
    data["sinfo"][1]["nodes"]["nodes"] = ["n[2,6-7]"]
    names = [node.name for node in parse_sinfo_json(json.dumps(data))]
    assert names == ["n1", "n2", "n6", "n7", "n3", "n4", "n5"]


def test_sinfo_reason_as_plain_text():
    data = json.loads(fixture("sinfo-24.11.json"))
    for entry in data["sinfo"]:
        entry["reason"] = entry["reason"]["description"]
    assert by_name(parse_sinfo_json(json.dumps(data)))["n3"].reason.startswith("gpushare:")


def test_json_errors_say_which_command():
    with pytest.raises(SlurmClientError, match="scontrol show nodes --json printed no JSON"):
        parse_sinfo_json("scontrol: unrecognized option '--json'", "scontrol show nodes --json")
    with pytest.raises(SlurmClientError, match="'nodes' or 'sinfo'"):
        parse_sinfo_json('{"meta": {}}')
    with pytest.raises(SlurmClientError, match="Unable to contact slurm controller"):
        parse_sinfo_json('{"sinfo": [], "errors": [{"error": "Unable to contact slurm '
                         'controller", "error_number": 1007}]}')


def test_scontrol_detail_text_has_gres_used():
    line = ("NodeName=n1 Arch=x86_64 CPUAlloc=2 Gres=gpu:h100:8,mps:h100:800 "
            "GresDrain=N/A GresUsed=gpu:h100:2(IDX:1-2),mps:h100:25(IDX:0),shard:0 "
            "State=MIXED Reason=(null)")
    (node,) = parse_scontrol_nodes(line)
    (h100,) = node_sharing(node).types
    assert (h100.free, h100.mps_used) == (5, 25)


# n1's line while the jobs of squeue-jobs-<release>.json ran (mps:25 by one user, mps:50 by
# another, gpu:h100:2), captured from the test Slurm of each release.
NODE_LINES = {
    "22.05": "NodeName=n1 Gres=gpu:h100:8,mps:h100:800 GresDrain=N/A "
             "GresUsed=gpu:h100:2(IDX:1-2),mps:h100:1(IDX:0),shard:0 State=MIXED",
    "24.11": "NodeName=n1 Gres=gpu:h100:8,mps:h100:800 GresDrain=N/A "
             "GresUsed=gpu:h100:2(IDX:1-2),mps:h100:75(75/100,0/100,0/100,0/100,0/100,0/100,"
             "0/100,0/100) State=MIXED",
}


@pytest.mark.parametrize("release", ["22.05", "24.11"])
def test_mps_use_is_the_sum_of_the_jobs_shares(release):
    held = parse_squeue_jobs(fixture(f"squeue-jobs-{release}.json"))
    assert list(held) == ["n1"]
    assert [item.split("(")[0] for item in held["n1"]] == ["mps:25", "mps:50", "gpu:h100:2"]
    (node,) = parse_scontrol_nodes(NODE_LINES[release])
    (sharing,) = summary([node], held)
    (h100,) = sharing.types
    assert (h100.mps_used, h100.mps_total, h100.mps_busy) == (75, 800, 1)
    assert (h100.used, h100.free) == (2, 5)  # GPUs 1-2 whole, GPU 0 serving MPS


def test_22_05_gres_used_alone_miscounts_mps():
    """Why the jobs are asked: GresUsed of 22.05 says 1 while 75 shares run."""
    (node,) = parse_scontrol_nodes(NODE_LINES["22.05"])
    (h100,) = node_sharing(node).types
    assert h100.mps_used == 1


def squeue_json(*jobs: dict) -> str:
    return json.dumps({"jobs": list(jobs)})


def test_jobs_on_several_nodes_and_jobs_holding_nothing():
    text = squeue_json(
        {"job_id": 7, "job_state": "RUNNING", "nodes": "n[1-2]",
         "gres_detail": ["mps:h100:40(IDX:3)", "mps:h100:40(IDX:1)"]},
        {"job_id": 8, "job_state": ["COMPLETING"], "nodes": "n2",
         "gres_detail": ["mps:10(IDX:3)"]},
        {"job_id": 9, "job_state": ["PENDING"], "nodes": "", "gres_detail": []},
        {"job_id": 10, "job_state": ["RUNNING"], "nodes": "n3", "gres_detail": [""]},
        {"job_id": 11, "job_state": ["COMPLETED"], "nodes": "n1",
         "gres_detail": ["mps:50(IDX:0)"]},
        {"job_id": 12, "job_state": ["RUNNING"], "nodes": "n[4-5]",  # not one per node
         "gres_detail": ["mps:50(IDX:0)"]})
    assert parse_squeue_jobs(text) == {"n1": ["mps:h100:40(IDX:3)"],
                                       "n2": ["mps:h100:40(IDX:1)", "mps:10(IDX:3)"]}
    assert parse_squeue_jobs(squeue_json()) == {}
    with pytest.raises(SlurmClientError, match="not its JSON"):
        parse_squeue_jobs("No jobs in the system\n")


def test_a_jobs_own_text_never_counts_as_gres_it_holds():
    """A job named, commented and held so as to forge scontrol -o's per-node fields
    (``x Nodes=mx1 CPU_IDs=0 Mem=0 GRES=mps:100(IDX:0)``, captured with the mixed node's
    jobs): its name is a JSON string, never GRES."""
    text = fixture("squeue-mixed-22.05.json")
    names = [job["name"] for job in json.loads(text)["jobs"]]
    assert any("GRES=mps:100(IDX:0)" in name for name in names), names
    held = parse_squeue_jobs(text)["mx1"]
    assert not [gres for gres in held if gres.startswith("mps:100")], held


def test_no_job_means_no_mps_use_whatever_gres_used_says():
    (node,) = parse_scontrol_nodes(NODE_LINES["22.05"])
    (sharing,) = summary([node], {})
    (h100,) = sharing.types
    assert (h100.mps_used, h100.mps_busy, h100.free) == (0, 0, 6)


def test_used_indexes():
    assert used_indexes("IDX:0-2,5") == {0, 1, 2, 5}
    assert used_indexes("IDX:N/A") == set()
    assert used_indexes("S:0-1") == set()


def test_node_without_gpus_is_left_out():
    assert node_sharing(SlurmNode("cpu1", ("IDLE",), gres="")) is None
    assert summary([SlurmNode("cpu1", ("IDLE",), gres="(null)")]) == []


def test_untyped_mps_belongs_to_the_only_gpu_type():
    node = SlurmNode("n1", ("MIXED",), gres="gpu:l40s:4,mps:400",
                     gres_used="gpu:l40s:0(IDX:N/A),mps:60(IDX:1,3)")
    (l40s,) = node_sharing(node).types
    assert (l40s.mps_used, l40s.mps_total, l40s.mps_busy, l40s.free) == (60, 400, 2, 2)


def _printing(path, name: str) -> str:
    path.write_text(f"#!/bin/sh\ncat {os.path.join(DATA, name)}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fake_sinfo(tmp_path):
    """An executable printing a fixture as sinfo --json would."""
    return lambda name: _printing(tmp_path / "sinfo", name)


@pytest.fixture
def fake_squeue(tmp_path):
    """An executable printing a fixture as squeue --json would."""
    return lambda name: _printing(tmp_path / "squeue", name)


def test_cli_table(fake_sinfo, fake_squeue, capsys):
    status = cli_main(["status", "--cluster", "--backend", "sinfo", "--sinfo",
                       fake_sinfo("sinfo-24.11.json"), "--squeue",
                       fake_squeue("squeue-jobs-24.11.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    lines = out.splitlines()
    assert lines[0] == "GPU sharing of 5 node(s), from slurmctld (sinfo-json)"
    header = next(line for line in lines if line.startswith("NODE"))
    assert header.split() == ["NODE", "STATE", "GPU", "TYPE", "WHOLE", "FREE", "MPS", "USED",
                              "MIG", "FREE"]
    n1 = next(line for line in lines if line.startswith("n1 "))
    assert n1.split() == ["n1", "mixed", "h100", "5/8", "75/800", "-"]  # the jobs' 25 + 50
    n5 = next(line for line in lines if line.startswith("n5 "))
    assert n5.split() == ["n5", "mixed", "a100", "1/1", "-", "1g.10gb:5/7"]
    assert "Drained: 2 node(s), 1 by gpushare" in out
    assert any(line.split()[:2] == ["n4", "Prolog"] for line in lines)
    assert "h100 13/32 whole GPUs free, MPS 75/3200 used; 1g.10gb 5/7 slices free" in out


def test_cli_json(fake_sinfo, fake_squeue, capsys):
    assert cli_main(["status", "--cluster", "--json", "--backend", "sinfo", "--sinfo",
                     fake_sinfo("sinfo-22.05.json"), "--squeue",
                     fake_squeue("squeue-jobs-22.05.json")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "sinfo-json"
    n5 = next(node for node in report["nodes"] if node["name"] == "n5")
    assert n5["mig"] == [{"type": "1g.10gb", "mig_profile": "1g.10gb", "total": 7, "used": 2,
                          "mps_busy": 0, "free": 5, "mps_used": 0, "mps_total": 0}]
    n3 = next(node for node in report["nodes"] if node["name"] == "n3")
    assert n3["drained"] and n3["drained_by_gpushare"] and n3["state"] == ["IDLE", "DRAIN"]
    assert report["totals"]["drained_nodes"] == 1
    (n1,) = next(node for node in report["nodes"] if node["name"] == "n1")["gpus"]
    assert (n1["mps_used"], n1["mps_busy"]) == (75, 1)  # the jobs', not GresUsed's


def test_cli_needs_cluster_and_a_working_slurm(tmp_path, capsys):
    assert cli_main(["status"]) == 2
    assert "--cluster" in capsys.readouterr().err
    assert cli_main(["status", "--cluster", "--backend", "sinfo", "--sinfo",
                     str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err


# A node with whole GPUs and MIG slices, Gres=gpu:h100:4,gpu:1g.10gb:2,mps:400 in slurm.conf,
# which Slurm shows as mps:h100:400,mps:1g.10gb:0; running: mps:25 and mps:50 (untyped, two
# users), gpu:h100:1 and gpu:1g.10gb:1. Captured from tests/slurm/test_status_mixed.py's bed
# on each release (22.05 on the host, 24.11 and 26.05 in tests/release_root.py's roots).
MIXED_RELEASES = ["22.05", "24.11", "26.05"]


@pytest.mark.parametrize("release", MIXED_RELEASES)
def test_node_with_whole_gpus_mig_slices_and_untyped_mps_jobs(release):
    (node,) = parse_scontrol_nodes(fixture(f"scontrol-mixed-{release}.txt"))
    assert "mps:h100:400,mps:1g.10gb:0" in node.gres
    held = parse_squeue_jobs(fixture(f"squeue-mixed-{release}.json"))
    # the jobs of scontrol-mixed's, and a second slice job (named to forge GRES)
    assert [item.split("(")[0] for item in held["mx1"]] == [
        "mps:25", "mps:50", "gpu:h100:1", "gpu:1g.10gb:1", "gpu:1g.10gb:1"]
    (sharing,) = summary([node], held)
    h100, slices = sharing.types
    assert (h100.gpu_type, h100.mps_used, h100.mps_total) == ("h100", 75, 400)
    # GPU 0 serves both MPS jobs, GPU 1 the whole-GPU job: 2 of 4 free.
    assert (h100.mps_busy, h100.used, h100.free) == (1, 1, 2)
    assert (slices.mig_profile, slices.used, slices.free) == ("1g.10gb", 2, 0)


@pytest.mark.parametrize("release", MIXED_RELEASES)
def test_mixed_node_from_gres_used_alone(release):
    """Without the jobs, GresUsed's MPS: 22.05 miscounts (1 for 75), 24.11 and 26.05 count
    per GPU (26.05 writes ``-`` for the GPU taken whole); the busy GPU is GPU 0 in all."""
    (node,) = parse_scontrol_nodes(fixture(f"scontrol-mixed-{release}.txt"))
    h100, _slices = node_sharing(node).types
    assert (h100.mps_used, h100.mps_busy, h100.free) == (
        1 if release == "22.05" else 75, 1, 2)


@pytest.mark.parametrize("held, owner", [
    (["mps:30(IDX:5)"], "a100"),  # 22.05: device 5 is the second a100
    (["mps:30(0/100,0/100,0/100,0/0,30/100,0/100)"], "a100"),  # 24.11 and later
    (["mps:30(IDX:0)"], "h100"),
])
def test_untyped_mps_job_goes_to_the_type_of_its_device(held, owner):
    """Two whole-GPU types with MPS and a MIG type between them in Gres= order: the job's
    device index tells the type (Slurm numbers the GPUs type after type)."""
    node = SlurmNode("n1", ("MIXED",),
                     gres="gpu:h100:2,gpu:1g.10gb:2,gpu:a100:2,mps:h100:200,mps:1g.10gb:0,"
                          "mps:a100:200")
    types = {t.gpu_type: t for t in node_sharing(node, held).types}
    assert types[owner].mps_used == 30 and types[owner].mps_busy == 1
    assert sum(t.mps_used for t in types.values()) == 30


def test_a_job_counted_without_devices():
    """A job's shared GRES on a node without device files: ``mps(CNT:30)``."""
    node = SlurmNode("n1", ("MIXED",), gres="gpu:l40s:4,mps:400")
    (l40s,) = node_sharing(node, ["mps(CNT:30)"]).types
    assert (l40s.mps_used, l40s.mps_busy) == (30, 0)


def test_used_indexes_of_26_05_whole_gpu_dash():
    assert used_indexes("75/100,-/100,0/100,0/100") == {0}
    assert used_indexes("-/0,0/0") == set()
