# SPDX-License-Identifier: GPL-2.0-or-later
"""``gpushare check``: does this node's gres.conf, its real GPUs and the plan agree?

Each disagreement is a ``Finding`` that says what is wrong, where (file:line, GPU, slice) and
how to fix it. The worst one becomes the drain reason when the check runs as slurm.conf's
HealthCheckProgram, so an operator reading ``sinfo -R`` knows what to do.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Optional

import hostlist

from gpushare.admin.check_host import (
    check_daemon_cgroup,
    check_daemon_containment,
    check_ptrace_scope,
    check_state_space,
    check_trash,
)
from gpushare.admin.plan import NodeGroup, Plan, PlanError, check_mig_change
from gpushare.admin.plan.model import release_tuple
from gpushare.admin.render import (
    PlannedDevice,
    RenderError,
    expected_gres,
    release_findings,
    slurm_node_gres,
)
from gpushare.admin.slurm_client import SlurmNode, parse_node_gres
from gpushare.gpu.gresconf import GresConf
from gpushare.gpu.inventory import Gpu, Inventory
from gpushare.node.drain import drain_node, fit_reason
from gpushare.node.verify import ERROR, WARNING, Finding

__all__ = [
    "ERROR",
    "WARNING",
    "Finding",
    "check_accounting",
    "check_cluster",
    "check_daemon_cgroup",
    "check_daemon_containment",
    "check_gres_all_nodes",
    "check_lending",
    "check_node",
    "check_ptrace_scope",
    "check_release",
    "check_state_space",
    "check_trash",
    "drain_node",
    "drain_reason",
    "exit_status",
]

_RANK = {ERROR: 2, WARNING: 1}


def exit_status(findings: Iterable[Finding]) -> int:
    """0 when all is well, 1 for warnings only, 2 when there is an error."""
    return max((_RANK.get(f.severity, 0) for f in findings), default=0)


# --------------------------------------------------------------------------------------------
# The running Slurm


def check_release(plan: Plan, running: Optional[str], controller: bool) -> list[Finding]:
    """The plan's Slurm release against ``running``, the one here (None: no Slurm here).

    Rendering takes the plan's ``slurm.version`` and never looks at the host, so this is
    where a plan written for another release shows. On the controller (``--cluster``,
    ``--all-nodes``) what cannot work is an error; on a node it is a warning, since the
    node's own jobs do not depend on it and a health check must not drain every node of a
    cluster for a line of the plan."""
    found = []
    for severity, message, fix in release_findings(plan, running):
        level = ERROR if severity == "error" and controller else WARNING
        found.append(Finding(level, message, f"{plan.path}: slurm.version", fix))
    return found


def check_lending(plan: Plan) -> list[Finding]:
    """The plan's lending rules in every state they can reach: no GPU or GPU instance is
    ever both schedulers' (``gpushare.admin.plan.lent.states_owned_once``)."""
    from gpushare.admin.plan.lent import states_owned_once

    return [Finding(ERROR, f"lending would give a device to both schedulers: {problem}",
                    f"{plan.path}: lending", "report this as a gpushare bug: the plan was "
                    "accepted but its rendering disagrees; remove the lending rule meanwhile")
            for problem in states_owned_once(plan)]


def check_accounting(plan: Plan, tracked: str) -> list[Finding]:
    """Whether slurmctld records every GPU kind of the plan in accounting
    (``AccountingStorageTRES``, ``tracked``), where a group has a relayout menu: without them
    sacct shows no MIG job's GPUs, so relayout's floors keep the plan's slices and
    ``--suggest`` refuses."""
    from gpushare.admin.tres import plan_kinds, plan_tres, tres_name, untracked

    if not any(group.relayout is not None for group in plan.groups):
        return []
    missing = untracked(plan_kinds(plan), tracked)
    if not missing:
        return []
    wanted = plan_tres(plan)
    return [Finding(
        WARNING, f"slurmctld does not record {','.join(map(tres_name, missing))} in accounting "
        "(AccountingStorageTRES): sacct cannot show those jobs' GPUs, so gpushare relayout "
        "keeps what the plan gives each of those kinds and --suggest refuses",
        "slurmctld AccountingStorageTRES", f"add AccountingStorageTRES={','.join(wanted)} "
        "(merged into yours; `gpushare render slurm-conf` prints it) and restart slurmctld")]


# --------------------------------------------------------------------------------------------
# One node


