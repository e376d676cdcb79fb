# SPDX-License-Identifier: GPL-2.0-or-later
"""Lay one real GPU out as two MIG layouts and back, through the node's step of
``gpushare relayout`` (``gpushare.admin.relayout.apply.apply_layout``), timing each step.

Usage: python3 tests/gpu/check_relayout.py RESULTS.json [--gpu INDEX] [--timeout SECONDS]
                                          [--dry-run]

Unlike the other checks this one CHANGES the GPU: it turns MIG mode on where the layout needs
it, creates and destroys MIG instances, and lays the GPU's first layout back at the end (whole
GPU, or the MIG instances it had). Run it as root on an idle node drained from Slurm, never
on a machine whose GPU settings must be left as they are. It answers:

  first layout    the GPU becomes 7 x the smallest 1g profile (MIG mode on where needed),
                  NVML reads it back, in how many seconds
  second layout   the GPU becomes 2 x the 3g profile, in how many seconds
  back            the GPU's first layout again, in how many seconds
  busy refused    (--dry-run only) a process on the GPU makes the step refuse, nothing changes

The GPU model comes from NVML's name and memory (an H100, H200, B200 or GB200: MIG mode
applies at once there; an A100 or A30 needs a GPU reset, which the step refuses). Prints a
table, writes every result to RESULTS.json (keep them under tests/gpu/results/), exits 1
when a check fails. ``--dry-run`` runs the same steps on the simulated NVML with an H200
profile, to check the script itself. Not a pytest module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [os.path.join(REPO, "src")]

from gpushare.admin.mig_profiles import GPU_MODELS, GpuModel  # noqa: E402
from gpushare.admin.plan import parse_plan  # noqa: E402
from gpushare.admin.relayout.apply import ApplyError, apply_layout  # noqa: E402
from gpushare.admin.relayout.menu import layout_name  # noqa: E402
from gpushare.gpu.inventory import collect, load_nvml  # noqa: E402
from gpushare.gpu.nvml import InventoryError  # noqa: E402

NODE = "gpucheck"


def plan_text(model: GpuModel, gpus: int, menu: list[str]) -> str:
    items = "".join(f"        - {item}\n" for item in menu)
    return ("version: 1\nslurm: {version: '24.11'}\nnode_groups:\n"
            f"  - name: check\n    nodes: {NODE}\n    gpu_model: {model.name}\n"
            f"    gpus: {gpus}\n    layout:\n      all: {{owner: slurm}}\n"
            f"    relayout:\n      min_interval_s: 0\n      menu:\n{items}")


def layout_of(source: str, index: int) -> str:
    gpu = collect(load_nvml(source), source).gpus[index]
    if not gpu.mig_current:
        return "whole"
    if not gpu.mig_devices:
        return "MIG with no instances"
    return layout_name(tuple(sorted(d.profile for d in gpu.mig_devices)))


def model_of(source: str, index: int) -> tuple[Optional[GpuModel], str, int]:
    inventory = collect(load_nvml(source), source)
    gpu = inventory.gpus[index]
    for model in GPU_MODELS:
        if model.profiles and model.matches_nvml_name(gpu.name, gpu.memory_total):
            return model, gpu.name, len(inventory.gpus)
    return None, gpu.name, len(inventory.gpus)


def layouts_for(model: GpuModel) -> tuple[str, str]:
    """7 x the 1g profile and 2 x the 3g profile of ``model`` (e.g. 7x1g.18gb, 2x3g.71gb)."""
    def named(compute: int) -> str:
        return next(p.name for p in model.profiles
                    if p.name.startswith(f"{compute}g.") and "+" not in p.name)
    return f"7x{named(1)}", f"2x{named(3)}"


def simulated_profile(directory: str) -> str:
    from gpushare.gpu.nvml_sim_plan import profile_from_plan

    model = next(m for m in GPU_MODELS if m.name == "h200-141gb")
    plan = parse_plan(plan_text(model, 2, ["whole"]), os.path.join(directory, "plan.yaml"))
    path = os.path.join(directory, "node.json")
    with open(path, "w") as handle:
        json.dump(profile_from_plan(plan, NODE), handle)
    return path


def step(results: list[dict[str, Any]], check: str, source: str, plan: Any, index: int,
         layout: str, timeout: float) -> bool:
    started = time.monotonic()
    try:
        result = apply_layout(load_nvml(source), plan, NODE, index, layout, timeout_s=timeout,
                              dry_run=False)
    except (ApplyError, InventoryError) as err:
        results.append({"check": check, "ok": False, "seconds": None, "detail": str(err)})
        return False
    seconds = round(time.monotonic() - started, 2)
    seen = layout_of(source, index)
    ok = seen == layout
    results.append({"check": check, "ok": ok, "seconds": seconds,
                    "detail": f"{result.old} -> {seen} in {seconds} s ({len(result.steps)} "
                              "NVML steps)" + ("" if ok else f"; wanted {layout}"),
                    "steps": result.steps})
    return ok


def busy_refused(results: list[dict[str, Any]], source: str, plan: Any, index: int,
                 layout: str) -> None:
    path = source.split(":", 1)[1]
    with open(path) as handle:
        profile = json.load(handle)
    before = layout_of(source, index)
    profile["gpus"][index]["processes"] = [{"pid": 4242, "kind": "compute"}]
    with open(path, "w") as handle:
        json.dump(profile, handle)
    try:
        apply_layout(load_nvml(source), plan, NODE, index, layout, dry_run=False)
        ok, detail = False, "the step changed a GPU in use"
    except ApplyError as err:
        ok, detail = "in use" in str(err) and layout_of(source, index) == before, str(err)
    profile["gpus"][index]["processes"] = []
    with open(path, "w") as handle:
        json.dump(profile, handle)
    results.append({"check": "busy refused", "ok": ok, "seconds": None, "detail": detail})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--gpu", type=int, help="the GPU to change (default: the last one)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="each step's time limit, as --step-timeout (default 120)")
    parser.add_argument("--dry-run", action="store_true",
                        help="the simulated NVML (an H200 profile) instead of the driver")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    machine: dict[str, Any] = {"dry_run": args.dry_run}
    with tempfile.TemporaryDirectory() as scratch:
        source = "sim:" + simulated_profile(scratch) if args.dry_run else "nvml"
        model, name, count = model_of(source, args.gpu if args.gpu is not None else -1)
        index = args.gpu if args.gpu is not None else count - 1
        machine.update(gpu_name=name, gpu_index=index, gpus=count)
        first = layout_of(source, index)
        machine["first_layout"] = first
        if model is None:
            results.append({"check": "model", "ok": False, "seconds": None,
                            "detail": f"{name} is no MIG-capable model gpushare knows"})
        elif first == "MIG with no instances":
            results.append({"check": "first layout", "ok": False, "seconds": None,
                            "detail": "MIG mode is on with no instances: nothing to lay back"})
        else:
            small, large = layouts_for(model)
            menu = list(dict.fromkeys(["whole", small, large, first]))
            plan = parse_plan(plan_text(model, count, menu), os.path.join(scratch, "plan.yaml"))
            machine["model"] = model.name
            if args.dry_run:
                busy_refused(results, source, plan, index, small)
            step(results, "first layout", source, plan, index, small, args.timeout)
            step(results, "second layout", source, plan, index, large, args.timeout)
            step(results, "back", source, plan, index, first, args.timeout)
    width = max(len(r["check"]) for r in results)
    print(f"{'CHECK':<{width}}  RESULT  DETAIL")
    for r in results:
        print(f"{r['check']:<{width}}  {'ok' if r['ok'] else 'FAIL':<6}  {r['detail']}")
    with open(args.results, "w") as handle:
        json.dump({"machine": machine, "results": results}, handle, indent=2)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
