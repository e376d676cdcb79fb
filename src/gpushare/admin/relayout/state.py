# SPDX-License-Identifier: GPL-2.0-or-later
"""Where the applied layouts live: one small JSON file beside the plan.

The plan says what a GPU may take; a relayout changes what it holds. ``gpushare relayout
--apply`` records each GPU it changed (its layout, when, by which decision) in this file, so
that ``gpushare render``, ``check`` and the next ``relayout`` compare against what the node
holds now, and the next round knows when a GPU last changed (the menu's ``min_interval_s``).
The node's step records its own GPU in the node's copy too, so a node whose /etc/gpushare
is not shared with the controller checks itself against what it applied.

Format (version 1)::

    {"version": 1,
     "gpus": {"n1": {"2": {"layout": "2x3g.40gb", "at": 1767225600.0, "decision": "r-..."}}},
     "counters": {"decisions": 3, "applied": 2, "restored": 1, "failed": 0}}

``decisions`` counts rounds that chose a change, ``applied`` and ``restored`` GPUs changed or
laid back after a failed step, ``failed`` nodes left drained for an administrator.

Every layout is still checked against the plan: the GPU must be wholly Slurm's and the
layout on its group's menu, or the file is refused with what is wrong.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional

from gpushare.admin.mig_profiles import place_slices
from gpushare.admin.plan import Plan
from gpushare.admin.plan.model import MigSlice, NodeGroup
from gpushare.admin.relayout.menu import Layout, layout_name, parse_layout
from gpushare.common.versioned import versioned_json

__all__ = ["COUNTERS", "Applied", "AppliedState", "StateError", "applied_plan", "as_applied",
           "default_path", "last_changes", "layouts_of", "load_state", "locked", "read_text",
           "save_state", "with_lent"]

STATE_VERSION = 1
STATE_NAME = "relayout-state.json"
MAX_STATE_BYTES = 4 << 20
COUNTERS = ("decisions", "applied", "restored", "failed")


class StateError(ValueError):
    """The state file cannot be read or does not fit the plan."""


@dataclass(frozen=True)
class Applied:
    """What a relayout applied to one GPU."""

    layout: str
    at: float  # seconds since the epoch
    decision: str = ""


@dataclass
class AppliedState:
    path: str
    gpus: dict[tuple[str, int], Applied] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, by: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + by


def default_path(plan_path: str) -> str:
    """``relayout-state.json`` in the plan's directory (/etc/gpushare/ for the default plan)."""
    return os.path.join(os.path.dirname(os.path.abspath(plan_path)), STATE_NAME)


def parse_state(text: str, path: str) -> AppliedState:
    raw = versioned_json(text, path, "relayout state file", STATE_VERSION, StateError)
    state = AppliedState(path)
    gpus = raw.get("gpus", {})
    if not isinstance(gpus, dict):
        raise StateError(f"{path}: gpus must be a mapping of node to GPU index to layout")
    for node, by_index in gpus.items():
        if not isinstance(by_index, dict):
            raise StateError(f"{path}: node {node}: a mapping of GPU index to layout")
        for index, entry in by_index.items():
            where = f"{path}: node {node} GPU {index}"
            if not str(index).isdigit() or not isinstance(entry, dict) \
                    or not isinstance(entry.get("layout"), str) \
                    or not isinstance(entry.get("at"), (int, float)) \
                    or not isinstance(entry.get("decision", ""), str):
                raise StateError(f"{where}: needs layout (text), at (seconds) and decision")
            state.gpus[(str(node), int(index))] = Applied(entry["layout"], float(entry["at"]),
                                                          entry.get("decision", ""))
    counters = raw.get("counters", {})
    if isinstance(counters, dict):
        state.counters = {str(k): int(v) for k, v in counters.items()
                          if isinstance(v, int) and v >= 0}
    return state


