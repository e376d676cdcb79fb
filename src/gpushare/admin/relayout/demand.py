# SPDX-License-Identifier: GPL-2.0-or-later
"""What the queue waits for and what each GPU holds, from slurmctld.

Demand is ``squeue -h -t PD -O SQUEUE_FORMAT`` (``jobgres``: job, its GRES per node, its
submit time, partitions, user, account, time limit, node and task counts, its GRES per job
and per task, and why it waits; the older ``-o "%i|%b|%V|%P|%u|%a|%l|%r"`` lines, with or
without the time limit, read too): each job counts what it asks of one node, from
``--gres``, ``--gpus`` or ``--gpus-per-task`` alike (``jobgres.per_node``). Only
a job that waits for resources (Reason ``Resources``, ``Priority`` or ``ReqNodeNotAvail``)
counts, and only on the
nodes of its partitions (``sinfo -h -a -o "%R|%N"``): a held job (``JobHeldUser``,
``JobHeldAdmin``), one that waits for another (``Dependency``) or for its ``--begin``
(``BeginTime``), or for a limit, could not start on a new layout either.
Supply is the plan's layout of every GPU with what slurmctld's ``GresUsed`` says is held,
mapped to GPUs in the order gres.conf lists the devices.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import Optional, Sequence

from gpushare.admin.cluster_status import used_indexes
from gpushare.admin.plan import Plan
from gpushare.admin.plan.model import GpuPlan
from gpushare.admin.relayout.decide import GpuState, Request
from gpushare.admin.relayout.jobgres import (
    SQUEUE_FORMAT,
    JobLine,
    gres_items,
    parse_line,
    per_node,
)
from gpushare.admin.relayout.menu import NOT_SLURMS, Layout, layout_name
from gpushare.admin.relayout.predict import LOOKBACK_S
from gpushare.admin.slurm_client import (
    DEFAULT_SINFO,
    DEFAULT_SQUEUE,
    GRES_ITEM_SPLIT,
    SlurmClientError,
    SlurmNode,
    gres_item,
    parse_node_gres,
)
from gpushare.common import proc

__all__ = ["SQUEUE_FORMAT", "Queue", "merge_recent", "parse_partitions", "parse_request",
           "parse_running", "parse_squeue", "parse_submitted", "parse_time_left", "partitions",
           "pending", "plan_layout", "planned", "read_queue", "recent", "running_ends",
           "supply"]

SINFO_FORMAT = "%R|%N"
# Waiting for resources: Resources, Priority, and ReqNodeNotAvail, which Slurm 22.05 gives a
# job whose type only drained or down nodes offer (measured on 22.05.8: "ReqNodeNotAvail,
# UnavailableNodes:rl[2-3]"), the very demand a new layout serves.
WAITING_REASONS = frozenset({"Resources", "Priority", "ReqNodeNotAvail"})
# squeue of 24.11 and later may print ReqNodeNotAvail's description instead of its name.
_REASON_TEXTS = {"Nodes required for job are DOWN, DRAINED or reserved": "ReqNodeNotAvail"}
_REASON_NAMES = {"JobHeldUser": "held", "JobHeldAdmin": "held", "Dependency": "dependency",
                 "BeginTime": "--begin in the future"}
UNREADABLE = "GPU request unreadable"


@dataclass
class Queue:
    """The pending jobs' requests that count, and how many jobs were left out and why."""

    requests: list[Request] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    # (seconds ago, request) of the counted jobs submitted within LOOKBACK_S
    recent: list[tuple[float, Request]] = field(default_factory=list)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def parse_request(job: str, gres: str, wait_s: float, nodes: Optional[frozenset[str]] = None,
                  user: str = "", account: str = "",
                  limit_s: Optional[float] = None) -> list[Request]:
    """One pending job's GPU requests per node from its GRES per node (``%b``):
    ``gres/gpu:3g.40gb:2`` → 3g.40gb × 2; a typed whole GPU or an untyped one → "whole";
    ``gres:mps:25`` → mps × 25; none where it does not read."""
    items = gres_items(gres)
    return [Request(job, kind, count, wait_s, nodes, user, account, limit_s)
            for _name, kind, count in items or ()]


