# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare relayout --apply``: carry a decision out through Slurm, a node at a time.

Slurm has no per-GPU drain, and a node that re-registers other GPUs while a job holds any
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
5. wait until slurmctld shows the new GRES, then resume the node.

A step that fails and lays the old layout back resumes the node as it was; one whose result
is unknown (a timeout, a failed restore) or a Slurm step that fails leaves the node drained
with the cause in its reason, for an administrator. The drain is only undone when its reason
is still ours.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from gpushare.admin.plan import Plan
from gpushare.admin.relayout import DEFAULT_NODE_COMMAND
from gpushare.admin.relayout.decide import Change, Decision
from gpushare.admin.relayout.state import Applied, applied_plan, locked
from gpushare.admin.slurm_client import (
    SlurmClientError,
    SlurmNode,
    parse_node_gres,
    parse_scontrol_nodes,
)
from gpushare.common import proc

__all__ = [
    "DEFAULT_NODE_COMMAND",
    "REASON_PREFIX",
    "Outcome",
    "RelayoutError",
    "Scontrol",
    "SetGresError",
    "Settings",
    "apply_decision",
    "command_argv",
    "set_node_gres",
]

REASON_PREFIX = "gpushare relayout"
PLACEHOLDERS = ("node", "gpu", "layout", "decision", "timeout", "round")
EXIT_UNKNOWN = 3  # the node's step: the GPU's layout is not known; keep the node drained
_BUSY_STATES = {"ALLOCATED", "MIXED", "COMPLETING"}


class RelayoutError(RuntimeError):
    """A step of the orchestration failed; the message is the node's drain reason."""


class SetGresError(ValueError):
    """slurm.conf has no line for the node, or one gpushare cannot safely rewrite."""


class Slurm(Protocol):
    """What the orchestration asks of slurmctld (scontrol, or a fake in the tests)."""

    def node(self, name: str) -> Optional[SlurmNode]: ...

    def drain(self, name: str, reason: str) -> None: ...

    def resume(self, name: str) -> None: ...

    def reconfigure(self) -> None: ...


