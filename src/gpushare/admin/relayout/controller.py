# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply``: carry a decision out through Slurm, as a transaction.

Before anything is drained, slurm.conf must be writable for every node of the decision
(``slurmconf``); the journal (``journal``) then records the plan, and every step is written
to it before it is taken, so the next run finishes or rolls back a run that was killed
(``recover``). The nodes finish in parallel (``Settings.parallel``); one node's failure is
its own. Slurm has no per-GPU drain, and a node that re-registers other GPUs while a job holds any
of its GPUs goes INVAL, so the whole node leaves service until it is idle. Per node:

1. drain it (``scontrol update State=DRAIN Reason="gpushare relayout: ..."``): running jobs
   finish, no new job starts there;
2. wait until it is idle (``--drain-timeout``; past it the node is resumed unchanged);
3. run the node's step for each changed GPU through the site's command (``ssh {node}
   gpushare relayout node ...``), each within ``--step-timeout``; the step lays the old
   layout back itself when a change fails;
4. record each applied layout in the state file, set the node's ``Gres=`` on its slurm.conf
   line, ``scontrol reconfigure`` (slurmctld re-reads slurm.conf, every slurmd re-reads
   gres.conf and registers again), optionally restart the node's slurmd;
5. wait until slurmctld shows the new GRES, then resume the node (``noderound``,
   ``slurmsync``).

A step that fails and lays the old layout back resumes the node as it was; one whose result
is unknown (a timeout, a failed restore) or a Slurm step that fails leaves the node drained
with the cause in its reason, for an administrator. The drain is only undone when its reason
is still ours.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from gpushare.admin.plan import Plan
from gpushare.admin.relayout import DEFAULT_NODE_COMMAND
from gpushare.admin.relayout.decide import Change, Decision
from gpushare.admin.relayout.journal import (
    GpuStep,
    Journal,
    NodeEntry,
    journal_path,
    save_journal,
)
from gpushare.admin.relayout.noderound import NodeRound
from gpushare.admin.relayout.remote import PLACEHOLDERS, command_argv
from gpushare.admin.relayout.settings import (
    REASON_PREFIX,
    Outcome,
    RelayoutError,
    Settings,
    Slurm,
    ours,
)
from gpushare.admin.relayout.slurmconf import SetGresError, check_writable, set_node_gres
from gpushare.admin.relayout.state import locked
from gpushare.admin.slurm_client import (
    SlurmClientError,
    SlurmNode,
    config_value,
    parse_scontrol_nodes,
)

__all__ = [
    "DEFAULT_NODE_COMMAND",
    "PLACEHOLDERS",
    "REASON_PREFIX",
    "Outcome",
    "RelayoutError",
    "Scontrol",
    "SetGresError",
    "Settings",
    "apply_decision",
    "command_argv",
    "recover",
    "set_node_gres",
]


