# SPDX-License-Identifier: GPL-2.0-or-later
"""gpushare check: gres.conf, inventory and plan compared; findings, exit status, draining."""

from __future__ import annotations

import os
import stat

from gpushare.admin.check import (
    ERROR,
    WARNING,
    Finding,
    check_cluster,
    check_gres_all_nodes,
    check_node,
    drain_node,
    drain_reason,
    exit_status,
)
from gpushare.admin.plan import parse_plan
from gpushare.admin.render import render_gres_conf
from gpushare.admin.slurm_client import SlurmNode
from gpushare.gpu.gresconf import parse_gres_conf
from gpushare.gpu.inventory import Gpu, GpuProcess, Inventory, MigDevice

PLAN = """\
version: 1
slurm: {version: "23.11"}   # several MIG profiles per node: beyond 22.05 with AutoDetect=off
node_groups:
  - name: a100
    nodes: a[1-2]
    gpu_model: a100-40gb
    gpus: 3
    layout:
      0: {owner: slurm, mig: [{profile: 3g.20gb, count: 2}]}
      1:
        mig:
          - {profile: 4g.20gb, owner: slurm}
          - {profile: 3g.20gb, owner: kubernetes}
      2: {owner: slurm, mps: 100}
"""


def inventory(mig1: bool = True, busy: bool = False, name: str = "NVIDIA A100-SXM4-40GB"
              ) -> Inventory:
    def mig(gpu: int, minor: int, gi: int, profile: str) -> MigDevice:
        base = 3 + 135 * minor + 9 * gi
        return MigDevice(gpu, gi, 0, profile, f"MIG-{gpu}-{gi}", 1,
                         [f"/dev/nvidia-caps/nvidia-cap{base}",
                          f"/dev/nvidia-caps/nvidia-cap{base + 1}"])
    procs = [GpuProcess(pid=42, used_memory=1)] if busy else []
    return Inventory("a1", "550", "12.4", "test", [
        Gpu(0, 0, "GPU-0", name, 40 << 30, "0:1", "default", True, True,
            [mig(0, 0, 1, "3g.20gb"), mig(0, 0, 2, "3g.20gb")], processes=procs),
        Gpu(1, 1, "GPU-1", name, 40 << 30, "0:2", "default", mig1, mig1,
            [mig(1, 1, 1, "4g.20gb"), mig(1, 1, 2, "3g.20gb")] if mig1 else []),
        Gpu(2, 2, "GPU-2", name, 40 << 30, "0:3", "default", False, False),
    ])


def good_gres(plan, inv) -> str:
    return render_gres_conf(plan, {"a1": inv}, node="a1")


def test_consistent_node_has_no_findings():
    plan = parse_plan(PLAN)
    inv = inventory()
    gres = parse_gres_conf(good_gres(plan, inv), "/etc/slurm/gres.conf")
    assert check_node(plan, "a1", gres, inv) == []
    assert exit_status([]) == 0


def test_kubernetes_slice_in_gres_conf_is_an_error_at_its_line():
    plan = parse_plan(PLAN)
    inv = inventory()
    text = good_gres(plan, inv) + ("NodeName=a1 Name=gpu Type=3g.20gb MultipleFiles=/dev/nvidia1,"
                                   "/dev/nvidia-caps/nvidia-cap156,/dev/nvidia-caps/nvidia-cap157\n")
    line = text.count("\n")
    findings = check_node(plan, "a1", parse_gres_conf(text, "/etc/slurm/gres.conf"), inv)
    assert len(findings) == 1
    (finding,) = findings
    assert finding.severity == ERROR
    assert finding.where == f"/etc/slurm/gres.conf:{line}"
    assert "GPU 1 slice 3g.20gb, which the plan gives to kubernetes" in finding.what
    assert "gpushare render gres" in finding.fix
    assert exit_status(findings) == 2


def test_missing_line_wrong_type_and_wrong_count():
    plan = parse_plan(PLAN)
    inv = inventory()
    text = good_gres(plan, inv)
    text = text.replace("Type=4g.20gb", "Type=4g.40gb").replace("Count=100", "Count=50")
    text = "\n".join(ln for ln in text.splitlines() if "nvidia-cap22" not in ln) + "\n"
    whats = [f.what for f in check_node(plan, "a1", parse_gres_conf(text), inv)]
    assert any("GPU 1 slice 4g.20gb has Type=4g.40gb" in w for w in whats)
    assert any("mps on GPU 2 has Count=50, the plan says 100" in w for w in whats)
    assert any("no gpu line for GPU 0 slice 3g.20gb" in w for w in whats)


def test_device_the_node_does_not_have():
    plan = parse_plan(PLAN)
    inv = inventory()
    text = good_gres(plan, inv) + "NodeName=a1 Name=gpu Type=a100 File=/dev/nvidia7\n"
    (finding,) = check_node(plan, "a1", parse_gres_conf(text), inv)
    assert "the node has no /dev/nvidia7" in finding.what


def test_inventory_disagreeing_with_plan():
    plan = parse_plan(PLAN)
    findings = check_node(plan, "a1", None, inventory(mig1=False))
    assert [f.severity for f in findings] == [ERROR]
    assert "GPU 1: MIG is off, the plan wants it on" in findings[0].what
    findings = check_node(plan, "a1", None, inventory(mig1=False, busy=True))
    assert any("Slurm is using GPU 0" in f.what for f in findings)
    findings = check_node(plan, "a1", None, inventory(name="NVIDIA H100 80GB HBM3"))
    assert all("the plan says a100-40gb" in f.what for f in findings) and len(findings) == 3


