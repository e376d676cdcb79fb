# SPDX-License-Identifier: GPL-2.0-or-later
"""What the queue waits for and what each GPU holds, from slurmctld.

Demand is ``squeue -h -t PD -o "%i|%b|%V"`` (job, its GRES per node, its submit time): Slurm
22.05 writes ``gres:gpu:1g.10gb:2``, 23.11 and later ``gres/gpu:1g.10gb:2``; both read the
same here. Supply is the plan's layout of every GPU with what slurmctld's ``GresUsed`` says
is held, mapped to GPUs in the order gres.conf lists the devices.
"""

from __future__ import annotations

import datetime
import os
import re
from typing import Optional, Sequence

from gpushare.admin.cluster_status import used_indexes
from gpushare.admin.plan import Plan
from gpushare.admin.relayout.decide import GpuState, Request
from gpushare.admin.relayout.menu import NOT_SLURMS, Layout, layout_name
from gpushare.admin.slurm_client import GRES_ITEM_SPLIT, SlurmClientError, SlurmNode, gres_item
from gpushare.common import proc

__all__ = ["SQUEUE_FORMAT", "parse_request", "parse_running", "parse_squeue",
           "parse_time_left", "pending", "plan_layout", "running_ends", "supply"]

DEFAULT_SQUEUE = "/usr/bin/squeue"
SQUEUE_FORMAT = "%i|%b|%V"
_MIG = re.compile(r"^\d+g\.\d+gb(\+me)?$", re.IGNORECASE)


def parse_request(job: str, gres: str, wait_s: float) -> list[Request]:
    """One pending job's GPU requests per node: ``gres/gpu:3g.40gb:2`` → 3g.40gb × 2; a typed
    whole GPU or an untyped one → "whole"; ``gres:mps:25`` → mps × 25."""
    requests: list[Request] = []
    for item in GRES_ITEM_SPLIT.split(gres or ""):
        item = item.strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        if not item or item in ("(null)", "N/A"):
            continue
        name, gres_type, count = gres_item(item.split("(", 1)[0])
        if name == "gpu":
            kind = gres_type.lower() if _MIG.match(gres_type) else "whole"
        elif name == "mps":
            kind = "mps"
        else:
            continue
        requests.append(Request(job, kind, count, wait_s))
    return requests


def parse_squeue(text: str, now: datetime.datetime) -> list[Request]:
    """Requests from ``squeue -h -t PD -o "%i|%b|%V"`` lines; ``now`` gives the wait."""
    requests: list[Request] = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3:
            continue
        job, gres, submitted = parts
        try:
            wait = max((now - datetime.datetime.fromisoformat(submitted)).total_seconds(), 0.0)
        except ValueError:
            wait = 0.0
        requests.extend(parse_request(job, gres, wait))
    return requests


def pending(squeue: str = DEFAULT_SQUEUE, timeout: float = 10.0,
            now: Optional[datetime.datetime] = None) -> list[Request]:
    """The pending jobs' GPU requests, asked of slurmctld."""
    text = _squeue(squeue, ["-h", "-t", "PD", "-o", SQUEUE_FORMAT], timeout)
    return parse_squeue(text, now or datetime.datetime.now())


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


def supply(plan: Plan, nodes: Sequence[SlurmNode],
           layouts: Optional[dict[tuple[str, int], Layout]] = None,
           last_change_s: Optional[dict[tuple[str, int], float]] = None,
           ends: Optional[dict[str, Optional[float]]] = None) -> list[GpuState]:
    """Every GPU of the nodes slurmctld knows in a group with a menu: its layout (the plan's,
    or ``layouts`` where a relayout changed it), what jobs hold of it, when it last changed
    and, from ``ends`` (running_ends), when its node's jobs' time limits end."""
    gpus: list[GpuState] = []
    for node in nodes:
        group = plan.group_of(node.name)
        if group is None or group.relayout is None:
            continue
        current: dict[int, Layout] = {}
        for gpu in group.gpus:
            layout = (layouts or {}).get((node.name, gpu.index))
            if layout is None and gpu.owner == "kubernetes":
                layout = Layout(NOT_SLURMS)
            elif layout is None:
                layout = plan_layout([s.profile for s in gpu.slices_of("slurm")], gpu.mps)
            current[gpu.index] = layout
        # gres.conf order: per GPU, its gpu devices (one per Slurm slice, or the GPU).
        gpu_devices: list[tuple[int, str]] = []
        for gpu in group.gpus:
            offers = current[gpu.index].offers()
            if "whole" in offers or "mps" in offers:
                gpu_devices.append((gpu.index, "whole"))
            else:
                gpu_devices.extend((gpu.index, p) for p in current[gpu.index].slices)
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
                                 (ends or {}).get(node.name)))
    return gpus
