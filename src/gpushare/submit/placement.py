# SPDX-License-Identifier: GPL-2.0-or-later
"""Where a multi-node GPU job runs: ``--switches`` on topology/tree, ``--segment`` on
topology/block, so that it stays in the fewest NVLink domains of its GPU type.

The last step of ``gpushare.submit.rules``; ``submit_hooks/job_submit.lua`` implements the
same lines (the end of its ``check``, and ``segment``). A job that names its nodes (``-w``)
or sets its own segment is placed as it asked; a segment is never chosen that Slurm could
not place with the job's own ``--spread-segments``.
"""

from __future__ import annotations

from typing import Any

from gpushare.submit.base import Release, before, number, reject
from gpushare.submit.facts import Facts
from gpushare.submit.gres import GresItem, user_item

__all__ = ["CONSOLIDATE_SEGMENTS", "SPREAD_SEGMENTS", "format_wait", "place"]

# job_desc bitflags of Slurm 25.11 (slurm.h); the bits are unused before it.
SPREAD_SEGMENTS = 1 << 43  # --spread-segments: each segment on base blocks of its own
CONSOLIDATE_SEGMENTS = 1 << 44  # --consolidate-segments: all in one aggregated block


def format_wait(seconds: int) -> str:
    """Seconds in Slurm's time syntax: ``5:00``, ``1:00:00``, ``1-00:00:00``."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def _fewest_domains(nodes: int, sizes: tuple[int, ...]) -> int:
    """Fewest NVLink domains whose nodes add up to ``nodes`` (they must hold them)."""
    total = 0
    for used, size in enumerate(sizes, start=1):
        total += size
        if total >= nodes:
            return used
    return len(sizes)


def _domains_reason(what: str, domains: int, largest: int) -> str:
    if domains == 1:
        return f"{what} fit in one NVLink domain"
    return f"{what} need {domains} NVLink domains of at most {largest} nodes"


def _candidate_types(asked: list[tuple[str, GresItem]], facts: Facts) -> list[str]:
    """The GRES types the job's GPUs could be: its own types, or for an untyped item the
    whole GPUs (and MIG slices too under policy ``any``)."""
    names: list[str] = []
    for _field, item in asked:
        if item.type is not None:
            choices: tuple[str, ...] = (item.type,)
        elif item.name == "gpu" and facts.policy.untyped_gpu == "any":
            choices = facts.gpu_types + facts.mig_types
        else:
            choices = facts.gpu_types
        names.extend(name for name in choices if name in facts.types and name not in names)
    return names


def _gpu_total(job: dict[str, Any], fields: dict[str, list[GresItem]]) -> int:
    """Whole GPUs the job asks for in total where that is known without -N: ``--gpus``, or
    ``--gpus-per-task`` times the task count; 0 otherwise."""
    total = sum(it.count for it in fields.get("tres_per_job", ())
                if it.is_gres and it.name == "gpu")
    tasks = number(job.get("num_tasks"))
    if tasks:
        total += tasks * sum(it.count for it in fields.get("tres_per_task", ())
                             if it.is_gres and it.name == "gpu")
    return total


def _switches(count: int, wait: int | None) -> str:
    return str(count) if wait is None else f"{count}@{format_wait(wait)}"


def place(job: dict[str, Any], facts: Facts, fields: dict[str, list[GresItem]],
          asked: list[tuple[str, GresItem]], changes: dict[str, Any], notes: list[str],
          release: Release) -> None:
    """Multi-node GPU jobs stay in the fewest NVLink domains of their GPU type, with a
    bounded wait. The node count is -N, or what the job's GPUs need without it."""
    candidates = _candidate_types(asked, facts)
    if len(candidates) == 1:
        sizes = facts.types[candidates[0]].domain_sizes
        per_node = facts.types[candidates[0]].per_node
    elif candidates:  # the job may get any of several types: every domain that holds one
        held = any(facts.types[name].domain_sizes for name in candidates)
        sizes = facts.domain_sizes if held else ()
        per_node = max(facts.types[name].per_node for name in candidates)
    else:  # a gres.conf without types: every domain, every node
        sizes = facts.domain_sizes
        per_node = max(facts.gpus_per_node.values(), default=0)
    min_nodes = number(job.get("min_nodes")) or 0
    total = _gpu_total(job, fields)
    implied = -(-total // per_node) if total and per_node else 0
    nodes = max(min_nodes, implied)
    if nodes <= 1:
        return
    if implied > min_nodes:
        gpu_flag = next(user_item(f, it) for f, it in asked
                        if it.name == "gpu" and f in ("tres_per_job", "tres_per_task"))
        what = f"{total} GPUs ({nodes} nodes of {per_node})"
    else:
        gpu_flag = ""
        what = f"{nodes} nodes"
    if len(candidates) == 1 and nodes > facts.types[candidates[0]].nodes:
        name = candidates[0]
        have = facts.types[name].nodes
        if gpu_flag:
            raise reject(gpu_flag, f"needs {nodes} nodes of at most {per_node} {name} each, "
                         f"and this cluster has {have} nodes with {name}",
                         f"ask for at most {have * per_node} GPUs")
        raise reject(f"-N {nodes}", f"asks for {nodes} nodes with {name}, and this cluster "
                     f"has {have}", f"ask for at most -N {have}")
    if not sizes:
        return  # PCIe nodes: no NVLink domain to keep the job in
    if facts.topology == "block":
        _segment(job, facts, nodes, what, sizes, changes, notes, release)
    else:
        _switches_rule(job, facts, nodes, what, sizes, changes, notes)


def _switches_rule(job: dict[str, Any], facts: Facts, nodes: int, what: str,
                   sizes: tuple[int, ...], changes: dict[str, Any], notes: list[str]) -> None:
    """topology/tree: ``--switches`` for the fewest domains, the user's count raised to it
    and their wait capped by the policy."""
    req = number(job.get("req_switch"))
    wait = number(job.get("wait4switch"))
    policy = facts.policy
    if nodes > sum(sizes):
        notes.append(f"no --switches: {what} are more than the NVLink domains hold "
                     f"({sum(sizes)} nodes)")
        return
    need = _fewest_domains(nodes, sizes)
    if req is None:
        changes["req_switch"] = need
        if wait != policy.switch_wait_s:
            changes["wait4switch"] = policy.switch_wait_s
        notes.append(f"--switches={need}@{format_wait(policy.switch_wait_s)} "
                     f"({_domains_reason(what, need, sizes[0])})")
        return
    reasons = []
    new_req, new_wait = req, wait
    if req < need:
        new_req = need
        changes["req_switch"] = need
        reasons.append(_domains_reason(what, need, sizes[0]))
    if wait is not None and wait > policy.max_switch_wait_s:
        new_wait = policy.max_switch_wait_s
        changes["wait4switch"] = new_wait
        reasons.append(f"the longest switch wait here is {format_wait(new_wait)}")
    if reasons:
        notes.append(f"--switches={_switches(req, wait)} -> "
                     f"--switches={_switches(new_req, new_wait)} ({', '.join(reasons)})")


def _bit(value: Any, bit: int) -> bool:
    """One bit of ``bitflags`` (a uint64 in slurmctld, a double in its Lua)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if value != value or value in (float("inf"), float("-inf")) or value < 0:
        return False
    return bool(int(value) & bit)


def _names_nodes(job: dict[str, Any]) -> bool:
    """Whether the job names its nodes (``-w``/``--nodelist``: ``req_nodes``)."""
    value = job.get("req_nodes")
    return isinstance(value, str) and value.strip(" \t\n\v\f\r") not in ("", "(null)")


def _largest_segment(nodes: int, block: int) -> int:
    """The largest segment that divides ``nodes`` and fits in ``block`` nodes."""
    return nodes if nodes <= block else max(d for d in range(1, block + 1) if nodes % d == 0)


def _segment(job: dict[str, Any], facts: Facts, nodes: int, what: str, sizes: tuple[int, ...],
             changes: dict[str, Any], notes: list[str], release: Release) -> None:
    """topology/block: ``--segment`` keeps each segment of the job's nodes in one block
    (NVLink domain); ``--switches`` means nothing there.

    Only where the job_desc has ``segment_size``: job_submit/gpushare from Slurm 24.11,
    job_submit.lua from 25.11. A segment the user gave is kept (refused before 25.11 where
    Slurm could never place it); none is added to a job that names its nodes (25.11 would
    then take only the named nodes, 24.11 refuses several segments with -w); with
    ``--spread-segments`` only one that leaves each segment a block of its own.
    """
    if job.get("segment_size") is None:
        return  # job_submit.lua before 25.11: Slurm's block placement alone
    given = number(job.get("segment_size"))
    base = min(facts.domain_sizes or sizes)  # the base block: BlockSizes' first
    if given:  # 0: unset, as NO_VAL16 is
        _users_segment(job, nodes, given, base, notes, release)
        return
    if _names_nodes(job):
        notes.append("no --segment: the job names its nodes (-w)")
        return
    if nodes > sum(sizes):
        notes.append(f"no --segment: {what} are more than the NVLink domains hold "
                     f"({sum(sizes)} nodes)")
        return
    block = min(sizes)  # a segment must fit in a block (before 25.11, in the base block)
    segment = _largest_segment(nodes, block)
    if segment <= 1:
        notes.append(f"no --segment: {what} do not split evenly into NVLink domains of "
                     f"{block} nodes")
        return
    count = nodes // segment
    if _bit(job.get("bitflags"), SPREAD_SEGMENTS) and count > len(sizes):
        notes.append(f"no --segment: --spread-segments puts each segment in a block of its "
                     f"own, and {what} need {count} segments of {segment} nodes "
                     f"({len(sizes)} blocks here)")
        return
    changes["segment_size"] = segment
    if segment == nodes:
        notes.append(f"--segment={segment} ({what} fit in one NVLink domain)")
    else:
        notes.append(f"--segment={segment} ({what} in segments of {segment}, each in one "
                     f"NVLink domain of {block} nodes)")


def _users_segment(job: dict[str, Any], nodes: int, given: int, base: int, notes: list[str],
                   release: Release) -> None:
    """The user's own ``--segment``: kept, unless Slurm before 25.11 could never place it."""
    if given > base:
        if before(release, (25, 11)):
            better = _largest_segment(nodes, base)
            fix = f"ask for one that fits, e.g. --segment={better}" if better > 1 else \
                "drop --segment"
            raise reject(f"--segment={given}", f"is larger than a block here ({base} nodes), "
                         "and Slurm before 25.11 places a segment only inside one block", fix)
        notes.append(f"--segment={given} kept, though larger than the base block here "
                     f"({base} nodes): a segment may then span several NVLink domains")
        return
    if _names_nodes(job) and nodes > given and before(release, (25, 11)):
        raise reject(f"--segment={given}", f"splits the job's {nodes} nodes into segments, "
                     "and Slurm before 25.11 cannot place segments on the nodes -w names",
                     "drop -w or --segment")
