# SPDX-License-Identifier: GPL-2.0-or-later
"""Reading a simulated node profile (the format ``gpushare.gpu.nvml_sim`` documents): every
field checked, with an error that names the file and the field.

Apart from the simulator's calls, so that each stays one concern; ``nvml_sim`` re-exports
``load_profile``, ``ProfileError``, ``PROFILE_FORMAT`` and ``standard_mig_minors``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Optional

from gpushare.gpu.nvml import InventoryError
from gpushare.gpu.nvml_sim_errors import NVML_ERRORS
from gpushare.gpu.nvml_sim_usage import usage_keys

__all__ = ["NVML_ERRORS", "PROFILE_FORMAT", "ProfileError", "load_profile",
           "standard_mig_minors"]

PROFILE_FORMAT = 1

_COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}
_FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}
_PROFILE_RE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:\+\w+)?$")


class ProfileError(InventoryError):
    """A simulated node profile is malformed; the message names the file and the field."""


_MISSING = object()


class _Reader:
    """Typed access to a profile's JSON with error messages that name the field."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, where: str, expected: str) -> ProfileError:
        return ProfileError(f"simulated node profile {self.path}: {where}: expected {expected}")

    def get(self, obj: dict[str, Any], key: str, kind: Any, where: str,
            default: Any = _MISSING, nullable: bool = False) -> Any:
        if key not in obj:
            if default is _MISSING:
                raise self.fail(f"{where}.{key}" if where else key, "a value (it is missing)")
            return default
        value = obj[key]
        if value is None and nullable:
            return None
        if kind is int and isinstance(value, bool):
            raise self.fail(f"{where}.{key}" if where else key, "an integer")
        if not isinstance(value, kind):
            names = {str: "a string", int: "an integer", bool: "true or false", list: "a list",
                     dict: "an object"}
            label = names.get(kind, getattr(kind, "__name__", str(kind)))
            null = " or null" if nullable else ""
            raise self.fail(f"{where}.{key}" if where else key, label + null)
        return value


def _slices(profile: str) -> Optional[tuple[int, int]]:
    match = _PROFILE_RE.match(profile)
    if not match:
        return None
    gi = int(match.group(2))
    return (int(match.group(1)) if match.group(1) else gi), gi


def _processes(r: _Reader, raw: Any, where: str) -> Optional[list[dict[str, Any]]]:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise r.fail(where, "a list of processes or null")
    procs = []
    for i, p in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(p, dict):
            raise r.fail(w, "an object")
        kind = r.get(p, "kind", str, w, "compute")
        if kind not in ("compute", "mps"):
            raise r.fail(f"{w}.kind", "compute or mps")
        procs.append({"pid": r.get(p, "pid", int, w),
                      "used_memory_mib": r.get(p, "used_memory_mib", int, w, 0),
                      "kind": kind})
    return procs


