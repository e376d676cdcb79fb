# SPDX-License-Identifier: GPL-2.0-or-later
"""Making slurmctld see a node's new layout: its ``Gres=`` in slurm.conf (through
``slurmconf``), the shared gres.conf, ``scontrol reconfigure``, the restarts, and the wait
until slurmctld shows it. Nodes run in parallel; the slurm.conf edit, the reconfigure and
the restarts are one node's at a time (``conf_lock``)."""

from __future__ import annotations

import threading
from typing import Callable, Optional

from gpushare.admin.plan import Plan
from gpushare.admin.relayout.remote import command_argv
from gpushare.admin.relayout.settings import Outcome, RelayoutError, Settings, Slurm, idle
from gpushare.admin.relayout.slurmconf import (
    SetGresError,
    check_writable,
    comparable,
    node_gres_in,
    set_node_gres,
    shows,
    write_conf,
)
from gpushare.admin.relayout.state import applied_plan, load_state, with_lent
from gpushare.admin.slurm_client import SlurmClientError, SlurmNode
from gpushare.common import proc

__all__ = ["SlurmSync"]

# Slurm's INVAL after a change: slurmd registered other GPUs than Gres= says, most often
# because no one rewrote the gres.conf it reads (the same Gres= either side says nothing).
INVALID_HINT = ("; INVAL: slurmd registered other GPUs than slurm.conf's Gres= gives the node: "
                "was its gres.conf rewritten (the node's step's --gres-conf, or "
                "--cluster-gres-conf for one that every node shares)?")


