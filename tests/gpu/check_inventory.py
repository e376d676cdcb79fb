# SPDX-License-Identifier: GPL-2.0-or-later
"""Compare ``gpushare inventory --json`` (real NVML) with ``nvidia-smi`` on a machine with a GPU.

Usage: python3 tests/gpu/check_inventory.py RESULTS.json [--source nvml|sim:PATH]

Field by field per GPU (matched by UUID): name, uuid, minor number, memory, PCI bus id, compute
mode, MIG mode (current, pending), MIG slices (GI/CI ids), NVLink active links
(``nvidia-smi nvlink -s``), fabric state/clique/cluster UUID, and compute processes. Prints a
table, writes every comparison to RESULTS.json, exits 1 on any mismatch.

It only reads: ``nvidia-smi -q -x`` and ``nvidia-smi nvlink -s``; it never changes a GPU setting.
Not a pytest module (run it by hand or from the GPU job of CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from typing import Any, Optional

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MIB = 1 << 20


def run(cmd: list[str], env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def gpushare_inventory(source: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = run([sys.executable, "-c", "import sys; from gpushare.cli import main; "
                "sys.exit(main(sys.argv[1:]))", "inventory", "--json", "--source", source], env)
    if proc.returncode != 0:
        raise SystemExit(f"gpushare inventory failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def _text(node: Optional[ET.Element], path: str) -> str:
    if node is None:
        return ""
    found = node.find(path)
    return (found.text or "").strip() if found is not None else ""


def _mib(value: str) -> Optional[int]:
    parts = value.split()
    return int(parts[0]) if parts and parts[0].isdigit() else None


def _active_links(index: int) -> Optional[int]:
    proc = run(["nvidia-smi", "nvlink", "-s", "-i", str(index)])
    if proc.returncode != 0:
        return None
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("Link ")]
    return sum(1 for ln in lines if "inactive" not in ln.lower())


def compare(inv: dict[str, Any], xml_text: str) -> list[dict[str, Any]]:
    root = ET.fromstring(xml_text)
    by_uuid = {g["uuid"]: g for g in inv["gpus"]}
    rows: list[dict[str, Any]] = []

    def row(gpu: str, field: str, ours: Any, theirs: Any, same: Optional[bool] = None) -> None:
        if same is None:
            same = ours == theirs
        rows.append({"gpu": gpu, "field": field, "gpushare": ours, "nvidia_smi": theirs,
                     "match": bool(same)})

    smi_gpus = root.findall("gpu")
    row("-", "gpu count", len(inv["gpus"]), len(smi_gpus))
    row("-", "driver version", inv["driver_version"], _text(root, "driver_version"))
    for smi_index, node in enumerate(smi_gpus):
        uuid = _text(node, "uuid")
        ours = by_uuid.get(uuid)
        label = f"{smi_index}"
        if ours is None:
            row(label, "uuid", None, uuid)
            continue
        row(label, "uuid", ours["uuid"], uuid)
        row(label, "name", ours["name"], _text(node, "product_name"))
        row(label, "minor", ours["minor"], int(_text(node, "minor_number") or -1))
        row(label, "memory MiB", ours["memory_total"] // MIB,
            _mib(_text(node, "fb_memory_usage/total")))
        row(label, "pci bus id", ours["pci_bus_id"].upper(),
            _text(node, "pci/pci_bus_id").upper())
        smi_mode = _text(node, "compute_mode").lower()
        row(label, "compute mode", ours["compute_mode"], smi_mode)
        current = _text(node, "mig_mode/current_mig")
        pending = _text(node, "mig_mode/pending_mig")
        if current in ("", "N/A"):
            row(label, "mig supported", "mig" not in ours["unsupported"], False)
        else:
            row(label, "mig current", ours["mig_current"], current == "Enabled")
            row(label, "mig pending", ours["mig_pending"], pending == "Enabled")
        smi_migs = sorted((int(_text(m, "gpu_instance_id")), int(_text(m, "compute_instance_id")))
                          for m in node.findall("mig_devices/mig_device"))
        row(label, "mig slices (gi, ci)",
            sorted((m["gi_id"], m["ci_id"]) for m in ours["mig_devices"]), smi_migs)
        active = _active_links(smi_index)
        ours_active = sum(1 for link in ours["nvlinks"] if link["active"])
        if active is None:
            row(label, "nvlink active", ours_active, "n/a", same=ours_active == 0)
        else:
            row(label, "nvlink active", ours_active, active)
        fabric = node.find("fabric")
        ours_fabric = ours["fabric"]
        if fabric is not None and _text(fabric, "state") not in ("", "N/A"):
            row(label, "fabric state", (ours_fabric or {}).get("state"),
                _text(fabric, "state").lower().replace(" ", "_"))
            clique = _text(fabric, "cliqueId") or _text(fabric, "clique_id")
            if clique.isdigit():
                row(label, "fabric clique", (ours_fabric or {}).get("clique_id"), int(clique))
            cluster = (_text(fabric, "clusterUuid") or _text(fabric, "cluster_uuid")).lower()
            if cluster and cluster != "n/a":
                theirs = "" if cluster.replace("-", "").strip("0") == "" else cluster
                row(label, "fabric cluster uuid", (ours_fabric or {}).get("cluster_uuid"), theirs)
        else:
            row(label, "fabric", ours_fabric and ours_fabric["state"], "n/a",
                same=ours_fabric is None or ours_fabric["state"] != "completed")
        smi_pids = sorted(int(_text(p, "pid")) for p in node.findall("processes/process_info")
                          if _text(p, "type") in ("C", "M+C", "C+G", "M"))
        ours_pids = sorted({p["pid"] for p in ours["processes"]}
                           | {p["pid"] for m in ours["mig_devices"] for p in m["processes"]})
        row(label, "compute pids", ours_pids, smi_pids)
    return rows


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out_path = argv[0]
    source = argv[argv.index("--source") + 1] if "--source" in argv else "nvml"
    inv = gpushare_inventory(source)
    smi = run(["nvidia-smi", "-q", "-x"])
    if smi.returncode != 0:
        raise SystemExit(f"nvidia-smi -q -x failed: {smi.stderr.strip() or smi.stdout.strip()}")
    rows = compare(inv, smi.stdout)
    width = max(len(r["field"]) for r in rows)
    for r in rows:
        mark = "ok " if r["match"] else "DIFF"
        print(f"{mark} gpu {r['gpu']:>2}  {r['field']:<{width}}  gpushare={r['gpushare']!s:<40} "
              f"nvidia-smi={r['nvidia_smi']}")
    bad = [r for r in rows if not r["match"]]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} fields agree")
    with open(out_path, "w") as f:
        json.dump({"inventory": inv, "comparisons": rows, "mismatches": len(bad)}, f, indent=2)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
