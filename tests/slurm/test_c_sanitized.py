# SPDX-License-Identifier: GPL-2.0-or-later
"""The SPANK plugin built with AddressSanitizer and UndefinedBehaviorSanitizer
(``GPUSHARE_SANITIZE=1 spank/build.py``) and run through real jobs in a bed of its own:
srun and sbatch load it, slurmd's job prologs and epilogs and slurmstepd's tasks run it.
The jobs take every C path: a worker's prolog, a join in C with a ticket, a leave in C, a
last job's epilog, a refused request's task, srun's options. Slurm's programs are not
instrumented, so the sanitizers' runtime is preloaded into them (``LD_PRELOAD``); every
report goes to a log file (``log_path``) and any such file fails the test. slurmd starts
slurmstepd with an environment of its own making, so each slurmd of this bed runs in a
mount namespace of its own where /usr/sbin/slurmstepd is a wrapper that preloads it."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import shutil
import subprocess
import tempfile
from typing import Optional

import pytest

import slurmbed
from slurmbed import wait_until

pytestmark = pytest.mark.slurm

U1 = slurmbed.TEST_USERS[0]
PREFIX = "sz"  # its own node names: slurmd's cgroups are named after them
NODE, OTHER = f"{PREFIX}1", f"{PREFIX}2"
ROOT = os.environ.get("GPUSHARE_SANITIZED_BED_ROOT", "/tmp/gpushare-sanitized-bed")
PORT = int(os.environ.get("GPUSHARE_SANITIZED_BED_PORT", "17600"))
SLURMSTEPD = "/usr/sbin/slurmstepd"
ENV_SCRIPT = ("for v in SLURM_JOB_ID CUDA_VISIBLE_DEVICES CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
              "CUDA_MPS_PIPE_DIRECTORY; do echo \"$v=${!v}\"; done\nsleep {sleep}\n")


def gcc_runtime(name: str) -> Optional[str]:
    """The shared sanitizer runtime gcc links (libasan.so), or None."""
    found = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True,
                           text=True).stdout.strip()
    return os.path.realpath(found) if os.path.isabs(found) and os.path.exists(found) else None


@dataclasses.dataclass
class SanitizedBed(slurmbed.SlurmBed):
    """A bed whose daemons and clients run the sanitized plugin with the runtime preloaded."""

    sanitizer_env: dict[str, str] = dataclasses.field(default_factory=dict)
    sanitized_plugin: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, **self.sanitizer_env}

    def _install_gpushare(self) -> None:
        super()._install_gpushare()
        shutil.copy2(self.sanitized_plugin, self.path("lib", "spank_gpushare.so"))
        with open(self.path("bin", "slurmstepd.real"), "w"):
            pass  # where the real one is bound, inside each slurmd's namespace
        wrapper = self.path("bin", "slurmstepd-sanitized")
        exports = "".join(f"export {name}='{value}'\n"
                          for name, value in self.sanitizer_env.items())
        with open(wrapper, "w") as handle:
            handle.write(f"#!/bin/bash\n{exports}exec -a \"$0\" "
                         f"{self.path('bin', 'slurmstepd.real')} \"$@\"\n")
        os.chmod(wrapper, 0o755)

    def start_slurmd(self, node: str) -> None:
        real, wrapper = self.path("bin", "slurmstepd.real"), self.path("bin",
                                                                        "slurmstepd-sanitized")
        self._spawn(f"slurmd-{node}", [
            "unshare", "--mount", "--propagation", "private", "sh", "-c",
            f"mount --bind {SLURMSTEPD} {real} && mount --bind {wrapper} {SLURMSTEPD} && "
            f"exec slurmd -N {node}"], self.path("run", f"slurmd-{node}.pid"))

    def as_user(self, argv: list[str], check: bool = True
                ) -> subprocess.CompletedProcess[str]:
        """A client run as the test user, keeping the sanitizer's variables."""
        return self.run(argv, user=U1, env=dict(self.sanitizer_env), check=check)

    def submit(self, script: str, *args: str) -> int:
        return self.sbatch(script, *args, user=U1, env=dict(self.sanitizer_env))