def read_text(path: str) -> Optional[str]:
    """A state file's text (relayout's or tidal's); None when there is none."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise StateError(f"{path}: cannot read: {err}") from None
    if len(text) > MAX_STATE_BYTES:
        raise StateError(f"{path}: larger than {MAX_STATE_BYTES} bytes")
    return text


def load_state(path: str) -> AppliedState:
    """The state file; an absent one is an empty state (nothing applied yet)."""
    text = read_text(path)
    return AppliedState(path) if text is None else parse_state(text, path)


def dump_state(state: AppliedState) -> str:
    gpus: dict[str, dict[str, Any]] = {}
    for (node, index), entry in sorted(state.gpus.items()):
        gpus.setdefault(node, {})[str(index)] = {"layout": entry.layout, "at": entry.at,
                                                 "decision": entry.decision}
    return json.dumps({"version": STATE_VERSION, "gpus": gpus,
                       "counters": dict(sorted(state.counters.items()))}, indent=1) + "\n"


def save_state(state: AppliedState) -> None:
    """Replace the file in one rename: a reader sees the old state or the new one."""
    from gpushare.admin.relayout.apply import write_atomically

    write_atomically(state.path, dump_state(state))


@contextlib.contextmanager
def locked(path: str) -> Iterator[AppliedState]:
    """Read, change and write the state under an exclusive lock (``<path>.lock``, never a
    symlink, in a directory of root's), so the controller and a node's step sharing the file
    never lose each other's entry."""
    from gpushare.admin.relayout.journal import open_beside

    fd = open_beside(path + ".lock", os.O_RDWR,  # never a symlink, in a directory of root's
                     advice="the controller's --apply and the node's step write beside the "
                     "state file: run them as root (or name a --state this user may write)")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        state = load_state(path)
        yield state
        save_state(state)
    finally:
        os.close(fd)


def last_changes(state: AppliedState, now: float) -> dict[tuple[str, int], float]:
    """Seconds since each recorded GPU last changed (the decision's ``last_change_s``)."""
    return {key: max(now - entry.at, 0.0) for key, entry in state.gpus.items()}


def layouts_of(plan: Plan, state: AppliedState) -> dict[tuple[str, int], Layout]:
    """Each recorded GPU's layout, checked against the plan (StateError when one is not on
    its group's menu or the GPU may not change)."""
    found: dict[tuple[str, int], Layout] = {}
    for (node, index), entry in state.gpus.items():
        where = f"{state.path}: node {node} GPU {index}"
        group = plan.group_of(node)
        if group is None:
            raise StateError(f"{where}: the node is in no node group of {plan.path}")
        gpu = next((g for g in group.gpus if g.index == index), None)
        if gpu is None:
            raise StateError(f"{where}: node group {group.name} has no GPU {index}")
        if not gpu.changeable:
            raise StateError(f"{where}: the plan does not give this GPU wholly to Slurm "
                             f"(line {gpu.line}); only such a GPU changes layout")
        if group.relayout is None:
            raise StateError(f"{where}: node group {group.name} has no relayout menu")
        layout, why = parse_layout(entry.layout, group.model)
        if layout is None:
            raise StateError(f"{where}: layout {entry.layout!r}: {why}")
        if group.relayout.item(layout.name) is None:
            raise StateError(f"{where}: layout {layout.name} is not on the relayout menu of "
                             f"node group {group.name}")
        found[(node, index)] = layout
    return found


def _with_layout(group: NodeGroup, node: str, layouts: dict[int, Layout]) -> NodeGroup:
    """``group`` narrowed to ``node`` with these GPUs in these layouts (the placements the
    node's step creates them at)."""
    gpus = []
    for gpu in group.gpus:
        layout = layouts.get(gpu.index)
        planned = layout_name(tuple(s.profile for s in gpu.slices_of("slurm")), gpu.mps)
        if layout is None or layout.name == planned:
            gpus.append(gpu)  # as the plan says, placements and all
            continue
        starts: Optional[list[int]] = place_slices(group.model, layout.slices) \
            if layout.mig else []
        assert starts is not None  # parse_layout placed it
        slices = tuple(MigSlice(profile, "slurm", start, True, gpu.line)
                       for profile, start in zip(layout.slices, starts))
        gpus.append(replace(gpu, mig=layout.mig, slices=slices, mps=layout.mps,
                            shard=gpu.shard if not layout.mig and not gpu.mig else 0))
    return replace(group, nodes=(node,), nodes_expr=node, gpus=tuple(gpus))


def applied_plan(plan: Plan, state: AppliedState) -> Plan:
    """The plan as the nodes hold it now: each node with a recorded change in a group of its
    own whose GPUs have the applied layouts; every other node as the plan says. The
    mig-parted config must still be rendered from ``plan`` itself (Kubernetes' side never
    changes)."""
    import hostlist

    layouts = layouts_of(plan, state)
    changed: dict[str, dict[int, Layout]] = {}
    for (node, index), layout in layouts.items():
        changed.setdefault(node, {})[index] = layout
    if not changed:
        return plan
    groups: list[NodeGroup] = []
    for group in plan.groups:
        rest = [node for node in group.nodes if node not in changed]
        if rest:
            groups.append(group if len(rest) == len(group.nodes) else replace(
                group, nodes=tuple(rest), nodes_expr=hostlist.collect_hostlist(rest)))
        groups.extend(_with_layout(group, node, changed[node])
                      for node in group.nodes if node in changed)
    return replace(plan, groups=tuple(groups), _by_node={})


def with_lent(plan: Plan, state_path: str) -> Plan:
    """The plan with what ``gpushare tidal`` has lent, from tidal-state.json beside the
    relayout state file (StateError when it does not fit the plan)."""
    from gpushare.admin.plan.lent import plan_with_lent
    from gpushare.admin.tidal.state import STATE_NAME
    from gpushare.admin.tidal.state import load_state as load_tidal

    tidal = load_tidal(os.path.join(os.path.dirname(os.path.abspath(state_path)), STATE_NAME))
    if not tidal.lent:
        return plan
    tidal.check(plan)
    return plan_with_lent(plan, tidal.lent_to(plan))


def as_applied(plan: Plan, option: Optional[str]) -> Plan:
    """The plan as the nodes hold it: the state file's layouts and what tidal has lent
    (``--state``: a path, "none", or None for relayout-state.json beside the plan, read
    when it exists; tidal-state.json is read beside it)."""
    if option == "none":
        return plan
    path = option or default_path(plan.path)
    return with_lent(applied_plan(plan, load_state(path)), path)
