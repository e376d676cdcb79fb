# SPDX-License-Identifier: GPL-2.0-or-later
"""Ground truth for ``gpushare usage``'s bandwidth shares: two MPS clients on one real GPU,
one bandwidth-bound and one compute-bound, each run alone and then side by side.

Usage: python3 tests/gpu/check_usage.py RESULTS.json [--mps-control PATH] [--python PATH]
                                       [--gpu INDEX] [--seconds S] [--dry-run]

Run as root on a machine with an NVIDIA GPU (GPM, for the bandwidth figure: Hopper or
later). It starts one MPS control daemon of its own (a private pipe directory), runs the
PyTorch clients through it, and reads the GPU with the sampler's own reader
(``gpushare.node.usage.nvmlread.NvmlReader``) and split
(``gpushare.node.usage.sampler.bandwidth_shares``) once a second. It answers:

  calls          which NVML calls the driver supports (GPM, per-process utilisation,
                 the MPS client list): what gpushare labels unavailable
  clients seen   the MPS list names both clients, with their device memory
  solo bw        each client alone: the GPU's DRAM bandwidth use (GPM), its own figure
  solo memUtil   each client alone: does per-process memUtil name the client, or only
                 the MPS server (the doubt dcgm-exporter #388 and #478 report)?
  shared split   side by side: each client's share as gpushare estimates it, against its
                 solo figure; within 10 percentage points passes (the issue's goal), and
                 the result says whether "estimated" is earned or the split is not usable

Prints a table, writes every sample and result to RESULTS.json (keep them under
tests/gpu/results/), exits 1 when a check fails. It only reads the GPU's settings; it
never changes compute mode, MIG mode or clocks. ``--dry-run`` runs the same steps on the
simulated NVML with stand-in clients (no GPU, no PyTorch, no MPS) to check the script.
Not a pytest module.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [os.path.join(REPO, "src")]

from gpushare.gpu.inventory import load_nvml  # noqa: E402
from gpushare.node.usage.nvmlread import DeviceSample, NvmlReader  # noqa: E402
from gpushare.node.usage.sampler import bandwidth_shares  # noqa: E402

TOLERANCE_PP = 10.0

# The clients: "bw" streams copies of 2 GiB buffers (DRAM-bound), "sm" multiplies small
# matrices that stay in cache (compute-bound). Each runs until killed.
CLIENT = r'''
import os, sys, time
kind = sys.argv[1]
if os.environ.get("GPUSHARE_CHECK_DRY") == "1":
    while True:
        time.sleep(1)
import torch
torch.cuda.init()
if kind == "bw":
    a = torch.empty(1 << 30, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    while True:
        for _ in range(20):
            b.copy_(a)
        torch.cuda.synchronize()
else:
    x = torch.randn(2048, 2048, dtype=torch.float16, device="cuda")
    while True:
        for _ in range(50):
            y = x @ x
        torch.cuda.synchronize()
'''


class Run:
    """One client set on the GPU: the processes, and the samples taken while they ran."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[dict[str, Any]] = []


