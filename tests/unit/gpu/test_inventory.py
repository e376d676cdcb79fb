# SPDX-License-Identifier: GPL-2.0-or-later
"""Inventory collected through the simulator equals what each profile says, field by field."""

from __future__ import annotations

import glob
import json
import math
import os

import pytest

from gpushare.gpu.inventory import (
    FabricInfo,
    Gpu,
    GpuProcess,
    Inventory,
    MigDevice,
    NvLink,
    collect,
    load_nvml,
    mig_caps_files,
    mig_profile_from_attributes,
    mig_profile_from_name,
    open_inventory,
    parse_mig_minors,
)

PROFILE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src", "gpushare", "gpu",
                           "profiles")
PROFILES = sorted(os.path.abspath(p) for p in glob.glob(os.path.join(PROFILE_DIR, "*.json")))
MIB = 1 << 20


def test_the_four_profiles_exist():
    names = {os.path.basename(p) for p in PROFILES}
    assert {"h100-8x-nvswitch.json", "a100-mig-mixed.json", "l40s-pcie.json",
            "gb200-tray.json"} <= names


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _expected_caps(minor: int, gi: int, ci: int) -> list[str]:
    # The driver's numbering, written out independently of the simulator.
    gi_minor = 3 + 135 * minor + 9 * gi
    return [f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
            f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1 + ci}"]


@pytest.mark.parametrize("path", PROFILES, ids=os.path.basename)
def test_profile_collects_to_what_it_says(path):
    with open(path) as f:
        raw = json.load(f)
    inv = open_inventory("sim:" + path)
    assert inv.source == "sim:" + path
    assert inv.driver_version == raw["driver_version"]
    cuda = raw["cuda_driver_version"]
    assert inv.cuda_driver_version == f"{cuda // 1000}.{cuda % 1000 // 10}"
    assert len(inv.gpus) == len(raw["gpus"])
    for index, (gpu, want) in enumerate(zip(inv.gpus, raw["gpus"])):
        assert gpu.nvml_index == index
        assert gpu.minor == want["minor"]
        assert gpu.uuid == want["uuid"]
        assert gpu.name == want["name"]
        assert gpu.memory_total == want["memory_mib"] * MIB
        assert gpu.pci_bus_id == want["pci_bus_id"]
        assert gpu.compute_mode == (want["compute_mode"] or "unknown")
        assert gpu.device_file == f"/dev/nvidia{want['minor']}"
        if want["mig"] is None:
            assert "mig" in gpu.unsupported
            assert (gpu.mig_current, gpu.mig_pending) == (False, False)
        else:
            assert (gpu.mig_current, gpu.mig_pending) == (want["mig"]["current"],
                                                          want["mig"]["pending"])
        want_migs = want.get("mig_devices", [])
        assert len(gpu.mig_devices) == len(want_migs)
        for mig, wm in zip(gpu.mig_devices, want_migs):
            assert (mig.gpu_index, mig.gi_id, mig.ci_id) == (index, wm["gi_id"], wm["ci_id"])
            assert mig.uuid == wm["uuid"]
            assert mig.profile == wm["profile"]
            assert mig.memory_total == wm["memory_mib"] * MIB
            assert mig.caps_files == _expected_caps(want["minor"], wm["gi_id"], wm["ci_id"])
            assert mig.gi_slices == int(wm["profile"].split("g.")[0])
        if want["nvlinks"] is None:
            assert "nvlink" in gpu.unsupported and gpu.nvlinks == []
        else:
            assert [(n.link, n.active, n.remote_pci_bus_id) for n in gpu.nvlinks] == [
                (i, link["active"], link["remote_pci_bus_id"] if link["active"] else "")
                for i, link in enumerate(want["nvlinks"])]
        if want["fabric"] is None:
            assert gpu.fabric is None and "fabric" in gpu.unsupported
        else:
            assert gpu.fabric.state == want["fabric"]["state"]
            assert gpu.fabric.clique_id == want["fabric"]["clique_id"]
            assert gpu.fabric.status == want["fabric"]["status"]
            zero = want["fabric"]["cluster_uuid"].replace("-", "").strip("0") == ""
            assert gpu.fabric.cluster_uuid == ("" if zero else want["fabric"]["cluster_uuid"])
        assert [(p.pid, p.used_memory, p.kind) for p in gpu.processes] == sorted(
            (p["pid"], p.get("used_memory_mib", 0) * MIB, p.get("kind", "compute"))
            for p in want["processes"] or [])