def _requests(line: JobLine, wait_s: float, nodes: Optional[frozenset[str]]
              ) -> Optional[list[Request]]:
    """The job's requests, one per kind it asks of one node; None where they do not read."""
    asked = per_node(line)
    if asked is None:
        return None
    return [Request(line.job, kind, count, wait_s, nodes, _named(line.user),
                    _named(line.account), parse_time_left(line.limit)) for kind, count in asked]


def read_queue(text: str, now: datetime.datetime,
               nodes_of: Optional[dict[str, frozenset[str]]] = None,
               lookback_s: float = LOOKBACK_S) -> Queue:
    """The requests that count, from ``squeue -h -t PD -O SQUEUE_FORMAT`` lines; ``now``
    gives the wait, ``nodes_of`` each partition's nodes (None: any node); those submitted
    within ``lookback_s`` are also ``recent``."""
    queue = Queue()
    for raw in text.splitlines():
        line = parse_line(raw)
        if line is None:
            continue
        reason = next((name for text, name in _REASON_TEXTS.items()
                       if line.reason.startswith(text)), line.reason.split(",", 1)[0].strip())
        if reason not in WAITING_REASONS:
            queue.skip(_REASON_NAMES.get(reason, f"reason {reason or 'none'}"))
            continue
        nodes: Optional[frozenset[str]] = None
        if nodes_of is not None:
            nodes = frozenset().union(*(nodes_of.get(p, frozenset())
                                        for p in line.partitions.split(",")))
            if not nodes:
                queue.skip(f"partition {line.partitions} unknown or without nodes")
                continue
        try:
            wait = max((now - datetime.datetime.fromisoformat(line.submitted)).total_seconds(),
                       0.0)
        except ValueError:
            wait = 0.0
        requests = _requests(line, wait, nodes)
        if requests is None:
            queue.skip(UNREADABLE)
            continue
        queue.requests.extend(requests)
        queue.recent.extend((wait, r) for r in requests if wait < lookback_s)
    return queue


def parse_submitted(text: str, now: datetime.datetime,
                    lookback_s: float = LOOKBACK_S) -> list[tuple[float, Request]]:
    """(seconds ago, request) of the jobs submitted within ``lookback_s``, from ``squeue -h
    -t R,CG,CD -O SQUEUE_FORMAT`` lines: with the pending ones, the recent submissions that
    stand for the next ones in the prediction of a change's effect."""
    found: list[tuple[float, Request]] = []
    for raw in text.splitlines():
        line = parse_line(raw)
        if line is None:
            continue
        try:
            ago = (now - datetime.datetime.fromisoformat(line.submitted)).total_seconds()
        except ValueError:
            continue
        if 0.0 <= ago < lookback_s:
            found.extend((ago, r) for r in _requests(line, 0.0, None) or ())
    return found


def recent(squeue: str = DEFAULT_SQUEUE, timeout: float = 10.0,
           now: Optional[datetime.datetime] = None,
           lookback_s: float = LOOKBACK_S) -> list[tuple[float, Request]]:
    """parse_submitted, asked of slurmctld (running and recently ended jobs)."""
    if lookback_s <= 0:
        return []
    text = _squeue(squeue, ["-h", "-t", "R,CG,CD", "-O", SQUEUE_FORMAT], timeout)
    return parse_submitted(text, now or datetime.datetime.now(), lookback_s)


def merge_recent(listed: Sequence[tuple[float, Request]],
                 accounted: Sequence[tuple[float, Request]]) -> list[tuple[float, Request]]:
    """The recent submissions that started, each job once: sacct's (``accounted``) and, of
    squeue's (``listed``), the jobs sacct does not show. squeue forgets a job MinJobAge (300 s
    by default) after it ends, and shows ended ones only as COMPLETED; sacct misses a kind
    that AccountingStorageTRES does not record."""
    seen = {request.job for _, request in accounted}
    return [*accounted, *((ago, request) for ago, request in listed if request.job not in seen)]


def _named(text: str) -> str:
    """A user or account name; "" where squeue has none (no accounting: "(null)")."""
    text = text.strip()
    return "" if text in ("(null)", "N/A") else text


