# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal``: the dry run an admin reads before any device moves."""

from __future__ import annotations

import pytest

from gpushare.cli import main

PLAN = """version: 1
slurm: {version: "24.11"}
node_groups:
  - name: infer
    nodes: k[1-2]
    gpu_model: a100-40gb
    gpus: 4
    layout:
      all: {owner: kubernetes}
lending:
  - name: night
    home: kubernetes
    nodes: k[1-2]
    gpus: 1-3
    window: {from: "20:00", to: "08:00"}
    max_lent: 4
    reclaim_minutes: 30
    borrowers: [batch]
  - name: idle
    home: kubernetes
    nodes: k1
    gpus: 0
    demand: {idle_below_percent: 50, for_minutes: 30}
    reclaim_minutes: 10
    borrowers: [batch]
"""


def run(tmp_path, capsys, *args):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    rc = main(["tidal", "--plan", str(plan), *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_inside_the_window_it_lends_up_to_max_lent_and_says_why(tmp_path, capsys):
    rc, out, _ = run(tmp_path, capsys, "--at", "23:30", "--needs", "night=1")
    assert rc == 0
    assert "night  kubernetes → slurm  6        0/4   open (opens 20:00, stops lending " \
           "07:30, reclaims 08:00)  lend 4" in out
    assert out.count("→ slurm: lent: in its window 20:00-08:00") == 4
    assert "not judged: give --needs idle=N" in out


def test_at_the_windows_end_it_reclaims_and_a_demand_lends_once_idle(tmp_path, capsys):
    rc, out, _ = run(tmp_path, capsys, "--at", "2026-12-24 08:00", "--lent", "night=4",
                     "--needs", "idle=0")
    assert rc == 0 and out.startswith("at 2026-12-24 08:00 (dry run: nothing moves)")
    assert out.count("→ kubernetes: reclaimed: outside its window 20:00-08:00") == 4
    assert "idle: k1 GPU 0 → slurm: lent: kubernetes under 50 % for 30+ min" in out


def test_bad_arguments_say_what_is_wrong(tmp_path, capsys):
    rc, _, err = run(tmp_path, capsys, "--needs", "nope=1")
    assert rc == 2 and "the plan has no lending rule 'nope'; it has idle, night" in err
    rc, _, err = run(tmp_path, capsys, "--at", "25:00")
    assert rc == 2 and "--at '25:00' is not HH:MM" in err
    rc, _, err = run(tmp_path, capsys, "--lent", "night=x")
    assert rc == 2 and "--lent 'night=x' must be RULE=N" in err
    rc, out, err = run(tmp_path, capsys, "--at", "23:30", "--lent", "night=99")
    assert (rc, out) == (2, "")
    assert "--lent night=99: rule night lends at most 4 of its 6 devices (max_lent)" in err
    rc, _, err = run(tmp_path, capsys, "--at", "23:30", "--lent", "night=4", "--needs", "night=0")
    assert rc == 0


def test_a_plan_without_rules_moves_nothing(tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.split("lending:")[0])
    assert main(["tidal", "--plan", str(plan)]) == 0
    assert "no lending rules; every device stays with its owner" in capsys.readouterr().out


def test_apply_refuses_what_it_cannot_carry_out_before_touching_anything(tmp_path, capsys):
    rc, _, err = run(tmp_path, capsys, "--apply")
    assert rc == 2 and "--cluster-gres-conf FILE (one file every node shares) or " \
        "--node-gres-command CMD (each node's own)" in err
    rc, _, err = run(tmp_path, capsys, "--apply", "--cluster-gres-conf", "gres.conf")
    assert rc == 2 and "give --cluster-gres-conf as an absolute path" in err
    rc, _, err = run(tmp_path, capsys, "--apply", "--node-gres-command",
                     "ssh {node} gpushare render gres --node {gpu}")
    assert rc == 2 and "--node-gres-command: unknown placeholder {gpu}" in err
    rc, _, err = run(tmp_path, capsys, "--apply", "--cluster-gres-conf", "/etc/gres.conf",
                     "--holders-command", "ssh {node} gpushare tidal holders --gpu {layout}")
    assert rc == 2 and "--holders-command: unknown placeholder {layout}" in err
    rc, _, err = run(tmp_path, capsys, "--apply", "--cluster-gres-conf", "/etc/gres.conf",
                     "--release-timeout", "0")
    assert rc == 2 and "--release-timeout must be between 1 and 86400 seconds" in err
    rc, _, err = run(tmp_path, capsys, "--apply", "--lent", "night=1")
    assert rc == 2 and "drop --lent" in err
    rc, _, err = run(tmp_path, capsys, "--apply", "--cluster-gres-conf", "/etc/gres.conf",
                     "--kubeconfig", str(tmp_path / "none"))
    assert rc == 2 and "cannot load Kubernetes credentials from" in err
    assert not (tmp_path / "tidal-state.json").exists()


@pytest.fixture
def node(tmp_path):
    """A node's simulated NVML (the plan's k1) and a stand-in kubelet: (GPU UUIDs,
    kubelet, the holders command's --socket and --source arguments)."""
    import json

    from gpushare.admin.plan import parse_plan
    from gpushare.gpu.nvml_sim_plan import profile_from_plan
    from kube_standin.kubelet import Kubelet

    profile = profile_from_plan(parse_plan(PLAN), "k1")
    (tmp_path / "k1.json").write_text(json.dumps(profile))
    kubelet = Kubelet(str(tmp_path / "kubelet.sock"))
    kubelet.start()
    yield ([gpu["uuid"] for gpu in profile["gpus"]], kubelet,
           ["--socket", str(tmp_path / "kubelet.sock"), "--source", f"sim:{tmp_path / 'k1.json'}"])
    kubelet.stop()


def test_holders_says_which_pod_holds_the_gpu_and_exits_by_it(node, capsys):
    from kube_standin.kubelet import Pod

    uuids, kubelet, where = node
    try:
        argv = ["tidal", "holders", "--gpu", "2", *where]
        assert main(argv) == 0
        assert capsys.readouterr().out == "no pod holds GPU 2\n"
        kubelet.pods = [Pod("serving", "llm-0", ids=(uuids[2],))]
        assert main(argv) == 1
        assert capsys.readouterr().out.startswith("pod serving/llm-0 container main holds "
                                                  "nvidia.com/gpu GPU-")
        assert main([*argv[:3], "9", *argv[4:]]) == 2
        assert "NVML shows no GPU 9 on this node (it has 4)" in capsys.readouterr().err
        assert main([*argv, "--dra", "gpu.nvidia.com/k1"]) == 2
        assert "must be DRIVER/POOL/DEVICE" in capsys.readouterr().err
    finally:
        kubelet.stop()
    assert main(argv) == 2
    assert "did not answer List (UNAVAILABLE" in capsys.readouterr().err


def test_holders_answers_for_several_devices_with_one_list_call(node, capsys):
    from kube_standin.kubelet import Pod

    uuids, kubelet, where = node
    try:
        argv = ["tidal", "holders", *where, "--devices", "2:-1:-:-,3:-1:-:gpu.nvidia.com/k1/gpu-3"]
        assert main(argv) == 0
        assert capsys.readouterr().out == "2:-1:-:- free\n3:-1:-:gpu.nvidia.com/k1/gpu-3 free\n"
        kubelet.pods = [Pod("serving", "llm-0", ids=(uuids[2],))]
        calls = kubelet.calls
        assert main(argv) == 1
        assert kubelet.calls == calls + 1
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("2:-1:-:- held pod serving/llm-0 container main holds "
                                   "nvidia.com/gpu GPU-"), lines
        assert lines[1:] == ["3:-1:-:gpu.nvidia.com/k1/gpu-3 free"]
        for bad in ("2:-1:-", "x:-1:-:-", "2:-1:-:-,9:-1:-:-"):
            assert main([*argv[:-1], bad]) == 2
            err = capsys.readouterr().err
            assert "is not GPU:SLICE:PROFILE:DRA" in err or "NVML shows no GPU 9" in err, err
    finally:
        kubelet.stop()


def test_no_change_says_why(tmp_path, capsys):
    """A rule that moves nothing says why: its home side needs all it holds, its window is
    shut, or it has lent its most."""
    rc, out, _ = run(tmp_path, capsys, "--at", "23:30", "--needs", "night=6", "--needs", "idle=1")
    assert rc == 0
    assert "no change: kubernetes needs 6 of the 6 at home: none to spare" in out
    assert "no change: kubernetes needs 1 of its 1 (100 %, not under 50 %)" in out
    rc, out, _ = run(tmp_path, capsys, "--at", "12:00", "--needs", "night=0")
    assert "no change: outside its window 20:00-08:00" in out
    rc, out, _ = run(tmp_path, capsys, "--at", "23:30", "--lent", "night=4", "--needs",
                     "night=0")
    assert "no change: 4 lent, its max_lent" in out


def _documented_commands():
    """The tidal dry runs docs/admin.md and `tidal --help` show, with the rule admin.md
    gives, on etc/plan.example.yaml's nodes."""
    import re
    import shlex
    from pathlib import Path

    from gpushare.cli import build_parser

    repo = Path(__file__).resolve().parents[3]
    doc = (repo / "docs" / "admin.md").read_text()
    section = doc.split("### Lending devices between the schedulers", 1)[1]
    rule = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    plan = (repo / "etc" / "plan.example.yaml").read_text() + "\n" + rule
    spans = re.findall(r"`(gpushare tidal --at [^`]*)`", section.split("####", 1)[0])
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    epilog = sub.choices["tidal"].epilog
    spans += [line.split("#")[0].strip() for line in epilog.splitlines()
              if "tidal --at" in line]
    return plan, [shlex.split(span)[1:] for span in spans]


def test_the_documented_dry_runs_show_a_move(tmp_path, capsys):
    plan_text, commands = _documented_commands()
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text)
    verdicts = []
    for argv in commands:
        assert main([*argv, "--plan", str(plan)]) == 0, argv
        row = next(line for line in capsys.readouterr().out.splitlines()
                   if line.startswith("night-batch"))
        verdicts.append(row.split(")  ")[-1].strip())
    assert len(commands) == 4  # two in admin.md, two in the help
    assert sorted(verdicts) == ["lend 6", "lend 6", "reclaim 6", "reclaim 6"], verdicts