def test_profiles_cover_the_promised_hardware():
    by_name = {os.path.basename(p): open_inventory("sim:" + p) for p in PROFILES}
    h100 = by_name["h100-8x-nvswitch.json"]
    assert len(h100.gpus) == 8
    assert all(len(g.nvlinks) == 18 and all(n.active for n in g.nvlinks) for g in h100.gpus)
    a100 = by_name["a100-mig-mixed.json"]
    layouts = [sorted(m.profile for m in g.mig_devices) for g in a100.gpus]
    assert layouts[0] == ["1g.10gb"] * 7
    assert layouts[1] == ["1g.10gb", "2g.20gb", "3g.40gb"]
    assert any(not g.mig_current for g in a100.gpus)
    assert any(g.mig_pending and not g.mig_current for g in a100.gpus)
    l40s = by_name["l40s-pcie.json"]
    assert len(l40s.gpus) == 4
    assert all(not g.nvlinks and "nvlink" in g.unsupported for g in l40s.gpus)
    gb200 = by_name["gb200-tray.json"]
    cliques = {(g.fabric.cluster_uuid, g.fabric.clique_id) for g in gb200.gpus}
    assert len(gb200.gpus) == 4 and len(cliques) == 1
    assert all(g.fabric.state == "completed" and g.fabric.cluster_uuid for g in gb200.gpus)


@pytest.mark.parametrize("name,profile", [
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb"),
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "3g.20gb"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
    ("NVIDIA A100-SXM4-80GB MIG 1c.3g.40gb", "1c.3g.40gb"),
    ("NVIDIA A100-SXM4-80GB", ""),
])
def test_mig_profile_from_name(name, profile):
    assert mig_profile_from_name(name) == profile


@pytest.mark.parametrize("gi,ci,mem,profile", [
    (1, 1, 4864, "1g.5gb"), (2, 2, 9728, "2g.10gb"), (3, 3, 19968, "3g.20gb"),
    (7, 7, 40192, "7g.40gb"), (1, 1, 9728, "1g.10gb"), (7, 7, 81152, "7g.80gb"),
    (3, 1, 40192, "1c.3g.40gb"),
])
def test_mig_profile_from_attributes(gi, ci, mem, profile):
    assert mig_profile_from_attributes(gi, ci, mem) == profile
    assert profile.endswith(f"{math.ceil(mem / 1024)}gb")


def test_mig_minors_parse_and_caps_files():
    minors = parse_mig_minors("config 1\nmonitor 2\ngpu3/gi2/access 30\n"
                              "gpu3/gi2/ci0/access 31\ngarbage line here\n")
    assert minors == {"config": 1, "monitor": 2, "gpu3/gi2/access": 30,
                      "gpu3/gi2/ci0/access": 31}
    assert mig_caps_files(minors, 3, 2, 0, "/x/dev") == [
        "/x/dev/nvidia-caps/nvidia-cap30", "/x/dev/nvidia-caps/nvidia-cap31"]
    assert mig_caps_files(minors, 0, 2, 0) == []


def test_profile_name_without_mig_profile_falls_back_to_attributes(tmp_path):
    raw = _load(os.path.join(PROFILE_DIR, "a100-mig-mixed.json"))
    raw["gpus"][1]["mig_devices"][0]["name"] = "NVIDIA A100-SXM4-80GB"
    raw["gpus"][1]["mig_devices"][0]["ci_slices"] = 1
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    inv = open_inventory(f"sim:{path}")
    assert inv.gpus[1].mig_devices[0].profile == "1c.3g.40gb"