class Scontrol:
    """Slurm through scontrol; each call bounded by ``timeout``, retried while slurmctld is
    briefly away (a restart) until ``patience`` seconds have passed."""

    def __init__(self, scontrol: str, timeout: float = 10.0, patience: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not scontrol.startswith("/"):
            raise SlurmClientError(f"{scontrol}: give the Slurm command as an absolute path")
        self.scontrol, self.timeout, self.patience, self.sleep = scontrol, timeout, patience, sleep

    def _call(self, *args: str) -> str:
        from gpushare.admin.slurm_client import run_slurm

        deadline = time.monotonic() + self.patience
        while True:
            try:
                return run_slurm([self.scontrol, *args], self.timeout)
            except SlurmClientError:
                if time.monotonic() > deadline:
                    raise
                self.sleep(2.0)

    def node(self, name: str) -> Optional[SlurmNode]:
        found = parse_scontrol_nodes(self._call("-d", "show", "-o", "node", name))
        return next((n for n in found if n.name == name), None)

    def drain(self, name: str, reason: str) -> None:
        self._call("update", f"NodeName={name}", "State=DRAIN", f"Reason={reason}")

    def resume(self, name: str) -> None:
        self._call("update", f"NodeName={name}", "State=RESUME")

    def reconfigure(self) -> None:
        self._call("reconfigure")

    def configless(self) -> bool:
        """Whether slurmctld serves slurm.conf to the nodes (SlurmctldParameters=
        enable_configless)."""
        value = config_value(self._call("show", "config"), "SlurmctldParameters")
        return value is not None and "enable_configless" in value


def _finish_all(rounds: list[NodeRound], settings: Settings, repair: bool = False) -> None:
    """Each node's round to its end, ``settings.parallel`` at once; a failure (even an
    unforeseen one) stays that node's and is reported as its outcome."""
    def one(node: NodeRound) -> None:
        try:
            node.finish(repair)
        except SlurmClientError as err:
            node.outcome.failed = f"slurmctld: {err}"
        except Exception as err:  # isolate the node, report it
            node.outcome.failed = f"{type(err).__name__}: {err}"
        node.mark(phase="done")  # not when killed: the next run settles it

    if not rounds:
        return
    with ThreadPoolExecutor(max_workers=max(1, min(settings.parallel, len(rounds)))) as pool:
        list(pool.map(one, rounds))


def _count(settings: Settings, outcomes: list[Outcome], round_counted: bool) -> None:
    with locked(settings.state_path) as state:
        if round_counted:
            state.count("decisions")
        for outcome in outcomes:
            state.count("applied", len(outcome.applied))
            state.count("restored", len(outcome.restored))
            state.count("failed", 1 if outcome.failed else 0)


def apply_decision(plan: Plan, decision: Decision, decision_id: str, slurm: Slurm,
                   settings: Settings, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep,
                   wall: Callable[[], float] = time.time) -> list[Outcome]:
    """Carry ``decision`` out: slurm.conf is checked writable for every node first (else
    RelayoutError, and nothing is drained); the journal is written; every node is drained,
    so that all of them empty at once, then the nodes are changed and brought back in
    parallel. The state file counts the round and each result (``gpushare metrics
    --relayout-state``)."""
    by_node: dict[str, list[Change]] = {}
    for change in decision.changes:
        by_node.setdefault(change.node, []).append(change)
    if not by_node:
        return []
    try:
        check_writable(settings.slurm_conf, list(by_node), settings.configless)
    except (OSError, SetGresError) as err:
        raise RelayoutError(f"nothing drained: {err}") from None
    journal = Journal(journal_path(settings.state_path), decision_id, wall(),
                      [NodeEntry(node, [GpuStep(c.index, c.old, c.new) for c in changes])
                       for node, changes in by_node.items()])
    save_journal(journal)
    conf_lock = threading.Lock()
    nodes = [NodeRound(plan, slurm, settings, decision_id, changes, journal, conf_lock, clock,
                       sleep, wall) for changes in by_node.values()]
    started = []
    for node in nodes:
        try:
            if node.start():
                started.append(node)
                continue
        except SlurmClientError as err:
            node.outcome.failed = f"slurmctld: {err}"
        node.mark(phase="done")
    _finish_all(started, settings)
    outcomes = [node.outcome for node in nodes]
    _count(settings, outcomes, True)
    return outcomes


def recover(plan: Plan, journal: Journal, slurm: Slurm, settings: Settings,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep,
            wall: Callable[[], float] = time.time) -> list[Outcome]:
    """Finish or roll back what a killed run left (``journal``): a node none of whose GPUs
    was touched is resumed if its drain is still ours (rolled back); on one the run began to
    change, drained again if need be and once idle, each GPU not yet applied takes the
    journalled layout or its old one back (finished); then Gres= and the drain are made to
    match. The journal is removed once every node is settled."""
    conf_lock = threading.Lock()
    rounds: list[NodeRound] = []
    outcomes: list[Outcome] = []
    for entry in journal.open_nodes:
        changes = [Change(entry.node, g.gpu, g.old, g.new, 0.0, False) for g in entry.gpus]
        node = NodeRound(plan, slurm, settings, journal.decision, changes, journal, conf_lock,
                         clock, sleep, wall)
        outcomes.append(node.outcome)
        touched = any(g.status in ("started", "unknown", "applied") for g in entry.gpus)
        try:
            now: Optional[SlurmNode] = slurm.node(entry.node)
            if not touched:
                if ours(now):
                    slurm.resume(entry.node)
                    node.say("resumed: the interrupted run had changed none of its GPUs")
                    node.await_service()
                node.mark(phase="done")
                continue
            if ours(now) or node.start():
                rounds.append(node)
                continue
            node.outcome.failed = (f"an interrupted run left a GPU of it unknown, and it "
                                   f"could not be drained again: {node.outcome.skipped}")
        except SlurmClientError as err:
            node.outcome.failed = f"slurmctld: {err}"
    _finish_all(rounds, settings, repair=True)
    _count(settings, [o for o in outcomes if o.applied or o.restored or o.failed], False)
    return outcomes