def parse_squeue(text: str, now: datetime.datetime,
                 nodes_of: Optional[dict[str, frozenset[str]]] = None) -> list[Request]:
    """read_queue's requests."""
    return read_queue(text, now, nodes_of).requests


def parse_partitions(text: str) -> dict[str, frozenset[str]]:
    """Each partition's nodes from ``sinfo -h -a -o "%R|%N"`` (a line per partition and
    node state, so a partition may come more than once)."""
    import hostlist

    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        name, sep, nodes = line.strip().partition("|")
        if not sep or not name:
            continue
        names = found.setdefault(name, set())
        if nodes and nodes not in ("(null)", "N/A"):
            try:
                names.update(hostlist.expand_hostlist(nodes))
            except (hostlist.BadHostlist, ValueError):
                continue
    return {name: frozenset(nodes) for name, nodes in found.items()}


def partitions(sinfo: str = DEFAULT_SINFO, timeout: float = 10.0) -> dict[str, frozenset[str]]:
    """parse_partitions, asked of slurmctld (hidden partitions too)."""
    return parse_partitions(_squeue(sinfo, ["-h", "-a", "-o", SINFO_FORMAT], timeout))


def pending(squeue: str = DEFAULT_SQUEUE, timeout: float = 10.0,
            now: Optional[datetime.datetime] = None,
            nodes_of: Optional[dict[str, frozenset[str]]] = None,
            lookback_s: float = LOOKBACK_S) -> Queue:
    """The pending jobs that count, asked of slurmctld."""
    text = _squeue(squeue, ["-h", "-t", "PD", "-O", SQUEUE_FORMAT], timeout)
    return read_queue(text, now or datetime.datetime.now(), nodes_of, lookback_s)