class Scontrol:
    """Slurm through scontrol; each call bounded by ``timeout``, retried while slurmctld is
    briefly away (a restart) until ``patience`` seconds have passed."""

    def __init__(self, scontrol: str, timeout: float = 10.0, patience: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if not scontrol.startswith("/"):
            raise SlurmClientError(f"{scontrol}: give the Slurm command as an absolute path")
        self.scontrol, self.timeout, self.patience, self.sleep = scontrol, timeout, patience, sleep

    def _call(self, *args: str) -> str:
        from gpushare.admin.slurm_client import _run

        deadline = time.monotonic() + self.patience
        while True:
            try:
                return _run([self.scontrol, *args], self.timeout)
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


@dataclass
class Settings:
    """Where things are and how long each step may take."""

    node_command: str = DEFAULT_NODE_COMMAND
    slurmd_restart: str = ""  # e.g. "ssh {node} systemctl restart slurmd"; "": none
    # Slurm before 23.11 keeps a node's GPU count across `scontrol reconfigure` ("invalid with
    # File configuration") and takes a new one only when slurmctld restarts; "": reconfigure.
    slurmctld_restart: str = ""
    slurm_conf: str = "/etc/slurm/slurm.conf"
    cluster_gres_conf: str = ""  # a gres.conf every node shares, re-rendered; "": none
    one_profile_per_node: bool = False  # Slurm before 23.11 with AutoDetect=off
    state_path: str = "/etc/gpushare/relayout-state.json"
    drain_timeout_s: float = 5400.0
    step_timeout_s: float = 120.0
    step_grace_s: float = 30.0  # beyond twice the step's own limit, before it is killed
    settle_timeout_s: float = 120.0
    poll_s: float = 2.0
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass
class Outcome:
    """What happened on one node."""

    node: str
    applied: list[Change] = field(default_factory=list)
    restored: list[tuple[Change, str]] = field(default_factory=list)
    failed: Optional[str] = None  # the node stays drained with this reason
    skipped: str = ""  # nothing was done, and why
    log: list[str] = field(default_factory=list)

    @property
    def resumed(self) -> bool:
        return self.failed is None and not self.skipped


def command_argv(template: str, **values: str) -> list[str]:
    """The site's command for one node, split as a shell would but never run by one: each
    ``{node}``, ``{gpu}``, ``{layout}``, ``{decision}``, ``{timeout}``, ``{round}`` (the
    round's other GPUs of the node, ``N=LAYOUT,...``) is replaced inside
    its word, so a value can never become a second argument or a shell operator."""
    words = shlex.split(template)
    if not words:
        raise ValueError("the command is empty")
    argv = []
    for word in words:
        for name in re.findall(r"{(\w*)}", word):
            if name not in PLACEHOLDERS:
                raise ValueError(f"unknown placeholder {{{name}}} in {template!r}; use "
                                 + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
        argv.append(re.sub(r"{(\w+)}",
                           lambda m: values.get(str(m.group(1)), str(m.group(0))), word))
    return argv


def _node_names(expression: str) -> list[str]:
    import hostlist

    try:
        return list(hostlist.expand_hostlist(expression))
    except (hostlist.BadHostlist, ValueError):
        return [expression]


def node_gres_in(text: str, node: str) -> str:
    """``Gres=`` of ``node``'s NodeName line in slurm.conf ``text`` ("" when it has none)."""
    for line in text.splitlines():
        words = line.split()
        match = re.match(r"(?i)nodename=(\S+)", words[0]) if words else None
        if match and match.group(1).upper() != "DEFAULT" and node in _node_names(match.group(1)):
            return next((w.split("=", 1)[1] for w in words[1:] if w.lower().startswith("gres=")),
                        "")
    return ""


def set_node_gres(text: str, node: str, gres: str) -> str:
    """slurm.conf ``text`` with ``Gres=`` of ``node``'s NodeName line set to ``gres`` (removed
    when empty). A line naming several nodes is split: the others keep theirs."""
    import hostlist

    lines = text.splitlines(keepends=True)
    for position, line in enumerate(lines):
        stripped = line.strip()
        match = re.match(r"(?i)nodename=(\S+)", stripped)
        if not match or match.group(1).upper() == "DEFAULT":
            continue
        names = _node_names(match.group(1))
        if node not in names:
            continue
        if stripped.endswith("\\"):
            raise SetGresError(f"the NodeName line of {node} goes on over several lines; "
                               "write it on one line")
        words = stripped.split()
        rest = [w for w in words[1:] if not w.lower().startswith("gres=")]
        own = [f"NodeName={node}", *rest] + ([f"Gres={gres}"] if gres else [])
        others = [n for n in names if n != node]
        replacement = []
        if others:
            old = [f"NodeName={hostlist.collect_hostlist(others)}", *words[1:]]
            replacement.append(" ".join(old) + "\n")
        replacement.append(" ".join(own) + "\n")
        lines[position:position + 1] = replacement
        return "".join(lines)
    raise SetGresError(f"no NodeName line names {node}")


def _comparable(gres: str) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for (name, gres_type), count in parse_node_gres(gres).items():
        if name not in ("gpu", "mps", "shard"):
            continue
        key = (name, "") if name in ("mps", "shard") else (name, gres_type)
        counts[key] = counts.get(key, 0) + count
    return {k: v for k, v in counts.items() if v}


def _shows(seen: dict[tuple[str, str], int], want: dict[tuple[str, str], int]) -> bool:
    """slurmctld shows the wanted GRES: the same types, each at least as many. Slurm 22.05
    counts each file of a MIG slice's ``MultipleFiles=`` line as a GPU of its own once a
    reconfigure has taken the node's count (3 per slice), more than slurm.conf says."""
    return set(seen) == set(want) and all(seen[key] >= count for key, count in want.items())


def _ours(node: Optional[SlurmNode]) -> bool:
    return node is not None and node.reason.startswith(REASON_PREFIX)


def _idle(node: SlurmNode) -> bool:
    return "IDLE" in node.states and not _BUSY_STATES.intersection(node.states)


def _fit(reason: str, limit: int = 240) -> str:
    """A drain reason on one line that scontrol stores whole."""
    flat = " ".join(reason.replace('"', "'").split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


class _Node:
    """One node's round: the steps above, each bounded."""

    def __init__(self, plan: Plan, slurm: Slurm, settings: Settings, decision_id: str,
                 changes: Sequence[Change], clock: Callable[[], float],
                 sleep: Callable[[float], None], wall: Callable[[], float]) -> None:
        self.plan, self.slurm, self.settings = plan, slurm, settings
        self.decision_id, self.changes = decision_id, list(changes)
        self.clock, self.sleep, self.wall = clock, sleep, wall
        self.outcome = Outcome(changes[0].node)

    @property
    def name(self) -> str:
        return self.outcome.node

    def say(self, text: str) -> None:
        self.outcome.log.append(f"{self.name}: {text}")

    def start(self) -> bool:
        """Drain the node; False when it is left alone (the outcome says why)."""
        before = self.slurm.node(self.name)
        if before is None:
            self.outcome.skipped = "slurmctld does not know the node"
            return False
        if before.down or (before.draining and not _ours(before)):
            self.outcome.skipped = (f"the node is {'+'.join(before.states)}"
                                    + (f" ({before.reason})" if before.reason else "")
                                    + "; left as it is")
            return False
        what = ", ".join(f"GPU {c.index} {c.old} -> {c.new}" for c in self.changes)
        self.slurm.drain(self.name, _fit(f"{REASON_PREFIX} {self.decision_id}: {what}"))
        self.say(f"drained for {what}")
        return True

    def finish(self) -> Outcome:
        """Wait until idle, change, make Slurm see it, resume (or leave it drained)."""
        try:
            self._wait_idle()
        except RelayoutError as err:
            self._resume_if_ours()
            self.outcome.skipped = str(err)
            self.say(f"{err}; resumed unchanged")
            return self.outcome
        try:
            self._steps()
            if self.outcome.applied:
                self._make_slurm_see_it()
        except RelayoutError as err:
            self.outcome.failed = str(err)
            try:
                self.slurm.drain(self.name, _fit(f"{REASON_PREFIX}: {err}"))
            except SlurmClientError as again:
                self.say(f"could not set the drain reason: {again}")
            self.say(f"left drained: {err}")
            return self.outcome
        self._resume_if_ours()
        self.say("resumed")
        return self.outcome

    def _wait_idle(self) -> None:
        deadline = self.clock() + self.settings.drain_timeout_s
        while True:
            node = self.slurm.node(self.name)
            if node is None or node.down:
                raise RelayoutError("the node went down while it drained")
            if not _ours(node):
                raise RelayoutError(f"someone else changed the node's drain ({node.reason!r})")
            if _idle(node):
                return
            if self.clock() > deadline:
                raise RelayoutError(f"its jobs still ran after --drain-timeout "
                                    f"{self.settings.drain_timeout_s:.0f} s")
            self.sleep(self.settings.poll_s)

    def _steps(self) -> None:
        timeout = self.settings.step_timeout_s
        for change in self.changes:
            others = ",".join(f"{c.index}={c.new}" for c in self.changes if c is not change)
            argv = command_argv(self.settings.node_command, node=self.name,
                                gpu=str(change.index), layout=change.new,
                                decision=self.decision_id, timeout=f"{timeout:g}",
                                round=others)
            # The step checks its own limit before each NVML change and restores on its
            # own; the margin lets it finish that restore before it is killed.
            limit = 2 * timeout + self.settings.step_grace_s
            try:
                done = proc.run(argv, timeout=limit, env=self.settings.env)
            except proc.CommandTimeout:
                raise RelayoutError(f"GPU {change.index} -> {change.new}: the node's step "
                                    f"did not end within {limit:.0f} s; its layout is "
                                    "unknown, check it with gpushare check") from None
            except proc.ProcError as err:
                raise RelayoutError(f"GPU {change.index}: the node's step could not run: "
                                    f"{err}") from None
            output = done.output
            if done.returncode == 0:
                self._record(change)
                self.say(f"GPU {change.index}: {change.old} -> {change.new}")
                continue
            last = output.splitlines()[-1] if output else f"exit {done.returncode}"
            if done.returncode == EXIT_UNKNOWN or done.returncode not in (1, 2):
                raise RelayoutError(f"GPU {change.index} -> {change.new} failed and its "
                                    f"layout is not known: {last}")
            self.outcome.restored.append((change, last))
            self.say(f"GPU {change.index} kept {change.old}: {last}")

    def _record(self, change: Change) -> None:
        with locked(self.settings.state_path) as state:
            state.gpus[(self.name, change.index)] = Applied(change.new, self.wall(),
                                                            self.decision_id)
        self.outcome.applied.append(change)

    def _make_slurm_see_it(self) -> None:
        from gpushare.admin.relayout.apply import write_atomically
        from gpushare.admin.relayout.state import load_state
        from gpushare.admin.render import slurm_node_gres

        try:
            now = applied_plan(self.plan, load_state(self.settings.state_path))
        except ValueError as err:
            raise RelayoutError(f"the state file does not fit the plan: {err}") from None
        group = now.group_of(self.name)
        assert group is not None  # the decision only changes nodes of the plan
        profiles = {s.profile for gpu in group.gpus for s in gpu.slices_of("slurm")}
        if self.settings.one_profile_per_node and len(profiles) > 1:
            raise RelayoutError(
                "GPU " + ", ".join(f"{c.index}" for c in self.outcome.applied) + " changed but "
                "not the others of the round, which leaves Slurm MIG profiles "
                + ", ".join(sorted(profiles)) + " on the node; this Slurm indexes one")
        gres = slurm_node_gres(group)
        path = self.settings.slurm_conf
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            old_gres = node_gres_in(text, self.name)
            new_text = set_node_gres(text, self.name, gres)
            if new_text != text:
                write_atomically(path, new_text)
        except (OSError, SetGresError) as err:
            raise RelayoutError(f"the GPUs changed but {path} was not updated: {err}") from None
        self.say(f"Gres={gres} in {path}")
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
            _comparable(gres) != _comparable(old_gres)
        try:
            self.slurm.reconfigure()
        except SlurmClientError as err:
            raise RelayoutError(f"scontrol reconfigure failed: {err}") from None
        if self.settings.slurmd_restart:
            self._run_restart("slurmd", self.settings.slurmd_restart)
        want = _comparable(gres)
        unsettled = {"INVAL", "INVALID_REG", "NOT_RESPONDING", "DOWN", "UNKNOWN"}

        def settled(node: SlurmNode) -> bool:
            return _shows(_comparable(node.gres), want) and not unsettled & set(node.states) \
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
            self._run_restart("slurmctld", self.settings.slurmctld_restart)
            try:
                self._settle(self.clock() + self.settings.settle_timeout_s, f"Gres={gres}",
                             settled)
                return
            except RelayoutError:
                if attempt == 2:
                    raise

    def _settle(self, deadline: float, what: str, ready: Callable[[SlurmNode], bool]) -> None:
        """Poll slurmctld until the node is ``ready``, through a slurmctld briefly away."""
        seen = ""
        while True:
            try:
                node = self.slurm.node(self.name)
            except SlurmClientError as err:
                node, seen = None, str(err)
            if node is not None:
                seen = f"Gres={node.gres or '(null)'} State={'+'.join(node.states)}"
                if ready(node):
                    return
            if self.clock() > deadline:
                raise RelayoutError(f"slurmctld still shows {seen}, not {what}, after "
                                    f"{self.settings.settle_timeout_s:.0f} s")
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

    def _resume_if_ours(self) -> None:
        node = self.slurm.node(self.name)
        if node is not None and not node.draining and not node.down:
            # Slurm before 23.11: the registration that cleared an INVAL cleared the drain.
            self.say("slurmctld had put it back in service once slurmd registered the new "
                     "GRES")
        elif _ours(node):
            self.slurm.resume(self.name)
        else:
            self.say("the drain is no longer ours; left as it is")


def apply_decision(plan: Plan, decision: Decision, decision_id: str, slurm: Slurm,
                   settings: Settings, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep,
                   wall: Callable[[], float] = time.time) -> list[Outcome]:
    """Carry ``decision`` out: every node is drained first, so that all of them empty at
    once, then each is changed and brought back in turn. The state file counts the round
    and each result (``gpushare metrics --relayout-state``)."""
    by_node: dict[str, list[Change]] = {}
    for change in decision.changes:
        by_node.setdefault(change.node, []).append(change)
    nodes = [_Node(plan, slurm, settings, decision_id, changes, clock, sleep, wall)
             for changes in by_node.values()]
    started = []
    for node in nodes:
        try:
            if node.start():
                started.append(node)
        except SlurmClientError as err:
            node.outcome.failed = f"slurmctld: {err}"
    for node in started:
        try:
            node.finish()
        except SlurmClientError as err:
            node.outcome.failed = f"slurmctld: {err}"
    outcomes = [node.outcome for node in nodes]
    with locked(settings.state_path) as state:
        if decision.changes:
            state.count("decisions")
        for outcome in outcomes:
            state.count("applied", len(outcome.applied))
            state.count("restored", len(outcome.restored))
            state.count("failed", 1 if outcome.failed else 0)
    return outcomes
