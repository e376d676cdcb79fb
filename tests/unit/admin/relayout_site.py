# SPDX-License-Identifier: GPL-2.0-or-later
"""What the ``gpushare relayout --apply`` tests share: the plan, h1's simulated GPUs,
slurm.conf, a fake slurmctld, and the node's step run as the site's command would run it."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
from typing import Optional

from tests.unit.admin.relayout_plans import mig_plan

from gpushare.admin.plan import parse_plan
from gpushare.admin.relayout.controller import Settings, apply_decision
from gpushare.admin.relayout.decide import Change, Decision
from gpushare.admin.slurm_client import SlurmClientError, SlurmNode
from gpushare.gpu.inventory import collect
from gpushare.gpu.nvml_sim import SimNvml, load_profile
from gpushare.gpu.nvml_sim_plan import profile_from_plan

PLAN = mig_plan(["7x1g.10gb", "2x3g.40gb", "whole"], min_interval_s=600)

SLURM_CONF = """\
ClusterName=x
NodeName=h[1-2] CPUs=2 RealMemory=1000 Gres=gpu:1g.10gb:15 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES
"""


SACCT_HEADER = "JobID|Submit|Start|End|ReqTRES|User|State"
# What `scontrol show config` says a site records in accounting: every GPU kind the plans of
# these tests give Slurm (without it sacct shows no job's GPUs, and the floors are the plan's).
TRACKED_TRES = ("cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu,"
                "gres/gpu:1g.10gb,gres/gpu:2g.20gb,gres/gpu:3g.40gb,gres/mps")
TRACKED = f"AccountingStorageTRES   = {TRACKED_TRES}"


def config_stub(directory: str, tres: str) -> str:
    """An scontrol whose ``show config`` shows ``AccountingStorageTRES = tres``: what the
    floors and ``--suggest`` ask before they read sacct."""
    path = os.path.join(directory, "scontrol")
    with open(path, "w", encoding="utf-8") as out:
        out.write("#!/bin/sh\n[ \"$*\" = 'show config' ] && echo "
                  f"{shlex.quote(f'AccountingStorageTRES   = {tres}')}\n")
    os.chmod(path, 0o755)
    return path


def scontrol_stub(directory: str, state: str = "IDLE+DRAIN") -> str:
    """An scontrol that shows every node asked for in ``state`` (``-d show -o node N``):
    what the node's step asks before it changes a GPU; each call's arguments appended to
    ``scontrol.args``."""
    path = os.path.join(directory, "scontrol")
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(path)}.args\n"
                  f"echo \"NodeName=$5 State={state} Gres=gpu:1g.10gb:15\"\n")
    os.chmod(path, 0o755)
    return path


def long_job() -> str:
    """A CPU job that started 30 days ago and still runs: what shows a sacct window that
    accounting reaches back past its start (``history.read_spans``)."""
    start = (datetime.datetime.now() - datetime.timedelta(days=30)).replace(microsecond=0)
    return f"1|{start.isoformat()}|{start.isoformat()}|Unknown|billing=1,cpu=1,node=1|u|RUNNING"


def sacct_stub(directory: str, rows: tuple[str, ...] = (), exit_code: int = 0,
               reaches: bool = True) -> str:
    """A sacct that prints its header and ``rows`` (``--parsable2``), after a job from before
    any window (:func:`long_job`, unless not ``reaches``: a slurmdbd younger than the
    window), or fails as sacct does without slurmdbd; each call's arguments appended to
    ``sacct.args``."""
    path = os.path.join(directory, "sacct")
    lines = "".join(f"echo {shlex.quote(row)}\n"
                    for row in (SACCT_HEADER, *((long_job(),) if reaches else ()), *rows))
    failure = ("echo 'sacct: error: Slurm accounting storage is disabled' >&2\n"
               f"exit {exit_code}\n") if exit_code else ""
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(path)}.args\n{failure}{lines}")
    os.chmod(path, 0o755)
    return path


class FakeSlurm:
    """slurmctld as the orchestration sees it: a node runs ``busy_polls`` more polls of
    jobs, ``reconfigure`` re-reads slurm.conf's Gres= (unless ``stale``, as Slurm 22.05 keeps
    a node's GPU count), a restart (``restarted_by`` written) re-reads it always."""

    def __init__(self, slurm_conf: str, busy_polls: int = 0) -> None:
        self.slurm_conf = slurm_conf
        self.busy = {"h1": busy_polls, "h2": 0}
        self.state = {"h1": set(), "h2": set()}
        self.reason = {"h1": "", "h2": ""}
        self.gres = {"h1": "gpu:1g.10gb:15", "h2": "gpu:1g.10gb:15"}
        self.calls: list[str] = []
        self.stale = False
        self.down_on: Optional[str] = None
        self.restarted_by: Optional[str] = None  # a file the site's restart command writes
        self.unregistered_polls = 0
        self.stale_restarts = 0

    def node(self, name: str) -> Optional[SlurmNode]:
        if self.down_on == "node":
            raise SlurmClientError("scontrol: slurmctld is down")
        self.notice_restart()
        registered = self.unregistered_polls == 0
        if not registered:
            self.unregistered_polls -= 1
            self.calls.append("unregistered")
        base = "MIXED" if self.busy[name] > 0 else "IDLE"
        if self.busy[name] > 0 and "DRAIN" in self.state[name]:
            self.busy[name] -= 1
        return SlurmNode(name, (base, *sorted(self.state[name])), self.reason[name],
                         self.gres[name], registered=registered)

    def drain(self, name: str, reason: str) -> None:
        self.calls.append(f"drain {name}")
        self.state[name].add("DRAIN")
        self.reason[name] = reason

    def resume(self, name: str) -> None:
        self.calls.append(f"resume {name}")
        self.state[name].discard("DRAIN")
        self.reason[name] = ""

    def notice_restart(self) -> None:
        if self.restarted_by and os.path.exists(self.restarted_by):
            os.unlink(self.restarted_by)
            self.calls.append("restarted")
            self.unregistered_polls = 2  # slurmd has not registered with the new slurmctld
            if self.stale_restarts:
                self.stale_restarts -= 1  # it registered its old gres.conf
            else:
                self.reload()

    def reconfigure(self) -> None:
        self.notice_restart()
        self.calls.append("reconfigure")
        if self.down_on == "reconfigure":
            raise SlurmClientError("scontrol reconfigure: slurmctld is down")
        if not self.stale:
            self.reload()

    def reload(self) -> None:
        with open(self.slurm_conf) as handle:
            for line in handle:
                words = dict(w.split("=", 1) for w in line.split() if "=" in w)
                if words.get("NodeName") in self.gres:
                    self.gres[words["NodeName"]] = words.get("Gres", "")


