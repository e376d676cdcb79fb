# SPDX-License-Identifier: GPL-2.0-or-later
"""A soak run on the real local Slurm: a seeded random mix of shared jobs of two users,
with daemon faults, one node fault and a hostile third user, that must end with no leak, no
wrong drain and no hung job.

The mix: batch jobs, `srun` steps and arrays at various shares on the GPUs of four nodes;
jobs cancelled while their set-up runs and while they run; a job its time limit ends; a
daemon killed under its job. Each node's MPS program is a stand-in of its own
(``mps_control=.../%n/...``), so a fault hits one node only: n2's daemons ignore ``quit``,
n3's start slowly and write no pid file, n1's control client hangs for a while (a job of
root's ends under it), and n4's daemons fail to start once (the node fault: a job of a user
with no daemon there starts one, the node is drained with the cause, the job is requeued
held; the test resumes the node and releases the job).

Meanwhile the hostile user plants deep trees, many files, FIFOs, sockets, links to root's
files and a fake ``control`` in their own MPS directories, fills them, requeues and cancels
their own jobs, and from outside Slurm runs processes whose argv names the MPS program
(``exec -a``) with their daemons' pipe directories, and writes those pids (and pid 1) into
the daemons' pid files.

``GPUSHARE_SOAK_SEED=<n>`` replays a run (the seed is printed); ``GPUSHARE_SOAK_JOBS=<n>``
(default 36 submissions, a few minutes on 2 CPUs) makes it longer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import time
from typing import Any, Callable, Generator, Optional

import pytest
from tests.slurm.test_mps import U1, U2, assert_nothing_left, mps_records, standin_program
from tests.slurm.test_mps import mps_bed as _mps_bed  # noqa: F401  (a fixture)

import slurmbed
from mps_standin.harness import PROGRAM_NAME, install_standin, standin_processes

U3 = "gpushare-u3"  # the hostile user
NODES = ("n1", "n2", "n3", "n4")
HANG_NODE = "n1"  # its control client hangs while root's job there ends
QUIT_NODE = "n2"  # its daemons ignore quit: every stop takes signals
SLOW_NODE = "n3"  # its daemons take 1.5 s to start and write no pid file
SOAK_FAULT_NODE = "n4"  # the node fault: its daemons fail to start, once
NODE_FAULTS = {QUIT_NODE: ("ignore_quit",), SLOW_NODE: ("slow_start", "no_pid_file")}
SHARES = (10, 25, 33, 50, 100)
MAX_ACTIVE = 8  # jobs (array tasks each) submitted and not yet ended
POLL_S = 0.5
DEFAULT_JOBS = 36
# What a crashed or aborted slurmd or slurmstepd leaves in its log (never its own
# "debug levels are ... syslog='fatal'").
SLURMD_CRASH = re.compile(r"\bfatal: |Segmentation|internal error")
USER_FAULT_WORDS = ("the job's user put it there", "changed by its user",
                    "filled $CUDA_MPS_LOG_DIRECTORY or $CUDA_MPS_PIPE_DIRECTORY")

# Honest users' fates, the hostile user's, and how often each is drawn after the required
# ones (every run has each at least once).
HONEST_FATES = ("normal", "srun", "array", "cancel_starting", "cancel_running",
                "kill_daemon", "timelimit")
# The hostile fates that leave files in their daemon's space for as long as it lives.
SPACE_FILLERS = ("plant_deep", "plant_many", "fill")
HOSTILE_FATES = ("plant_deep", "plant_many", "plant_control", "fill", "requeue_self",
                 "cancel_self", "hostile_normal")
WEIGHTS = {"normal": 26, "srun": 8, "array": 6, "cancel_starting": 3, "cancel_running": 4,
           "kill_daemon": 3, "timelimit": 0, "plant_deep": 4, "plant_many": 3,
           "plant_control": 3, "fill": 3, "requeue_self": 1, "cancel_self": 3,
           "hostile_normal": 6}
# (fate, node or "") every run has; the long ones first.
REQUIRED = (("timelimit", ""), ("requeue_self", ""), ("cancel_starting", SLOW_NODE),
            ("cancel_running", ""), ("kill_daemon", ""), ("plant_deep", ""),
            ("plant_many", SLOW_NODE), ("plant_control", ""), ("fill", ""),
            ("cancel_self", ""), ("srun", ""), ("array", ""), ("normal", QUIT_NODE),
            ("hostile_normal", SLOW_NODE))

START_LINE = ('echo "SOAK-START job=$SLURM_JOB_ID restart=${SLURM_RESTART_COUNT:-0} '
              'pipe=$CUDA_MPS_PIPE_DIRECTORY share=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"\n')


# True when the daemon's space is out of inodes or blocks.
SPACE_FULL = ("python3 -c 'import os, sys; s = [os.statvfs(os.environ[v]) for v in "
              "(\"CUDA_MPS_LOG_DIRECTORY\", \"CUDA_MPS_PIPE_DIRECTORY\")]; "
              "sys.exit(0 if any(v.f_favail == 0 or v.f_bavail == 0 for v in s) else 1)'")


def planting(body: str) -> str:
    """A hostile job's plant: SOAK-PLANTED when ``body`` (one ``&&`` chain) succeeds;
    SOAK-SPACE-FULL when it stopped because its daemon's space is out of inodes or blocks
    (the space is the user's own, ``mps_space=``, and their earlier plants on the same
    daemon may have used it: their own job meets it); else the job fails."""
    return (f"if {body}; then echo SOAK-PLANTED\n"
            f"elif {SPACE_FULL}; then echo SOAK-SPACE-FULL\nelse exit 1\nfi\n")


PLANT_DEEP = planting(
    'cd "$CUDA_MPS_LOG_DIRECTORY" && mkdir -p "d$SLURM_JOB_ID/$(printf \'d/%.0s\' $(seq 70))"'
    ' && cd "$CUDA_MPS_PIPE_DIRECTORY" && mkdir -p "p$SLURM_JOB_ID/$(printf \'p/%.0s\' '
    '$(seq 300))"')
PLANT_MANY = planting(
    'J=$SLURM_JOB_ID && P="$CUDA_MPS_PIPE_DIRECTORY" && cd "$CUDA_MPS_LOG_DIRECTORY"'
    ' && mkdir "many.$J" && (cd "many.$J" && seq 1 3000 | sed \'s/^/f/\' | xargs touch)'
    ' && mkfifo "fifo.$J" "$P/fifo.$J"'
    " && python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])'"
    ' "sock.$J" && ln -s / "root.$J" && ln -s /etc/shadow "$P/shadow.$J"'
    ' && ln -s /etc/passwd "passwd.$J" && ln -s "$CUDA_MPS_LOG_DIRECTORY" "loop.$J"'
    ' && ln -s /nonexistent "$P/dangling.$J" && mkdir -p "deep.$J/a/b"'
    ' && ln -s / "deep.$J/a/b/up"')
PLANT_CONTROL = {
    "fifo": 'mkfifo control',
    "file": 'echo x > control',
    # A socket of the user's that never answers, for as long as the job runs.
    "socket": ("{ python3 -c 'import socket, time; s = socket.socket(socket.AF_UNIX, "
               "socket.SOCK_SEQPACKET); s.bind(\"control\"); s.listen(1); time.sleep(10)' & }"
               " && sleep 0.5"),
}
# Up to {fill} bytes, or until the daemon's own space (mps_space=, 16 MiB) is full.
FILL = planting(
    '{ head -c {fill} /dev/zero > "$CUDA_MPS_LOG_DIRECTORY/fill.$SLURM_JOB_ID" || '
    '[ -s "$CUDA_MPS_LOG_DIRECTORY/fill.$SLURM_JOB_ID" ]; } && '
    'mkdir "$CUDA_MPS_PIPE_DIRECTORY/spam.$SLURM_JOB_ID" && '
    '(cd "$CUDA_MPS_PIPE_DIRECTORY/spam.$SLURM_JOB_ID" && seq 1 2000 | xargs touch)')

# The hostile user's process outside Slurm: for each of their daemon directories it sees on
# any node, a process whose argv[0] is that node's MPS program and whose environment names
# the daemon's pipe directory, and that pid (or pid 1, for every third directory) written
# into the daemon's pid file, again whenever the file says otherwise.
PLANTER = r"""
import json, os, subprocess, sys, time
state, uid, stop, report, token = sys.argv[1:6]
programs = json.loads(sys.argv[6])
spoofers, planted, dirs = {}, {}, []
while not os.path.exists(stop):
    for node, program in sorted(programs.items()):
        mps = os.path.join(state, node, "mps")
        try:
            names = sorted(os.listdir(mps))
        except OSError:
            continue
        for name in names:
            pipe = os.path.join(mps, name, "pipe")
            if not name.startswith("u%s-" % uid) or "." in name or not os.path.isdir(pipe):
                continue
            if pipe not in spoofers:
                spoofers[pipe] = subprocess.Popen(
                    ["bash", "-c", "exec -a %s sleep 3600" % program],
                    env={"PATH": "/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": pipe,
                         "GPUSHARE_SOAK_SPOOF": token},
                    start_new_session=True, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
                dirs.append(pipe)
            value = "1" if dirs.index(pipe) % 3 == 2 else str(spoofers[pipe])
            path = os.path.join(pipe, "nvidia-cuda-mps-control.pid")
            try:
                with open(path) as handle:
                    if handle.read().strip() == value:
                        continue
            except OSError:
                pass
            try:
                with open(path, "w") as handle:
                    handle.write(value + "\n")
                planted[node] = planted.get(node, 0) + 1
            except OSError:
                pass
    time.sleep(0.1)
with open(report, "w") as handle:
    json.dump({"spoofers": spoofers, "planted": planted}, handle)
"""


# ---------------------------------------------------------------------------- the plan


@dataclasses.dataclass
class Spec:
    """One submission of the plan, or one of its two node events (kind "event")."""

    index: int
    fate: str
    user: str
    node: str
    share: int = 25
    kind: str = "batch"  # batch | srun | array | event
    sleep: int = 2
    tasks: int = 1
    when: str = ""  # cancel_self: while "starting" or "running"
    control: str = ""  # plant_control: what replaces control (PLANT_CONTROL)

    @property
    def label(self) -> str:
        if self.kind == "event":
            return f"#{self.index} {self.fate}"
        extra = f"x{self.tasks}" if self.kind == "array" else ""
        detail = self.when or self.control
        return (f"#{self.index} {self.fate}{'/' + detail if detail else ''} {self.user} "
                f"{self.kind}{extra} {self.node} mps:{self.share}")


def draw(rng: random.Random, index: int, fate: str, node: str = "") -> Spec:
    """One submission of ``fate``: its user, node, share and length, drawn."""
    hostile = fate in HOSTILE_FATES
    user = U3 if hostile else rng.choice((U1, U2))
    if not node:
        # U2's first job on the fault node must start a daemon there: U2 has no other.
        choices = [n for n in NODES if not (user == U2 and n == SOAK_FAULT_NODE)]
        if fate == "kill_daemon":  # QUIT_NODE's stops are counted: none skips quit
            choices = [n for n in choices if n != QUIT_NODE]
        node = rng.choice(choices)
    elif user == U2 and node == SOAK_FAULT_NODE:
        user = U1
    spec = Spec(index, fate, user, node, share=rng.choice(SHARES), sleep=rng.randint(1, 5))
    if fate == "srun":
        spec.kind = "srun"
    elif fate == "array":
        spec.kind, spec.tasks = "array", rng.randint(2, 4)
    elif fate in ("cancel_starting", "cancel_running", "cancel_self", "timelimit"):
        spec.sleep = 300
        spec.when = (rng.choice(("starting", "running")) if fate == "cancel_self" else "")
    elif fate == "kill_daemon":
        spec.sleep = 8
    elif fate == "requeue_self":
        spec.sleep = 4
    elif fate == "plant_control":
        spec.control = rng.choice(sorted(PLANT_CONTROL))
    return spec


def make_plan(seed: int, count: int) -> list[Spec]:
    """The soak's submissions in order, with the hang window and the node fault among them;
    every fate of REQUIRED at least once, the rest drawn by WEIGHTS."""
    rng = random.Random(seed)
    count = max(count, len(REQUIRED) + 2)
    long_ones = [draw(rng, 0, fate, node) for fate, node in REQUIRED[:2]]
    rest = [draw(rng, 0, fate, node) for fate, node in REQUIRED[2:]]
    fates = sorted(WEIGHTS)
    for _ in range(count - len(REQUIRED)):
        rest.append(draw(rng, 0, rng.choices(fates, [WEIGHTS[f] for f in fates])[0]))
    rng.shuffle(rest)
    for name, node in (("hang_window", HANG_NODE), ("node_fault", SOAK_FAULT_NODE)):
        at = rng.randint(len(rest) // 4, 3 * len(rest) // 4)
        rest.insert(at, Spec(0, name, "root" if name == "hang_window" else U2, node,
                             kind="event"))
    plan = long_ones + rest
    for index, spec in enumerate(plan, start=1):
        spec.index = index
    return plan


def test_every_plan_has_every_fault_and_attack():
    """Whatever the seed, each fate, both node events, three users on every node kind and
    the fault node's constraint (no other job of the fault job's user there) are in it."""
    for seed in range(200):
        plan = make_plan(seed, DEFAULT_JOBS)
        fates = {spec.fate for spec in plan}
        assert set(HONEST_FATES) | set(HOSTILE_FATES) | {"hang_window", "node_fault"} <= fates
        assert not [s for s in plan if s.user == U2 and s.node == SOAK_FAULT_NODE
                    and s.kind != "event"], seed
        assert {s.node for s in plan if s.fate == "cancel_starting"} >= {SLOW_NODE}
        assert any(s.user == U3 and s.node == SLOW_NODE for s in plan)
        assert any(s.node == QUIT_NODE and s.user != U3 and s.fate == "normal" for s in plan)
        assert [s.fate for s in plan[:2]] == ["timelimit", "requeue_self"]
        assert len([s for s in plan if s.kind != "event"]) == DEFAULT_JOBS
    assert make_plan(7, DEFAULT_JOBS) == make_plan(7, DEFAULT_JOBS)


# ---------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Tracked:
    """A submitted job: its id (an array's base id; an srun's once it printed it), when it
    must have ended, and what it may end as."""

    spec: Spec
    submitted: float
    deadline: float
    job_id: int = 0
    out: str = ""  # the batch job's output, or the srun's stdout (an array: its pattern)
    popen: Optional[subprocess.Popen] = None
    min_restarts: int = 0
    done: bool = False
    ended: float = 0.0
    hung: str = ""
    actions: list[str] = dataclasses.field(default_factory=list)

    def name(self) -> str:
        return f"job {self.job_id or '?'} ({self.spec.label})"


class Soak:
    """The driver: submits the plan, runs each job's and event's steps between polls of
    slurmctld, the nodes, the debug log and the daemon records, and keeps what it saw."""

    def __init__(self, bed: Any, plan: list[Spec], programs: dict[str, str],
                 seed: int) -> None:
        self.bed = bed
        self.plan = plan
        self.programs = programs
        self.rng = random.Random(seed + 1)
        self.token = f"soak{os.getpid()}-{time.monotonic_ns()}"
        self.tracked: list[Tracked] = []
        self.jobs: dict[str, dict[str, str]] = {}
        self.nodes: dict[str, dict[str, str]] = {}
        self.reserved: set[str] = set()
        self.fault_drain_allowed = False
        self.fault_reasons: list[str] = []
        self.wrong_drains: dict[str, str] = {}
        # Job ids whose prolog forked a worker, and whose worker ended (either line may
        # come first: the worker may end before slurmd logs the fork).
        self.detached: set[int] = set()
        self.answered: set[int] = set()
        self.debug_at = os.path.getsize(bed.debug_log) if os.path.exists(bed.debug_log) else 0
        self.log_at = {node.name: os.path.getsize(self.log_path(node.name))
                       for node in bed.nodes}
        self.daemon_pids: dict[int, str] = {}  # every daemon pid a record named -> its key
        self.killed: list[int] = []
        self.requeues: list[str] = []
        self.fill = min(64 << 20, shutil.disk_usage(bed.out_dir).free // 100)

    # ---- looking

    def log_path(self, node: str) -> str:
        return self.bed.path("log", f"slurmd-{node}.log")

    def log_since(self, node: str, at: Optional[int] = None) -> str:
        with open(self.log_path(node), "rb") as handle:
            handle.seek(self.log_at[node] if at is None else at)
            return handle.read().decode("utf-8", "replace")

    def poll(self) -> None:
        result = self.bed.run(["scontrol", "show", "job", "-o"], check=False)
        for line in result.stdout.splitlines():
            record = dict(re.findall(r"(\w+(?:/\w+)?)=(\S*)", line))
            if "JobId" in record:
                self.jobs[record["JobId"]] = record
        result = self.bed.run(["scontrol", "show", "node", "-o"], check=False)
        for line in result.stdout.splitlines():
            record = dict(re.findall(r"(\w+)=((?:[^ ]| (?!\w+=))*)", line.strip()))
            if "NodeName" not in record:
                continue
            self.nodes[record["NodeName"]] = record
            if "DRAIN" in record.get("State", ""):
                node, reason = record["NodeName"], record.get("Reason", "")
                if node == SOAK_FAULT_NODE and self.fault_drain_allowed:
                    if reason not in self.fault_reasons:
                        self.fault_reasons.append(reason)
                else:
                    self.wrong_drains.setdefault(node, reason)
        if os.path.exists(self.bed.debug_log):
            with open(self.bed.debug_log, "rb") as handle:
                handle.seek(self.debug_at)
                data = handle.read()
            complete = data[:data.rfind(b"\n") + 1]
            self.debug_at += len(complete)
            for line in complete.decode("utf-8", "replace").splitlines():
                found = re.search(r" job=(\d+) cb=job_prolog (detached|python rc=|prefork rc=)",
                                  line)
                if found:
                    (self.detached if found[2] == "detached" else self.answered).add(
                        int(found[1]))
        for record in mps_records(self.bed):
            if record.get("daemon_pid"):
                self.daemon_pids[int(record["daemon_pid"])] = record["key"]
        now = time.monotonic()
        for tracked in self.tracked:
            if tracked.done or tracked.hung:
                continue
            if self.finished(tracked):
                tracked.done, tracked.ended = True, now
            elif now > tracked.deadline:
                tracked.hung = f"{tracked.name()} still {self.state_of(tracked)} " \
                               f"{now - tracked.submitted:.0f} s after its submission"

    def tasks(self, tracked: Tracked) -> list[dict[str, str]]:
        """An array's tasks as slurmctld last showed them (split from the pending record)."""
        return [r for r in self.jobs.values() if r.get("ArrayJobId") == str(tracked.job_id)
                and r.get("ArrayTaskId", "").isdigit()]

    def state_of(self, tracked: Tracked) -> str:
        if tracked.spec.kind == "array":
            return ",".join(f"{t['JobId']}:{t.get('JobState')}" for t in self.tasks(tracked)) \
                or "PENDING"
        if tracked.spec.kind == "srun" and tracked.popen and tracked.popen.poll() is None \
                and not tracked.job_id:
            return "srun waiting"
        return self.jobs.get(str(tracked.job_id), {}).get("JobState", "unknown")

    def finished(self, tracked: Tracked) -> bool:
        terminal = slurmbed.TERMINAL_STATES
        if tracked.spec.kind == "array":
            tasks = self.tasks(tracked)
            return len(tasks) == tracked.spec.tasks and all(
                t.get("JobState") in terminal for t in tasks)
        if tracked.spec.kind == "srun":
            self.srun_id(tracked)
            if tracked.popen is None or tracked.popen.poll() is None:
                return False
            return not tracked.job_id or self.jobs.get(str(tracked.job_id), {}).get(
                "JobState") in terminal
        record = self.jobs.get(str(tracked.job_id), {})
        return record.get("JobState") in terminal and int(
            record.get("Restarts", "0") or 0) >= tracked.min_restarts

    def output(self, tracked: Tracked, task: str = "") -> str:
        path = tracked.out.replace("%a", task) if task else tracked.out
        try:
            with open(path, errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def srun_id(self, tracked: Tracked) -> None:
        if tracked.spec.kind == "srun" and not tracked.job_id:
            found = re.search(r"SOAK-START job=(\d+)", self.output(tracked))
            if found:
                tracked.job_id = int(found[1])

    def started(self, tracked: Tracked) -> bool:
        """Its script (every task of an array) runs: the set-up on the node is over."""
        if tracked.spec.kind == "array":
            tasks = self.tasks(tracked)
            return len(tasks) == tracked.spec.tasks and all(
                "SOAK-START" in self.output(tracked, t["ArrayTaskId"]) for t in tasks)
        return "SOAK-START" in self.output(tracked)

    def settled(self, node: str) -> bool:
        """No job set-up runs or waits on ``node``: each of its jobs runs its script or has
        ended, and no prolog worker of theirs is still at work (a job cancelled during its
        set-up leaves one)."""
        for tracked in self.tracked:
            if tracked.spec.node != node:
                continue
            if not (tracked.done or self.started(tracked)):
                return False
            ids = [int(t["JobId"]) for t in self.tasks(tracked)] or [tracked.job_id]
            if any(i in self.detached and i not in self.answered for i in ids):
                return False
        return True

    def active(self) -> int:
        return sum(t.spec.tasks for t in self.tracked if not (t.done or t.hung))

    def daemon_of(self, job_id: int) -> Optional[dict]:
        return next((r for r in mps_records(self.bed)
                     if str(job_id) in r["jobs"] and r.get("daemon_pid")), None)

    # ---- doing

    def until(self, what: str, check: Callable[[], Any], timeout: float
              ) -> Generator[None, None, Any]:
        """Steps until ``check()`` is true (its value); AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not true after {timeout:.0f} s\n"
                                     f"{self.summary()}\n{self.bed.logs(20)}")
            yield

    def script(self, spec: Spec, release: str = "") -> str:
        body = {"plant_deep": PLANT_DEEP, "plant_many": PLANT_MANY,
                "fill": FILL.replace("{fill}", str(self.fill))}.get(spec.fate, "")
        if spec.fate == "plant_control":
            # No control left to move (control_taken_before) still runs the job's script;
            # a plant that met the user's own space full says so (own_space_full_before).
            body = (f'cd "$CUDA_MPS_PIPE_DIRECTORY" && mv control "control.moved.$SLURM_JOB_ID"'
                    f" && {{ {PLANT_CONTROL[spec.control]} && echo SOAK-PLANTED || "
                    f"{{ {SPACE_FULL} && echo SOAK-SPACE-FULL; }}; }}\n")
        if release:
            body = f"while [ ! -e {release} ]; do sleep 0.2; done\n"
        return START_LINE + body + f"sleep {spec.sleep}\necho SOAK-END\n"

    def submit(self, spec: Spec, *args: str, release: str = "") -> Tracked:
        bound = 150.0 + spec.sleep
        if spec.fate == "timelimit":
            bound = 300.0
        elif spec.fate in ("cancel_starting", "cancel_running", "cancel_self"):
            bound = 200.0
        elif spec.fate == "requeue_self":
            bound = 360.0
        now = time.monotonic()
        tracked = Tracked(spec, now, now + bound)
        options = [f"--gres=mps:{spec.share}", "-w", spec.node, "-c1"]
        if spec.kind == "srun":
            tracked.out = os.path.join(self.bed.out_dir, f"{self.token}-srun{spec.index}.out")
            argv = ["runuser", "-u", spec.user, "--whitelist-environment=SLURM_CONF", "--",
                    "srun", *options, "bash", "-c", self.script(spec)]
            with open(tracked.out, "w") as handle:
                tracked.popen = subprocess.Popen(argv, env=self.bed.env, cwd=self.bed.out_dir,
                                                 stdout=handle, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL)
        else:
            if spec.kind == "array":
                options += [f"--array=1-{spec.tasks}", f"--output={self.bed.out_dir}/%A_%a.out"]
            if spec.fate == "timelimit":
                options.append("--time=1")
            tracked.job_id = self.bed.sbatch(self.script(spec, release), *options, *args,
                                             user=spec.user)
            tracked.out = os.path.join(self.bed.out_dir, (
                f"{tracked.job_id}_%a.out" if spec.kind == "array" else f"{tracked.job_id}.out"))
        self.tracked.append(tracked)
        return tracked

    def job(self, spec: Spec) -> Generator[None, None, None]:
        """Submit one job of the plan and do what its fate asks while it runs."""
        tracked = self.submit(spec, *(["--open-mode=append"] if spec.fate == "requeue_self"
                                      else []))
        yield
        fate = spec.fate
        if fate == "cancel_starting" or (fate == "cancel_self" and spec.when == "starting"):
            def starting() -> bool:
                state = self.jobs.get(str(tracked.job_id), {}).get("JobState", "PENDING")
                return tracked.job_id in self.detached or state != "PENDING"
            yield from self.until(f"{tracked.name()} starting", starting, 120)
            phase = "running" if self.started(tracked) else "starting"
            self.cancel(tracked, f"cancelled while {phase}")
        elif fate in ("cancel_running", "cancel_self", "kill_daemon", "requeue_self"):
            yield from self.until(f"{tracked.name()} running",
                                  lambda: self.started(tracked) or tracked.done, 150)
            if tracked.done:
                return
            if fate == "kill_daemon":
                record = yield from self.until(f"the daemon of {tracked.name()}",
                                               lambda: self.daemon_of(tracked.job_id), 60)
                self.kill_daemon(tracked, record)
                return
            pause = time.monotonic() + self.rng.uniform(0, 2)
            while time.monotonic() < pause:
                yield
            if fate == "requeue_self":
                result = self.bed.run(["scontrol", "requeue", str(tracked.job_id)], user=U3,
                                      check=False)
                tracked.actions.append(f"requeued by its user: rc={result.returncode}")
                if result.returncode == 0:
                    tracked.min_restarts = 1
                else:
                    self.requeues.append(f"{tracked.name()}: {result.stderr.strip()}")
            else:
                self.cancel(tracked, "cancelled while running")

    def cancel(self, tracked: Tracked, what: str) -> None:
        result = self.bed.run(["scancel", str(tracked.job_id)], user=tracked.spec.user,
                              check=False)
        tracked.actions.append(f"{what} by its user: rc={result.returncode}")

    def kill_daemon(self, tracked: Tracked, record: dict) -> None:
        """SIGKILL the job's daemon (checked to be the node's MPS program first)."""
        pid = int(record["daemon_pid"])
        program = self.programs[tracked.spec.node]
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            tracked.actions.append(f"daemon {pid} gone before the kill")
            return
        try:
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except (FileNotFoundError, ProcessLookupError):
                # It exited after pidfd_open (a zombie has no exe): the job's end stopped it.
                tracked.actions.append(f"daemon {pid} gone before the kill")
                return
            if exe != os.path.realpath(program):
                raise AssertionError(f"record {record['key']} names pid {pid}, which does not "
                                     f"run {program}: {exe}")
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
        self.killed.append(pid)
        tracked.actions.append(f"daemon {pid} ({record['key']}) killed under it")

    def hang_window(self, spec: Spec) -> Generator[None, None, None]:
        """HANG_NODE's control client hangs while a job of root's ends there: its daemon's
        quit is killed after timeout= and the daemon ended with signals. No new job starts
        there meanwhile (a hung client at a daemon's start is a node fault)."""
        node = spec.node
        self.reserved.add(node)
        release = os.path.join(self.bed.out_dir, f"{self.token}-release")
        holder = self.submit(Spec(spec.index, "hang_holder", "root", node, 25, sleep=0),
                             release=release)
        holder.deadline = float("inf")  # bounded once released
        yield from self.until(f"the jobs on {node} set up", lambda: self.settled(node), 240)
        mark = os.path.getsize(self.log_path(node))
        set_node_faults(self.bed, node, "hang_client")
        with open(release, "w"):
            pass
        holder.deadline = time.monotonic() + 120

        def stopped_through_the_hung_client() -> bool:
            return holder.done and any(
                f"job {holder.job_id}: " in line and "control command 'quit' failed" in line
                and "no answer within" in line
                for line in self.log_since(node, mark).splitlines())
        yield from self.until(f"root's daemon on {node} stopped past its hung client",
                              stopped_through_the_hung_client, 120)
        holder.actions.append("its daemon's quit hung; ended with signals")
        set_node_faults(self.bed, node)
        self.reserved.discard(node)

    def node_fault(self, spec: Spec) -> Generator[None, None, None]:
        """The fault node's MPS program fails at start under a job of a user with no daemon
        there: the node is drained with the cause and the batch job requeued held; the
        node resumed and the job released, it runs."""
        node = spec.node
        self.reserved.add(node)
        yield from self.until(f"the jobs on {node} set up", lambda: self.settled(node), 240)
        set_node_faults(self.bed, node, "die_start")
        self.fault_drain_allowed = True
        victim = self.submit(Spec(spec.index, "node_fault", U2, node, 25, sleep=2),
                             "--open-mode=append")
        victim.min_restarts = 1
        victim.deadline = float("inf")  # bounded once released
        yield from self.until(f"{node} drained by its MPS program",
                              lambda: "DRAIN" in self.nodes.get(node, {}).get("State", ""), 120)

        yield from self.until(
            f"{victim.name()} requeued held",
            lambda: slurmbed.requeued_held(self.jobs.get(str(victim.job_id), {})), 120)
        victim.actions.append("hit by the node fault: requeued held")
        set_node_faults(self.bed, node)
        self.bed.resume(node)
        yield from self.until(f"{node} resumed",
                              lambda: "DRAIN" not in self.nodes.get(node, {}).get("State", "x"),
                              60)
        self.fault_drain_allowed = False
        self.bed.run(["scontrol", "release", str(victim.job_id)])
        victim.actions.append("released after the node was resumed")
        # Three minutes from when Slurm lets the requeued job start, not from its release.
        victim.deadline = time.monotonic() + 180 + slurmbed.eligible_in(
            self.bed.job(victim.job_id))
        self.reserved.discard(node)

    def run(self) -> None:
        waiting = list(self.plan)
        steps: list[Generator[None, None, None]] = []
        while waiting or steps or any(not (t.done or t.hung) for t in self.tracked):
            self.poll()
            for spec in list(waiting):
                if spec.kind != "event" and self.active() + spec.tasks > MAX_ACTIVE:
                    break
                if spec.kind != "event" and spec.node in self.reserved:
                    continue
                waiting.remove(spec)
                if spec.kind == "event":
                    # Reserved now, not at the event's first step: a job later in this
                    # pass must not be submitted to the node the event is about to fault.
                    self.reserved.add(spec.node)
                steps.append(getattr(self, spec.fate)(spec) if spec.kind == "event"
                             else self.job(spec))
            for step in list(steps):
                try:
                    next(step)
                except StopIteration:
                    steps.remove(step)
            time.sleep(POLL_S)

    def story(self, job_id: str, node: str) -> str:
        """What slurmctld and the node's slurmd logged about a job, and its last record."""
        record = self.jobs.get(job_id, {})
        fields = " ".join(f"{k}={record.get(k)}" for k in (
            "JobState", "Reason", "ExitCode", "DerivedExitCode", "RunTime", "TimeLimit",
            "StartTime", "EndTime", "Restarts"))
        lines = [f"  scontrol: {fields}"]
        about = re.compile(rf"\[{job_id}\.|\b[Jj]ob(?:Id=| |)?{job_id}\b")
        for name in ("slurmctld", f"slurmd-{node}"):
            with open(self.bed.path("log", f"{name}.log"), errors="replace") as handle:
                lines += [f"  {name}: {line.rstrip()}" for line in handle
                          if about.search(line)][-40:]
        return "\n".join(lines)

    def summary(self) -> str:
        lines = []
        for tracked in self.tracked:
            actions = "; ".join(tracked.actions)
            lines.append(f"  {tracked.name()}: {self.state_of(tracked)}"
                         f"{' [' + actions + ']' if actions else ''}")
        return "\n".join(lines)

    def teardown(self) -> None:
        """End what this run started outside Slurm (its sruns), whatever happened."""
        for tracked in self.tracked:
            if tracked.popen and tracked.popen.poll() is None:
                tracked.popen.kill()
                tracked.popen.wait()


def set_node_faults(bed: Any, node: str, *names: str) -> None:
    """The faults of ``node``'s own stand-in (read at each start, quit and SIGTERM)."""
    path = bed.path("bin", "soak", node, "faults")
    with open(path, "w") as handle:
        handle.write("\n".join(names) + "\n")
    os.chmod(path, 0o644)


# ---------------------------------------------------------------------------- the planter


class Planter:
    """The hostile user's process outside Slurm (PLANTER), and what it reports at the end."""

    def __init__(self, bed: Any, programs: dict[str, str], token: str) -> None:
        self.bed = bed
        self.token = token
        self.stop_path = os.path.join(bed.out_dir, f"{token}-stop")
        self.report_path = os.path.join(bed.out_dir, f"{token}-planter.json")
        script = os.path.join(bed.out_dir, f"{token}-planter.py")
        with open(script, "w") as handle:
            handle.write(PLANTER)
        os.chmod(script, 0o644)
        self.popen = subprocess.Popen(
            ["runuser", "-u", U3, "--", "setsid", "/usr/bin/python3", script, bed.state_dir,
             str(slurmbed.uid_of(U3)), self.stop_path, self.report_path, token,
             json.dumps(programs)], cwd=bed.out_dir, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(self) -> dict[str, Any]:
        with open(self.stop_path, "w"):
            pass
        output, _ = self.popen.communicate(timeout=60)
        assert self.popen.returncode == 0, output
        with open(self.report_path) as handle:
            return json.load(handle)

    def spoofers(self) -> list[int]:
        """Live processes carrying this run's spoof marker (the planter's, found by it)."""
        marker = f"GPUSHARE_SOAK_SPOOF={self.token}".encode()
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/environ", "rb") as handle:
                        if marker in handle.read().split(b"\0"):
                            found.append(int(name))
                except OSError:
                    continue
        return found

    def end(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()
        # SIGKILL only asks: on a loaded machine a killed process may still run (and show
        # the stand-in's argv) a while later, so each one is waited for until it has died.
        pidfds = []
        for pid in self.spoofers():
            with contextlib.suppress(ProcessLookupError):
                pidfds.append(os.pidfd_open(pid))
                signal.pidfd_send_signal(pidfds[-1], signal.SIGKILL)
        try:
            for pidfd in pidfds:
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                assert poller.poll(60_000), "an impostor outlived SIGKILL by 60 s"
        finally:
            for pidfd in pidfds:
                os.close(pidfd)


def runs_a_standin(pid: int, programs: dict[str, str]) -> bool:
    """Whether ``pid`` is a live process of one of the nodes' stand-ins (by its exe)."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    return exe in {os.path.realpath(program) for program in programs.values()}


def describe(pid: int, token: str) -> str:
    """What a left process is: its argv, state, parent, owner, cgroup, and whether it
    carries this run's spoof marker (one of the hostile user's impostors)."""
    facts = {}
    for name in ("cmdline", "environ", "status", "cgroup"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as handle:
                facts[name] = handle.read()
        except OSError as error:
            facts[name] = str(error).encode()
    status = dict(line.split(b":", 1) for line in facts["status"].splitlines() if b":" in line)
    fields = {key: status.get(key.encode(), b"?").strip().decode(errors="replace")
              for key in ("State", "PPid", "Uid")}
    spoof = f"GPUSHARE_SOAK_SPOOF={token}".encode() in facts["environ"].split(b"\0")
    argv = facts["cmdline"].replace(b"\0", b" ").decode(errors="replace").strip()
    return (f"  pid {pid}: {argv!r} {fields} impostor={spoof} "
            f"cgroup={facts['cgroup'].decode(errors='replace').strip()}")


def argv0(pid: int) -> Optional[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().split(b"\0")[0]
    except OSError:
        return None


# ---------------------------------------------------------------------------- the test


@pytest.fixture(params=["prefork=no", "prefork=yes"])
def soak_bed(_mps_bed, request):  # noqa: F811  (the fixture imported above)
    """test_mps.py's bed with a hostile third user and a stand-in of its own per node
    (``mps_control=<root>/bin/soak/%n/...``), each with its node's faults; the same run
    with each node's prefork server setting up and undoing the jobs after its first."""
    bed = _mps_bed
    slurmbed.ensure_user(U3)
    programs = {}
    for node in bed.nodes:
        folder = bed.path("bin", "soak", node.name)
        os.makedirs(folder, mode=0o755, exist_ok=True)
        programs[node.name] = install_standin(folder)
        set_node_faults(bed, node.name, *NODE_FAULTS.get(node.name, ()))
    per_node = bed.path("bin", "soak", "%n", PROGRAM_NAME)
    line = bed.plugstack_line().replace(f"mps_control={standin_program(bed)}",
                                        f"mps_control={per_node}")
    assert per_node in line, line
    bed.write_plugstack(line.rstrip("\n") + f" {request.param}\n")
    try:
        yield bed, programs, request.param == "prefork=yes"
    finally:
        for user in (U3, "root"):
            bed.run(["scancel", "-u", user], check=False)
        for node in bed.nodes:
            set_node_faults(bed, node.name)
        bed.stop_prefork()


@pytest.mark.slurm
def test_a_soak_with_faults_and_a_hostile_user_ends_clean(soak_bed):
    bed, programs, prefork = soak_bed
    seed = int(os.environ.get("GPUSHARE_SOAK_SEED", str(random.SystemRandom().randrange(10**6))))
    count = int(os.environ.get("GPUSHARE_SOAK_JOBS", str(DEFAULT_JOBS)))
    plan = make_plan(seed, count)
    print(f"\nsoak: GPUSHARE_SOAK_SEED={seed} GPUSHARE_SOAK_JOBS={count} replays this run")
    for node in bed.nodes:
        assert "DRAIN" not in bed.node_state(node.name)["State"], bed.node_state(node.name)
    slurmds = {node.name: bed._pids[f"slurmd-{node.name}"] for node in bed.nodes}
    soak = Soak(bed, plan, programs, seed)
    planter = Planter(bed, programs, soak.token)
    started = time.monotonic()
    try:
        soak.run()
        report = planter.finish()
        spoofers = [int(pid) for pid in report["spoofers"].values()]
        # The impostors outlived every job: no signal of root's reached them, and no
        # record ever named one (or pid 1) as its daemon.
        assert spoofers, report
        wanted = {os.fsencode(program) for program in programs.values()}
        gone = [pid for pid in spoofers if argv0(pid) not in wanted]
        assert not gone, f"impostors signalled: {gone}"
        named = {pid: key for pid, key in soak.daemon_pids.items() if pid in spoofers or pid == 1}
        assert not named, f"records named an impostor as their daemon: {named}"
        planter.end()
        assert_nothing_left(bed, timeout=180)
        # A process that is ending (its stop sent as the last record went) is waited for;
        # one that is left runs on.
        deadline = time.monotonic() + 30
        while True:
            left = {node: standin_processes(program) for node, program in programs.items()}
            if not any(left.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert not any(left.values()), (
            f"stand-in processes left: {left}\n" + "\n".join(
                describe(pid, planter.token) for pids in left.values() for pid in pids)
            + f"\n{soak.summary()}")
        elapsed = time.monotonic() - started
        soak.poll()  # slurmctld's last word: nothing was requeued or failed after its end
        print(f"soak: {len(soak.tracked)} submissions "
              f"({sum(t.spec.tasks for t in soak.tracked)} jobs) in {elapsed:.0f} s; "
              f"planted pid files {report['planted']}, {len(spoofers)} impostors, daemons "
              f"killed {soak.killed}\n{soak.summary()}")
        check_outcomes(soak, report, slurmds)
        if prefork:  # the servers set up (and undid) jobs under the same attacks
            lines = bed.debug_lines()
            assert any("cb=job_prolog prefork rc=" in line for line in lines), lines[-20:]
            assert any("cb=job_epilog prefork rc=" in line for line in lines), lines[-20:]
    finally:
        soak.teardown()
        planter.end()


def check_outcomes(soak: Soak, report: dict[str, Any], slurmds: dict[str, int]) -> None:
    """Every check of the soak's end; one AssertionError naming each job, node or log line
    that fails one."""
    bed = soak.bed
    failed: list[str] = [t.hung for t in soak.tracked if t.hung]  # no hung job
    # Only the node fault drained a node, with its cause; none is drained now.
    failed += [f"{node} wrongly drained: {reason}" for node, reason in soak.wrong_drains.items()]
    if not soak.fault_reasons:
        failed.append("the node fault drained nothing")
    cause = re.compile(r"gpushare: MPS start failed: nvidia-cuda-mps-control -d exit 1 "
                       rf"\(GPU \d+, daemon u{slurmbed.uid_of(U2)}-")
    failed += [f"{SOAK_FAULT_NODE} drained for another cause: {reason}"
               for reason in soak.fault_reasons if not cause.match(reason)]
    for node in bed.nodes:
        state = bed.node_state(node.name)
        if "DRAIN" in state["State"]:
            failed.append(f"{node.name} still drained: {state.get('Reason')}")
    failed += [f"the hostile user could not requeue {what}" for what in soak.requeues]
    # Every job ended as its fate says: the other users' all COMPLETED.
    failed += [problem for tracked in soak.tracked for problem in outcome(soak, tracked)]
    # The faults happened: n2's daemons ignored quit, the killed daemons are gone, the
    # slow node's pid files were planted.
    if "ignored quit for 5 s; ending it with signals" not in soak.log_since(QUIT_NODE):
        failed.append(f"no daemon on {QUIT_NODE} ignored quit")
    if not soak.killed:
        failed.append("no daemon was killed under its job")
    failed += [f"killed daemon {pid} still runs" for pid in soak.killed
               if runs_a_standin(pid, soak.programs)]
    if not report["planted"].get(SLOW_NODE):
        failed.append(f"no pid file planted on {SLOW_NODE}: {report}")
    # slurmd and slurmstepd never crashed.
    for node, pid in slurmds.items():
        if bed._pids.get(f"slurmd-{node}") != pid or argv0(pid) is None:
            failed.append(f"slurmd of {node} (pid {pid}) is gone")
        failed += [f"slurmd-{node}.log: {line}" for line in soak.log_since(node).splitlines()
                   if SLURMD_CRASH.search(line) and not refused_by_design(soak, line)]
    assert not failed, "\n".join(failed) + "\n" + soak.summary()


def refused_by_design(soak: Soak, line: str) -> bool:
    """Whether ``line`` is slurmstepd's word for a task gpushare refused on purpose: the
    node fault's job (its first run) and a hostile job failed for its user's own fault.
    slurmstepd 24.11 logs a refused task_init_privileged as a task child's "fatal"."""
    found = re.search(r"\[(\d+)\.batch\] fatal: _fork_all_tasks: "
                      r"_pre_task_child_privileged\(\) failed", line)
    if not found:
        return False
    tracked = next((t for t in soak.tracked if str(t.job_id) == found[1]), None)
    if tracked is None:
        return False
    if tracked.spec.fate == "node_fault":
        return True
    return tracked.spec.user == U3 and soak.state_of(tracked) == "FAILED" and any(
        words in soak.output(tracked) for words in USER_FAULT_WORDS)


def outcome(soak: Soak, tracked: Tracked) -> list[str]:
    """What is wrong with how ``tracked`` ended ([] when it ended as its fate says)."""
    spec = tracked.spec
    if spec.kind == "array":
        ends = [(t["JobId"], t.get("JobState", ""), soak.output(tracked, t["ArrayTaskId"]))
                for t in soak.tasks(tracked)]
    else:
        soak.srun_id(tracked)
        ends = [(str(tracked.job_id), soak.state_of(tracked), soak.output(tracked))]
    wanted = {"timelimit": "TIMEOUT", "cancel_starting": "CANCELLED",
              "cancel_running": "CANCELLED", "cancel_self": "CANCELLED"}.get(spec.fate,
                                                                           "COMPLETED")
    problems = []
    for job_id, state, output in ends:
        where = f"job {job_id} ({spec.label})"
        if spec.kind == "srun" and tracked.popen and tracked.popen.returncode != 0:
            problems.append(f"{where}: srun exited {tracked.popen.returncode}: {output[-800:]}")
            continue
        if state != wanted:
            if spec.user == U3 and state == "FAILED" and user_fault_allowed(soak, tracked) \
                    and any(words in output for words in USER_FAULT_WORDS):
                continue  # a job of the hostile user on a daemon whose control they faked
            problems.append(f"{where} ended {state}, not {wanted}: {output[-800:]}\n"
                            f"{soak.story(job_id, spec.node)}")
            continue
        if wanted != "COMPLETED":
            continue
        starts = re.findall(r"SOAK-START job=\d+ restart=(\d+) pipe=(\S*) share=(\S*)", output)
        uid = slurmbed.uid_of(spec.user) if spec.user != "root" else 0
        prefix = f"{soak.bed.state_of(spec.node)}/mps/u{uid}-"
        if not starts or "SOAK-END" not in output:
            problems.append(f"{where} COMPLETED without running its script: {output[-800:]}")
        elif not all(pipe.startswith(prefix) and share == str(spec.share)
                     for _restart, pipe, share in starts):
            problems.append(f"{where} got another daemon or share than {prefix}…, "
                            f"{spec.share}: {starts}")
        elif tracked.min_restarts and starts[-1][0] != str(tracked.min_restarts):
            problems.append(f"{where} did not run again after its requeue: {starts}")
        elif spec.fate in ("plant_deep", "plant_many", "plant_control", "fill") \
                and "SOAK-PLANTED" not in output \
                and not control_taken_before(soak, tracked, output) \
                and not own_space_full_before(soak, tracked, output):
            problems.append(f"{where} did not plant: {output[-800:]}")
    return problems


def control_taken_before(soak: Soak, tracked: Tracked, output: str) -> bool:
    """A plant_control job that found no control to move: the same user's earlier
    plant_control on the node took it from the daemon they share, so the attack this job
    would make is in place already (its job still ran its script on its own daemon)."""
    return (tracked.spec.fate == "plant_control"
            and "mv: cannot stat 'control'" in output
            and same_users_plant_before(soak, tracked, ("plant_control",)))


def own_space_full_before(soak: Soak, tracked: Tracked, output: str) -> bool:
    """A plant that met its daemon's space full: the same user's other plants on the node
    used it (each daemon's space is its user's own, ``mps_space``); a fake control too
    needs an inode, and a file one a block."""
    return (tracked.spec.fate in (*SPACE_FILLERS, "plant_control")
            and "SOAK-SPACE-FULL" in output
            and same_users_plant_before(soak, tracked, SPACE_FILLERS))


def same_users_plant_before(soak: Soak, tracked: Tracked, fates: tuple[str, ...]) -> bool:
    """Whether another job of ``tracked``'s user on its node, of one of ``fates``, was
    submitted before ``tracked`` ended: jobs of one user on a node share its daemon and run
    side by side, so one submitted later may still plant first."""
    return any(t.spec.fate in fates and t.spec.node == tracked.spec.node
               and t.spec.user == tracked.spec.user and t is not tracked
               and t.submitted < (tracked.ended or time.monotonic()) for t in soak.tracked)


def user_fault_allowed(soak: Soak, tracked: Tracked) -> bool:
    """Whether a job of the hostile user on the same node faked a daemon's control or
    filled its space before ``tracked`` ended: only then may it fail, and with its user's
    fault as the message."""
    return any(t.spec.fate in ("plant_control", *SPACE_FILLERS)
               and t.spec.node == tracked.spec.node
               and t is not tracked and t.submitted < (tracked.ended or time.monotonic())
               for t in soak.tracked)