def _gpu(r: _Reader, raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise r.fail(where, "an object")
    gpu: dict[str, Any] = {
        "minor": r.get(raw, "minor", int, where),
        "uuid": r.get(raw, "uuid", str, where),
        "name": r.get(raw, "name", str, where),
        "memory_mib": r.get(raw, "memory_mib", int, where),
        "pci_bus_id": r.get(raw, "pci_bus_id", str, where),
        "compute_mode": r.get(raw, "compute_mode", str, where, "default", nullable=True),
        "processes": _processes(r, raw.get("processes", []), f"{where}.processes"),
    }
    gpu.update(usage_keys(r, raw, where, gpu["processes"], raw.get("processes")))
    if not gpu["uuid"].startswith("GPU-"):
        raise r.fail(f"{where}.uuid", "a UUID starting with GPU-")
    if gpu["compute_mode"] is not None and gpu["compute_mode"] not in _COMPUTE_MODES:
        raise r.fail(f"{where}.compute_mode", "one of " + ", ".join(_COMPUTE_MODES))
    mig = r.get(raw, "mig", dict, where, None, nullable=True)
    if mig is not None:
        mig = {"current": r.get(mig, "current", bool, f"{where}.mig"),
               "pending": r.get(mig, "pending", bool, f"{where}.mig")}
    gpu["mig"] = mig
    gpu["mig_devices"] = []
    raw_migs = r.get(raw, "mig_devices", list, where, [])
    if raw_migs and not (mig and mig["current"]):
        raise r.fail(f"{where}.mig_devices", "no MIG devices unless mig.current is true")
    for i, m in enumerate(raw_migs):
        w = f"{where}.mig_devices[{i}]"
        if not isinstance(m, dict):
            raise r.fail(w, "an object")
        profile = r.get(m, "profile", str, w)
        derived = _slices(profile)
        if derived is None:
            raise r.fail(f"{w}.profile", "a MIG profile such as 1g.10gb or 1c.3g.40gb")
        dev = {
            "gi_id": r.get(m, "gi_id", int, w),
            "ci_id": r.get(m, "ci_id", int, w),
            "uuid": r.get(m, "uuid", str, w),
            "profile": profile,
            "memory_mib": r.get(m, "memory_mib", int, w),
            "ci_slices": r.get(m, "ci_slices", int, w, derived[0]),
            "gi_slices": r.get(m, "gi_slices", int, w, derived[1]),
            "name": r.get(m, "name", str, w, f"{gpu['name']} MIG {profile}"),
            "processes": _processes(r, m.get("processes", []), f"{w}.processes"),
        }
        dev.update(usage_keys(r, m, w, dev["processes"], m.get("processes")))
        if not dev["uuid"].startswith("MIG-"):
            raise r.fail(f"{w}.uuid", "a UUID starting with MIG-")
        gpu["mig_devices"].append(dev)
    links = r.get(raw, "nvlinks", list, where, None, nullable=True)
    if links is not None:
        parsed = []
        for i, link in enumerate(links):
            w = f"{where}.nvlinks[{i}]"
            if not isinstance(link, dict):
                raise r.fail(w, "an object")
            parsed.append({"active": r.get(link, "active", bool, w),
                           "remote_pci_bus_id": r.get(link, "remote_pci_bus_id", str, w, "")})
        links = parsed
    gpu["nvlinks"] = links
    fabric = r.get(raw, "fabric", dict, where, None, nullable=True)
    if fabric is not None:
        w = f"{where}.fabric"
        state = r.get(fabric, "state", str, w)
        if state not in _FABRIC_STATES:
            raise r.fail(f"{w}.state", "one of " + ", ".join(_FABRIC_STATES))
        status = r.get(fabric, "status", str, w, "success")
        if status != "success" and status.upper() not in NVML_ERRORS:
            raise r.fail(f"{w}.status", "success or an NVML error name such as NOT_READY")
        cluster = r.get(fabric, "cluster_uuid", str, w, "")
        try:
            cluster_bytes = bytes.fromhex(cluster.replace("-", "")) if cluster else bytes(16)
        except ValueError:
            cluster_bytes = b""
        if len(cluster_bytes) != 16:
            raise r.fail(f"{w}.cluster_uuid", "a UUID (32 hex digits)")
        fabric = {"state": state, "status": status, "cluster_uuid": cluster_bytes,
                  "clique_id": r.get(fabric, "clique_id", int, w, 0)}
    gpu["fabric"] = fabric
    return gpu


def load_profile(path: str, device_root: Optional[str] = None) -> dict[str, Any]:
    """Read and check a simulated node profile; ``device_root`` re-roots its device files."""
    if not os.path.isabs(path):
        raise ProfileError(f"simulated node profile path {path!r} must be absolute")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as err:
        raise ProfileError(f"cannot read simulated node profile {path}: {err.strerror}") from None
    except ValueError as err:
        raise ProfileError(f"simulated node profile {path} is not valid JSON: {err}") from None
    r = _Reader(path)
    if not isinstance(raw, dict):
        raise r.fail("top level", "a JSON object")
    if raw.get("format") != PROFILE_FORMAT:
        raise r.fail("format", f"{PROFILE_FORMAT} (this gpushare reads profile format "
                     f"{PROFILE_FORMAT})")
    gpus = r.get(raw, "gpus", list, "")
    profile: dict[str, Any] = {
        "path": path,
        "description": r.get(raw, "description", str, "", ""),
        "hostname": r.get(raw, "hostname", str, "", ""),
        "driver_version": r.get(raw, "driver_version", str, ""),
        "cuda_driver_version": r.get(raw, "cuda_driver_version", int, ""),
        "device_dir": r.get(raw, "device_dir", str, "", "/dev"),
        "mig_minors": r.get(raw, "mig_minors", str, "", None, nullable=True),
        "errors": {},
        "gpus": [_gpu(r, g, f"gpus[{i}]") for i, g in enumerate(gpus)],
    }
    for fn, name in r.get(raw, "errors", dict, "", {}).items():
        if not isinstance(name, str) or name.upper() not in NVML_ERRORS:
            raise r.fail(f"errors.{fn}", "an NVML error name such as NO_PERMISSION")
        profile["errors"][fn] = NVML_ERRORS[name.upper()]
    hang = r.get(raw, "hang", list, "", [])
    if not all(isinstance(fn, str) and fn.startswith("nvml") for fn in hang):
        raise r.fail("hang", "a list of NVML function names such as nvmlInit")
    profile["hang"] = frozenset(hang)
    freeze = r.get(raw, "freeze", str, "", "")
    if freeze and not os.path.isabs(freeze):
        raise r.fail("freeze", "an absolute path to a cgroup v1 freezer directory")
    profile["freeze"] = freeze
    live_dir = r.get(raw, "live_dir", str, "", "")
    if live_dir and not os.path.isabs(live_dir):
        raise r.fail("live_dir", "an absolute path to a root-owned sticky directory")
    profile["live_dir"] = live_dir
    profile["error_on_call"] = {}
    for fn, spec in r.get(raw, "error_on_call", dict, "", {}).items():
        if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], int)
                and not isinstance(spec[0], bool) and spec[0] >= 1
                and isinstance(spec[1], str) and spec[1].upper() in NVML_ERRORS):
            raise r.fail(f"error_on_call.{fn}", "[N, error name] such as [2, IN_USE]")
        profile["error_on_call"][fn] = (spec[0], NVML_ERRORS[spec[1].upper()])
    if not profile["device_dir"].startswith("/"):
        raise r.fail("device_dir", "an absolute path")
    if device_root is not None:
        profile["device_dir"] = os.path.join(device_root, profile["device_dir"].lstrip("/"))
    profile["device_dir"] = os.path.normpath(profile["device_dir"])
    uuids = [g["uuid"] for g in profile["gpus"]] + [
        m["uuid"] for g in profile["gpus"] for m in g["mig_devices"]]
    if len(set(uuids)) != len(uuids):
        raise r.fail("gpus", "every GPU and MIG UUID to be different")
    minors = [g["minor"] for g in profile["gpus"]]
    if len(set(minors)) != len(minors):
        raise r.fail("gpus", "every GPU minor number to be different")
    return profile


def standard_mig_minors(gpu_minors: list[int]) -> str:
    """The mig-minors file the NVIDIA driver writes, for GPUs with these minor numbers."""
    lines = ["config 1", "monitor 2"]
    for g in sorted(gpu_minors):
        for gi in range(15):
            base = 3 + 135 * g + 9 * gi
            lines.append(f"gpu{g}/gi{gi}/access {base}")
            lines.extend(f"gpu{g}/gi{gi}/ci{ci}/access {base + 1 + ci}" for ci in range(8))
    return "\n".join(lines) + "\n"
