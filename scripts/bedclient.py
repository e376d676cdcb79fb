# SPDX-License-Identifier: GPL-2.0-or-later
"""What the tests ask of a running local Slurm (``slurmbed.SlurmBed``): its paths, the
Slurm clients run against it (as root or a test user), jobs' states and output, nodes'
states, and the daemons' and gpushare's logs. ``slurmbed`` sets the bed up and runs it."""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import Callable, Iterable, Optional, Sequence

TEST_USERS = ("gpushare-u1", "gpushare-u2")
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


class BedError(RuntimeError):
    """The local Slurm could not be set up or did not behave."""


class BedClient:
    """A bed's paths and clients: what a test reads and runs, whoever started the bed."""

    root: str

    # ---- layout ---------------------------------------------------------------------

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def conf(self) -> str:
        return self.path("etc", "slurm.conf")

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=self.conf, GPUSHARE_FACTS=self.facts_path)

    @property
    def state_dir(self) -> str:
        # Short: MPS's control socket lies below it and a socket path has at most 107 bytes.
        return self.path("s")

    def state_of(self, node: str) -> str:
        """The plugin's state directory on ``node`` (state_dir=<root>/state/%n)."""
        return os.path.join(self.state_dir, node)

    @property
    def debug_log(self) -> str:
        return self.path("log", "gpushare-debug.log")

    @property
    def out_dir(self) -> str:
        return self.path("out")

    @property
    def facts_path(self) -> str:
        return self.path("etc", "gpushare-facts.json")

    # ---- clients --------------------------------------------------------------------

    def run(self, argv: Sequence[str], user: Optional[str] = None, check: bool = True,
            timeout: float = 120.0, env: Optional[dict[str, str]] = None,
            input_text: Optional[str] = None) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client (optionally as a test user) against this bed."""
        full_env = self.env
        if env:
            full_env.update(env)
        if user:
            keep = ",".join(sorted(set(env or {}) | {"SLURM_CONF"}))
            argv = ["runuser", "-u", user, f"--whitelist-environment={keep}", "--", *argv]
        result = subprocess.run(list(argv), env=full_env, capture_output=True, text=True,
                                timeout=timeout, input=input_text, cwd=self.out_dir)
        if check and result.returncode != 0:
            raise BedError(f"{' '.join(argv)} exited {result.returncode}\nstdout: "
                           f"{result.stdout}\nstderr: {result.stderr}")
        return result

    def sbatch(self, script: str, *args: str, user: str = TEST_USERS[0],
               env: Optional[dict[str, str]] = None) -> int:
        """Submit a batch script (text); returns the job id. Output goes to out/<id>.out."""
        path = os.path.join(self.out_dir, f"script-{time.monotonic_ns()}.sh")
        with open(path, "w") as handle:
            handle.write("#!/bin/bash\n" + script + "\n")
        os.chmod(path, 0o755)
        result = self.run(["sbatch", "--parsable", f"--output={self.out_dir}/%j.out", *args,
                           path], user=user, env=env)
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (array tasks: the first record)."""
        result = self.run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
        text = result.stdout.splitlines()[0] if result.stdout.strip() else ""
        return dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", text))

    def wait_job(self, job_id: int, timeout: float = 120.0,
                 states: Iterable[str] = TERMINAL_STATES) -> dict[str, str]:
        wanted = set(states)
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in wanted:
                return info
            time.sleep(0.2)
        raise BedError(f"job {job_id} not in {sorted(wanted)} after {timeout:.0f}s: {info}")

    def wait_requeued_held(self, job_id: int, timeout: float = 120.0) -> dict[str, str]:
        """The job once requeued and now held, as slurmctld leaves a batch job whose prolog
        failed (the bed sets no nohold_on_prolog_fail); BedError after ``timeout``."""
        deadline = time.monotonic() + timeout
        info: dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if requeued_held(info):
                return info
            time.sleep(0.2)
        raise BedError(f"job {job_id} not requeued and held after {timeout:.0f}s: {info}")

    def end_held(self, job_id: int) -> dict[str, str]:
        """A job whose prolog failed: waits until slurmctld has requeued and held it (a
        cancel sent before that can be overtaken by the requeue), then cancels it and
        waits for its end."""
        self.wait_requeued_held(job_id)
        self.run(["scancel", str(job_id)], check=False)
        return self.wait_job(job_id)

    def output(self, job_id: int, default: Optional[str] = None) -> str:
        """The job's output file; ``default`` where slurmstepd has not made it (yet)."""
        try:
            with open(os.path.join(self.out_dir, f"{job_id}.out")) as handle:
                return handle.read()
        except FileNotFoundError:
            if default is None:
                raise
            return default

    def node_state(self, node: str) -> dict[str, str]:
        result = self.run(["scontrol", "show", "node", "-o", node])
        return dict(re.findall(r"(\w+)=((?:[^ ]| (?!\w+=))*)", result.stdout.strip()))

    def resume(self, *nodes: str) -> None:
        for node in nodes:
            self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)

    def logs(self, tail: int = 60) -> str:
        """The last lines of each daemon log, for failure reports."""
        chunks = []
        for name in sorted(os.listdir(self.path("log"))) if os.path.isdir(self.path("log")) else []:
            with open(self.path("log", name), errors="replace") as handle:
                lines = handle.readlines()[-tail:]
            chunks.append(f"==> {name} <==\n" + "".join(lines))
        return "\n".join(chunks)

    def lines_about(self, job_ids: list[str], most: int = 60) -> str:
        """Every daemon log's and the debug log's lines naming one of ``job_ids`` (as
        gpushare and Slurm write a job id), for a report of what a job left behind."""
        if not job_ids:
            return ""
        marks = tuple(mark for job in job_ids for mark in (
            f"job {job}:", f"job={job} ", f"JobId={job} ", f"[{job}.", f"job {job} ",
            f"jobs {job},", f",{job} "))
        found = []
        names = sorted(os.listdir(self.path("log"))) if os.path.isdir(self.path("log")) else []
        for path in [self.path("log", name) for name in names] + [self.debug_log]:
            if not os.path.exists(path):
                continue
            with open(path, errors="replace") as handle:
                found += [f"{os.path.basename(path)}: {line.rstrip()}" for line in handle
                          if any(mark in line for mark in marks)]
        return "\n".join(found[-most:])

    def debug_lines(self) -> list[str]:
        if not os.path.exists(self.debug_log):
            return []
        with open(self.debug_log) as handle:
            return handle.read().splitlines()