def check_node(plan: Plan, node: str, gres: Optional[GresConf] = None,
               inventory: Optional[Inventory] = None,
               device_root: Optional[str] = None) -> list[Finding]:
    """Compare whatever of gres.conf and the inventory is given with the plan."""
    group = plan.group_of(node)
    if group is None:
        return [Finding(ERROR, f"node {node} is in no node group of the plan", plan.path,
                        f"add {node} to a node group's nodes in {plan.path}")]
    findings: list[Finding] = []
    if inventory is not None:
        findings.extend(_check_inventory(plan, group, node, inventory))
    if gres is not None:
        findings.extend(_check_gres(plan, group, node, gres, inventory, device_root))
    return findings


def _gpu_busy(gpu: Gpu) -> bool:
    return bool(gpu.processes) or any(getattr(m, "processes", None) for m in gpu.mig_devices)


def _check_inventory(plan: Plan, group: NodeGroup, node: str, inventory: Inventory
                     ) -> list[Finding]:
    findings: list[Finding] = []
    source = f"node {node} ({inventory.source})"
    real = {gpu.nvml_index: gpu for gpu in inventory.gpus}
    if len(real) != len(group.gpus):
        findings.append(Finding(
            ERROR, f"the node has {len(real)} GPUs, the plan's group {group.name} has "
            f"{len(group.gpus)}", f"{plan.path}:{group.line}",
            "fix the group's gpus: in the plan, or check the node's hardware (nvidia-smi -L)"))
    for planned in group.gpus:
        gpu = real.get(planned.index)
        if gpu is None:
            continue
        where = f"{source} GPU {planned.index}"
        if not group.model.matches_nvml_name(gpu.name, gpu.memory_total):
            findings.append(Finding(
                ERROR, f"GPU {planned.index} is a {gpu.name}, the plan says {group.model.name}",
                where, f"set gpu_model for group {group.name} at {plan.path}:{group.line}"))
            continue
        if planned.mig != gpu.mig_current:
            wanted = "on" if planned.mig else "off"
            findings.append(Finding(
                ERROR, f"GPU {planned.index}: MIG is {'on' if gpu.mig_current else 'off'}, the "
                f"plan wants it {wanted}", where,
                f"drain the node, then apply the layout: nvidia-mig-parted apply -f "
                f"<rendered config> -c {plan.mig_config_prefix}-{group.name}"))
        elif gpu.mig_pending != gpu.mig_current:
            findings.append(Finding(
                WARNING, f"GPU {planned.index}: MIG mode change to "
                f"{'on' if gpu.mig_pending else 'off'} is pending until the next GPU reset",
                where, "drain the node and reset its GPUs, or revert the pending change"))
        if planned.mig and gpu.mig_current:
            want = Counter(s.profile for s in planned.slices)
            have = Counter(m.profile for m in gpu.mig_devices)
            if want != have:
                findings.append(Finding(
                    ERROR, f"GPU {planned.index}: MIG slices are {_counts(have) or 'none'}, the "
                    f"plan has {_counts(want)}", where,
                    f"drain the node, then apply: nvidia-mig-parted apply -f <rendered config> "
                    f"-c {plan.mig_config_prefix}-{group.name}"))
    busy = [gpu.nvml_index for gpu in inventory.gpus if _gpu_busy(gpu)]
    try:
        check_mig_change(plan, _Named(inventory, node), busy)
    except PlanError as err:
        where, _sep, what = err.problems[0].partition(": ")
        findings.append(Finding(ERROR, what, where,
                                f"drain the node (scontrol update NodeName={node} State=DRAIN "
                                "Reason=...) and apply the layout once its jobs have ended"))
    return findings


class _Named:
    """The inventory seen under the Slurm node name (the host name may differ)."""

    def __init__(self, inventory: Inventory, node: str):
        self.hostname = node
        self.gpus = inventory.gpus


def _counts(counter: Counter[str]) -> str:
    return " + ".join(f"{n} × {p}" for p, n in sorted(counter.items()))


def _files_key(files: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(re.sub(r"/+", "/", f) for f in files))


def _describe(device: PlannedDevice) -> str:
    if device.multiple_files:
        return f"GPU {device.gpu_index} slice {device.type}"
    if device.name == "gpu":
        return f"GPU {device.gpu_index} ({device.type})"
    return f"{device.name} on GPU {device.gpu_index}"