@pytest.fixture
def reports():
    """Where the sanitizers write: every user's processes may (the tasks' callbacks run
    as the job's user)."""
    path = tempfile.mkdtemp(prefix="gpushare-sanitizer.")
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def sanitized_plugin(out_dir: str) -> str:
    out = os.path.join(out_dir, "spank_gpushare.so")
    subprocess.run(["/usr/bin/python3", os.path.join(slurmbed.REPO, "spank", "build.py"),
                    "--out", out], check=True, env=dict(os.environ, GPUSHARE_SANITIZE="1"),
                   stdout=subprocess.DEVNULL)
    return out


def report_text(path: str) -> str:
    texts = []
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), errors="replace") as handle:
            texts.append(f"--- {name}\n{handle.read()[-6000:]}")
    return "\n".join(texts)


def maps_of_steps(job_id: int) -> list[str]:
    """The memory maps of the job's slurmstepd processes."""
    maps = []
    for cmdline_path in glob.glob("/proc/[0-9]*/cmdline"):
        with contextlib.suppress(OSError), open(cmdline_path, "rb") as handle:
            if handle.read().startswith(f"slurmstepd: [{job_id}".encode()):
                with open(os.path.join(os.path.dirname(cmdline_path), "maps")) as maps_file:
                    maps.append(maps_file.read())
    return maps


def prolog_lines(bed: slurmbed.SlurmBed, job_id: int) -> list[str]:
    return [line for line in bed.debug_lines()
            if f" job={job_id} " in line and "cb=job_prolog" in line]


def run_jobs(bed: SanitizedBed) -> None:
    """A worker's prolog (the holder), a join and a leave in C, srun's options and a
    refused request, then the last job's epilog."""
    holder = bed.submit("sleep 60", "--gres=mps:25", "-w", NODE, "-c1")
    ticket = os.path.join(bed.state_of(NODE), "daemons", "tickets",
                          f"u{slurmbed.uid_of(U1)}.g0.s25")
    wait_until("the holder's join ticket", lambda: os.path.exists(ticket), 60)
    maps = maps_of_steps(holder)
    assert maps and all("libasan" in m and "spank_gpushare.so" in m for m in maps), \
        "the holder's slurmstepd does not run the sanitized plugin"
    joined = bed.submit(ENV_SCRIPT.replace("{sleep}", "1"), "--gres=mps:25", "-w", NODE, "-c1")
    assert bed.wait_job(joined, timeout=60)["JobState"] == "COMPLETED"
    assert any("python=skip reason=joined" in line for line in prolog_lines(bed, joined)), \
        prolog_lines(bed, joined)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in bed.output(joined)
    step = bed.as_user(["srun", "-w", OTHER, "--gres=mps:50", "--gpu-share=50", "bash", "-c",
                        "echo share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
    assert "share=50" in step.stdout, step.stdout + step.stderr
    refused = bed.as_user(["srun", "-w", OTHER, "--gres=mps:50", "--gpu-share=20", "true"],
                          check=False)
    assert refused.returncode != 0 and "ask for different shares" in refused.stderr
    bed.run(["scancel", str(holder)])
    assert bed.wait_job(holder, timeout=60)["JobState"] == "CANCELLED"
    wait_until("the last epilog", lambda: not os.path.exists(ticket), 60)


def test_the_sanitized_plugin_runs_real_jobs_without_a_report(reports, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm needs root")
    libasan = gcc_runtime("libasan.so")
    if libasan is None:
        pytest.skip("gcc's AddressSanitizer runtime (libasan) is not installed")
    plain = slurmbed.plan_bed(root=ROOT, port_base=PORT, node_prefix=PREFIX)
    bed = SanitizedBed(
        **{f.name: getattr(plain, f.name) for f in dataclasses.fields(plain)},
        sanitized_plugin=sanitized_plugin(str(tmp_path)),
        sanitizer_env={
            "LD_PRELOAD": libasan,
            # Slurm's own programs are not instrumented: their leaks are not ours to find.
            "ASAN_OPTIONS": f"log_path={reports}/asan:detect_leaks=0:halt_on_error=1",
            "UBSAN_OPTIONS": f"log_path={reports}/ubsan:print_stacktrace=1",
        })
    try:
        with bed:
            run_jobs(bed)
    except (AssertionError, slurmbed.BedError) as err:
        raise AssertionError(f"{err}\nsanitizer reports:\n{report_text(reports)}") from None
    assert not os.listdir(reports), report_text(reports)
