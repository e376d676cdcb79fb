# SPDX-License-Identifier: GPL-2.0-or-later
"""Drive gpushare's MPS lifecycle with the real nvidia-cuda-mps-control and a PyTorch client.

Usage: python3 tests/gpu/check_mps.py RESULTS.json [--mps-control PATH] [--python PATH]
                                     [--gpu INDEX] [--dry-run]

Run as root on a machine with an NVIDIA GPU. It creates two system users if missing, starts
daemons through ``gpushare.node.mps.MpsManager`` (the code job_prolog runs) and answers:

  side by side   two users' daemons on one GPU (separate pipe dirs) both serve a busy
                 client at the same time: neither waits for the other
  pinned limit   a client of a 25 % share can allocate below its pinned device memory
                 limit and fails past it; also with the variable unset in the client (the
                 daemon's default still holds)
  device index   the client sees one device, index 0 (CUDA_VISIBLE_DEVICES=0 as the plugin
                 sets it), and its UUID is the GPU's the daemon was given
  device by UUID the client also finds its device when CUDA_VISIBLE_DEVICES holds the GPU's
                 UUID, as a --gpu-mps task keeps it under Slurm 26.05's gres.conf
                 Flags=env_uuid (gpushare then leaves Slurm's UUIDs in place)
  cleanup        release stops every daemon; no record and no daemon process remain

Prints a table, writes every result to RESULTS.json (keep them under tests/gpu/results/),
exits 1 when a check fails. It only reads GPU settings (``nvidia-smi --query-gpu``); it
never changes compute mode, MIG mode or clocks. ``--dry-run`` runs the same steps with the
stand-in daemon and an emulated client (no GPU, no PyTorch) to check the script itself.
Not a pytest module.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path[:0] = [os.path.join(REPO, "src"), os.path.join(REPO, "scripts")]

from gpushare.common import proc  # noqa: E402
from gpushare.node.config import PluginConfig  # noqa: E402
from gpushare.node.mps import MpsDevice, MpsError, MpsLease, MpsManager  # noqa: E402
from mps_standin.harness import StandinInstall, ensure_users, traversable_tmpdir  # noqa: E402

MIB = 1 << 20
BUSY_SECONDS = 6.0
CLIENT_TIMEOUT = 240.0

# The client: one JSON line on stdout. Runs as the job's user with the lease's environment.
CLIENT = r'''
import json, os, sys, time
mode, arg = sys.argv[1], float(sys.argv[2])
out = {"mode": mode, "pid": os.getpid(), "uid": os.getuid(),
       "env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_")}}
if os.environ.get("GPUSHARE_CHECK_DRY") == "1":
    # Emulation for --dry-run: what a CUDA client would see from the environment alone.
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    out.update(device_count=len(visible), uuid=os.environ["GPUSHARE_CHECK_DRY_UUID"],
               ready=time.time())
    limit = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=" +
                           os.environ.get("GPUSHARE_CHECK_DRY_DEFAULT", "0M"))
    size = limit.split(",")[0].split("=")[1]
    cap = int(size[:-1]) << (30 if size.endswith("G") else 20)
    if mode == "alloc":
        out["allocated"] = cap == 0 or arg <= cap
        out["error"] = "" if out["allocated"] else "emulated: past the pinned limit"
    if mode == "busy":
        time.sleep(arg)
    out["end"] = time.time()
    print(json.dumps(out))
    sys.exit(0)
import torch
torch.cuda.init()
out["device_count"] = torch.cuda.device_count()
props = torch.cuda.get_device_properties(0)
out["uuid"] = "GPU-" + str(props.uuid) if not str(props.uuid).startswith(("GPU-", "MIG-")) \
    else str(props.uuid)
out["sm_count"] = props.multi_processor_count
x = torch.ones(1, device="cuda")
torch.cuda.synchronize()
out["ready"] = time.time()
if mode == "alloc":
    try:
        block = torch.empty(int(arg), dtype=torch.uint8, device="cuda")
        block.fill_(1)
        torch.cuda.synchronize()
        out["allocated"] = True
        out["error"] = ""
        del block
    except Exception as err:  # OutOfMemoryError or a CUDA error: the limit held
        out["allocated"] = False
        out["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
if mode == "busy":
    a = torch.randn(4096, 4096, device="cuda")
    kernels = 0
    deadline = time.time() + arg
    while time.time() < deadline:
        a = (a @ a).clamp_(-1, 1)
        kernels += 1
        if kernels % 16 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    out["kernels"] = kernels
out["end"] = time.time()
print(json.dumps(out))
'''


class Checker:
    """Runs the checks against one GPU and collects results."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.results: list[dict[str, Any]] = []
        self.base = traversable_tmpdir(prefix="gs-mps-")  # MPS socket paths stay short
        self.users = ensure_users()
        self.client_file = os.path.join(self.base, "client.py")
        with open(self.client_file, "w") as handle:
            handle.write(CLIENT)
        os.chmod(self.client_file, 0o644)
        if opts.dry_run:
            self.standin = StandinInstall(self.base)
            self.program = self.standin.program
        else:
            self.program = opts.mps_control
        self.config = PluginConfig(state_dir=os.path.join(self.base, "state"),
                                   mps_control=self.program, timeout=30.0)
        self.manager = MpsManager(self.config, lock_timeout=120)
        self.gpu = self._pick_gpu()

    # ------------------------------------------------------------------ facts

    def _pick_gpu(self) -> dict[str, Any]:
        if self.opts.dry_run:
            return {"index": 0, "uuid": "GPU-00000000-1111-2222-3333-444444444444",
                    "memory_mib": 81559, "compute_mode": "Default", "mig": "N/A",
                    "name": "dry run"}
        query = "index,uuid,memory.total,compute_mode,mig.mode.current,name"
        result = subprocess.run(["nvidia-smi", f"--query-gpu={query}",
                                 "--format=csv,noheader,nounits"], capture_output=True,
                                text=True, timeout=60)
        if result.returncode != 0:
            raise SystemExit(f"nvidia-smi failed: {result.stderr.strip()}")
        gpus = []
        for line in result.stdout.strip().splitlines():
            index, uuid, memory, mode, mig, name = [f.strip() for f in line.split(",", 5)]
            gpus.append({"index": int(index), "uuid": uuid, "memory_mib": int(memory),
                         "compute_mode": mode, "mig": mig, "name": name})
        if not gpus:
            raise SystemExit("nvidia-smi lists no GPU")
        # The last GPU by default: on a multi-GPU machine its index differs from the 0 the
        # client must see, so the remapping is really tested.
        wanted = self.opts.gpu if self.opts.gpu is not None else gpus[-1]["index"]
        for gpu in gpus:
            if gpu["index"] == wanted:
                return gpu
        raise SystemExit(f"no GPU with index {wanted}; nvidia-smi lists "
                         f"{[g['index'] for g in gpus]}")

    def machine(self) -> dict[str, Any]:
        info: dict[str, Any] = {"gpu": self.gpu, "mps_control": self.program,
                                "dry_run": self.opts.dry_run, "python": self.opts.python,
                                "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
        if not self.opts.dry_run:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=60)
            info["driver"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else ""
        return info

    def device(self) -> MpsDevice:
        return MpsDevice(uuid=self.gpu["uuid"], gpu_index=self.gpu["index"],
                         memory_total=self.gpu["memory_mib"] * MIB,
                         label=f"GPU {self.gpu['index']}")

    # ------------------------------------------------------------------ helpers

    def record(self, name: str, ok: Optional[bool], detail: str, **data: Any) -> None:
        self.results.append({"check": name, "ok": ok, "detail": detail, **data})

    def client_env(self, lease: MpsLease, drop: tuple[str, ...] = ()) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.base,
               **{k: v for k, v in lease.env.items() if k not in drop}}
        for key in ("LD_LIBRARY_PATH", "PYTHONPATH"):
            if os.environ.get(key):
                env[key] = os.environ[key]
        if self.opts.dry_run:
            env.update(GPUSHARE_CHECK_DRY="1", GPUSHARE_CHECK_DRY_UUID=self.gpu["uuid"])
            default = self._standin_default(lease)
            if default:
                env["GPUSHARE_CHECK_DRY_DEFAULT"] = default
        return env

    def _standin_default(self, lease: MpsLease) -> str:
        try:
            with open(os.path.join(lease.log_dir, "standin-state.json")) as handle:
                return str(json.load(handle)["default_device_pinned_mem_limit"].get("0", ""))
        except (OSError, ValueError, KeyError):
            return ""

    def start_client(self, lease: MpsLease, mode: str, arg: float,
                     drop: tuple[str, ...] = ()) -> subprocess.Popen | dict[str, Any]:
        try:
            return subprocess.Popen(
                [self.opts.python, self.client_file, mode, str(arg)],
                env=self.client_env(lease, drop), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, cwd=self.base, user=lease.uid,
                group=lease.gid, extra_groups=[], start_new_session=True)
        except OSError as err:
            return {"failed": f"cannot run {self.opts.python} as uid {lease.uid} ({err}); "
                              "give --python an interpreter with PyTorch that user can run"}

    @staticmethod
    def finish(client: subprocess.Popen | dict[str, Any]) -> dict[str, Any]:
        if isinstance(client, dict):
            return client
        try:
            stdout, stderr = client.communicate(timeout=CLIENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(client.pid, 9)
            client.communicate()
            return {"failed": f"no answer within {CLIENT_TIMEOUT:g} s (killed)"}
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if client.returncode != 0 or not lines:
            return {"failed": f"exit {client.returncode}: {stderr.strip()[-600:]}"}
        return json.loads(lines[-1])

    def control(self, lease: MpsLease, command: str) -> str:
        """One control command through the lease's pipe, as its user ('' on failure)."""
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CUDA_MPS_PIPE_DIRECTORY": lease.pipe_dir,
               "CUDA_MPS_LOG_DIRECTORY": lease.log_dir}
        try:
            result = proc.run([self.program], input_text=command + "\n", env=env,
                              uid=lease.uid, gid=lease.gid, timeout=30)
        except proc.ProcError:
            return ""
        return result.stdout

    def servers(self, lease: MpsLease) -> list[int]:
        return [int(w) for w in self.control(lease, "get_server_list").split() if w.isdigit()]

    # ------------------------------------------------------------------ checks

    def check_side_by_side(self) -> None:
        u1, u2 = self.users
        dev = self.device()
        leases = [self.manager.acquire(101, u1.pw_uid, u1.pw_gid, [dev], "shared", 50),
                  self.manager.acquire(102, u2.pw_uid, u2.pw_gid, [dev], "shared", 50)]
        separate = leases[0].pipe_dir != leases[1].pipe_dir and \
            leases[0].daemon_pid != leases[1].daemon_pid
        if self.opts.dry_run:  # a real CUDA client makes its daemon start a server
            for lease in leases:
                self.control(lease, f"start_server -uid {lease.uid}")
        clients = [self.start_client(lease, "busy", BUSY_SECONDS) for lease in leases]
        time.sleep(BUSY_SECONDS / 2)
        servers = [self.servers(lease) for lease in leases]
        outs = [self.finish(client) for client in clients]
        failed = [o["failed"] for o in outs if "failed" in o]
        if failed:
            self.record("side by side", False, "; ".join(failed), servers=servers)
        else:
            # Each client was ready (context made, first kernel done) before the other ended.
            overlap = outs[0]["ready"] < outs[1]["end"] and outs[1]["ready"] < outs[0]["end"]
            ok = separate and overlap and all(servers)
            self.record("side by side", ok,
                        f"2 daemons (pids {leases[0].daemon_pid}, {leases[1].daemon_pid}), "
                        f"servers {servers}, ran at once: {overlap}", clients=outs,
                        servers=servers)
        self.release(101, 102)

    def check_pinned_limit(self) -> None:
        u1 = self.users[0]
        lease = self.manager.acquire(201, u1.pw_uid, u1.pw_gid, [self.device()], "shared", 25)
        limit_text = lease.env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
        if not limit_text.startswith("0="):
            self.record("pinned limit", False, f"no limit in the task env: {lease.env}")
            self.release(201)
            return
        size = limit_text.split("=", 1)[1]
        limit = int(size[:-1]) << (30 if size.endswith("G") else 20)
        cases = [("below (90 %)", int(limit * 0.9), (), True),
                 ("past (110 %)", int(limit * 1.1), (), False),
                 ("past, variable unset", int(limit * 1.1),
                  ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",), False)]
        rows = []
        ok = True
        for label, nbytes, drop, expected in cases:
            out = self.finish(self.start_client(lease, "alloc", nbytes, drop))
            got = out.get("allocated")
            rows.append({"case": label, "bytes": nbytes, "expected": expected, "got": got,
                         "error": out.get("error", out.get("failed", ""))})
            ok = ok and got is expected
        words = {True: "allocated", False: "refused", None: "failed"}
        self.record("pinned limit", ok, f"limit {limit_text}; " + "; ".join(
            f"{r['case']}: {words[r['got']]}" for r in rows), cases=rows)
        self.release(201)

    def check_device_index(self) -> None:
        u1 = self.users[0]
        lease = self.manager.acquire(301, u1.pw_uid, u1.pw_gid, [self.device()], "shared", 25)
        out = self.finish(self.start_client(lease, "info", 0))
        if "failed" in out:
            self.record("device index", False, out["failed"])
        else:
            ok = (lease.env["CUDA_VISIBLE_DEVICES"] == "0" and out["device_count"] == 1
                  and out["uuid"] == self.gpu["uuid"])
            self.record("device index", ok,
                        f"CUDA_VISIBLE_DEVICES={lease.env['CUDA_VISIBLE_DEVICES']}: "
                        f"{out['device_count']} device(s), device 0 = {out['uuid']} "
                        f"(GPU {self.gpu['index']} = {self.gpu['uuid']})", client=out)
        self.release(301)

    def check_device_by_uuid(self) -> None:
        u1 = self.users[0]
        lease = self.manager.acquire(401, u1.pw_uid, u1.pw_gid, [self.device()], "shared", 25)
        by_uuid = lease._replace(env={**lease.env, "CUDA_VISIBLE_DEVICES": self.gpu["uuid"]})
        out = self.finish(self.start_client(by_uuid, "info", 0))
        if "failed" in out:
            self.record("device by UUID", False, out["failed"])
        else:
            ok = out["device_count"] == 1 and out["uuid"] == self.gpu["uuid"]
            self.record("device by UUID", ok,
                        f"CUDA_VISIBLE_DEVICES={self.gpu['uuid']}: {out['device_count']} "
                        f"device(s), device 0 = {out['uuid']}", client=out)
        self.release(401)

    def check_cleanup(self, pids: list[int]) -> None:
        left = self.manager.records()
        alive = [pid for pid in pids if _alive(pid)]
        self.record("cleanup", not left and not alive,
                    f"records left {len(left)}, daemons alive {alive or 'none'}")

    def release(self, *jobs: int) -> None:
        for job in jobs:
            self.manager.release(job)

    def run_all(self) -> None:
        pids: list[int] = []
        original = self.manager.acquire

        def acquire(*args: Any, **kwargs: Any) -> MpsLease:
            lease = original(*args, **kwargs)
            if lease.daemon_pid:
                pids.append(lease.daemon_pid)
            return lease

        self.manager.acquire = acquire  # type: ignore[method-assign]
        for name, check in (("side by side", self.check_side_by_side),
                            ("pinned limit", self.check_pinned_limit),
                            ("device index", self.check_device_index),
                            ("device by UUID", self.check_device_by_uuid)):
            try:
                check()
            except MpsError as err:
                self.record(name, False, f"MpsError: {err}")
                for job in (101, 102, 201, 301, 401):
                    try:
                        self.manager.release(job)
                    except MpsError as again:
                        self.record(name + " release", False, str(again))
        self.check_cleanup(pids)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def print_table(results: list[dict[str, Any]]) -> None:
    width = max(len(r["check"]) for r in results)
    print(f"{'CHECK'.ljust(width)}  RESULT  DETAIL")
    for r in results:
        verdict = {True: "ok", False: "FAIL", None: "n/a"}[r["ok"]]
        print(f"{r['check'].ljust(width)}  {verdict:<6}  {r['detail']}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="where to write the results JSON")
    parser.add_argument("--mps-control", default=shutil.which("nvidia-cuda-mps-control")
                        or "/usr/bin/nvidia-cuda-mps-control")
    parser.add_argument("--python", default=None,
                        help="interpreter with PyTorch the client runs under, as the test "
                        "users (default: this one; /usr/bin/python3 with --dry-run)")
    parser.add_argument("--gpu", type=int, default=None, help="GPU index (default: the last)")
    parser.add_argument("--dry-run", action="store_true",
                        help="stand-in daemon and emulated client: check the script, no GPU")
    opts = parser.parse_args(argv)
    opts.python = opts.python or ("/usr/bin/python3" if opts.dry_run else sys.executable)
    if os.geteuid() != 0:
        print("check_mps: run as root (daemons are started as two test users)", file=sys.stderr)
        return 2
    if not opts.dry_run and not os.path.exists(opts.mps_control):
        print(f"check_mps: {opts.mps_control} not found; give --mps-control", file=sys.stderr)
        return 2
    checker = Checker(opts)
    started = time.time()
    try:
        checker.run_all()
        report = {"started": started, "seconds": round(time.time() - started, 1),
                  "machine": checker.machine(), "results": checker.results}
    finally:
        checker.close()
    out_dir = os.path.dirname(os.path.abspath(opts.results))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=out_dir, delete=False) as handle:
        json.dump(report, handle, indent=1)
    os.replace(handle.name, opts.results)
    os.chmod(opts.results, 0o644)
    print_table(checker.results)
    return 0 if all(r["ok"] for r in checker.results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
