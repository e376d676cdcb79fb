# SPDX-License-Identifier: GPL-2.0-or-later
"""The node's step of a relayout against the simulated NVML: NVML's MIG calls one at a time,
refusals, the restore after a failure midway, and the re-rendered gres.conf."""

from __future__ import annotations

import json
import os

import pytest
from tests.unit.admin.relayout_plans import mig_plan
from tests.unit.admin.relayout_site import scontrol_stub

from gpushare.admin.plan import parse_plan
from gpushare.admin.relayout.apply import ApplyError, apply_layout, render_node_gres
from gpushare.gpu.inventory import collect
from gpushare.gpu.nvml_sim import SimNvml, load_profile
from gpushare.gpu.nvml_sim_plan import profile_from_plan

PLAN = mig_plan(["7x1g.10gb", "3g.40gb+2g.20gb+1g.10gb", "2x3g.40gb", "whole"])


@pytest.fixture
def plan():
    return parse_plan(PLAN)


def write_profile(tmp_path, plan, edit=None):
    raw = profile_from_plan(plan, "h1")
    if edit:
        edit(raw)
    path = tmp_path / "h1.json"
    path.write_text(json.dumps(raw))
    return str(path)


def fresh(path):
    """A new NVML, as the next process on the node would open it."""
    return SimNvml(load_profile(path))


def layout_of(path, index):
    inventory = collect(fresh(path), "sim:" + path)
    gpu = inventory.gpus[index]
    if not gpu.mig_current:
        return "whole"
    return sorted((d.profile, d.gi_id) for d in gpu.mig_devices)


def test_a_gpu_changes_to_a_menu_layout_and_back(tmp_path, plan):
    path = write_profile(tmp_path, plan)
    before = layout_of(path, 2)
    assert len(before) == 7
    result = apply_layout(fresh(path), plan, "h1", 2, "3g.40gb+2g.20gb+1g.10gb", dry_run=False)
    assert result.changed and result.old == "7x1g.10gb"
    # NVIDIA's numbering: 3g at slice 0 is GI 1, 2g at slice 4 is GI 5, 1g at slice 6 is GI 13
    assert layout_of(path, 2) == [("1g.10gb", 13), ("2g.20gb", 5), ("3g.40gb", 1)]
    assert layout_of(path, 3) == before  # the neighbour is untouched
    again = apply_layout(fresh(path), plan, "h1", 2, "3g.40gb+2g.20gb+1g.10gb", dry_run=False)
    assert not again.changed
    apply_layout(fresh(path), plan, "h1", 2, "whole", dry_run=False)
    assert layout_of(path, 2) == "whole"
    apply_layout(fresh(path), plan, "h1", 2, "7x1g.10gb", dry_run=False)
    assert layout_of(path, 2) == before


def test_a_dry_run_changes_nothing(tmp_path, plan):
    path = write_profile(tmp_path, plan)
    before = layout_of(path, 2)
    result = apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb")
    assert result.changed and "would change" in result.steps[0]
    assert layout_of(path, 2) == before


