# SPDX-License-Identifier: GPL-2.0-or-later
"""The cluster's GPU sharing at a glance, from slurmctld's view (``gpushare status --cluster``).

Per node, from its configured GRES and what is in use (GresUsed): for each GPU type the
whole GPUs free, the MPS shares used of the total, and the MIG slices free by profile;
drained nodes with their reason, gpushare's own (``gpushare: ...``) marked.

A GPU serving MPS jobs is not free for a whole-GPU job: the GPUs named by the MPS
allocations' ``IDX:`` are taken off the free count of the node's GPU type (MPS is
configured per GPU, so each MPS index is one GPU of that type). 24.11 gives MPS use per GPU
(``used/total`` in device order) instead of ``IDX:``; both are read.

MPS use is taken from the jobs' allocations when they are given (``squeue --json``):
22.05's ``GresUsed`` counts one unit for all of a GPU's MPS jobs (``mps:h100:1(IDX:0)`` while
jobs of mps:25 and mps:50 run), so only the jobs tell how many shares are in use.

A job that asked for untyped ``--gres=mps:N`` holds an untyped ``mps:N(...)``, while a node
whose GRES has several GPU types reports typed MPS (``gpu:h100:4,gpu:1g.10gb:2,mps:400``
shows as ``mps:h100:400,mps:1g.10gb:0``). Such a job's shares belong to the only type with
MPS, else to the type whose devices its indexes name (Slurm numbers a node's GPUs type after
type, in the order of its ``Gres=``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from gpushare.admin.slurm_client import GRES_ITEM_SPLIT, SlurmNode, gres_item

__all__ = ["NodeSharing", "TypeSharing", "node_sharing", "summary", "used_indexes"]

GPUSHARE_REASON = "gpushare:"
# A MIG profile as a GRES type: 1g.10gb, 3g.40gb, nvidia_a100_1g.10gb, 1g.12gb+me, ...
_MIG_TYPE = re.compile(r"(\d+g\.\d+gb(?:\+me)?)", re.IGNORECASE)


class TypeSharing(NamedTuple):
    """One GPU type (or MIG profile) of one node."""

    gpu_type: str
    mig_profile: str  # "" for whole GPUs
    total: int
    used: int  # whole-GPU (or slice) allocations
    mps_busy: int = 0  # GPUs of this type serving MPS jobs
    mps_used: int = 0
    mps_total: int = 0

    @property
    def free(self) -> int:
        return max(0, self.total - self.used - self.mps_busy)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.gpu_type, "mig_profile": self.mig_profile, "total": self.total,
                "used": self.used, "mps_busy": self.mps_busy, "free": self.free,
                "mps_used": self.mps_used, "mps_total": self.mps_total}


class NodeSharing(NamedTuple):
    name: str
    states: tuple[str, ...]
    drained: bool
    reason: str
    types: tuple[TypeSharing, ...]

    @property
    def drained_by_gpushare(self) -> bool:
        return self.drained and self.reason.startswith(GPUSHARE_REASON)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": list(self.states), "drained": self.drained,
                "reason": self.reason, "drained_by_gpushare": self.drained_by_gpushare,
                "gpus": [t.to_dict() for t in self.types if not t.mig_profile],
                "mig": [t.to_dict() for t in self.types if t.mig_profile]}


def _items(text: str) -> list[tuple[str, str, int, str]]:
    """``gpu:h100:2(IDX:1-2),mps:h100:25(IDX:0)`` → [(name, type, count, inside parens)]."""
    items: list[tuple[str, str, int, str]] = []
    text = (text or "").strip()
    if text in ("", "(null)", "N/A"):
        return items
    for item in GRES_ITEM_SPLIT.split(text):
        head, _, rest = item.strip().partition("(")
        name, gres_type, count = gres_item(head)
        detail = rest.rstrip(")")
        counted = re.fullmatch(r"CNT:(\d+)", detail)  # a job's mps(CNT:25): no device bitmap
        if counted:
            count = int(counted.group(1))
        if name:
            items.append((name, gres_type, count, detail))
    return items


def used_indexes(detail: str) -> set[int]:
    """The device indexes a GresUsed item names.

    22.05 writes ``IDX:0-1,3`` (none for ``IDX:N/A``); 24.11 writes shared GRES (mps,
    shard) per GPU as ``used/total`` in device order (``mps:h100:25(0/100,25/100)``): the
    GPUs with a use are the busy ones. 26.05's GresUsed writes ``-`` for a GPU taken whole
    (``mps:h100:75(75/100,-/100)``): not an MPS use.
    """
    match = re.search(r"IDX:([0-9,\-]+)", detail)
    found: set[int] = set()
    if match is None:
        per_gpu = re.fullmatch(r"((\d+|-)/\d+)(,(\d+|-)/\d+)*", detail.strip())
        if per_gpu:
            for index, part in enumerate(detail.strip().split(",")):
                used = part.split("/")[0]
                if used.isdigit() and int(used) > 0:
                    found.add(index)
        return found
    for part in match.group(1).split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.update(range(int(low), int(high or low) + 1))
    return found


def _gpu_counts(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, gres_type, count, _detail in _items(text):
        if name == "gpu":
            counts[gres_type] = counts.get(gres_type, 0) + count
    return counts


def _device_types(gpus: Mapping[str, int]) -> list[str]:
    """The GPU type of each device index: Slurm numbers them type after type."""
    return [gres_type for gres_type, count in gpus.items() for _ in range(count)]


def _mps_type(detail: str, mps_total: Mapping[str, int], devices: Sequence[str]) -> str:
    """The type an untyped MPS allocation belongs to; "" when it cannot be told."""
    with_mps = [gres_type for gres_type, count in mps_total.items() if count > 0]
    if len(with_mps) == 1:
        return with_mps[0]
    named = {devices[index] for index in used_indexes(detail) if index < len(devices)}
    if len(named) == 1 and next(iter(named)) in with_mps:
        return named.pop()
    return ""


def node_sharing(node: SlurmNode,
                 held: Optional[Sequence[str]] = None) -> Optional[NodeSharing]:
    """One node's sharing; None for a node without GPUs or MPS in its GRES.

    ``held``: the GRES the node's jobs hold there (``mps:25(IDX:0)``, one per job); when
    given, MPS use is their sum rather than GresUsed's.
    """
    total = _gpu_counts(node.gres)
    used = _gpu_counts(node.gres_used)
    mps_total: dict[str, int] = {}
    mps_used: dict[str, int] = {}
    mps_gpus: dict[str, set[int]] = {}
    for name, gres_type, count, _detail in _items(node.gres):
        if name == "mps":
            mps_total[gres_type] = mps_total.get(gres_type, 0) + count
    in_use = [node.gres_used] if held is None else list(held)
    devices = _device_types(total)
    for text in in_use:
        for name, gres_type, count, detail in _items(text):
            if name != "mps":
                continue
            if not gres_type and "" not in mps_total:  # a job's untyped mps:25
                gres_type = _mps_type(detail, mps_total, devices)
            mps_used[gres_type] = mps_used.get(gres_type, 0) + count
            mps_gpus.setdefault(gres_type, set()).update(used_indexes(detail))
    if not total and not mps_total:
        return None
    whole = [t for t in total if not _MIG_TYPE.search(t)]
    types = []
    for gres_type in total:
        profile = _MIG_TYPE.search(gres_type)
        if profile:
            types.append(TypeSharing(gres_type, profile.group(1).lower(), total[gres_type],
                                     used.get(gres_type, 0)))
            continue
        # Untyped MPS (mps:400) belongs to the node's only whole-GPU type, if it has one.
        mps_key = gres_type if gres_type in mps_total else ("" if len(whole) == 1 else None)
        types.append(TypeSharing(
            gres_type, "", total[gres_type], used.get(gres_type, 0),
            mps_busy=len(mps_gpus.get(mps_key, set())) if mps_key is not None else 0,
            mps_used=mps_used.get(mps_key, 0) if mps_key is not None else 0,
            mps_total=mps_total.get(mps_key, 0) if mps_key is not None else 0))
    return NodeSharing(node.name, node.states, node.draining, node.reason, tuple(types))


def summary(nodes: Sequence[SlurmNode],
            held: Optional[Mapping[str, Sequence[str]]] = None) -> list[NodeSharing]:
    """Every node with GPUs; ``held`` (node → its jobs' GRES) gives MPS use when known."""
    found = (node_sharing(node, None if held is None else held.get(node.name, ()))
             for node in nodes)
    return [sharing for sharing in found if sharing is not None]


def totals(sharing: Sequence[NodeSharing]) -> dict[str, Any]:
    """Cluster sums by GPU type and MIG profile; drained nodes' GPUs are not counted free."""
    gpus: dict[str, dict[str, int]] = {}
    mig: dict[str, dict[str, int]] = {}
    for node in sharing:
        for item in node.types:
            table = mig if item.mig_profile else gpus
            row = table.setdefault(item.mig_profile or item.gpu_type,
                                   {"total": 0, "free": 0, "mps_used": 0, "mps_total": 0})
            row["total"] += item.total
            row["free"] += 0 if node.drained else item.free
            row["mps_used"] += item.mps_used
            row["mps_total"] += item.mps_total
    for row in mig.values():
        del row["mps_used"], row["mps_total"]
    return {"gpus": gpus, "mig": mig, "nodes": len(sharing),
            "drained_nodes": sum(1 for node in sharing if node.drained),
            "drained_by_gpushare": sum(1 for node in sharing if node.drained_by_gpushare)}