def _check_gres(plan: Plan, group: NodeGroup, node: str, gres: GresConf,
                inventory: Optional[Inventory], device_root: Optional[str]) -> list[Finding]:
    findings: list[Finding] = []
    render_hint = f"gpushare render gres --plan {plan.path} --node {node}"
    mode = gres.autodetect(node)
    if mode in ("nvml", "nvidia"):
        kube_owned = any(g.owner != "slurm" for g in group.gpus)
        findings.append(Finding(
            ERROR if kube_owned else WARNING,
            f"gres.conf uses AutoDetect={mode}: Slurm takes every GPU and MIG slice NVML "
            "reports" + (", including those the plan gives to kubernetes" if kube_owned else ""),
            gres.path, f"use the rendered gres.conf (AutoDetect=off): {render_hint}"))
    try:
        expected = expected_gres(plan, group, inventory, device_root)
        foreign = expected_gres(plan, group, inventory, device_root, owner="kubernetes")
    except RenderError:  # the node's MIG layout differs from the plan: reported above
        expected = expected_gres(plan, group, None, device_root)
        foreign = expected_gres(plan, group, None, device_root, owner="kubernetes")
    real_files = _real_files(inventory, device_root or plan.slurm.device_root)
    for name in ("gpu", "mps", "shard"):
        want = {_files_key(d.files): d for d in expected if d.name == name}
        have = gres.devices(node, name, inventory if mode in ("nvml", "nvidia") else None)
        if name != "gpu" and not want and not have:
            continue
        kube = {_files_key(d.files): d for d in foreign if d.name == name}
        seen: set[tuple[str, ...]] = set()
        for device in have:
            key = _files_key(device.files)
            where = f"{gres.path}:{device.line}" if device.line else f"{gres.path} (AutoDetect)"
            label = f"{name}{':' + device.type if device.type else ''} {','.join(device.files)}"
            if key in seen:
                findings.append(Finding(ERROR, f"{label} is listed twice", where,
                                        "remove the duplicate line"))
                continue
            seen.add(key)
            planned = want.get(key)
            if planned is None:
                if key in kube:
                    findings.append(Finding(
                        ERROR, f"gres.conf gives Slurm {_describe(kube[key])}, which the plan "
                        "gives to kubernetes: both schedulers would use it", where,
                        f"remove the line, or render gres.conf again: {render_hint}"))
                elif real_files is not None and not set(device.files) <= real_files:
                    missing = sorted(set(device.files) - real_files)
                    findings.append(Finding(
                        ERROR, f"gres.conf lists {label}, but the node has no "
                        f"{', '.join(missing)} (NVML and mig-minors)", where,
                        f"render gres.conf again from the node's inventory: {render_hint} "
                        "--source nvml"))
                else:
                    findings.append(Finding(
                        ERROR, f"gres.conf lists {label}, which the plan does not give Slurm",
                        where, f"remove the line or change the plan; then {render_hint}"))
                continue
            if name == "gpu" and device.type != planned.type:
                findings.append(Finding(
                    ERROR, f"{_describe(planned)} has Type={device.type or '(none)'} in "
                    f"gres.conf, the plan says {planned.type}", where,
                    f"set Type={planned.type}, or {render_hint}"))
            if name != "gpu" and device.gres_count != planned.count:
                findings.append(Finding(
                    ERROR, f"{_describe(planned)} has Count={device.gres_count}, the plan says "
                    f"{planned.count}", where, f"set Count={planned.count}, or {render_hint}"))
        for key, planned in want.items():
            if key not in seen:
                findings.append(Finding(
                    ERROR, f"gres.conf has no {name} line for {_describe(planned)} "
                    f"({','.join(planned.files)}) that the plan gives Slurm", gres.path,
                    f"add it: {render_hint}"))
    return findings


def check_gres_all_nodes(plan: Plan, gres: GresConf, device_root: Optional[str] = None
                         ) -> list[Finding]:
    """A cluster-wide gres.conf against the plan, for every node of the plan.

    Nodes of one node group to which the same gres.conf lines apply get the same devices, so
    they share one verdict: a 10 000-node cluster costs one check per distinct pair.
    """
    applicable: dict[str, list[int]] = {node: [] for node in plan.nodes}
    common: list[int] = []
    for position, line in enumerate(gres.lines):
        if line.nodes is None:
            common.append(position)
            continue
        for node in line.nodes:
            if node in applicable:
                applicable[node].append(position)
    classes: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for node, positions in applicable.items():
        group = plan.group_of(node)
        assert group is not None
        classes.setdefault((group.name, tuple(positions)), []).append(node)
    findings: list[Finding] = []
    for (_group, line_positions), nodes in classes.items():
        subset = GresConf(gres.path,
                          [gres.lines[i] for i in sorted(common + list(line_positions))])
        label = f"node {nodes[0]}" if len(nodes) == 1 else \
            f"nodes {hostlist.collect_hostlist(nodes)}"
        for finding in check_node(plan, nodes[0], subset, None, device_root):
            fix = finding.fix if len(nodes) == 1 else \
                finding.fix.replace(f"--node {nodes[0]}", "--node NAME")
            findings.append(Finding(finding.severity, f"{label}: {finding.what}",
                                    finding.where, fix))
    return findings