def test_a_busy_gpu_is_refused_and_nvml_refuses_to_destroy_a_busy_slice(tmp_path, plan):
    def busy(raw):
        raw["gpus"][2]["mig_devices"][3]["processes"] = [{"pid": 777, "kind": "compute"}]

    path = write_profile(tmp_path, plan, busy)
    before = layout_of(path, 2)
    with pytest.raises(ApplyError, match=r"in use .*777"):
        apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False)
    assert layout_of(path, 2) == before
    nvml = fresh(path)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(2)
    gi_id = nvml.nvmlDeviceGetGpuInstanceId(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 3))
    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
    ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    with pytest.raises(nvml.NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(ci)
    with pytest.raises(nvml.NVMLError_InUse):  # a GPU instance with a compute instance
        nvml.nvmlGpuInstanceDestroy(gi)


@pytest.mark.parametrize("index, why", [(0, "Kubernetes'"), (1, "shared by Slurm and Kub")])
def test_kubernetes_and_mixed_gpus_never_change(tmp_path, plan, index, why):
    path = write_profile(tmp_path, plan)
    before = layout_of(path, index)
    with pytest.raises(ApplyError, match=why):
        apply_layout(fresh(path), plan, "h1", index, "2x3g.40gb", dry_run=False)
    assert layout_of(path, index) == before


def test_a_layout_off_the_menu_is_refused(tmp_path, plan):
    path = write_profile(tmp_path, plan)
    with pytest.raises(ApplyError, match="not on the relayout menu"):
        apply_layout(fresh(path), plan, "h1", 2, "4g.40gb", dry_run=False)


def test_a_failure_midway_restores_the_old_layout(tmp_path, plan):
    def second_create_fails(raw):
        raw["error_on_call"] = {
            "nvmlDeviceCreateGpuInstanceWithPlacement": [2, "INSUFFICIENT_RESOURCES"]}

    path = write_profile(tmp_path, plan, second_create_fails)
    before = layout_of(path, 2)
    with pytest.raises(ApplyError, match=r"failed .*Insufficient resources.*restored the old "
                       r"layout 7x1g.10gb"):
        apply_layout(fresh(path), plan, "h1", 2, "3g.40gb+2g.20gb+1g.10gb", dry_run=False)
    assert layout_of(path, 2) == before


def test_a_failed_restore_says_what_the_gpu_holds(tmp_path, plan):
    def creates_fail(raw):
        raw["errors"] = {"nvmlGpuInstanceCreateComputeInstance": "UNKNOWN"}

    path = write_profile(tmp_path, plan, creates_fail)
    with pytest.raises(ApplyError, match=r"restoring 7x1g.10gb failed too .*NVML shows: "
                       r"1g.10gb@0. Keep the node drained"):
        apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False)


def test_the_time_limit_restores_the_old_layout(tmp_path, plan):
    path = write_profile(tmp_path, plan)
    before = layout_of(path, 2)
    now = {"s": 0.0}
    nvml = fresh(path)
    def slow_create(*args):  # the first creation takes 100 s
        if now["s"] == 0.0:
            now["s"] = 100.0
        return SimNvml.nvmlDeviceCreateGpuInstanceWithPlacement(nvml, *args)

    nvml.nvmlDeviceCreateGpuInstanceWithPlacement = slow_create
    with pytest.raises(ApplyError, match=r"time limit passed.*restored the old layout"):
        apply_layout(nvml, plan, "h1", 2, "2x3g.40gb", dry_run=False, timeout_s=35.0,
                     clock=lambda: now["s"])
    assert layout_of(path, 2) == before


def test_gres_conf_is_rendered_from_the_new_layout(tmp_path, plan):
    path = write_profile(tmp_path, plan)
    apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False)
    nvml = fresh(path)
    inventory = collect(nvml, "sim:" + path, nvml.mig_minors_text, nvml.device_dir, "h1")
    text = render_node_gres(plan, "h1", 2, "2x3g.40gb", inventory)
    lines = [line for line in text.splitlines() if line.startswith("NodeName=")]
    gpu2 = [line for line in lines if "=/dev/nvidia2," in line]
    # the two 3g.40gb are GPU instances 1 and 2: capability files 3 + 135*2 + 9*gi (+1)
    assert gpu2 == [
        "NodeName=h1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia2,"
        "/dev/nvidia-caps/nvidia-cap282,/dev/nvidia-caps/nvidia-cap283",
        "NodeName=h1 Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia2,"
        "/dev/nvidia-caps/nvidia-cap291,/dev/nvidia-caps/nvidia-cap292"]
    # GPU 3 keeps its seven 1g.10gb, GPU 1 its Slurm slice; Kubernetes' slices are not listed
    assert sum("=/dev/nvidia3," in line for line in lines) == 7
    assert sum("=/dev/nvidia1," in line for line in lines) == 1
    assert len(lines) == 10 and "/dev/nvidia0" not in text