def test_node_not_in_plan_and_autodetect_warning():
    plan = parse_plan(PLAN)
    (finding,) = check_node(plan, "zz", None, None)
    assert "node zz is in no node group" in finding.what
    gres = parse_gres_conf("AutoDetect=nvml\n", "g.conf")
    findings = check_node(plan, "a1", gres, None)
    assert findings[0].severity == ERROR and "AutoDetect=nvml" in findings[0].what


def test_drain_reason_is_short_and_names_worst():
    findings = [Finding(WARNING, "pending", "x", "y"),
                Finding(ERROR, 'gres.conf gives "Slurm" ' + "x" * 200, "a", "b"),
                Finding(ERROR, "second", "a", "b")]
    reason = drain_reason(findings)
    assert reason.startswith("gpushare: gres.conf gives 'Slurm' x")
    assert reason.endswith("... (+1 more)") and len(reason) <= 100
    assert drain_reason([]) == ""


def test_drain_runs_scontrol_with_fixed_arguments(tmp_path):
    script = tmp_path / "scontrol"
    out = tmp_path / "args"
    script.write_text(f"#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > {out}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    assert drain_node("a1", "gpushare: bad", str(script), timeout=5) is None
    assert out.read_text().splitlines() == ["update", "NodeName=a1", "State=DRAIN",
                                            "Reason=gpushare: bad"]
    assert "absolute path" in drain_node("a1", "r", "scontrol")
    assert "none does not exist; install it" in drain_node("a1", "r",
                                                        os.path.join(str(tmp_path), "none"))
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    assert "did not answer" in drain_node("a1", "r", str(slow), timeout=0.2)


def test_cluster_view():
    plan = parse_plan(PLAN)
    nodes = [
        SlurmNode("a1", ("IDLE",), "", "gpu:3g.20gb:2(S:0),gpu:4g.20gb:1,gpu:a100:1,mps:100"),
        SlurmNode("a2", ("IDLE", "DRAIN"), "gpushare: MIG off", "gpu:a100:3"),
        SlurmNode("c1", ("IDLE",), "", "gpu:l40s:4"),
    ]
    findings = check_cluster(plan, nodes)
    by_where = {}
    for f in findings:
        by_where.setdefault(f.where, []).append(f)
    assert "slurmctld node a1" not in by_where
    a2 = by_where["slurmctld node a2"]
    assert any(f.severity == ERROR and "Gres=gpu:a100:3" in f.what for f in a2)
    assert any(f.severity == WARNING and "gpushare: MIG off" in f.what for f in a2)
    assert by_where["slurmctld node c1"][0].severity == WARNING
    missing = check_cluster(plan, nodes[:1])
    assert any("unknown to slurmctld: a2" in f.what for f in missing)


def test_all_nodes_shares_verdicts_and_finds_the_odd_node():
    plan = parse_plan(PLAN.replace("a[1-2]", "a[1-6]"))
    text = render_gres_conf(plan)
    assert check_gres_all_nodes(plan, parse_gres_conf(text)) == []
    text += "NodeName=a[3-4] Name=gpu Type=a100 File=/dev/nvidia1\n"
    (finding,) = check_gres_all_nodes(plan, parse_gres_conf(text, "g.conf"))
    assert finding.what.startswith("nodes a[3-4]: gres.conf lists gpu:a100 /dev/nvidia1")
    assert finding.where == f"g.conf:{text.count(chr(10))}"


def test_drain_never_runs_an_scontrol_a_user_could_replace(tmp_path):
    if os.geteuid() != 0:
        import pytest

        pytest.skip("root-owned programs need root")
    script = tmp_path / "scontrol"
    out = tmp_path / "ran"
    script.write_text(f"#!/bin/sh\ntouch {out}\n")
    script.chmod(0o777)
    assert "scontrol refused: " in drain_node("a1", "r", str(script), timeout=5)
    assert not out.exists()


def test_a_gres_fix_before_23_11_says_to_restart_slurmctld():
    """22.05.8 logs "Attempt to change gres/gpu Count ... invalid" on a reconfigure and sets
    the node INVAL: the count changes only when slurmctld restarts."""
    node = [SlurmNode("a2", ("IDLE",), "", "gpu:a100:3")]
    (new,) = [f for f in check_cluster(parse_plan(PLAN), node) if f.severity == ERROR]
    assert new.fix.endswith("`scontrol reconfigure`")
    old = parse_plan(PLAN.replace('version: "23.11"', 'version: "22.05"'))
    (fix,) = [f.fix for f in check_cluster(old, node) if f.severity == ERROR]
    assert fix.endswith("`scontrol reconfigure`, then restart slurmctld (Slurm 22.05 takes a "
                        "node's new GPU count only when slurmctld starts)")


def test_accounting_must_record_every_gpu_kind_a_relayout_reads():
    """With a relayout menu, slurmctld's AccountingStorageTRES must list whole GPUs and
    every MIG profile and MPS the plan or the menu gives Slurm: without them sacct shows no
    such job's GPUs (relayout's floors and --suggest read it)."""
    from tests.unit.admin.relayout_plans import mig_plan

    from gpushare.admin.check import check_accounting
    from gpushare.admin.tres import plan_tres

    plan = parse_plan(mig_plan(["7x1g.10gb", "2x3g.40gb", "whole"]))
    default = "cpu,mem,energy,node,billing,fs/disk,vmem,pages"
    [finding] = check_accounting(plan, default + ",gres/gpu")
    assert finding.severity == WARNING
    assert "does not record gres/gpu:1g.10gb,gres/gpu:3g.40gb in accounting" in finding.what
    assert "AccountingStorageTRES=gres/gpu," in finding.fix
    assert check_accounting(plan, default + "," + ",".join(plan_tres(plan))) == []
    assert check_accounting(parse_plan(PLAN), default) == []  # no relayout: not needed
