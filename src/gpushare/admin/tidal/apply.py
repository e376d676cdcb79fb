# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare tidal --apply``: move devices between the schedulers, step by step, journalled.

One move of a device from its holder (the source) to the other scheduler (the target), in
the steps of ``moves.STEPS``, each written to the journal before the next:

1. ``fenced``: no new work lands on the device. Kubernetes as the source: its fence goes up
   (``kube``). Slurm, either way: the node is drained, because its ``Gres=`` changes and
   Slurm has no per-GPU drain (a node that registers other GPUs under a running job goes
   INVAL).
2. ``released``: the holder has let go. Kubernetes as the source: the node's kubelet lists
   no pod holding the device (``--holders-command``, run on the node). Slurm: the node is
   idle. A lend whose device is still held after ``--release-timeout`` is undone and
   counted refused (busy); a reclaim keeps waiting up to ``--drain-timeout``: no job is
   ended for it.
3. ``given``: the state file says where the device is, the node's ``Gres=`` and gres.conf
   (the shared one, or the node's own through ``--node-gres-command``) are rendered from
   the plan with what is lent (read back from that file, as relayout, render and check
   read it), slurmctld is told and shows it.
   A node holding a device lent to Slurm carries a reservation from the time borrowed
   work must be gone by (``reservation``), set here, before it resumes: no job that would
   outlive the rule's promise starts there, so the reclaim ends none.
4. ``unfenced``: Kubernetes as the target: its fence comes down. Slurm: the node resumes.

The Kubernetes fence of a device lent to Slurm stays up while it is lent (that is what
keeps pods off it); a reclaim takes it down last. A run that dies leaves each move at its
step; the next run finishes it or undoes it (``moves.recover``) before anything new.
"""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from gpushare.admin.plan import Plan
from gpushare.admin.plan.lending import Device, LendingRule
from gpushare.admin.relayout.remote import command_argv
from gpushare.admin.relayout.settings import (
    Outcome,
    RelayoutError,
    Settings,
    Slurm,
    fit,
)
from gpushare.admin.relayout.slurmsync import SlurmSync
from gpushare.admin.slurm_client import SlurmClientError, SlurmNode
from gpushare.admin.tidal.decide import Move
from gpushare.admin.tidal.journal import MoveEntry, TidalJournal
from gpushare.admin.tidal.kube import KubeError, KubeFence
from gpushare.admin.tidal.moves import K8S, SLURM, STEPS, recover
from gpushare.admin.tidal.reservation import Reservations, borrowed_until, reservation_name
from gpushare.admin.tidal.state import Lent, TidalState, save_state
from gpushare.common import proc

__all__ = ["REASON_PREFIX", "MoveFailed", "Mover", "SlurmSide", "StillHeld", "TidalSettings"]

REASON_PREFIX = "gpushare tidal"
HELD, FREE = 1, 0  # the holders command's exit status
HOLDERS_PLACEHOLDERS = ("node", "gpu", "slice", "profile", "dra", "devices")
BATCH_PLACEHOLDER = "{devices}"  # every device of a node in one run (``device_spec``s)


class MoveFailed(RuntimeError):
    """A step could not be taken; the move is undone where it may be, else left for the
    next run (the message says which)."""


class StillHeld(MoveFailed):
    """The home side kept the device past the release timeout (a refusal, not a fault)."""


@dataclass
class TidalSettings:
    slurm: Settings = field(default_factory=Settings)  # slurm.conf, gres.conf, timeouts
    holders_command: str = "ssh {node} gpushare tidal holders --devices {devices}"
    release_timeout_s: float = 600.0
    # renders a node's own gres.conf on the node (where gres.conf is per node, not shared);
    # "": the shared one (slurm.cluster_gres_conf) alone
    node_gres_command: str = ""


def device_spec(device: Device, values: dict[str, str]) -> str:
    """One device as ``gpushare tidal holders --devices`` takes it: GPU:SLICE:PROFILE:DRA
    (no field holds a ':' or ','), echoed back as the first word of its answer line."""
    return ":".join((values["gpu"], values["slice"], values["profile"], values["dra"]))


def _ours(node: Optional[SlurmNode]) -> bool:
    """Drained by a tidal run (a resumed node may keep its last reason: Slurm 24.11)."""
    return node is not None and node.draining and node.reason.startswith(REASON_PREFIX)


class SlurmSide(SlurmSync):
    """The Slurm side of one node: drain, idle, Gres= from the plan with what is lent,
    resume. The drain is undone only while its reason is still ours."""

    def __init__(self, plan: Plan, slurm: Slurm, settings: Settings, node: str,
                 conf_lock: threading.Lock, clock: Callable[[], float],
                 sleep: Callable[[float], None], node_gres_command: str = "") -> None:
        self.plan, self.slurm, self.settings = plan, slurm, settings
        self.conf_lock, self.clock, self.sleep = conf_lock, clock, sleep
        self.node_gres_command = node_gres_command
        self.outcome = Outcome(node)

    def drain(self, why: str) -> None:
        node = self.slurm.node(self.name)
        if node is None:
            raise MoveFailed(f"slurmctld does not know node {self.name}")
        if node.draining and not _ours(node):
            raise MoveFailed(f"node {self.name} is drained by someone else ({node.reason!r})")
        if not _ours(node):
            self.slurm.drain(self.name, fit(f"{REASON_PREFIX}: {why}"))

    def wait_idle(self, timeout_s: float) -> None:
        try:
            self.wait_drained(_ours, timeout_s)
        except RelayoutError as err:
            raise MoveFailed(str(err)) from None

    def make_seen(self) -> None:
        if self.node_gres_command:
            self._render_on_node()
        try:
            self._make_slurm_see_it()
        except RelayoutError as err:
            raise MoveFailed(str(err)) from None

    def _render_on_node(self) -> None:
        """The node's own gres.conf, rendered on the node from the plan and the state file
        beside it (which the node must see, as the SPANK plugin's check does), before the
        reconfigure reads it."""
        argv = command_argv(self.node_gres_command, ("node",), node=self.name)
        try:
            done = proc.run(argv, timeout=self.settings.settle_timeout_s, env=self.settings.env)
        except proc.ProcError as err:
            raise MoveFailed(f"rendering node {self.name}'s gres.conf failed: {err}") from None
        if done.returncode != 0:
            lines = done.output.strip().splitlines()
            raise MoveFailed(f"rendering node {self.name}'s gres.conf failed (exit "
                             f"{done.returncode}): {lines[-1] if lines else 'no output'}")
        self.say("rendered its gres.conf")

    def resume(self) -> None:
        node = self.slurm.node(self.name)
        if _ours(node):
            self.slurm.resume(self.name)
        elif node is not None and node.draining:
            self.say("the drain is no longer ours; left as it is")


class Mover:
    """Carries moves out (see the module's text); ``log`` says what happened."""

    def __init__(self, plan: Plan, slurm: Slurm, kube: KubeFence, settings: TidalSettings,
                 state: TidalState, journal: TidalJournal,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time,
                 reservations: Optional[Reservations] = None) -> None:
        self.plan, self.slurm, self.kube, self.settings = plan, slurm, kube, settings
        self.reservations = reservations
        self.when = datetime.datetime.now()  # the round's local time (run_round sets it)
        self.state, self.journal = state, journal
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.rules = {rule.name: rule for rule in plan.lending}
        self.conf_lock = threading.Lock()
        self.log: list[str] = []

    # -- one step each --------------------------------------------------------------------
    def _slurm(self, device: Device) -> SlurmSide:
        return SlurmSide(self.plan, self.slurm, self.settings.slurm, device.node,
                         self.conf_lock, self.clock, self.sleep,
                         self.settings.node_gres_command)

    def _fence(self, move: MoveEntry, side: SlurmSide) -> None:
        if move.source == K8S:
            self.kube.fence(move.device, move.rule)
        side.drain(f"{move.device.describe()} {move.source} -> {move.target} ({move.rule})")

    def holders(self, move: MoveEntry) -> tuple[int, str]:
        """FREE or HELD and the first line the node said of ``move``'s device."""
        return self.holders_on(move.device.node, [move.device], move.rule)[move.device]

    def holders_on(self, node: str, devices: list[Device], rule_name: str
                   ) -> dict[Device, tuple[int, str]]:
        """The holders command for ``devices`` of one node under one rule: one run where the
        template takes ``{devices}``, else one per device; MoveFailed when a run fails or
        leaves a device unanswered."""
        template = self.settings.holders_command
        if BATCH_PLACEHOLDER not in template:
            return {device: self._holders_run(node, device.describe(),
                                              self._fill(device, rule_name))
                    for device in devices}
        specs = {device_spec(d, self._fill(d, rule_name)): d for d in devices}
        code, lines = self._holders_lines(node, f"{len(devices)} device(s)",
                                          devices=",".join(specs))
        answers: dict[Device, tuple[int, str]] = {}
        for line in lines:
            spec, _, rest = line.partition(" ")
            verdict, _, text = rest.partition(" ")
            device = specs.get(spec)
            if device is not None and verdict in ("free", "held"):
                answers[device] = (FREE if verdict == "free" else HELD, text or line)
        missing = [d.describe() for d in devices if d not in answers]
        if missing:
            raise MoveFailed(f"asking node {node} which pods hold its devices: no answer for "
                             f"{', '.join(missing)} (exit {code})")
        return answers

    def _fill(self, device: Device, rule_name: str) -> dict[str, str]:
        dra = "-"
        if self.kube.settings.mode == "dra":
            dra = "/".join(self.kube.dra_key(device))
        return {"gpu": str(device.gpu), "slice": str(device.slice),
                "profile": self.rules[rule_name].profile or "-", "dra": dra}

    def _holders_run(self, node: str, what: str, values: dict[str, str]) -> tuple[int, str]:
        code, lines = self._holders_lines(node, what, **values)
        return code, lines[0] if lines else ""

    def _holders_lines(self, node: str, what: str, **values: str) -> tuple[int, list[str]]:
        argv = command_argv(self.settings.holders_command, HOLDERS_PLACEHOLDERS, node=node,
                            **{name: values.get(name, "-") for name in HOLDERS_PLACEHOLDERS
                               if name != "node"})
        try:
            done = proc.run(argv, timeout=self.settings.slurm.settle_timeout_s,
                            env=self.settings.slurm.env)
        except proc.ProcError as err:
            raise MoveFailed(f"asking node {node} which pods hold {what} failed: "
                             f"{err}") from None
        lines = done.output.strip().splitlines()
        if done.returncode not in (FREE, HELD):
            raise MoveFailed(f"asking node {node} which pods hold {what} failed (exit "
                             f"{done.returncode}): {lines[-1] if lines else 'no output'}")
        return done.returncode, lines

    def _release(self, move: MoveEntry, side: SlurmSide) -> None:
        if move.source == K8S:
            deadline = self.clock() + self.settings.release_timeout_s
            while True:
                code, first = self.holders(move)
                if code == FREE:
                    break
                if self.clock() > deadline:
                    raise StillHeld(f"{move.device.describe()} was still held after "
                                     f"{self.settings.release_timeout_s:.0f} s: {first}")
                self.sleep(self.settings.slurm.poll_s)
        side.wait_idle(self.settings.slurm.drain_timeout_s)

    def _give(self, move: MoveEntry, side: SlurmSide) -> None:
        now = self.wall()
        home = self.rules[move.rule].home
        if move.target == home:
            entry = self.state.lent.pop(move.device, None)
            if entry is not None:
                self.state.counters.lent(move.source, max(0.0, now - entry.since))
        else:
            self.state.lent.setdefault(move.device, Lent(move.rule, now))
        save_state(self.state)
        side.make_seen()
        self.reserve(move.device.node)

    def reserve(self, node: str) -> None:
        """The node's reservation from the earliest time a job on what it has lent to Slurm
        must be gone by (``reservation``), before the node resumes; removed when nothing
        is lent there. Each round sets it again: a demand's bound moves with the clock."""
        if self.reservations is None:
            return
        ends = []
        for device, entry in self.state.lent.items():
            rule = self.rules.get(entry.rule)
            if device.node == node and rule is not None and rule.borrower == SLURM:
                bound = borrowed_until(rule, self.when)
                if bound is not None:
                    ends.append((bound, rule.reclaim_minutes))
        name = reservation_name(node)
        try:
            if ends:
                start, minutes = min(ends)
                self.reservations.set(name, node, start, minutes)
            else:
                self.reservations.clear(name)
        except SlurmClientError as err:
            raise MoveFailed(f"the reservation {name} that keeps borrowed jobs within the "
                             f"rule's promise could not be set: {err}") from None

    def _unfence(self, move: MoveEntry, side: SlurmSide) -> None:
        if move.target == K8S:
            self.kube.unfence(move.device)
        side.resume()

    # -- a whole move ---------------------------------------------------------------------
    def _steps_from(self, move: MoveEntry, after: str) -> None:
        side = self._slurm(move.device)
        actions = {"fenced": self._fence, "released": self._release, "given": self._give,
                   "unfenced": self._unfence}
        for step in STEPS[STEPS.index(after) + 1:]:
            if step in actions:
                self.journal.mark(move, started=step)
                actions[step](move, side)
            self.journal.mark(move, step=step)
        self.log.extend(side.outcome.log)

    def _undo(self, move: MoveEntry) -> None:
        """Back to where it was: the source keeps the device (before ``given``)."""
        if move.source == K8S:
            self.kube.unfence(move.device)
        self._slurm(move.device).resume()
        self.journal.mark(move, step="done")

    def carry_out(self, move: MoveEntry) -> bool:
        """One move; False when it was undone or left for the next run (logged)."""
        started = self.clock()
        try:
            self._steps_from(move, move.step)
        except (MoveFailed, KubeError, SlurmClientError) as err:
            decision = recover(move.step, move.reclaim, move.started)
            if decision.action == "undo":
                try:
                    self._undo(move)
                except (MoveFailed, KubeError, SlurmClientError) as again:
                    self.log.append(f"{move.device.describe()}: {err}; undoing it failed too "
                                    f"({again}): the next run tries again")
                    return False
                self.state.counters.refuse("busy" if isinstance(err, StillHeld) else "failed")
                save_state(self.state)
                self.log.append(f"{move.device.describe()}: not moved: {err}")
            else:
                self.log.append(f"{move.device.describe()}: {err}; {decision.why}: the next "
                                "run finishes it")
            return False
        if move.reclaim:
            self.state.counters.reclaimed(self.clock() - started)
            save_state(self.state)
        self.log.append(f"{move.device.describe()}: {move.source} -> {move.target} "
                        f"({move.rule})")
        return True

    def recover_open(self) -> None:
        """Finish or undo what an earlier run left in the journal."""
        for move in list(self.journal.open_moves):
            decision = recover(move.step, move.reclaim, move.started)
            self.log.append(f"{move.device.describe()}: an earlier run left it at "
                            f"'{move.step}'; {decision.action} ({decision.why})")
            if decision.action == "undo":
                try:
                    self._undo(move)
                except (MoveFailed, KubeError, SlurmClientError) as err:
                    self.log.append(f"{move.device.describe()}: undoing failed: {err}")
            elif decision.action == "finish":
                self.carry_out(move)

    def plan_move(self, move: Move) -> MoveEntry:
        rule: LendingRule = self.rules[move.rule]
        source = rule.home if move.to == rule.borrower else rule.borrower
        entry = MoveEntry(move.device, move.rule, source, move.to,
                          reclaim=move.to == rule.home)
        self.journal.moves.append(entry)
        self.journal.mark(entry)
        return entry