def dry_profile(directory: str, pids: dict[str, int]) -> str:
    """A simulated H200 whose GPM and memUtil give what the real check expects."""
    procs = []
    bw = 0.0
    for kind, pid in pids.items():
        util = {"bw": (20, 70), "sm": (90, 4)}[kind]
        procs.append({"pid": pid, "used_memory_mib": 4096, "kind": "mps",
                      "sm_util": util[0], "mem_util": util[1]})
        bw += {"bw": 68.0, "sm": 4.0}[kind]
    path = os.path.join(directory, "h200.json")
    with open(path, "w") as f:
        json.dump({"format": 1, "driver_version": "570.133.20", "cuda_driver_version": 12080,
                   "gpus": [{"minor": 0, "uuid": "GPU-00000000-0000-0000-0000-0000000000c8",
                             "name": "NVIDIA H200", "memory_mib": 143771,
                             "pci_bus_id": "00000000:18:00.0", "mig": None,
                             "gpm": {"dram_bw_util": min(bw, 100.0)}, "processes": procs}]},
                  f)
    return path


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="gs-check-usage-")
        self.pipe = os.path.join(self.tmp, "pipe")
        self.logs = os.path.join(self.tmp, "log")
        self.results: list[tuple[str, bool, str]] = []
        self.report: dict[str, Any] = {"runs": {}}
        self.env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=self.pipe,
                        CUDA_MPS_LOG_DIRECTORY=self.logs,
                        CUDA_VISIBLE_DEVICES=str(args.gpu))
        if args.dry_run:
            self.env["GPUSHARE_CHECK_DRY"] = "1"

    def result(self, name: str, ok: bool, detail: str) -> None:
        self.results.append((name, ok, detail))

    def start_daemon(self) -> None:
        os.makedirs(self.pipe)
        os.makedirs(self.logs)
        if not self.args.dry_run:
            subprocess.run([self.args.mps_control, "-d"], env=self.env, check=True,
                           timeout=30)

    def stop_daemon(self) -> None:
        if not self.args.dry_run:
            subprocess.run([self.args.mps_control], input=b"quit\n", env=self.env,
                           timeout=30, check=False)

    def clients(self, kinds: list[str]) -> dict[str, subprocess.Popen[bytes]]:
        python = self.args.python if not self.args.dry_run else sys.executable
        return {kind: subprocess.Popen([python, "-c", CLIENT, kind], env=self.env)
                for kind in kinds}

    def nvml(self, pids: dict[str, int]) -> Any:
        source = "nvml" if not self.args.dry_run else "sim:" + dry_profile(self.tmp, pids)
        nvml = load_nvml(source)
        nvml.nvmlInit()
        return nvml

    def measure(self, kinds: list[str]) -> Run:
        run = Run("+".join(kinds))
        procs = self.clients(kinds)
        try:
            pids = {kind: p.pid for kind, p in procs.items()}
            nvml = self.nvml(pids)
            reader = NvmlReader(nvml, settle=0.2)
            time.sleep(0 if self.args.dry_run else 8)  # CUDA start, buffers allocated
            for _ in range(self.args.seconds):
                device = self.device(reader, nvml)
                if device is not None:
                    run.samples.append(self.sample(device, pids, reader))
                time.sleep(0 if self.args.dry_run else 1)
            reader.close()
            nvml.nvmlShutdown()
        finally:
            for proc in procs.values():
                proc.kill()
                proc.wait()
        self.report["runs"][run.name] = run.samples
        return run

    def device(self, reader: NvmlReader, nvml: Any) -> Optional[DeviceSample]:
        samples = reader.read()
        if self.args.dry_run:
            return samples[0]
        uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(self.args.gpu))
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        return next((s for s in samples if s.uuid == uuid), None)

    @staticmethod
    def sample(device: DeviceSample, pids: dict[str, int],
               reader: NvmlReader) -> dict[str, Any]:
        by_pid = {kind: device.procs.get(pid) for kind, pid in pids.items()}
        shares = bandwidth_shares(device, {pid: (device.procs[pid].mem_util or 0.0)
                                           for pid in pids.values() if pid in device.procs})
        return {"bw_util": device.bw_util, "util_measured": device.util_measured,
                "unsupported": sorted(reader.unsupported),
                "pids_seen": sorted(device.procs),
                "clients": {kind: None if p is None else
                            {"mem_bytes": p.mem_bytes, "sm": p.sm, "mem_util": p.mem_util}
                            for kind, p in by_pid.items()},
                "shares": {kind: (shares or {}).get(pid) for kind, pid in pids.items()}}

    def run(self) -> int:
        self.start_daemon()
        try:
            solo = {kind: self.measure([kind]) for kind in ("bw", "sm")}
            both = self.measure(["bw", "sm"])
        finally:
            self.stop_daemon()
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.judge(solo, both)
        return self.finish()

    def judge(self, solo: dict[str, Run], both: Run) -> None:
        last = both.samples[-1] if both.samples else {}
        unsupported = last.get("unsupported", ["(no sample)"])
        self.result("calls", not unsupported,
                    "all supported" if not unsupported else "unsupported: " +
                    ", ".join(unsupported))
        seen = [k for k, c in last.get("clients", {}).items() if c and c["mem_bytes"]]
        self.result("clients seen", len(seen) == 2,
                    f"with device memory: {', '.join(seen) or 'none'}")
        for kind, run in solo.items():
            bws = [s["bw_util"] for s in run.samples if s["bw_util"] is not None]
            named = [s for s in run.samples if (s["clients"].get(kind) or {}).get("mem_util")
                     is not None]
            self.report[f"solo_{kind}_bw"] = statistics.median(bws) if bws else None
            self.result(f"solo bw {kind}", bool(bws),
                        f"median {statistics.median(bws):.1f} %" if bws else "no GPM figure")
            self.result(f"solo memUtil {kind}", bool(named),
                        f"client named in {len(named)}/{len(run.samples)} samples")
        for kind in ("bw", "sm"):
            shares = [s["shares"][kind] for s in both.samples if s["shares"][kind] is not None]
            alone = self.report.get(f"solo_{kind}_bw")
            if not shares or alone is None:
                self.result(f"shared split {kind}", False, "no estimate: not usable here")
                continue
            estimate = statistics.median(shares)
            self.report[f"shared_{kind}_estimate"] = estimate
            ok = abs(estimate - alone) <= TOLERANCE_PP
            self.result(f"shared split {kind}", ok,
                        f"estimated {estimate:.1f} % against {alone:.1f} % alone "
                        f"(within {TOLERANCE_PP:g} pp: {'yes' if ok else 'no'})")

    def finish(self) -> int:
        width = max(len(name) for name, _ok, _d in self.results)
        print(f"{'CHECK'.ljust(width)}  RESULT  DETAIL")
        for name, ok, detail in self.results:
            print(f"{name.ljust(width)}  {'ok' if ok else 'FAIL':6}  {detail}")
        self.report["results"] = [{"check": n, "ok": ok, "detail": d}
                                  for n, ok, d in self.results]
        self.report["dry_run"] = self.args.dry_run
        with open(self.args.results, "w") as f:
            json.dump(self.report, f, indent=1)
        return 0 if all(ok for _n, ok, _d in self.results) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--mps-control", default=shutil.which("nvidia-cuda-mps-control")
                        or "/usr/bin/nvidia-cuda-mps-control")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--seconds", type=int, default=15,
                        help="samples per run, one a second (default 15)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0 and not args.dry_run:
        print("check_usage: run as root", file=sys.stderr)
        return 2
    return Check(args).run()


if __name__ == "__main__":
    sys.exit(main())