def test_the_command_is_a_dry_run_until_apply_and_then_rewrites_gres_conf(tmp_path, plan,
                                                                          capsys):
    from gpushare.cli import main

    path = write_profile(tmp_path, plan)
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    gres = tmp_path / "gres.conf"
    gres.write_text("old\n")
    before = layout_of(path, 2)
    argv = ["relayout", "node", "--plan", str(plan_file), "--node", "h1", "--gpu", "2",
            "--layout", "2x3g.40gb", "--source", "sim:" + path, "--gres-conf", str(gres),
            "--lock-dir", str(tmp_path / "run"), "--scontrol", scontrol_stub(str(tmp_path))]
    assert main(argv) == 0
    assert "7x1g.10gb -> 2x3g.40gb (dry run" in capsys.readouterr().out
    assert layout_of(path, 2) == before and gres.read_text() == "old\n"
    assert main([*argv, "--apply"]) == 0
    out = capsys.readouterr().out
    assert "7x1g.10gb -> 2x3g.40gb" in out and f"rewrote {gres}" in out
    assert layout_of(path, 2) == [("3g.40gb", 1), ("3g.40gb", 2)]
    assert gres.read_text().count("Type=3g.40gb") == 2
    assert main([*argv[:-8], "--gpu", "0", "--layout", "whole", "--source", "sim:" + path,
                 "--gres-conf", "none", *argv[-2:], "--apply"]) == 2
    assert "Kubernetes'" in capsys.readouterr().err


def test_gres_conf_keeps_what_an_earlier_step_did_to_another_gpu(tmp_path, plan):
    path = write_profile(tmp_path, plan)
    apply_layout(fresh(path), plan, "h1", 3, "whole", dry_run=False)
    apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False)
    nvml = fresh(path)
    inventory = collect(nvml, "sim:" + path, nvml.mig_minors_text, nvml.device_dir, "h1")
    text = render_node_gres(plan, "h1", 2, "2x3g.40gb", inventory)
    lines = [line for line in text.splitlines() if line.startswith("NodeName=")]
    gpu3 = [line for line in lines if "/dev/nvidia3" in line]
    assert len(gpu3) == 1 and "Type=h100" in gpu3[0] and "nvidia-caps" not in gpu3[0]
    assert sum("Type=3g.40gb" in line for line in lines) == 2


def test_the_simulated_nvml_keeps_nvidias_rules(tmp_path, plan):
    import ctypes

    path = write_profile(tmp_path, plan)
    nvml = fresh(path)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)  # Kubernetes' 3g.40gb at slice 0
    names = {}
    for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except nvml.NVMLError_NotSupported:
            continue
        names[info.name.decode()] = info.id
    assert names == {"MIG 1g.10gb": 19, "MIG 2g.20gb": 14, "MIG 3g.40gb": 9, "MIG 4g.40gb": 5,
                     "MIG 7g.80gb": 0, "MIG 1g.10gb+me": 20, "MIG 1g.20gb": 15}
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 2, 2  # overlaps the 3g.40gb at slices 0-3
    with pytest.raises(nvml.NVMLError) as err:
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, 14, ctypes.byref(placement))
    assert err.value.value == 23  # NVML_ERROR_INSUFFICIENT_RESOURCES
    gi = nvml.nvmlDeviceCreateGpuInstance(handle, 9)  # the other half
    assert nvml.nvmlGpuInstanceGetInfo(gi).placement.start == 4
    with pytest.raises(nvml.NVMLError):  # no room for a third 3g.40gb
        nvml.nvmlDeviceCreateGpuInstance(handle, 9)
    with pytest.raises(nvml.NVMLError_InUse):  # MIG off while instances exist
        nvml.nvmlDeviceSetMigMode(handle, 0)
    nvml.nvmlGpuInstanceDestroy(gi)  # no compute instance yet: destroyable
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetGpuInstanceById(handle, 2)


def test_slurm_22_05_never_gets_a_second_mig_profile_on_a_node(tmp_path):
    plan = parse_plan(PLAN.replace("slurm: {version: '24.11'}", "slurm: {version: '22.05'}")
                      .replace("      0: {owner: kubernetes, mig: [{profile: 3g.40gb}]}\n"
                               "      1:\n        mig:\n"
                               "          - {profile: 3g.40gb, owner: kubernetes}\n"
                               "          - {profile: 1g.10gb, owner: slurm}\n", "")
                      .replace("        - 3g.40gb+2g.20gb+1g.10gb\n", ""))
    path = write_profile(tmp_path, plan)
    before = layout_of(path, 2)
    with pytest.raises(ApplyError, match=r"one MIG profile per node; 2x3g.40gb on GPU 2 would "
                       r"give node h1 1g.10gb, 3g.40gb"):
        apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False)
    assert layout_of(path, 2) == before
    apply_layout(fresh(path), plan, "h1", 2, "whole", dry_run=False)  # no MIG profile: fine
    assert layout_of(path, 2) == "whole"


