# SPDX-License-Identifier: GPL-2.0-or-later
"""One round of ``gpushare tidal --apply``: settle what an earlier run left, then per rule
ask what the home side uses, decide, and carry the moves out.

A device whose home is Slurm is kept fenced in Kubernetes while it is at home, so that only
a lend opens it there.

What the home side uses is read, not guessed: for a Kubernetes home, a device is busy when
the node's kubelet lists a pod holding it (the same holders command the moves use); for a
Slurm home, every device of a node that runs jobs is busy (Slurm has no per-GPU drain, so
lending one would keep the node's other GPUs out of service until its jobs end). A rule's
``needs`` is its busy devices and the work waiting for one (``waiting``: Slurm's pending
jobs, Kubernetes' unschedulable pods), unless the operator gives a figure (``--needs``).
"""

from __future__ import annotations

import datetime
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from gpushare.admin.plan.lending import Device, LendingRule
from gpushare.admin.relayout.settings import idle
from gpushare.admin.tidal.apply import FREE, MoveFailed, Mover
from gpushare.admin.tidal.decide import HomeUse, RuleState, decide_why
from gpushare.admin.tidal.journal import MoveEntry
from gpushare.admin.tidal.kube import KubeError
from gpushare.admin.tidal.moves import K8S, SLURM
from gpushare.admin.tidal.state import save_state
from gpushare.admin.tidal.waiting import Waiting, WaitingError

__all__ = ["run_round"]

HOLDERS_AT_ONCE = 16  # nodes asked at once which pods hold their devices


def _busy(mover: Mover, rule: LendingRule, at_home: list[Device]) -> frozenset[Device]:
    busy = set()
    nodes = sorted({d.node for d in at_home})
    if rule.home == K8S:
        def ask(node: str) -> set[Device]:
            mine = [d for d in at_home if d.node == node]
            try:
                answers = mover.holders_on(node, mine, rule.name)
            except (MoveFailed, KubeError) as err:
                mover.log.append(f"{rule.name}: {node}'s devices counted busy: {err}")
                return set(mine)
            return {d for d, (code, _) in answers.items() if code != FREE}

        # one holders run per node (each one ssh), the nodes at once
        with ThreadPoolExecutor(max_workers=min(HOLDERS_AT_ONCE, len(nodes) or 1)) as pool:
            for found in pool.map(ask, nodes):
                busy |= found
    else:
        for node_name in nodes:
            node = mover.slurm.node(node_name)
            if node is None or not idle(node):
                busy.update(d for d in at_home if d.node == node_name)
    return frozenset(busy)


def _fence_home(mover: Mover, rule: LendingRule, at_home: list[Device]) -> bool:
    """Slurm's devices at home stay fenced in Kubernetes (the DRA driver publishes every GPU
    of the node); False, logged, when the fence cannot be put up: nothing moves then."""
    for device in at_home:
        try:
            mover.kube.fence(device, rule.name)
        except KubeError as err:
            mover.log.append(f"{rule.name}: {device.describe()} could not be fenced in "
                             f"Kubernetes while Slurm holds it: {err}; no move for this rule")
            return False
    return True


def _needs(mover: Mover, rule: LendingRule, busy: frozenset[Device], waiting: Waiting,
           given: dict[str, int]) -> Optional[int]:
    """What the home side needs of the rule's devices: ``--needs``, else what it runs and
    what waits for one (None, logged: the waiting work could not be read)."""
    if rule.name in given:
        return given[rule.name]
    try:
        waits = waiting.of(rule)
    except WaitingError as err:
        mover.log.append(f"{rule.name}: no move: {err}")
        return None
    return min(len(busy) + waits, len(rule.devices))


def run_round(mover: Mover, when: datetime.datetime, needs: dict[str, int],
              waiting: Waiting) -> list[MoveEntry]:
    """Settle, decide, move; the moves carried out (``mover.log`` says the rest)."""
    mover.when = when
    mover.recover_open()
    state = mover.state
    minute = when.hour * 60 + when.minute
    now_minutes = when.timestamp() / 60.0
    done: list[MoveEntry] = []
    for rule in mover.plan.lending:
        lent = frozenset(d for d, e in state.lent.items() if e.rule == rule.name)
        at_home = [d for d in rule.devices if d not in lent]
        if rule.home == SLURM and not _fence_home(mover, rule, at_home):
            continue
        busy = _busy(mover, rule, at_home)
        wanted = _needs(mover, rule, busy, waiting, needs)
        if wanted is None:
            continue
        use = HomeUse(needs=wanted, busy=busy)
        timer = RuleState(idle_since=state.idle_since.get(rule.name))
        moves, why = decide_why(rule, minute, now_minutes, use, lent, timer)
        if timer.idle_since is None:
            state.idle_since.pop(rule.name, None)
        else:
            state.idle_since[rule.name] = timer.idle_since
        save_state(state)
        if not moves:
            mover.log.append(f"{rule.name}: no move ({len(lent)} lent, {len(busy)} of "
                             f"{len(at_home)} at home busy, {rule.home} needs {wanted}): "
                             + why)
        for move in moves:
            mover.log.append(f"{rule.name}: {move.device.describe()} -> {move.to}: {move.why}")
            entry = mover.plan_move(move)
            if mover.carry_out(entry):
                done.append(entry)
    _reserve_again(mover)
    return done


def _reserve_again(mover: Mover) -> None:
    """Each node holding a device lent to Slurm gets its reservation set for this round's
    clock (a demand's bound moves on; one an operator deleted comes back)."""
    rules = {rule.name: rule for rule in mover.plan.lending}
    nodes = {device.node for device, entry in mover.state.lent.items()
             if entry.rule in rules and rules[entry.rule].borrower == SLURM}
    for node in sorted(nodes):
        try:
            mover.reserve(node)
        except MoveFailed as err:
            mover.log.append(f"{node}: {err}")