def parse_time_left(text: str) -> Optional[float]:
    """squeue's ``%L``: ``1-02:03:04``, ``02:03:04``, ``03:04`` → seconds; None for
    UNLIMITED, NOT_SET or anything else."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 \
            or (days and not days.isdigit()):
        return None
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400.0


def parse_running(text: str) -> dict[str, Optional[float]]:
    """Per node, when the last of its jobs' time limits ends (None: a job without one), from
    ``squeue -h -t R,CG,S -o "%N|%L"``."""
    import hostlist

    ends: dict[str, Optional[float]] = {}
    for line in text.splitlines():
        nodes, _, left = line.strip().partition("|")
        if not nodes:
            continue
        try:
            names = hostlist.expand_hostlist(nodes)
        except (hostlist.BadHostlist, ValueError):
            continue
        seconds = parse_time_left(left)
        for name in names:
            if name in ends and ends[name] is None:
                continue
            ends[name] = None if seconds is None else max(ends.get(name) or 0.0, seconds)
    return ends


def running_ends(squeue: str = DEFAULT_SQUEUE, timeout: float = 10.0
                 ) -> dict[str, Optional[float]]:
    """parse_running, asked of slurmctld."""
    return parse_running(_squeue(squeue, ["-h", "-t", "R,CG,S", "-o", "%N|%L"], timeout))


def _squeue(squeue: str, args: list[str], timeout: float) -> str:
    if not squeue.startswith("/"):
        raise SlurmClientError(f"{squeue}: give the Slurm command as an absolute path")
    argv = [squeue, *args]
    try:
        done = proc.run(argv, timeout=timeout, env=os.environ, output_limit=None)
    except proc.ProcError as err:
        raise SlurmClientError(f"{' '.join(argv)}: {err}") from None
    if done.returncode != 0:
        raise SlurmClientError(f"{' '.join(argv)} failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-200:]}")
    return done.stdout


def plan_layout(slices: Sequence[str], mps: int) -> Layout:
    """The layout the plan gives a GPU (its Slurm slices)."""
    ordered = tuple(sorted(slices, key=lambda p: (-int(p.split("g.")[0]), p)))
    return Layout(layout_name(ordered, mps), ordered, mps)


def _planned(gpu: GpuPlan) -> Layout:
    """What the plan itself gives Slurm of ``gpu``, whatever a relayout made of it."""
    if gpu.owner == "kubernetes":
        return Layout(NOT_SLURMS)
    return plan_layout([s.profile for s in gpu.slices_of("slurm")], gpu.mps)


def planned(plan: Plan, gpus: Sequence[GpuState]) -> list[Layout]:
    """The plan's own layout of each of ``gpus``: no change made by relayout (the floors'
    baseline, ``keep``)."""
    layouts = []
    for state in gpus:
        group = plan.group_of(state.node)
        gpu = next((g for g in group.gpus if g.index == state.index), None) if group else None
        layouts.append(state.layout if gpu is None else _planned(gpu))
    return layouts


def _device_order(node: SlurmNode, whole_type: str, gpus: Sequence[GpuPlan],
                  current: dict[int, Layout]) -> list[tuple[int, str]]:
    """(GPU index, "whole" or profile) of each of the node's gpu devices in Slurm's index
    order, which ``IDX:`` names: type after type in the order of the node's ``Gres=``
    (render puts whole GPUs first), each type's devices in gres.conf's GPU order."""
    devices: list[tuple[int, str, str]] = []
    for gpu in gpus:
        offers = current[gpu.index].offers()
        if "whole" in offers or "mps" in offers:
            devices.append((gpu.index, "whole", whole_type))
        else:
            devices.extend((gpu.index, p, p) for p in current[gpu.index].slices)
    types = [gres_type.lower() for name, gres_type in parse_node_gres(node.gres)
             if name == "gpu"]

    def rank(device: tuple[int, str, str]) -> tuple[int, bool]:
        kind = device[2].lower()
        found = next((i for i, t in enumerate(types) if t == kind or t.endswith("_" + kind)),
                     len(types))
        return found, device[1] != "whole"

    return [(index, kind) for index, kind, _type in sorted(devices, key=rank)]


def supply(plan: Plan, nodes: Sequence[SlurmNode],
           layouts: Optional[dict[tuple[str, int], Layout]] = None,
           last_change_s: Optional[dict[tuple[str, int], float]] = None,
           ends: Optional[dict[str, Optional[float]]] = None) -> list[GpuState]:
    """Every GPU of the nodes slurmctld knows in a group with a menu, in service (not
    drained, down or unregistered): its layout (the plan's,
    or ``layouts`` where a relayout changed it), what jobs hold of it, when it last changed
    and, from ``ends`` (running_ends), when its node's jobs' time limits end."""
    gpus: list[GpuState] = []
    for node in nodes:
        group = plan.group_of(node.name)
        if group is None or group.relayout is None:
            continue
        if node.draining or node.down or not node.registered or \
                {"FAIL", "UNKNOWN", "NOT_RESPONDING"} & set(node.states):
            continue  # out of service: no job starts there, and it is not changed
        current = {gpu.index: (layouts or {}).get((node.name, gpu.index)) or _planned(gpu)
                   for gpu in group.gpus}
        gpu_devices = _device_order(node, group.model.gres_type, group.gpus, current)
        mps_gpus = [i for i in sorted(current) if current[i].mps]
        used: dict[int, dict[str, int]] = {}
        for item in GRES_ITEM_SPLIT.split(node.gres_used or ""):
            head, _, detail = item.strip().partition("(")
            if not head or head in ("(null)", "N/A"):
                continue
            name, _type, count = gres_item(head)
            if not count:
                continue
            indexes = used_indexes(detail.rstrip(")"))
            if name == "gpu":
                for index in indexes:
                    if index < len(gpu_devices):
                        gpu_index, kind = gpu_devices[index]
                        kinds = used.setdefault(gpu_index, {})
                        kinds[kind] = kinds.get(kind, 0) + 1
            elif name == "mps":
                for position in indexes:
                    if position < len(mps_gpus):
                        kinds = used.setdefault(mps_gpus[position], {})
                        kinds["mps"] = current[mps_gpus[position]].mps
        for gpu in group.gpus:
            held = used.get(gpu.index, {})
            gpus.append(GpuState(node.name, gpu.index, group.name, current[gpu.index],
                                 bool(held), gpu.changeable,
                                 (last_change_s or {}).get((node.name, gpu.index)), held,
                                 (ends or {}).get(node.name),
                                 group.model.mode_change_needs_reset))
    return gpus
