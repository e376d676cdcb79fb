# SPDX-License-Identifier: GPL-2.0-or-later
"""One node's round of ``gpushare relayout --apply``: drain, wait until idle, run the node's
step for each GPU, make Slurm see it, resume; every move written to the journal first.

The same round repairs what a killed run left (``repair``): on a node the killed run began
to change, each GPU not yet applied (one whose step started and never reported may hold no
instances) gets the journalled layout, else its old one back; then Gres= and the drain are
made to match what the GPUs hold.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Sequence

from gpushare.admin.plan import Plan
from gpushare.admin.relayout.decide import Change
from gpushare.admin.relayout.journal import Journal
from gpushare.admin.relayout.remote import command_argv
from gpushare.admin.relayout.settings import (
    EXIT_UNKNOWN,
    REASON_PREFIX,
    Outcome,
    RelayoutError,
    Settings,
    Slurm,
    fit,
    ours,
)
from gpushare.admin.relayout.slurmsync import SlurmSync
from gpushare.admin.relayout.state import Applied, load_state, locked
from gpushare.admin.slurm_client import SlurmClientError
from gpushare.common import proc

__all__ = ["NodeRound"]


class NodeRound(SlurmSync):
    """One node's round: the steps above, each bounded."""

    def __init__(self, plan: Plan, slurm: Slurm, settings: Settings, decision_id: str,
                 changes: Sequence[Change], journal: Journal, conf_lock: threading.Lock,
                 clock: Callable[[], float], sleep: Callable[[float], None],
                 wall: Callable[[], float]) -> None:
        self.plan, self.slurm, self.settings = plan, slurm, settings
        self.decision_id, self.changes = decision_id, list(changes)
        self.journal, self.conf_lock = journal, conf_lock
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.outcome = Outcome(changes[0].node)
        self._prior: dict[int, Optional[Applied]] = {}

    def mark(self, phase: Optional[str] = None, gpu: Optional[int] = None,
             status: Optional[str] = None) -> None:
        self.journal.mark(self.name, phase, gpu, status)

    def start(self) -> bool:
        """Drain the node; False when it is left alone (the outcome says why)."""
        before = self.slurm.node(self.name)
        if before is None:
            self.outcome.skipped = "slurmctld does not know the node"
            return False
        if before.down or (before.draining and not ours(before)):
            self.outcome.skipped = (f"the node is {'+'.join(before.states)}"
                                    + (f" ({before.reason})" if before.reason else "")
                                    + "; left as it is")
            return False
        what = ", ".join(f"GPU {c.index} {c.old} -> {c.new}" for c in self.changes)
        self.slurm.drain(self.name, fit(f"{REASON_PREFIX} {self.decision_id}: {what}"))
        self.say(f"drained for {what}")
        return True

    def finish(self, repair: bool = False) -> Outcome:
        """Wait until idle, change, make Slurm see it, resume (or leave it drained)."""
        try:
            self.wait_drained(ours, self.settings.drain_timeout_s, "--drain-timeout")
        except RelayoutError as err:
            if repair:  # Slurm may not know what its GPUs hold: not back to service
                return self._leave_drained(RelayoutError(
                    f"an interrupted run had begun changing its GPUs, and {err}"))
            self._resume_if_ours()
            self.outcome.skipped = str(err)
            self.say(f"{err}; resumed unchanged")
            return self.outcome
        try:
            self._repair_steps() if repair else self._steps()
            self._keep_one_profile()
            self.mark(phase="slurm")
            if self.outcome.applied:
                self._make_slurm_see_it()
        except RelayoutError as err:
            return self._leave_drained(err)
        self._resume_if_ours()
        self.say("resumed")
        if repair:  # the round this run decides next must count the node and its new GPUs
            self.mark(phase="done")  # settled: a run killed during the wait leaves it alone
            self.await_service()
        return self.outcome

    def _leave_drained(self, err: RelayoutError) -> Outcome:
        self.outcome.failed = str(err)
        try:
            self.slurm.drain(self.name, fit(f"{REASON_PREFIX}: {err}"))
        except SlurmClientError as again:
            self.say(f"could not set the drain reason: {again}")
        self.say(f"left drained: {err}")
        return self.outcome

    def _run_step(self, change: Change, layout: str,
                  others: Optional[dict[int, str]] = None) -> tuple[int, str]:
        """The node's step for one GPU: its exit status (0, or 1/2: refused or laid back) and
        last line; RelayoutError when its result is not known. ``others``: the round's
        other GPUs' layouts the step counts (default: their new ones)."""
        timeout = self.settings.step_timeout_s
        layouts = others if others is not None else {c.index: c.new for c in self.changes}
        round_text = ",".join(f"{i}={text}" for i, text in sorted(layouts.items())
                              if i != change.index)
        argv = command_argv(self.settings.node_command, node=self.name,
                            gpu=str(change.index), layout=layout,
                            decision=self.decision_id, timeout=f"{timeout:g}",
                            round=round_text)
        # The step checks its own limit before each NVML change and restores on its own;
        # the margin lets it finish that restore before it is killed.
        limit = 2 * timeout + self.settings.step_grace_s
        try:
            done = proc.run(argv, timeout=limit, env=self.settings.env)
        except proc.CommandTimeout:
            raise RelayoutError(f"GPU {change.index} -> {layout}: the node's step did not end "
                                f"within {limit:.0f} s; its layout is unknown, check it with "
                                "gpushare check") from None
        except proc.ProcError as err:
            raise RelayoutError(f"GPU {change.index}: the node's step could not run: "
                                f"{err}") from None
        output = done.output
        last = output.splitlines()[-1] if output else f"exit {done.returncode}"
        if done.returncode == EXIT_UNKNOWN or done.returncode not in (0, 1, 2):
            raise RelayoutError(f"GPU {change.index} -> {layout} failed and its layout is "
                                f"not known: {last}")
        return done.returncode, last

    def _remember(self, change: Change) -> None:
        """The state file's entry before the step (which records its own) changes it."""
        if change.index not in self._prior:
            self._prior[change.index] = load_state(self.settings.state_path).gpus.get(
                (self.name, change.index))

    def _steps(self) -> None:
        for change in self.changes:
            self._remember(change)
            self.mark(phase="changing", gpu=change.index, status="started")
            try:
                code, last = self._run_step(change, change.new)
            except RelayoutError:
                self.mark(gpu=change.index, status="unknown")
                raise
            if code == 0:
                self._record(change, change.new)
                self.say(f"GPU {change.index}: {change.old} -> {change.new}")
                continue
            self.mark(gpu=change.index, status="kept")
            self.outcome.restored.append((change, last))
            self.say(f"GPU {change.index} kept {change.old}: {last}")

    def _repair_steps(self) -> None:
        """Finish the round an interrupted run began on this node: each GPU not yet applied
        or kept takes its journalled layout, else its old one back (the lay-back that
        follows keeps one MIG profile where Slurm indexes one)."""
        status = {g.gpu: g.status for g in self.journal.node(self.name).gpus}
        for change in self.changes:
            if status[change.index] == "applied":
                self.outcome.applied.append(change)
                continue
            if status[change.index] == "kept":
                continue
            self._remember(change)
            self.mark(phase="changing", gpu=change.index, status="started")
            code, last = self._run_step(change, change.new)
            if code == 0:
                self._record(change, change.new)
                self.say(f"GPU {change.index}: finished {change.old} -> {change.new}")
                continue
            code, again = self._run_step(change, change.old,
                                         {c.index: c.old for c in self.changes})
            if code != 0:
                raise RelayoutError(f"GPU {change.index} of an interrupted run took neither "
                                    f"{change.new} ({last}) nor {change.old} ({again})")
            self.mark(gpu=change.index, status="kept")
            self.outcome.restored.append((change, last))
            self.say(f"GPU {change.index}: laid back to {change.old}: {last}")

    def _keep_one_profile(self) -> None:
        """Slurm before 23.11 indexes one MIG profile per node: where a GPU of the round kept
        its old layout (its step refused or laid it back, or an interrupted run never
        started it) and two profiles would remain, lay the ones that changed back too, so
        the node resumes as it was rather than staying drained."""
        if not self.settings.one_profile_per_node or not self.outcome.applied:
            return
        if len(self._slurm_profiles()) <= 1:
            return
        for change in list(self.outcome.applied):
            # The end it heads to: every GPU of the round in its old layout.
            code, last = self._run_step(change, change.old,
                                        {c.index: c.old for c in self.changes})
            if code != 0:
                raise RelayoutError(
                    f"GPU {change.index} changed but not the others of the round, which leaves "
                    "two Slurm MIG profiles on the node (this Slurm indexes one), and laying "
                    f"it back to {change.old} failed: {last}")
            self._unrecord(change)
            self.outcome.applied.remove(change)
            self.outcome.restored.append((change, "laid back: the round's other GPUs kept "
                                          "their layout and this Slurm indexes one MIG "
                                          "profile per node"))
            self.say(f"GPU {change.index}: laid back to {change.old} (one MIG profile per "
                     "node)")

    def _record(self, change: Change, layout: str) -> None:
        with locked(self.settings.state_path) as state:
            state.gpus[(self.name, change.index)] = Applied(layout, self.wall(),
                                                            self.decision_id)
        self.mark(gpu=change.index, status="applied")
        self.outcome.applied.append(change)

    def _unrecord(self, change: Change) -> None:
        """The state file's entry as it was before this round changed the GPU (the node's
        step recorded the old layout as applied)."""
        with locked(self.settings.state_path) as state:
            prior = self._prior.get(change.index)
            if prior is None:
                state.gpus.pop((self.name, change.index), None)
            else:
                state.gpus[(self.name, change.index)] = prior
        self.mark(gpu=change.index, status="kept")

    def _resume_if_ours(self) -> None:
        node = self.slurm.node(self.name)
        if node is not None and not node.draining and not node.down:
            # Slurm before 23.11: the registration that cleared an INVAL cleared the drain.
            self.say("slurmctld had put it back in service once slurmd registered the new "
                     "GRES")
        elif ours(node):
            self.slurm.resume(self.name)
        else:
            self.say("the drain is no longer ours; left as it is")
