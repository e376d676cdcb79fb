# SPDX-License-Identifier: GPL-2.0-or-later
"""Render what Slurm and Kubernetes are told about GPUs from the one ownership plan.

The device lists are built as data first (``expected_gres``), so that ``gpushare check``
compares a node's real gres.conf with exactly what would be rendered; the jinja2 templates in
``gpushare/admin/templates`` only lay that data out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import hostlist
import jinja2

from gpushare.admin.mig_profiles import caps_minors, gi_id_for_placement
from gpushare.admin.plan import (
    GpuPlan,
    NodeGroup,
    Plan,
    env_uuid_renders,
    gres_syntax_of,
    release_tuple,
    with_slurm_version,
)
from gpushare.admin.topology import build_blocks, build_switches
from gpushare.admin.tres import plan_tres
from gpushare.gpu.inventory import Gpu, Inventory

__all__ = [
    "PlannedDevice",
    "RenderError",
    "expected_gres",
    "render_gres_conf",
    "render_mig_parted",
    "render_plugstack",
    "render_topology",
    "slurm_node_gres",
    "whole_gpu_nodes",
]

# The node feature of the nodes whose Slurm GPUs are all whole (whole_gpu_nodes).
WHOLE_GPU_FEATURE = "gpushare_whole"

_TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
_ENV: Optional[jinja2.Environment] = None


class RenderError(ValueError):
    """The plan cannot be rendered for this node (e.g. the inventory disagrees with it)."""


@dataclass(frozen=True)
class PlannedDevice:
    """One gres.conf device the plan gives, as Slurm will count it (before whole GPUs are
    folded into ranges); gpushare.gpu.gresconf.GresDevice is one read from a gres.conf."""

    name: str  # gpu | mps | shard
    type: str  # "h100", "3g.20gb", "" for mps/shard
    files: tuple[str, ...]
    multiple_files: bool  # MIG: the GPU, its GI cap and its CI cap make one device
    count: int = 0  # mps/shard Count=; 0: not written
    flags: str = ""
    gpu_index: int = -1
    comment: str = ""


def _env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_TEMPLATE_DIR),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
    return _ENV


def _render(template: str, **values: Any) -> str:
    return _env().get_template(template).render(**values)


def _dev(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def _rebase(path: str, root: str) -> str:
    """Move an inventory path under /dev to the device root the gres.conf is written for."""
    if path.startswith("/dev/"):
        return _dev(root, path[len("/dev/"):])
    return path


# --------------------------------------------------------------------------------------------
# gres.conf


def expected_gres(plan: Plan, group: NodeGroup, inventory: Optional[Inventory] = None,
                  device_root: Optional[str] = None, owner: str = "slurm") -> list[PlannedDevice]:
    """Every device ``owner`` owns on one node of ``group``, in GPU order (as gres.conf lines;
    ``owner="kubernetes"`` lets ``gpushare check`` recognise a slice listed by mistake).

    With the node's inventory the files are the real ones (GPU minors, MIG capability files);
    without it the GPU minor is its index and the MIG capability minors follow the standard
    mig-minors numbering for the placements the plan gives or solves.
    """
    root = device_root or plan.slurm.device_root
    real: dict[int, Gpu] = {}
    if inventory is not None:
        real = {gpu.nvml_index: gpu for gpu in inventory.gpus}
        missing = [gpu.index for gpu in group.gpus if gpu.index not in real]
        if missing:
            raise RenderError(f"node {inventory.hostname}: the plan has GPU "
                              f"{', '.join(map(str, missing))} but the node shows "
                              f"{len(real)} GPUs; run `gpushare check` on the node")
    flags = plan.slurm.sharing_flag
    gpu_flags = "env_uuid" if env_uuid_renders(plan.slurm) else ""
    devices: list[PlannedDevice] = []
    for gpu in group.gpus:
        minor = real[gpu.index].minor if real else gpu.index
        gpu_file = _dev(root, f"nvidia{minor}")
        if not gpu.mig:
            if gpu.owner != owner:
                continue
            devices.append(PlannedDevice("gpu", group.model.gres_type, (gpu_file,), False,
                                         flags=gpu_flags, gpu_index=gpu.index))
            if gpu.mps and owner == "slurm":
                devices.append(PlannedDevice("mps", "", (gpu_file,), False, gpu.mps, flags,
                                             gpu.index))
            if gpu.shard and owner == "slurm":
                devices.append(PlannedDevice("shard", "", (gpu_file,), False, gpu.shard,
                                             flags, gpu.index))
            continue
        slices = _owned_slices(group, gpu, real.get(gpu.index), minor, root, owner)
        devices.extend(PlannedDevice("gpu", profile, (gpu_file, gi_file, ci_file), True,
                                     flags=gpu_flags, gpu_index=gpu.index, comment=comment)
                       for profile, gi_file, ci_file, comment in slices)
    return devices


def _owned_slices(group: NodeGroup, gpu: GpuPlan, real: Optional[Gpu], minor: int, root: str,
                  owner: str) -> list[tuple[str, str, str, str]]:
    mine = gpu.slices_of(owner)
    if not mine:
        return []
    caps = _dev(root, "nvidia-caps/nvidia-cap")
    if real is None:
        rows = []
        for mig_slice in sorted(mine, key=lambda s: s.placement):
            profile = group.model.profile(mig_slice.profile)
            assert profile is not None  # the plan parser checked it
            gi = gi_id_for_placement(group.model, mig_slice.placement, profile.memory_slices)
            gi_minor, ci_minor = caps_minors(minor, gi, 0)
            rows.append((mig_slice.profile, f"{caps}{gi_minor}", f"{caps}{ci_minor}",
                         f"GPU {gpu.index} slice {mig_slice.profile} (GPU instance {gi})"))
        return rows
    wanted: dict[str, int] = {}
    for mig_slice in mine:
        wanted[mig_slice.profile] = wanted.get(mig_slice.profile, 0) + 1
    keyed: list[tuple[tuple[int, int], str, str, str, str]] = []
    for profile_name, count in wanted.items():
        found = sorted((d for d in real.mig_devices if d.profile == profile_name),
                       key=lambda d: (d.gi_id, d.ci_id))
        if len(found) != count:
            raise RenderError(f"GPU {gpu.index}: the plan gives {owner} {count} × {profile_name} "
                              f"but the GPU has {len(found)}; apply the MIG layout first, then "
                              "render again (`gpushare check` shows the difference)")
        for device in found:
            if len(device.caps_files) >= 2:
                gi_file, ci_file = (_rebase(f, root) for f in device.caps_files[:2])
            else:
                gi_minor, ci_minor = caps_minors(real.minor, device.gi_id, device.ci_id)
                gi_file, ci_file = f"{caps}{gi_minor}", f"{caps}{ci_minor}"
            keyed.append(((device.gi_id, device.ci_id), profile_name, gi_file, ci_file,
                         f"GPU {gpu.index} slice {profile_name} {device.uuid}"))
    return [row[1:] for row in sorted(keyed)]


def _fold(devices: list[PlannedDevice]) -> list[dict[str, Any]]:
    """Template rows in Slurm's index order: whole GPUs by GPU (consecutive ones of one type
    folded into ``File=/dev/nvidia[0-7]``), then MIG slices, then mps, then shard lines."""
    rows: list[dict[str, Any]] = []
    run: list[str] = []
    run_type = ""
    run_flags = [""]  # a run's gpu lines share their flags (env_uuid or none, plan-wide)

    def close_run() -> None:
        if run:
            rows.append({"name": "gpu", "type": run_type, "count": 0, "multiple_files": False,
                         "files": hostlist.collect_hostlist(run), "flags": run_flags[0],
                         "comment": f"{len(run)} whole {run_type} GPU"
                                    + ("s" if len(run) > 1 else "")})
            run.clear()

    # Whole GPUs before MIG slices: slurmd 22.05 without AutoDetect splits every
    # MultipleFiles line into one GPU per file, so Slurm's indices stay right only when the
    # slices come last (and are of one type; see check_autodetect_off).
    ordered = sorted(devices, key=lambda d: (d.name != "gpu" or d.multiple_files))
    for name in ("gpu", "mps", "shard"):
        for device in ordered:
            if device.name != name:
                continue
            if name == "gpu" and not device.multiple_files:
                if run and run_type != device.type:
                    close_run()
                run_type, run_flags[0] = device.type, device.flags
                run.extend(device.files)
                continue
            close_run()
            rows.append({"name": device.name, "type": device.type, "count": device.count,
                         "multiple_files": device.multiple_files,
                         "files": ",".join(device.files), "flags": device.flags,
                         "comment": device.comment})
        close_run()
    return rows


def for_installed_slurm(plan: Plan, installed: Optional[str]) -> tuple[Plan, str]:
    """The plan to render, and a note for the admin ("" when there is nothing to say).

    A plan that names ``slurm.version`` is rendered for that release whatever runs here
    (``installed`` is not consulted: sites render in configuration management, often where
    no Slurm or another release runs; ``gpushare check`` and the submit hooks compare it with
    the running Slurm). A plan without one takes the installed release ``installed`` (None:
    none here, so the plan's default, said in the note).
    """
    if plan.slurm.version_given:
        return plan, ""
    if installed is None:
        return plan, (f"the plan has no slurm.version and no Slurm is installed here: "
                      f"rendering for Slurm {plan.slurm.version}")
    if (plan.slurm.topology == "block" or plan.slurm.imex) and \
            release_tuple(installed) < (24, 5):
        raise RenderError(
            f"{plan.path}: slurm.topology: block and slurm.imex need Slurm 24.05 or later "
            f"(topology/block with BlockSizes, --segment, switch/nvidia_imex); this "
            f"machine runs Slurm {installed}: set slurm.version to the cluster's release")
    return with_slurm_version(plan, installed), ""


def release_findings(plan: Plan, running: Optional[str]) -> list[tuple[str, str, str]]:
    """What differs between the plan's Slurm release and ``running``, the one that runs
    here: (``"error"`` or ``"warning"``, what, how to fix it) for ``gpushare check``. None
    when they agree, when the plan names no release (it is then rendered for the running
    one) or when nothing runs here. An error where what is rendered from the plan cannot
    work with the running Slurm (a feature it lacks; request strings in the other syntax,
    which slurmctld rejects), a warning where only the release differs."""
    if not plan.slurm.version_given or running is None:
        return []
    wanted = plan.slurm.version
    if release_tuple(wanted) == release_tuple(running):
        return []
    fix = (f'set slurm.version: "{".".join(running.split(".")[:2])}" in {plan.path} and '
           "render again")
    if env_uuid_renders(plan.slurm) and not env_uuid_renders(
            with_slurm_version(plan, running).slurm):
        return [("error", f"the plan is for Slurm {wanted} with slurm.env_uuid: Slurm "
                          f"{running} running here ignores gres.conf Flags=env_uuid, and any "
                          "Flags= on a gpu line leaves its jobs no CUDA_VISIBLE_DEVICES",
                 f"upgrade Slurm to 26.05, or {fix}")]
    if (plan.slurm.topology == "block" or plan.slurm.imex) and \
            release_tuple(running) < (24, 5):
        return [("error", f"the plan is for Slurm {wanted} with slurm.topology: block or "
                          f"slurm.imex, which Slurm {running} running here lacks (they need "
                          "24.05 or later)", f"upgrade Slurm, or {fix}")]
    if gres_syntax_of(running) != plan.slurm.gres_syntax:
        return [("error", f"the plan is for Slurm {wanted}: the submit facts rendered from it "
                          f"write requests as {_example(plan.slurm.gres_syntax)}, which Slurm "
                          f"{running} running here rejects (it takes "
                          f"{_example(gres_syntax_of(running))})", fix)]
    return [("warning", f"the plan is for Slurm {wanted}, Slurm {running} runs here", fix)]


def _example(syntax: str) -> str:
    return "gres:gpu:1" if syntax == "22.05" else "gres/gpu:1"


def check_autodetect_off(plan: Plan, group: NodeGroup) -> None:
    """Refuse a MIG layout that Slurm 22.05 cannot index from an AutoDetect=off gres.conf.

    Measured on 22.05.8: slurmd splits each ``MultipleFiles`` line into one GPU per file, so
    a second MIG type on a node is allocated under the first one's indices and every step
    fails with "Invalid generic resource (gres) specification".
    """
    if not plan.slurm.version.startswith(("21.", "22.")):
        return
    profiles = sorted({s.profile for gpu in group.gpus for s in gpu.slices_of("slurm")})
    if len(profiles) > 1:
        raise RenderError(
            f"{plan.path}:{group.line}: node group {group.name} gives Slurm MIG slices of "
            f"{len(profiles)} profiles ({', '.join(profiles)}); Slurm "
            f"{plan.slurm.version} with AutoDetect=off indexes only one MIG profile per node "
            "correctly: give Slurm one profile per node group, or upgrade Slurm")


def render_gres_conf(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None,
                     device_root: Optional[str] = None, node: Optional[str] = None) -> str:
    """gres.conf for the whole cluster, or for ``node`` alone.

    Groups without inventories get one block for all their nodes; a node with an inventory gets
    its own block built from its real device files.
    """
    inventories = dict(inventory_by_node or {})
    blocks = []
    groups = plan.groups
    if node is not None:
        group = plan.group_of(node)
        if group is None:
            raise RenderError(f"{plan.path}: node {node} is in no node group")
        groups = (group,)
    for group in groups:
        check_autodetect_off(plan, group)
        members = [node] if node is not None else [n for n in group.nodes if n in inventories]
        for member in members:
            lines = _fold(expected_gres(plan, group, inventories.get(member), device_root))
            if lines:
                blocks.append({"title": f"node {member} (group {group.name}, "
                                        f"{group.model.name})", "nodes": member, "lines": lines})
        if node is None:
            rest = [n for n in group.nodes if n not in inventories]
            if rest:
                lines = _fold(expected_gres(plan, group, None, device_root))
                if lines:
                    blocks.append({"title": f"node group {group.name} ({group.model.name})",
                                   "nodes": hostlist.collect_hostlist(rest), "lines": lines})
    caps_note = ""
    if any(group.has_mig for group in groups) and not inventories:
        caps_note = ("MIG capability files follow the standard mig-minors numbering for the "
                     "plan's placements; render on the node (--source) to use the real ones.")
    uuid_note = ""
    if env_uuid_renders(plan.slurm):
        uuid_note = ("Flags=env_uuid (Slurm 26.05): a job's CUDA_VISIBLE_DEVICES names its "
                     "GPUs by UUID where slurmd knows them; with AutoDetect=off only "
                     "fake_gpus.conf tells it, elsewhere it logs a warning and keeps indices. "
                     "gpushare takes either.")
    elif plan.slurm.env_uuid:
        uuid_note = (f"slurm.env_uuid is not rendered: Slurm {plan.slurm.version} has no "
                     "gres.conf Flags=env_uuid (26.05 on).")
    return _render("gres.conf.j2", plan_path=plan.path, version=plan.version, blocks=blocks,
                   caps_note=caps_note, uuid_note=uuid_note)


def slurm_node_gres(group: NodeGroup) -> str:
    """The ``Gres=`` value of slurm.conf's NodeName line for a node of this group."""
    counts: dict[tuple[str, str], int] = {}
    for gpu in group.gpus:
        if not gpu.mig:
            if gpu.owner == "slurm":
                key = ("gpu", group.model.gres_type)
                counts[key] = counts.get(key, 0) + 1
                for name, value in (("mps", gpu.mps), ("shard", gpu.shard)):
                    if value:
                        counts[(name, "")] = counts.get((name, ""), 0) + value
            continue
        for mig_slice in gpu.slices_of("slurm"):
            key = ("gpu", mig_slice.profile)
            counts[key] = counts.get(key, 0) + 1
    # Whole GPUs first, in the same order as the gres.conf lines (see _fold).
    whole = {group.model.gres_type}
    order = sorted(counts, key=lambda key: (key[0] != "gpu", key[1] not in whole))
    return ",".join(f"{name}:{gres_type}:{counts[(name, gres_type)]}" if gres_type
                    else f"{name}:{counts[(name, gres_type)]}" for name, gres_type in order)


# --------------------------------------------------------------------------------------------
# topology.conf, mig-parted, plugstack, facts


def render_topology(plan: Plan, inventory_by_node: Optional[Mapping[str, Inventory]] = None
                    ) -> str:
    if plan.slurm.topology == "block":
        blocks, sizes = build_blocks(plan, inventory_by_node)
        return _render("topology.conf.j2", plan_path=plan.path, version=plan.version,
                       blocks=blocks, block_sizes=",".join(map(str, sizes)), switches=[])
    switches = build_switches(plan, inventory_by_node)
    return _render("topology.conf.j2", plan_path=plan.path, version=plan.version,
                   switches=switches, blocks=[])


def whole_gpu_nodes(plan: Plan) -> list[str]:
    """The nodes that get the node feature WHOLE_GPU_FEATURE: those whose Slurm GPUs are
    all whole, where Slurm also owns MIG slices and no node has both. The submit hooks then
    keep an untyped ``--gres=gpu:N`` on these nodes (facts ``whole_gpu_feature``) instead
    of refusing it; where a node has both, a feature cannot keep a job off its slices.
    Empty when there is nothing to keep apart."""
    whole: list[str] = []
    slices = False
    for group in plan.groups:
        has_whole = any(not gpu.mig and gpu.owner == "slurm" for gpu in group.gpus)
        has_slices = any(gpu.slices_of("slurm") for gpu in group.gpus)
        if has_whole and has_slices:
            return []
        slices = slices or has_slices
        if has_whole:
            whole.extend(group.nodes)
    return whole if slices else []


def _node_gres_lines(plan: Plan) -> list[str]:
    """Comments giving each group's NodeName ``Gres=`` and the ``GresTypes=`` they need: a
    site keeps its own NodeName lines (CPUs, memory), so these are not keys."""
    rows = [(group.nodes_expr, slurm_node_gres(group)) for group in plan.groups]
    rows = [(nodes, gres) for nodes, gres in rows if gres]
    if not rows:
        return []
    names = {item.split(":", 1)[0] for _nodes, gres in rows for item in gres.split(",")}
    if any(group.relayout is not None and any(item.layout.mps for item in group.relayout.items)
           for group in plan.groups):
        names.add("mps")  # a relayout may give a GPU MPS units later
    types = sorted(names, key=("gpu", "mps", "shard").index)
    return [f"# Gres= of each group's NodeName lines (GresTypes= must name {','.join(types)});",
            "# `gpushare check --cluster` compares them with slurmctld's:",
            *(f"#   NodeName={nodes} ... Gres={gres}" for nodes, gres in rows)]


def _accounting_lines(plan: Plan) -> list[str]:
    if not any(group.gpus for group in plan.groups):
        return []
    return ["# With slurmdbd: record every GPU kind, so that sacct shows what jobs used",
            "# (relayout's floors and --suggest read it); merge into your AccountingStorageTRES:",
            f"#   AccountingStorageTRES={','.join(plan_tres(plan))}"]


def render_slurm_conf(plan: Plan) -> str:
    """The slurm.conf lines the plan implies: the topology plugin for its NVLink domains,
    the IMEX channel allocation of multi-node NVLink jobs (slurm.imex), and, for the site's
    own NodeName lines, each group's ``Gres=`` and the feature of the nodes whose Slurm GPUs
    are all whole."""
    lines = [f"# slurm.conf lines rendered by gpushare from {plan.path}"]
    if plan.domains or plan.domains_from_fabric:
        lines.append(f"TopologyPlugin=topology/{plan.slurm.topology}")
    if plan.slurm.imex:
        lines.append("# An IMEX channel per job for multi-node NVLink (Slurm 24.05 or later)")
        lines.append("SwitchType=switch/nvidia_imex")
    lines += _node_gres_lines(plan)
    lines += _accounting_lines(plan)
    whole = whole_gpu_nodes(plan)
    if whole:
        lines += [
            f"# Add Features={WHOLE_GPU_FEATURE} to the NodeName lines of these nodes (their",
            "# Slurm GPUs are all whole, the MIG slices are on other nodes): the submit hooks",
            f"# add --constraint={WHOLE_GPU_FEATURE} to a --gres=gpu:N without a type.",
            f"#   NodeName={hostlist.collect_hostlist(whole)} ... "
            f"Features={WHOLE_GPU_FEATURE}",
        ]
    return "\n".join(lines) + "\n"


def _mig_layouts(plan: Plan) -> list[tuple[str, NodeGroup, list[dict[str, Any]]]]:
    """One named config per group that uses MIG or gives GPUs to Kubernetes; every GPU of the
    node is listed (so `nvidia-mig-parted assert` covers the node), equal layouts merged."""
    configs: list[tuple[str, NodeGroup, list[dict[str, Any]]]] = []
    for group in plan.groups:
        if not group.has_mig and all(gpu.owner == "slurm" for gpu in group.gpus):
            continue
        entries: list[dict[str, Any]] = []
        layout_of: dict[tuple[Any, ...], dict[str, Any]] = {}
        for gpu in group.gpus:
            counts: dict[str, int] = {}
            for mig_slice in gpu.slices:
                counts[mig_slice.profile] = counts.get(mig_slice.profile, 0) + 1
            owners = tuple(sorted({(s.profile, s.owner) for s in gpu.slices}))
            key = (gpu.mig, tuple(counts.items()), owners, gpu.owner)
            entry = layout_of.get(key)
            if entry is None:
                entry = {"devices": [], "mig-enabled": gpu.mig,
                         "mig-devices": dict(counts), "_owners": owners, "_owner": gpu.owner}
                layout_of[key] = entry
                entries.append(entry)
            entry["devices"].append(gpu.index)
        for entry in entries:
            if len(entry["devices"]) == len(group.gpus):
                entry["devices"] = "all"
        configs.append((f"{plan.mig_config_prefix}-{group.name}", group, entries))
    return configs


def render_mig_parted(plan: Plan) -> str:
    configs = []
    for name, group, entries in _mig_layouts(plan):
        rows = []
        for entry in entries:
            if entry["mig-enabled"]:
                comment = "slices: " + ", ".join(f"{profile} → {owner}"
                                                 for profile, owner in entry["_owners"])
            else:
                comment = f"whole GPU owned by {entry['_owner']}"
            devices = entry["devices"]
            rows.append({"devices": devices if devices == "all"
                         else "[" + ", ".join(map(str, devices)) + "]",
                         "mig_enabled": entry["mig-enabled"],
                         "mig_devices": list(entry["mig-devices"].items()),
                         "comment": comment})
        configs.append({"name": name, "group": group.name, "nodes": group.nodes_expr,
                        "entries": rows})
    return _render("mig-parted.yaml.j2", plan_path=plan.path, version=plan.version,
                   configs=configs)


IMEX_CHANNELS = "/dev/nvidia-caps-imex-channels"


def render_plugstack(plan: Plan) -> str:
    """The gpushare line; with ``slurm.imex`` each GPU task checks for its IMEX channel."""
    args = list(plan.slurm.plugin_args)
    if plan.slurm.imex and not any(key == "imex_channels" for key, _value in args):
        args.append(("imex_channels", IMEX_CHANNELS))
    return _render("plugstack.conf.j2", plan_path=plan.path, plugin=plan.slurm.plugin,
                   args=args)
