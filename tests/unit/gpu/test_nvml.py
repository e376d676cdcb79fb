# SPDX-License-Identifier: GPL-2.0-or-later
"""The NVML seam: source selection, the simulator's fidelity to pynvml, and clear errors."""

from __future__ import annotations

import ctypes.util
import json
import os

import pytest

from gpushare.cli import main
from gpushare.gpu.inventory import InventoryError, load_nvml, open_inventory
from gpushare.gpu.nvml_sim import ProfileError, SimNvml, load_profile, standard_mig_minors

PROFILE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "src",
                                           "gpushare", "gpu", "profiles"))
A100 = os.path.join(PROFILE_DIR, "a100-mig-mixed.json")
H100 = os.path.join(PROFILE_DIR, "h100-8x-nvswitch.json")


def _write(tmp_path, raw, name="p.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)


def _raw(path=A100):
    with open(path) as f:
        return json.load(f)


def test_source_selection_is_explicit():
    assert isinstance(load_nvml("sim:" + A100), SimNvml)
    with pytest.raises(InventoryError, match="unknown GPU inventory source 'gpu'"):
        load_nvml("gpu")


def test_real_source_is_pynvml():
    pynvml = pytest.importorskip("pynvml")
    assert load_nvml("nvml") is pynvml


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                    reason="this machine has an NVIDIA driver")
def test_real_nvml_without_driver_says_so():
    pytest.importorskip("pynvml")
    with pytest.raises(InventoryError) as err:
        open_inventory("nvml")
    assert str(err.value) == (
        "no NVIDIA driver/NVML on this node (libnvidia-ml.so.1 not found); for a test on a "
        "node without GPUs, give a simulated profile: --source sim:FILE (gpushare commands) "
        "or inventory=sim:FILE (the plugstack line)")


def test_simulator_names_exist_in_pynvml():
    pynvml = pytest.importorskip("pynvml")
    sim = load_nvml("sim:" + A100)
    names = [n for n in dir(SimNvml) if n.startswith(("nvml", "NVML", "c_nvml"))]
    names += [n for n in vars(sim) if n.startswith(("NVML_", "NVMLError_"))]
    assert "nvmlDeviceGetGpuFabricInfoV" in names
    for name in names:
        assert hasattr(pynvml, name), name
        if name.startswith("NVML_"):
            assert getattr(sim, name) == getattr(pynvml, name), name