def test_slurm_22_05_changes_a_nodes_gpus_together_in_one_round(tmp_path):
    """The controller tells each step what the round does to the node's other GPUs: on a
    drained node they change one after the other, and only the end has to hold one MIG
    profile."""
    plan = parse_plan(PLAN.replace("slurm: {version: '24.11'}", "slurm: {version: '22.05'}")
                      .replace("      0: {owner: kubernetes, mig: [{profile: 3g.40gb}]}\n"
                               "      1:\n        mig:\n"
                               "          - {profile: 3g.40gb, owner: kubernetes}\n"
                               "          - {profile: 1g.10gb, owner: slurm}\n", "")
                      .replace("        - 3g.40gb+2g.20gb+1g.10gb\n", ""))
    path = write_profile(tmp_path, plan)
    whole = {0: "whole", 1: "whole"}
    with pytest.raises(ApplyError, match=r"would give node h1 1g\.10gb, 3g\.40gb"):
        apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False,
                     round_layouts={3: "2x3g.40gb"})  # GPUs 0 and 1 keep 7 × 1g.10gb
    for index in (0, 1):
        apply_layout(fresh(path), plan, "h1", index, "whole", dry_run=False)
    apply_layout(fresh(path), plan, "h1", 2, "2x3g.40gb", dry_run=False,
                 round_layouts={3: "2x3g.40gb", **whole})
    apply_layout(fresh(path), plan, "h1", 3, "2x3g.40gb", dry_run=False,
                 round_layouts={2: "2x3g.40gb"})
    assert layout_of(path, 2) == layout_of(path, 3) == [("3g.40gb", 1), ("3g.40gb", 2)]


@pytest.mark.parametrize("installed, code", [("24.11.5", 0), ("22.05.8", 2)])
def test_the_command_holds_a_plan_without_a_release_to_the_installed_one(
        tmp_path, monkeypatch, capsys, installed, code):
    """As the controller does: a plan that names no slurm.version follows the Slurm that
    runs here, so a second MIG profile on the node is refused only on 22.05."""
    import gpushare.admin.slurm_client as slurm_client
    from gpushare.cli import main

    text = (PLAN.replace("slurm: {version: '24.11'}\n", "")
            .replace("      0: {owner: kubernetes, mig: [{profile: 3g.40gb}]}\n"
                     "      1:\n        mig:\n"
                     "          - {profile: 3g.40gb, owner: kubernetes}\n"
                     "          - {profile: 1g.10gb, owner: slurm}\n", "")
            .replace("        - 3g.40gb+2g.20gb+1g.10gb\n", ""))
    assert "version: '24.11'" not in text
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(text)
    path = write_profile(tmp_path, parse_plan(text, str(plan_file)))
    monkeypatch.setattr(slurm_client, "installed_release", lambda *a, **k: installed)
    assert main(["relayout", "node", "--plan", str(plan_file), "--node", "h1", "--gpu", "2",
                 "--layout", "2x3g.40gb", "--source", "sim:" + path, "--gres-conf", "none",
                 "--state", "none", "--lock-dir", str(tmp_path / "run"), "--scontrol",
                 scontrol_stub(str(tmp_path)), "--apply"]) == code
    assert ("one MIG profile per node" in capsys.readouterr().err) == (code == 2)


