# SPDX-License-Identifier: GPL-2.0-or-later
"""Layout rules: which GPUs a node group has, who owns each, which MIG slices fit where, and
which layout changes a node can take while Slurm uses it."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import hostlist

from gpushare.admin.mig_profiles import GpuModel, find_model, model_names, place_slices
from gpushare.admin.plan.lines import Checker, YamlMap, YamlSeq, line_of
from gpushare.admin.plan.model import (
    MAX_GPUS_PER_NODE,
    OWNERS,
    GpuPlan,
    MigSlice,
    NodeGroup,
    Plan,
    PlanError,
)

_GROUP_KEYS = ("name", "nodes", "gpu_model", "gpus", "layout")
_GPU_KEYS = ("owner", "mps", "shard", "mig")
_SLICE_KEYS = ("profile", "owner", "count", "placement")


def _gpu_indices(c: Checker, key: Any, line: int, where: str, count: int) -> Optional[list[int]]:
    """``all``, ``3``, ``"0-3"``, ``"0,2,5"`` or ``"0-1,4"`` → GPU indices."""
    if isinstance(key, int) and not isinstance(key, bool):
        text = str(key)
    elif isinstance(key, str):
        text = key.strip()
    else:
        c.error(line, f"{where}: layout key {key!r} must be all, a GPU index, or a range "
                "like 0-3")
        return None
    if text == "all":
        return list(range(count))
    indices: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            c.error(line, f"{where}: layout key {key!r} must be all, a GPU index, or a range "
                    "like 0-3")
            return None
        first, last = int(low), int(high) if sep else int(low)
        if first > last or last >= count:
            c.error(line, f"{where}: GPUs {part.strip()} are not within 0-{count - 1} "
                    f"(the group has {count} GPUs per node)")
            return None
        indices.extend(range(first, last + 1))
    return indices


def _gpu_plan(c: Checker, raw: Any, line: int, where: str, index: int, model: GpuModel,
              units_default: int, cache: dict[Any, Optional[list[int]]]) -> Optional[GpuPlan]:
    spec = c.mapping(raw, line, f"{where} GPU {index}", _GPU_KEYS)
    if spec is None:
        return None
    owner = None
    if "owner" in spec:
        owner = c.choice(spec["owner"], line_of(spec, "owner"), f"{where} GPU {index}: owner",
                         OWNERS)
    if "mig" not in spec:
        if "owner" not in spec:
            c.error(spec.line, f"{where} GPU {index}: say who owns it (owner: slurm or "
                    "owner: kubernetes), or give its MIG slices (mig: [...])")
            return None
        mps = shard = 0
        if "mps" in spec:
            value = spec["mps"]
            if value is True:
                mps = units_default
            else:
                mps = c.integer(value, line_of(spec, "mps"), f"{where} GPU {index}: mps",
                                1, 100000) or 0
        if "shard" in spec:
            shard = c.integer(spec["shard"], line_of(spec, "shard"),
                              f"{where} GPU {index}: shard", 1, 100000) or 0
        if mps and shard:
            c.error(spec.line, f"{where} GPU {index}: a GPU is shared through mps or shard, "
                    "not both; keep one")
        if (mps or shard) and owner == "kubernetes":
            c.error(spec.line, f"{where} GPU {index}: mps/shard are Slurm's sharing, but the "
                    "GPU belongs to kubernetes; remove them or set owner: slurm")
        if owner is None:
            return None
        return GpuPlan(index, False, owner, (), mps, shard, spec.line)
    for key in ("mps", "shard"):
        if key in spec:
            c.error(line_of(spec, key), f"{where} GPU {index}: {key} applies to whole GPUs; "
                    "a MIG GPU is shared through its slices")
    if not model.mig_capable:
        c.error(line_of(spec, "mig"), f"{where} GPU {index}: {model.a_name} has no MIG; "
                "give it as a whole GPU (owner: ...)")
        return None
    raw_slices = spec["mig"]
    slice_line = line_of(spec, "mig")
    if not isinstance(raw_slices, YamlSeq) or not raw_slices:
        c.error(slice_line, f"{where} GPU {index}: mig must be a non-empty list of slices like "
                "{profile: 1g.10gb, owner: slurm}")
        return None
    slices: list[tuple[str, str, Optional[int], int]] = []  # profile, owner, placement, line
    ok = True
    for pos, item in enumerate(raw_slices):
        item_line = line_of(raw_slices, pos)
        what = f"{where} GPU {index} slice {pos + 1}"
        entry = c.mapping(item, item_line, what, _SLICE_KEYS, ("profile",))
        if entry is None or "profile" not in entry:
            ok = False
            continue
        profile = c.string(entry["profile"], line_of(entry, "profile"), f"{what}: profile")
        if profile is not None and model.profile(profile) is None:
            c.error(line_of(entry, "profile"), f"{what}: {model.a_name} has no MIG profile "
                    f"{profile!r}; it has " + ", ".join(p.name for p in model.profiles))
            profile = None
        slice_owner = owner
        if "owner" in entry:
            slice_owner = c.choice(entry["owner"], line_of(entry, "owner"), f"{what}: owner",
                                   OWNERS)
        elif owner is None:
            c.error(entry.line, f"{what}: say who owns it (owner: slurm or owner: kubernetes) "
                    "here or for the whole GPU")
        count = 1
        if "count" in entry:
            count = c.integer(entry["count"], line_of(entry, "count"), f"{what}: count",
                              1, model.compute_slices) or 0
        placement: Optional[int] = None
        if "placement" in entry:
            placement = c.integer(entry["placement"], line_of(entry, "placement"),
                                  f"{what}: placement", 0, model.memory_slices - 1)
            if placement is not None and count > 1:
                c.error(line_of(entry, "placement"), f"{what}: a placement fixes one slice; "
                        "use count: 1 with it")
                placement = None
        if profile is None or slice_owner is None or not count:
            ok = False
            continue
        slices.extend((profile, slice_owner, placement, entry.line) for _ in range(count))
    if not ok:
        return None
    owners_by_profile: dict[str, tuple[str, int]] = {}
    for profile, slice_owner, _placement, slice_line_no in slices:
        seen = owners_by_profile.setdefault(profile, (slice_owner, slice_line_no))
        if seen[0] != slice_owner:
            c.error(slice_line_no, f"{where} GPU {index}: slice {profile} owned twice "
                    f"({seen[0]} at line {seen[1]}, {slice_owner} at line {slice_line_no}); "
                    "slices of one profile on one GPU cannot be told apart by gres.conf or "
                    "the MIG manager, so give each owner a different profile or GPU")
            return None
    cache_key = (model.name, tuple(s[0] for s in slices), tuple(s[2] for s in slices))
    if cache_key not in cache:
        cache[cache_key] = place_slices(model, cache_key[1], cache_key[2])
    placements = cache[cache_key]
    if placements is None:
        c.error(slice_line, f"{where} GPU {index}: {model.a_name} cannot hold "
                f"{' + '.join(s[0] for s in slices)}: {_why_not(model, slices)}")
        return None
    mig_slices = tuple(MigSlice(s[0], s[1], start, s[2] is not None, s[3])
                       for s, start in zip(slices, placements))
    owners = {s.owner for s in mig_slices}
    gpu_owner = owners.pop() if len(owners) == 1 else "mixed"
    return GpuPlan(index, True, gpu_owner, mig_slices, 0, 0, spec.line)


def _why_not(model: GpuModel, slices: list[tuple[str, str, Optional[int], int]]) -> str:
    counts: dict[str, int] = {}
    compute = memory = 0
    for name, *_ in slices:
        profile = model.profile(name)
        assert profile is not None
        counts[name] = counts.get(name, 0) + 1
        compute += profile.compute_slices
        memory += profile.memory_slices
        if counts[name] > profile.max_instances:
            return f"at most {profile.max_instances} × {name} fit on one GPU"
    if compute > model.compute_slices:
        return f"they need {compute} compute slices and the GPU has {model.compute_slices}"
    if memory > model.memory_slices:
        return f"they need {memory} memory slices and the GPU has {model.memory_slices}"
    return ("no placement fits them together under NVIDIA's MIG placement rules "
            "(see `nvidia-smi mig -lgipp`); choose other profiles or remove fixed placements")


def node_group(c: Checker, raw: Any, line: int, position: int, units_default: int,
           cache: dict[Any, Optional[list[int]]]) -> Optional[NodeGroup]:
    what = f"node_groups[{position}]"
    section = c.mapping(raw, line, what, (*_GROUP_KEYS, "relayout"), _GROUP_KEYS)
    if section is None or any(key not in section for key in _GROUP_KEYS):
        return None
    name = c.string(section["name"], line_of(section, "name"), f"{what}.name")
    if name is not None:
        what = f"node group {name}"
    nodes = c.hostlist(section["nodes"], line_of(section, "nodes"), f"{what}: nodes")
    model_name = c.string(section["gpu_model"], line_of(section, "gpu_model"),
                          f"{what}: gpu_model")
    model = find_model(model_name) if model_name is not None else None
    if model_name is not None and model is None:
        c.error(line_of(section, "gpu_model"), f"{what}: unknown gpu_model {model_name!r}; "
                "known: " + ", ".join(model_names()))
    count = c.integer(section["gpus"], line_of(section, "gpus"), f"{what}: gpus", 1,
                      MAX_GPUS_PER_NODE)
    if name is None or nodes is None or model is None or count is None:
        return None
    expr = hostlist.collect_hostlist(list(nodes))
    where = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {expr}"
    layout = section["layout"]
    if not isinstance(layout, YamlMap) or not layout:
        c.error(line_of(section, "layout"), f"{what}: layout must map GPUs (all, 0, 0-3) to "
                "their owner or MIG slices")
        return None
    default_key = next((k for k in layout if k == "all"), None)
    chosen: dict[int, tuple[Any, int]] = {}  # gpu index -> (raw spec, line)
    for key in layout:
        if key == "all":
            continue
        key_line = line_of(layout, key)
        indices = _gpu_indices(c, key, key_line, where, count)
        for index in indices or ():
            if index in chosen:
                c.error(key_line, f"{where} GPU {index}: laid out twice (line {chosen[index][1]} "
                        f"and line {key_line}); give each GPU once")
            chosen[index] = (layout[key], key_line)
    gpus: list[GpuPlan] = []
    built: dict[int, Optional[GpuPlan]] = {}  # one parse (and one report) per distinct spec
    for index in range(count):
        if index in chosen:
            raw_spec, spec_line = chosen[index]
        elif default_key is not None:
            raw_spec, spec_line = layout[default_key], line_of(layout, default_key)
        else:
            c.error(layout.line, f"{where} GPU {index}: not in the layout; add it or an "
                    "'all:' entry")
            continue
        if id(raw_spec) in built:
            previous = built[id(raw_spec)]
            if previous is not None:
                gpus.append(_reindex(previous, index))
            continue
        gpu = _gpu_plan(c, raw_spec, spec_line, where, index, model, units_default, cache)
        built[id(raw_spec)] = gpu
        if gpu is not None:
            gpus.append(gpu)
    if len(gpus) != count:
        return None
    menu = None
    if "relayout" in section:
        from gpushare.admin.relayout.menu import check_mig_mode, parse_menu

        changeable = sum(gpu.changeable for gpu in gpus) * len(nodes)
        menu = parse_menu(c, section["relayout"], line_of(section, "relayout"), where, model,
                          changeable)
        if menu is not None:
            check_mig_mode(c, where, model, menu,
                           {gpu.index: (gpu.mig, gpu.line) for gpu in gpus if gpu.changeable})
    return NodeGroup(name, expr, nodes, model, tuple(gpus), section.line, menu)


def _reindex(gpu: GpuPlan, index: int) -> GpuPlan:
    return GpuPlan(index, gpu.mig, gpu.owner, gpu.slices, gpu.mps, gpu.shard, gpu.line)



def check_mig_change(plan: Plan, inventory: Any, busy_gpus: Iterable[int]) -> list[int]:
    """GPUs of this node whose MIG mode the plan changes; PlanError if that hits busy GPUs.

    The MIG manager (mig-parted) resets *every* GPU of a node after any MIG mode change, so a
    mode change on one Kubernetes GPU would kill the Slurm jobs on all the others.
    """
    group = plan.group_of(inventory.hostname)
    if group is None:
        raise PlanError([f"{plan.path}: node {inventory.hostname} is in no node group"])
    planned = {gpu.index: gpu for gpu in group.gpus}
    changes = [gpu.nvml_index for gpu in inventory.gpus
               if gpu.nvml_index in planned
               and planned[gpu.nvml_index].mig != bool(gpu.mig_current)]
    busy = sorted(set(busy_gpus))
    if changes and busy:
        first = planned[changes[0]]
        modes = ", ".join(f"GPU {i} to MIG {'on' if planned[i].mig else 'off'}" for i in changes)
        raise PlanError([
            f"{plan.path}:{first.line}: node {inventory.hostname}: the plan switches {modes}; "
            f"the MIG manager then resets every GPU of the node, but Slurm is using GPU "
            f"{', '.join(str(i) for i in busy)}; drain the node and wait for its jobs to end "
            "before applying this layout"])
    return changes