def _real_files(inventory: Optional[Inventory], root: str) -> Optional[set[str]]:
    if inventory is None:
        return None
    files: set[str] = set()
    base = root.rstrip("/")
    for gpu in inventory.gpus:
        files.add(f"{base}/nvidia{gpu.minor}")
        for mig in gpu.mig_devices:
            for path in mig.caps_files:
                files.add(base + path[len("/dev"):] if path.startswith("/dev/") else path)
    return files


# --------------------------------------------------------------------------------------------
# The cluster


def _count_restart(plan: Plan) -> str:
    """Before 23.11 a reconfigure keeps a node's GPU count (the node goes INVAL when slurmd
    registers the new one); only a restart of slurmctld takes it."""
    if release_tuple(plan.slurm.version) >= (23, 11):
        return ""
    return (f", then restart slurmctld (Slurm {plan.slurm.version} takes a node's new GPU "
            "count only when slurmctld starts)")


def check_cluster(plan: Plan, nodes: list[SlurmNode]) -> list[Finding]:
    """What slurmctld believes (GRES, state, drain reason) against the plan."""
    findings: list[Finding] = []
    known = {node.name: node for node in nodes}
    # By group object: a relayout's applied layouts give a changed node a group of its own
    # under the same name (gpushare.admin.relayout.state.applied_plan).
    expected_by_group = {id(group): _comparable(parse_node_gres(slurm_node_gres(group)))
                         for group in plan.groups}
    missing = [name for name in plan.nodes if name not in known]
    if missing:
        findings.append(Finding(
            WARNING, f"{len(missing)} plan node(s) unknown to slurmctld: "
            f"{hostlist.collect_hostlist(missing)}", plan.path,
            "add them to slurm.conf (NodeName=... Gres=...) or remove them from the plan"))
    for node in nodes:
        group = plan.group_of(node.name)
        actual = _comparable({k: v for k, v in parse_node_gres(node.gres).items()
                              if k[0] in ("gpu", "mps", "shard")})
        where = f"slurmctld node {node.name}"
        if group is None:
            if actual:
                findings.append(Finding(
                    WARNING, f"node {node.name} has GPU GRES {node.gres} but is in no node "
                    "group of the plan", where, f"add it to a node group in {plan.path}"))
            continue
        expected = expected_by_group[id(group)]
        if actual != expected:
            findings.append(Finding(
                ERROR, f"node {node.name}: slurmctld has Gres={node.gres or '(none)'}, the plan "
                f"gives Slurm {slurm_node_gres(group) or '(nothing)'}", where,
                f"set Gres={slurm_node_gres(group)} on the node's slurm.conf line and "
                "`scontrol reconfigure`" + _count_restart(plan)))
        if node.draining or node.down:
            state = "+".join(node.states)
            by_us = node.reason.startswith("gpushare")
            findings.append(Finding(
                WARNING, f"node {node.name} is {state}"
                + (f": {node.reason}" if node.reason else ""), where,
                ("run `gpushare check` on the node, fix what it reports, then " if by_us else "")
                + f"scontrol update NodeName={node.name} State=RESUME"))
    return findings


def _comparable(counts: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """slurmctld names a node's mps/shard after the GPU type they run on (``mps:h100:800``
    for slurm.conf's ``mps:800``): compare shared GRES by their total count only."""
    merged: dict[tuple[str, str], int] = {}
    for (name, gres_type), count in counts.items():
        key = (name, "") if name in ("mps", "shard") else (name, gres_type)
        merged[key] = merged.get(key, 0) + count
    return merged


# --------------------------------------------------------------------------------------------
# Draining (HealthCheckProgram)


def drain_reason(findings: Iterable[Finding]) -> str:
    """A readable reason of at most ~100 characters naming the worst finding."""
    ranked = sorted(findings, key=lambda f: -_RANK.get(f.severity, 0))
    if not ranked:
        return ""
    errors = sum(1 for f in ranked if f.severity == ERROR)
    return fit_reason(ranked[0].what, f" (+{errors - 1} more)" if errors > 1 else "")