def test_simulator_errors_behave_like_pynvml():
    sim = load_nvml("sim:" + A100)
    with pytest.raises(sim.NVMLError) as err:
        sim.nvmlDeviceGetCount()
    assert err.value.value == sim.NVML_ERROR_UNINITIALIZED
    sim.nvmlInit()
    with pytest.raises(sim.NVMLError_NotFound):
        sim.nvmlDeviceGetHandleByUUID("GPU-none")
    gpu3 = sim.nvmlDeviceGetHandleByIndex(3)
    assert sim.nvmlDeviceGetMigMode(gpu3) == [0, 1]
    assert sim.nvmlDeviceGetMaxMigDeviceCount(gpu3) == 0
    gpu0 = sim.nvmlDeviceGetHandleByIndex(0)
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 0)
    assert sim.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) is gpu0
    assert sim.nvmlDeviceGetHandleByUUID(sim.nvmlDeviceGetUUID(mig)) is mig
    assert sim.nvmlDeviceIsMigDeviceHandle(mig) == 1
    with pytest.raises(sim.NVMLError) as err:
        sim.nvmlDeviceGetMigDeviceHandleByIndex(gpu0, 7)
    assert err.value.value == sim.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(sim.NVMLError_NotSupported):
        sim.nvmlDeviceGetMinorNumber(mig)
    with pytest.raises(sim.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetNvLinkState(gpu0, 12)
    assert sim.nvmlDeviceGetPciInfo(gpu0).busId == b"00000000:07:00.0"
    sim.nvmlShutdown()


@pytest.mark.parametrize("fn,error,message", [
    ("nvmlInit", "LIBRARY_NOT_FOUND", "no NVIDIA driver/NVML on this node "
     "(libnvidia-ml.so.1 not found); for a test on a node without GPUs, give a simulated "
     "profile: --source sim:FILE (gpushare commands) or inventory=sim:FILE (the plugstack "
     "line)"),
    ("nvmlInit", "DRIVER_NOT_LOADED", "the NVIDIA kernel driver is not loaded"),
    ("nvmlDeviceGetHandleByIndex", "NO_PERMISSION",
     "no permission to get the handle of GPU 0 (NVML: Insufficient Permissions); run as root"),
    ("nvmlInit", "LIB_RM_VERSION_MISMATCH", "different versions"),
    ("nvmlDeviceGetMemoryInfo", "GPU_IS_LOST", "a GPU fell off the bus"),
    ("nvmlDeviceGetUUID", "UNKNOWN",
     "could not read the UUID of GPU 0: NVML says Unknown Error (NVML_ERROR_UNKNOWN)"),
    ("nvmlDeviceGetNvLinkState", "TIMEOUT", "could not read NVLink 0 of GPU 0"),
    ("nvmlDeviceGetComputeRunningProcesses", "NO_PERMISSION",
     "no permission to list the processes on GPU 0"),
])
def test_each_nvml_failure_is_a_clear_inventory_error(tmp_path, fn, error, message):
    raw = _raw(H100)
    raw["errors"] = {fn: error}
    with pytest.raises(InventoryError) as err:
        open_inventory("sim:" + _write(tmp_path, raw))
    assert message in str(err.value)


@pytest.mark.parametrize("fn,feature", [
    ("nvmlDeviceGetComputeMode", "compute_mode"),
    ("nvmlDeviceGetMigMode", "mig"),
    ("nvmlDeviceGetNvLinkState", "nvlink"),
    ("nvmlDeviceGetComputeRunningProcesses", "processes"),
    ("nvmlDeviceGetMPSComputeRunningProcesses", "mps_processes"),
])
def test_not_supported_marks_the_field_instead_of_failing(tmp_path, fn, feature):
    raw = _raw(H100)
    raw["errors"] = {fn: "NOT_SUPPORTED"}
    inv = open_inventory("sim:" + _write(tmp_path, raw))
    assert all(feature in g.unsupported for g in inv.gpus)


def test_fabric_falls_back_to_the_old_call_on_an_older_driver(tmp_path):
    raw = _raw(os.path.join(PROFILE_DIR, "gb200-tray.json"))
    raw["errors"] = {"nvmlDeviceGetGpuFabricInfoV": "FUNCTION_NOT_FOUND"}
    inv = open_inventory("sim:" + _write(tmp_path, raw))
    assert inv.gpus[0].fabric.state == "completed" and inv.gpus[0].fabric.clique_id == 32766
    raw["errors"]["nvmlDeviceGetGpuFabricInfo"] = "NOT_SUPPORTED"
    inv = open_inventory("sim:" + _write(tmp_path, raw))
    assert inv.gpus[0].fabric is None and "fabric" in inv.gpus[0].unsupported


def test_fabric_states_and_status(tmp_path):
    raw = _raw(os.path.join(PROFILE_DIR, "gb200-tray.json"))
    raw["gpus"][0]["fabric"] = {"state": "in_progress"}
    raw["gpus"][1]["fabric"]["status"] = "TIMEOUT"
    inv = open_inventory("sim:" + _write(tmp_path, raw))
    assert inv.gpus[0].fabric.state == "in_progress"
    assert inv.gpus[0].fabric.cluster_uuid == ""
    assert inv.gpus[1].fabric.status == "Timeout"


def test_device_root_rewrites_device_dir():
    profile = load_profile(A100, device_root="/tmp/bed")
    assert profile["device_dir"] == "/tmp/bed/dev"
    sim = SimNvml(profile)
    assert sim.device_dir == "/tmp/bed/dev"


def test_standard_mig_minors_numbering():
    minors = standard_mig_minors([0, 1]).splitlines()
    assert minors[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi2/access 21" in minors
    assert "gpu1/gi0/access 138" in minors
    assert len(minors) == 2 + 2 * 15 * 9


@pytest.mark.parametrize("mutate,message", [
    (lambda r: r.pop("gpus"), "gpus: expected a value (it is missing)"),
    (lambda r: r.update(format=2), "format: expected 1"),
    (lambda r: r["gpus"][0].update(minor="0"), "gpus[0].minor: expected an integer"),
    (lambda r: r["gpus"][0].update(uuid="abc"), "gpus[0].uuid: expected a UUID starting with"),
    (lambda r: r["gpus"][2].update(mig_devices=r["gpus"][0]["mig_devices"]),
     "gpus[2].mig_devices: expected no MIG devices unless mig.current is true"),
    (lambda r: r["gpus"][0]["mig_devices"][0].update(profile="small"),
     "gpus[0].mig_devices[0].profile: expected a MIG profile"),
    (lambda r: r["gpus"][1].update(minor=0), "every GPU minor number to be different"),
    (lambda r: r["gpus"][1].update(uuid=r["gpus"][0]["uuid"]), "every GPU and MIG UUID"),
    (lambda r: r["gpus"][0].update(compute_mode="shared"), "gpus[0].compute_mode: expected one"),
    (lambda r: r.update(errors={"nvmlInit": "BROKEN"}), "errors.nvmlInit: expected an NVML"),
    (lambda r: r.update(hang=["Init"]), "hang: expected a list of NVML function names"),
    (lambda r: r.update(hang="nvmlInit"), "hang: expected"),
    (lambda r: r["gpus"][0].update(processes=[{"pid": 1, "kind": "gfx"}]),
     "gpus[0].processes[0].kind: expected compute or mps"),
    (lambda r: r["gpus"][0].update(nvlinks=[{"active": "yes"}]),
     "gpus[0].nvlinks[0].active: expected true or false"),
])
def test_bad_profiles_name_the_field(tmp_path, mutate, message):
    raw = _raw()
    mutate(raw)
    path = _write(tmp_path, raw)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    assert str(err.value).startswith(f"simulated node profile {path}")
    assert message in str(err.value)


def test_unreadable_profiles(tmp_path):
    with pytest.raises(ProfileError, match="must be absolute"):
        load_profile("profile.json")
    with pytest.raises(ProfileError, match="cannot read simulated node profile"):
        load_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ProfileError, match="is not valid JSON"):
        load_profile(str(bad))


def test_cli_inventory_table_json_and_errors(tmp_path, capsys):
    assert main(["inventory", "--source", "sim:" + A100]) == 0
    out = capsys.readouterr().out
    assert "MIG slices:" in out and "1g.10gb" in out and "off (pending on)" in out
    assert "/dev/nvidia-caps/nvidia-cap66" in out
    assert main(["inventory", "--json", "--source", "sim:" + A100]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpus"][1]["mig_devices"][0]["profile"] == "3g.40gb"
    raw = _raw()
    raw["errors"] = {"nvmlInit": "DRIVER_NOT_LOADED"}
    assert main(["inventory", "--source", "sim:" + _write(tmp_path, raw)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpushare: the NVIDIA kernel driver is not loaded")
    assert "Traceback" not in err



def test_a_call_the_profile_hangs_never_returns(tmp_path):
    """NVML stuck in the driver (the worker's deadline test on the real Slurm uses it)."""
    import threading

    raw = _raw()
    raw["hang"] = ["nvmlDeviceGetCount"]
    nvml = SimNvml(load_profile(_write(tmp_path, raw)))
    nvml.nvmlInit()
    answered = []
    caller = threading.Thread(target=lambda: answered.append(nvml.nvmlDeviceGetCount()),
                              daemon=True)
    caller.start()
    caller.join(0.5)
    assert caller.is_alive() and not answered
    assert nvml.nvmlSystemGetDriverVersion()  # the other calls still answer


def test_fake_gpus_conf_tells_slurmd_the_whole_gpus_uuids():
    """Slurm's fake_gpus.conf (26.05): <type>|<cpus>|<cpu range>|<links>|<file>|<uuid>|<flags>
    per whole GPU, in NVML order by the -1 of its links; MIG-mode GPUs are left out."""
    sim = SimNvml(load_profile(A100, device_root="/tmp/bed"))
    rows = [line.split("|") for line in sim.fake_gpus_conf(8).splitlines()]
    whole = [g for g in _raw()["gpus"] if not (g.get("mig") or {}).get("current")]
    assert len(rows) == len(whole) == 2
    for at, (row, gpu) in enumerate(zip(rows, whole)):
        assert row[:3] == ["nvidia_a100-sxm4-80gb", "8", "0-7"], row
        assert row[3].split(",").index("-1") == at and row[3].count("-1") == 1
        assert row[4:] == [f"/tmp/bed/dev/nvidia{gpu['minor']}", gpu["uuid"], "nvidia_gpu_env"]
    assert len(SimNvml(load_profile(H100)).fake_gpus_conf(2).splitlines()) == 8