class SlurmSync:
    """The Slurm side of one node's round (mixed into its NodeRound)."""

    plan: Plan
    slurm: Slurm
    settings: Settings
    outcome: Outcome
    conf_lock: threading.Lock
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    @property
    def name(self) -> str:
        return self.outcome.node

    def say(self, text: str) -> None:
        self.outcome.log.append(f"{self.name}: {text}")

    def _applied(self) -> Plan:
        try:
            path = self.settings.state_path
            return with_lent(applied_plan(self.plan, load_state(path)), path)
        except ValueError as err:
            raise RelayoutError(f"the state file does not fit the plan: {err}") from None

    def wait_drained(self, ours: Callable[[Optional[SlurmNode]], bool], timeout_s: float,
                     limit: str = "") -> None:
        """Until the node, drained by us, runs no job; RelayoutError when it goes down, when
        someone else changes its drain (``ours`` tells), or after ``timeout_s`` (``limit``
        names the option that set it)."""
        deadline = self.clock() + timeout_s
        while True:
            node = self.slurm.node(self.name)
            if node is None or node.down:
                raise RelayoutError(f"node {self.name} went down while it drained")
            if not ours(node):
                raise RelayoutError(f"someone else changed node {self.name}'s drain "
                                    f"({node.reason!r})")
            if idle(node):
                return
            if self.clock() > deadline:
                named = f"{limit} " if limit else ""
                raise RelayoutError(f"node {self.name}'s jobs still ran after {named}"
                                    f"{timeout_s:.0f} s")
            self.sleep(self.settings.poll_s)

    def _slurm_profiles(self) -> set[str]:
        """The Slurm MIG profiles the node holds, as the state file and the plan say."""
        group = self._applied().group_of(self.name)
        assert group is not None  # the decision only changes nodes of the plan
        return {s.profile for gpu in group.gpus for s in gpu.slices_of("slurm")}

    def _make_slurm_see_it(self) -> None:
        from gpushare.admin.render import slurm_node_gres

        now = self._applied()
        group = now.group_of(self.name)
        assert group is not None  # the decision only changes nodes of the plan
        profiles = self._slurm_profiles()
        if self.settings.one_profile_per_node and len(profiles) > 1:
            raise RelayoutError(
                "GPU " + ", ".join(f"{c.index}" for c in self.outcome.applied) + " changed but "
                "not the others of the round, which leaves Slurm MIG profiles "
                + ", ".join(sorted(profiles)) + " on the node; this Slurm indexes one")
        gres = slurm_node_gres(group)
        path = self.settings.slurm_conf
        with self.conf_lock:  # one node's slurm.conf edit, reconfigure and restarts at a time
            try:
                target = check_writable(path, [self.name], self.settings.configless)
                with open(target, encoding="utf-8") as handle:
                    text = handle.read()
                old_gres = node_gres_in(text, self.name)
                new_text = set_node_gres(text, self.name, gres)
                if new_text != text:
                    write_conf(target, new_text)
            except (OSError, SetGresError) as err:
                raise RelayoutError(f"the GPUs changed but {path} was not updated: "
                                    f"{err}") from None
            self.say(f"Gres={gres} in {path}")
            restart = self._tell_slurm(now, gres, old_gres)
        self._await(gres, restart)

    def _tell_slurm(self, now: Plan, gres: str, old_gres: str) -> bool:
        """Render the shared gres.conf, reconfigure, restart slurmd; whether slurmctld must
        restart too (Slurm before 23.11 and a new GPU count)."""
        from gpushare.admin.relayout.apply import write_atomically

        if self.settings.cluster_gres_conf:
            from gpushare.admin.render import RenderError, render_gres_conf

            shared = self.settings.cluster_gres_conf
            try:
                write_atomically(shared, render_gres_conf(now))
            except (OSError, RenderError) as err:
                raise RelayoutError(f"the GPUs changed but {shared} was not rendered: "
                                    f"{err}") from None
            self.say(f"rendered {shared}")
        restart = bool(self.settings.slurmctld_restart) and \
            comparable(gres) != comparable(old_gres)
        try:
            self.slurm.reconfigure()
        except SlurmClientError as err:
            raise RelayoutError(f"scontrol reconfigure failed: {err}") from None
        if self.settings.slurmd_restart:
            self._run_restart("slurmd", self.settings.slurmd_restart)
        return restart

    def _await(self, gres: str, restart: bool) -> None:
        """Until slurmctld shows ``gres`` (restarting slurmctld first where it must)."""
        want = comparable(gres)
        unsettled = {"INVAL", "INVALID_REG", "NOT_RESPONDING", "DOWN", "UNKNOWN"}

        def settled(node: SlurmNode) -> bool:
            return shows(comparable(node.gres), want) and not unsettled & set(node.states) \
                and (node.registered or not restart)

        if not restart:
            self._settle(self.clock() + self.settings.settle_timeout_s, f"Gres={gres}", settled)
            return
        # After the reconfigure, so that the first registration the new slurmctld sees is
        # slurmd's new gres.conf. Until then the old slurmctld may take a lower count for
        # INVAL and replace the drain's reason; jobs live on in their slurmstepds. Should
        # slurmd's registration of its old gres.conf still beat the reconfigure (the new
        # slurmctld then keeps the old types), a second restart finds the new one.
        for attempt in (1, 2):
            with self.conf_lock:
                self._run_restart("slurmctld", self.settings.slurmctld_restart)
            try:
                self._settle(self.clock() + self.settings.settle_timeout_s, f"Gres={gres}",
                             settled)
                return
            except RelayoutError:
                if attempt == 2:
                    raise

    def await_service(self) -> None:
        """After a resume: until slurmctld has heard from the node again (Slurm may show a
        resumed node NOT_RESPONDING until its ping answers), so that a round decided next
        sees it in service. Bounded by --settle-timeout; a node still away is only said."""
        away = {"NOT_RESPONDING", "DOWN", "UNKNOWN"}
        try:
            self._settle(self.clock() + self.settings.settle_timeout_s, "in service",
                         lambda node: not away & set(node.states))
        except RelayoutError as err:
            self.say(str(err))

    def _settle(self, deadline: float, what: str, ready: Callable[[SlurmNode], bool]) -> None:
        """Poll slurmctld until the node is ``ready``, through a slurmctld briefly away."""
        seen, invalid = "", False
        while True:
            try:
                node = self.slurm.node(self.name)
            except SlurmClientError as err:
                node, seen = None, str(err)
            if node is not None:
                seen = f"Gres={node.gres or '(null)'} State={'+'.join(node.states)}"
                invalid = bool({"INVAL", "INVALID_REG"} & set(node.states))
                if ready(node):
                    return
            if self.clock() > deadline:
                raise RelayoutError(f"slurmctld still shows {seen}, not {what}, after "
                                    f"{self.settings.settle_timeout_s:.0f} s"
                                    + (INVALID_HINT if invalid else ""))
            self.sleep(self.settings.poll_s)

    def _run_restart(self, daemon: str, template: str) -> None:
        argv = command_argv(template, node=self.name)
        try:
            done = proc.run(argv, timeout=self.settings.settle_timeout_s, env=self.settings.env)
        except proc.ProcError as err:
            raise RelayoutError(f"restarting {daemon} failed: {err}") from None
        if done.returncode != 0:
            raise RelayoutError(f"restarting {daemon} failed (exit {done.returncode}): "
                                f"{done.output[-200:]}")
        self.say(f"restarted {daemon}")