def test_whole_and_mps_are_different_slurm_layouts_of_one_nvml_state(tmp_path):
    """NVML shows a GPU with MIG off alike whether Slurm has it whole or in MPS units: the
    step compares Slurm's layout (the state file's, else the plan's) and says that only
    gres.conf and Gres= change."""
    plan = parse_plan(mig_plan(["7x1g.10gb", "whole", '"mps:100"']))
    path = write_profile(tmp_path, plan)
    apply_layout(fresh(path), plan, "h1", 3, "whole", dry_run=False)
    result = apply_layout(fresh(path), plan, "h1", 3, "mps:100", recorded="whole")
    assert result.changed and (result.old, result.new) == ("whole", "mps:100")
    assert result.steps == ["would change only what Slurm is told (gres.conf, the node's "
                            "Gres=): whole -> mps:100; NVML has nothing to change (MIG stays "
                            "off)"]
    again = apply_layout(fresh(path), plan, "h1", 3, "mps:100", recorded="mps:100")
    assert not again.changed and again.old == "mps:100"


def test_the_command_says_what_changes_from_whole_to_mps(tmp_path, capsys):
    from gpushare.cli import main

    text = mig_plan(["7x1g.10gb", "whole", '"mps:100"'])
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(text)
    path = write_profile(tmp_path, parse_plan(text))
    gres = tmp_path / "gres.conf"
    gres.write_text("old\n")
    argv = ["relayout", "node", "--plan", str(plan_file), "--node", "h1", "--gpu", "3",
            "--source", "sim:" + path, "--gres-conf", str(gres), "--lock-dir",
            str(tmp_path / "run"), "--scontrol", scontrol_stub(str(tmp_path))]
    assert main([*argv, "--layout", "whole", "--apply"]) == 0
    capsys.readouterr()
    assert main([*argv, "--layout", "mps:100"]) == 0
    out = capsys.readouterr().out
    assert "already has" not in out
    assert "GPU 3 of node h1: whole -> mps:100 (dry run; --apply changes it)" in out
    assert "only what Slurm is told (gres.conf, the node's Gres=)" in out
    assert main([*argv, "--layout", "mps:100", "--apply"]) == 0
    assert "GPU 3 of node h1: whole -> mps:100" in capsys.readouterr().out
    assert "Name=mps" in gres.read_text()
    assert main([*argv, "--layout", "mps:100"]) == 0
    assert "GPU 3 of node h1 already has layout mps:100" in capsys.readouterr().out


def test_a_step_on_a_node_another_step_holds_changes_nothing_and_says_so(tmp_path, plan,
                                                                          capsys):
    """A step a killed run left behind may still be changing the node's GPUs: the next run's
    step waits for its lock, then changes nothing, names the holder and exits 3 (the layout
    is not known, the controller keeps the node drained); once it has ended, the step runs."""
    from gpushare.admin.relayout.journal import held
    from gpushare.cli import main

    path = write_profile(tmp_path, plan)
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    lock_dir = tmp_path / "run"
    argv = ["relayout", "node", "--plan", str(plan_file), "--node", "h1", "--gpu", "2",
            "--layout", "2x3g.40gb", "--source", "sim:" + path, "--gres-conf", "none",
            "--state", "none", "--lock-dir", str(lock_dir), "--step-timeout", "1",
            "--scontrol", scontrol_stub(str(tmp_path)), "--apply"]
    before = layout_of(path, 2)
    lock_dir.mkdir(mode=0o755)
    lock_dir.chmod(0o755)  # whatever the umask: root's directory, as the step needs
    with held(str(lock_dir / "relayout-h1.lock"), "busy", record={"gpu": 5}):
        assert main(argv) == 3
        assert layout_of(path, 2) == before
    err = capsys.readouterr().err
    assert "another relayout step holds node h1" in err and '"gpu": 5' in err, err
    assert f'"pid": {os.getpid()}' in err
    assert "check the node with gpushare check and resume it" in err
    assert main(argv) == 0
    assert layout_of(path, 2) == [("3g.40gb", 1), ("3g.40gb", 2)]


def test_a_step_waits_for_a_lock_let_go_within_its_wait(tmp_path):
    """A step finishing now lets go within the wait: the next one takes the lock and runs."""
    from gpushare.admin.relayout.journal import LockBusy, held

    path = str(tmp_path / "relayout-h1.lock")
    now = [0.0]
    outer = held(path, "busy")
    outer.__enter__()

    def sleep(seconds):
        now[0] += seconds
        if now[0] >= 3.0 and outer is not None:  # the other step ends 3 s in
            outer.__exit__(None, None, None)
            released.append(now[0])

    released: list[float] = []

    with held(path, "{holder}", wait_s=10.0, clock=lambda: now[0], sleep=sleep):
        assert 3.0 <= now[0] < 10.0 and len(released) == 1
    outer = None
    with held(path, "busy"), pytest.raises(LockBusy), \
            held(path, "busy {path}", wait_s=1.0, clock=lambda: now[0], sleep=sleep):
        pass