def test_explicit_mig_minors_device_root_and_processes(tmp_path):
    raw = _load(os.path.join(PROFILE_DIR, "a100-mig-mixed.json"))
    raw["hostname"] = "gpu07"
    raw["device_dir"] = str(tmp_path / "dev")
    raw["mig_minors"] = "config 1\nmonitor 2\ngpu1/gi2/access 500\ngpu1/gi2/ci0/access 501\n"
    raw["gpus"][1]["mig_devices"][0]["processes"] = [{"pid": 77, "used_memory_mib": 512}]
    raw["gpus"][2]["processes"] = [{"pid": 88, "used_memory_mib": 2048, "kind": "mps"},
                                   {"pid": 5}]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    inv = open_inventory(f"sim:{path}")
    assert inv.hostname == "gpu07"
    gpu1 = inv.gpus[1]
    assert gpu1.device_file == str(tmp_path / "dev" / "nvidia1")
    assert gpu1.mig_devices[0].caps_files == [str(tmp_path / "dev/nvidia-caps/nvidia-cap500"),
                                             str(tmp_path / "dev/nvidia-caps/nvidia-cap501")]
    assert gpu1.mig_devices[1].caps_files == []  # not listed in this mig-minors
    slice_procs = gpu1.mig_devices[0].processes
    assert [(p.pid, p.used_memory, p.gi_id, p.ci_id) for p in slice_procs] == [
        (77, 512 * MIB, 2, 0)]
    # the parent handle aggregates its slices' processes, tagged with their instance ids
    assert [(p.pid, p.gi_id) for p in gpu1.processes] == [(77, 2)]
    assert [(p.pid, p.used_memory, p.kind, p.gi_id) for p in inv.gpus[2].processes] == [
        (5, 0, "compute", None), (88, 2048 * MIB, "mps", None)]


def inventory_from_dict(data):
    """Rebuild an inventory from ``to_dict()`` output (``gpushare inventory --json``)."""
    gpus = []
    for g in data.get("gpus", []):
        g = dict(g)
        g["nvml_index"] = g.pop("index")
        migs = []
        for m in g.pop("mig_devices", []):
            m = dict(m)
            m["processes"] = [GpuProcess(**p) for p in m.get("processes", [])]
            migs.append(MigDevice(**m))
        nvlinks = [NvLink(**n) for n in g.pop("nvlinks", [])]
        fabric = g.pop("fabric", None)
        procs = [GpuProcess(**p) for p in g.pop("processes", [])]
        gpus.append(Gpu(**g, mig_devices=migs, nvlinks=nvlinks,
                        fabric=FabricInfo(**fabric) if fabric else None, processes=procs))
    return Inventory(hostname=data["hostname"], driver_version=data["driver_version"],
                     cuda_driver_version=data["cuda_driver_version"], source=data["source"],
                     gpus=gpus)


def test_to_dict_from_dict_round_trip():
    for path in PROFILES:
        inv = open_inventory("sim:" + path)
        data = json.loads(json.dumps(inv.to_dict()))
        assert inventory_from_dict(data) == inv


def test_lookup_helpers():
    inv = open_inventory("sim:" + os.path.join(os.path.abspath(PROFILE_DIR),
                                               "a100-mig-mixed.json"))
    gpu = inv.gpus[1]
    assert inv.gpu_by_uuid(gpu.uuid) is gpu
    assert inv.gpu_by_minor(gpu.minor) is gpu
    assert inv.mig_by_uuid(gpu.mig_devices[2].uuid) == (gpu, gpu.mig_devices[2])
    assert inv.gpu_by_uuid("GPU-nope") is None and inv.mig_by_uuid("MIG-nope") is None


def test_collect_uses_the_given_nvml_object_and_shuts_it_down():
    nvml = load_nvml("sim:" + PROFILES[0])
    inv = collect(nvml, "sim:x", None, hostname="h")
    assert inv.hostname == "h" and inv.source == "sim:x"
    assert all(m.caps_files == [] for g in inv.gpus for m in g.mig_devices)
    with pytest.raises(nvml.NVMLError):  # shut down again: calls now fail as in pynvml
        nvml.nvmlDeviceGetCount()