def make_site(tmp_path):
    """The plan, h1's simulated GPUs, slurm.conf, and the node's step run as the site's
    command would run it (here, locally)."""
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(PLAN)
    plan = parse_plan(PLAN, str(plan_file))
    profile = tmp_path / "h1.json"
    profile.write_text(json.dumps(profile_from_plan(plan, "h1")))
    conf = tmp_path / "slurm.conf"
    conf.write_text(SLURM_CONF)
    state = tmp_path / "relayout-state.json"
    step = [sys.executable, "-m", "gpushare.cli", "relayout", "node", "--plan", str(plan_file),
            "--node", "{node}", "--gpu", "{gpu}", "--layout", "{layout}", "--decision",
            "{decision}", "--step-timeout", "{timeout}", "--source", f"sim:{profile}",
            "--gres-conf", str(tmp_path / "gres.conf"), "--state", str(state),
            "--lock-dir", str(tmp_path / "run"),
            # The fake slurmctld lives in the test's process: the step sees the node drained.
            "--scontrol", scontrol_stub(str(tmp_path)), "--apply"]
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                   "src"))
    settings = Settings(node_command=shlex.join(step), slurm_conf=str(conf),
                        state_path=str(state), drain_timeout_s=60, step_timeout_s=30,
                        settle_timeout_s=10, poll_s=0.0, env=env)
    return plan, settings, profile, FakeSlurm(str(conf))


def layout_of(profile, index):
    nvml = SimNvml(load_profile(str(profile)))
    gpu = collect(nvml, f"sim:{profile}").gpus[index]
    return sorted(d.profile for d in gpu.mig_devices) if gpu.mig_current else "whole"


def decision(*changes: tuple[str, int, str]) -> Decision:
    return Decision(changes=[Change(node, index, "7x1g.10gb", new, 1.0, False)
                             for node, index, new in changes])


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 1.0)


def run(plan, settings, slurm, chosen, clock=None):
    clock = clock or Clock()
    return apply_decision(plan, chosen, "r1", slurm, settings, clock=clock, sleep=clock.sleep,
                          wall=lambda: 5000.0)