def requeued_held(info: dict[str, str]) -> bool:
    """Whether ``scontrol show job`` fields say requeued once and held."""
    return info.get("JobState") == "PENDING" and info.get("Restarts") == "1" and (
        info.get("Priority") == "0" or "held" in info.get("Reason", "").lower())


def eligible_in(info: dict[str, str]) -> float:
    """Seconds until slurmctld may start the job (``scontrol show job``'s EligibleTime, in
    local time): a requeued batch job waits Slurm's requeue delay (about two minutes) after
    its requeue, held or not; 0 when it may start now."""
    try:
        at = time.mktime(time.strptime(info.get("EligibleTime", ""), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return 0.0
    return max(0.0, at - time.time())


def worker_ended(line: str, callback: str, rc: str = "0") -> bool:
    """Whether a debug line says a job worker's ``callback`` ended with ``rc`` ("": any),
    run in the worker's own interpreter (``python rc=``) or by a child of the node's prefork
    server (``prefork rc=``, the default after a node's first worker)."""
    return any(f"cb={callback} {how} rc={rc}" in line for how in ("python", "prefork"))


WORKER_STARTED = re.compile(r" pid=(\d+) .*(?:python=start|cb=\S+ prefork child=\d+)")
"""A worker's first debug line, either way it runs its callback; ``pid=`` is the worker's."""


def wait_until(what: str, check: Callable[[], object], timeout: float = 60.0) -> object:
    """``check()``'s first true value, polled until ``timeout``; AssertionError naming
    ``what`` after that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not true after {timeout:.0f} s")
        time.sleep(0.2)