@pytest.mark.parametrize("node, lock_dir, what", [
    ("../h1", "/run/gpushare", "is not a Slurm node name"),
    ("h1", "run", "--lock-dir must be an absolute path")])
def test_the_nodes_lock_takes_no_path_from_a_name(tmp_path, plan, capsys, node, lock_dir,
                                                  what):
    from gpushare.cli import main

    path = write_profile(tmp_path, plan)
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    assert main(["relayout", "node", "--plan", str(plan_file), "--node", node, "--gpu", "2",
                 "--layout", "2x3g.40gb", "--source", "sim:" + path, "--gres-conf", "none",
                 "--state", "none", "--lock-dir", lock_dir, "--apply"]) == 2
    assert what in capsys.readouterr().err


@pytest.mark.parametrize("state,why", [
    ("IDLE", "slurmctld shows it IDLE, so a job may start on it meanwhile; drain it first"),
    ("MIXED+DRAIN", "slurmctld shows it MIXED+DRAIN: a job holds it"),
    ("IDLE+COMPLETING+DRAIN", "slurmctld shows it IDLE+COMPLETING+DRAIN: a job holds it"),
])
def test_the_step_changes_a_gpu_only_on_a_node_slurm_shows_drained_and_idle(
        tmp_path, plan, capsys, state, why):
    """A job holding a MIG slice may have no process on the GPU yet (the step's NVML check
    passes), and Slurm may start one on a node in service: the step asks slurmctld first."""
    from gpushare.cli import main

    path = write_profile(tmp_path, plan)
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    before = layout_of(path, 2)
    argv = ["relayout", "node", "--plan", str(plan_file), "--node", "h1", "--gpu", "2",
            "--layout", "2x3g.40gb", "--source", "sim:" + path, "--gres-conf", "none",
            "--state", "none", "--lock-dir", str(tmp_path / "run"), "--apply"]
    stub = scontrol_stub(str(tmp_path), state)
    assert main([*argv, "--scontrol", stub]) == 2
    err = capsys.readouterr().err
    assert f"GPU 2 of node h1 not changed: {why}" in err, err
    assert layout_of(path, 2) == before
    with open(stub + ".args", encoding="utf-8") as args:
        assert args.read().split() == ["-d", "show", "-o", "node", "h1"]
    # Drained and idle, or down: the change is made (and back).
    assert main([*argv, "--scontrol", scontrol_stub(str(tmp_path), "IDLE+DRAIN")]) == 0
    assert layout_of(path, 2) == [("3g.40gb", 1), ("3g.40gb", 2)]
    assert main([*argv, "--scontrol", scontrol_stub(str(tmp_path), "DOWN"),
                 "--layout", "7x1g.10gb"]) == 0
    assert layout_of(path, 2) == before


def test_without_slurmctld_the_step_refuses_unless_told(tmp_path, plan, capsys):
    from gpushare.cli import main

    path = write_profile(tmp_path, plan)
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    down = tmp_path / "scontrol"
    down.write_text("#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm "
                    "controller (connect failure)' >&2\nexit 1\n")
    down.chmod(0o755)
    before = layout_of(path, 2)
    argv = ["relayout", "node", "--plan", str(plan_file), "--node", "h1", "--gpu", "2",
            "--layout", "2x3g.40gb", "--source", "sim:" + path, "--gres-conf", "none",
            "--state", "none", "--lock-dir", str(tmp_path / "run"), "--scontrol", str(down),
            "--apply"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "slurmctld cannot say whether the node is drained" in err and \
        "Unable to contact slurm controller" in err and "--unchecked" in err, err
    assert layout_of(path, 2) == before
    assert main([*argv, "--unchecked"]) == 0
    assert layout_of(path, 2) == [("3g.40gb", 1), ("3g.40gb", 2)]
