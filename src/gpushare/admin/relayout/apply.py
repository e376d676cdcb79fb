# SPDX-License-Identifier: GPL-2.0-or-later
"""The node's step of a relayout: lay one idle, Slurm-only GPU out anew, as root, through NVML.

Runs on the node (the node drained and idle is the caller's business: Slurm's drain or
``scontrol reboot ASAP``). It makes the same pynvml calls as NVIDIA's mig-parted, one instance
at a time, with explicit placements, so it drives a real GPU and the simulated NVML alike:

1. the plan must give the GPU wholly to Slurm and list the layout on its group's menu;
2. no process may run on the GPU;
3. destroy its compute instances, then its GPU instances; switch MIG mode if the layout needs
   it (Hopper and later apply that at once; an A100/A30 needs a reset: such a change is
   refused before anything is touched, in a dry run too);
4. create the target's GPU instances at the placements NVIDIA's rules give, each with one
   compute instance spanning it, and read the result back from NVML;
5. on any failure, or when the time limit passes, restore the old layout the same way and say
   so; if even that fails, say exactly what NVML shows now;
6. re-render this node's gres.conf from the plan and the new layout, atomically.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from gpushare.admin.mig_profiles import place_slices
from gpushare.admin.plan import Plan
from gpushare.admin.plan.model import GpuPlan, MigSlice, NodeGroup
from gpushare.admin.relayout.menu import (
    Layout,
    layout_name,
    one_profile_per_node,
    parse_layout,
)
from gpushare.gpu.nvml import InventoryError, describe_nvml_error, nvml_call, text

__all__ = ["ApplyError", "ApplyResult", "Instance", "apply_layout", "render_node_gres",
           "write_atomically"]

_GI_IDS = range(15)  # GPU-instance ids a GPU may have (binary tree over 8 memory slices)
_CI_IDS = range(8)


class ApplyError(RuntimeError):
    """The step was refused or failed; the message says why and in what state the GPU is.
    ``unknown``: the old layout could not be laid back, so the node must stay drained."""

    def __init__(self, message: str, unknown: bool = False) -> None:
        super().__init__(message)
        self.unknown = unknown


class _Timeout(Exception):
    pass


@dataclass(frozen=True, order=True)
class Instance:
    """One GPU instance: its profile and memory-slice start (with one full compute instance)."""

    profile: str
    start: int


@dataclass
class ApplyResult:
    node: str
    gpu: int
    old: str
    new: str
    changed: bool
    steps: list[str] = field(default_factory=list)


@dataclass
class _State:
    mig: bool
    instances: tuple[Instance, ...]

    @property
    def name(self) -> str:
        if not self.mig:
            return "whole"
        return layout_name(tuple(i.profile for i in self.instances)) if self.instances \
            else "MIG with no instances"


def _check_plan(plan: Plan, node: str, index: int, layout_text: str
                ) -> tuple[NodeGroup, GpuPlan, Layout]:
    group = plan.group_of(node)
    if group is None:
        raise ApplyError(f"{plan.path}: node {node} is in no node group")
    gpu = next((g for g in group.gpus if g.index == index), None)
    if gpu is None:
        raise ApplyError(f"{plan.path}: node group {group.name} has no GPU {index}")
    if not gpu.changeable:
        owner = "Kubernetes'" if gpu.owner == "kubernetes" else "shared by Slurm and Kubernetes"
        raise ApplyError(f"GPU {index} of node {node} is {owner} in the plan (line {gpu.line}); "
                         "only a GPU wholly Slurm's changes layout")
    if group.relayout is None:
        raise ApplyError(f"{plan.path}: node group {group.name} has no relayout menu")
    layout, why = parse_layout(layout_text, group.model)
    if layout is None:
        raise ApplyError(f"layout {layout_text!r}: {why}")
    if group.relayout.item(layout.name) is None:
        raise ApplyError(f"layout {layout.name} is not on the relayout menu of node group "
                         f"{group.name}: " + ", ".join(i.layout.name for i in group.relayout.items))
    return group, gpu, layout


class _Gpu:
    """One GPU through NVML, with the step's deadline checked before every change."""

    def __init__(self, nvml: Any, index: int, group: NodeGroup, deadline: float,
                 clock: Callable[[], float], steps: list[str]) -> None:
        self.nvml, self.index, self.group = nvml, index, group
        self.deadline, self.clock, self.steps = deadline, clock, steps
        self.handle = nvml_call(nvml, f"open GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
        self._ids: dict[str, int] = {}

    def call(self, what: str, fn_name: str, *args: Any) -> Any:
        """One NVML call of the change, refused once the time limit has passed."""
        if self.clock() > self.deadline:
            raise _Timeout(f"the time limit passed before: {what}")
        return nvml_call(self.nvml, what, getattr(self.nvml, fn_name), *args)

    def processes(self) -> list[int]:
        pids: list[int] = []
        for fn in ("nvmlDeviceGetComputeRunningProcesses",
                   "nvmlDeviceGetMPSComputeRunningProcesses"):
            try:
                pids += [p.pid for p in getattr(self.nvml, fn)(self.handle)]
            except self.nvml.NVMLError as err:
                raise ApplyError(describe_nvml_error(
                    self.nvml, err, f"list the processes on GPU {self.index}")) from None
        return sorted(set(pids))

    def profile_ids(self) -> dict[str, int]:
        """GPU-instance profile name -> profile ID, as this GPU's NVML numbers them."""
        if self._ids:
            return self._ids
        for index in range(self.nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(self.handle, index)
            except self.nvml.NVMLError:
                continue  # a profile this GPU lacks
            name = text(info.name)
            self._ids[name[4:] if name.startswith("MIG ") else name] = int(info.id)
        return self._ids

    def read(self) -> _State:
        current, _pending = nvml_call(self.nvml, f"read GPU {self.index}'s MIG mode",
                                      self.nvml.nvmlDeviceGetMigMode, self.handle)
        if not current:
            return _State(False, ())
        names = {pid: name for name, pid in self.profile_ids().items()}
        found = []
        for gi_id in _GI_IDS:
            gi = self._gi(gi_id)
            if gi is None:
                continue
            info = nvml_call(self.nvml, f"read GPU instance {gi_id}",
                             self.nvml.nvmlGpuInstanceGetInfo, gi)
            found.append(Instance(names.get(int(info.profileId), f"profile {info.profileId}"),
                                  int(info.placement.start)))
        return _State(True, tuple(sorted(found)))

    def _gi(self, gi_id: int) -> Any:
        try:
            return self.nvml.nvmlDeviceGetGpuInstanceById(self.handle, gi_id)
        except self.nvml.NVMLError as err:
            if err.value in (self.nvml.NVML_ERROR_NOT_FOUND,
                             self.nvml.NVML_ERROR_INVALID_ARGUMENT):
                return None
            raise InventoryError(describe_nvml_error(
                self.nvml, err, f"look up GPU instance {gi_id}")) from None

    def clear(self) -> None:
        """Destroy every compute instance, then every GPU instance, one at a time."""
        current, _pending = self.call(f"read GPU {self.index}'s MIG mode",
                                      "nvmlDeviceGetMigMode", self.handle)
        if not current:
            return
        for gi_id in _GI_IDS:
            gi = self._gi(gi_id)
            if gi is None:
                continue
            for ci_id in _CI_IDS:
                try:
                    ci = self.nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
                except self.nvml.NVMLError:
                    continue
                self.call(f"destroy compute instance {ci_id} of GPU instance {gi_id}",
                          "nvmlComputeInstanceDestroy", ci)
                self.steps.append(f"destroyed compute instance {gi_id}/{ci_id}")
            self.call(f"destroy GPU instance {gi_id}", "nvmlGpuInstanceDestroy", gi)
            self.steps.append(f"destroyed GPU instance {gi_id}")

    def set_mig(self, mig: bool) -> None:
        current, _pending = self.call(f"read GPU {self.index}'s MIG mode",
                                      "nvmlDeviceGetMigMode", self.handle)
        if bool(current) == mig:
            return
        status = self.call(f"turn MIG {'on' if mig else 'off'} on GPU {self.index}",
                           "nvmlDeviceSetMigMode", self.handle, int(mig))
        if status != self.nvml.NVML_SUCCESS:
            raise InventoryError(f"GPU {self.index} applies the MIG mode change only after a "
                                 "GPU reset (an A100 or A30); gpushare does not reset GPUs")
        self.steps.append(f"MIG mode {'on' if mig else 'off'}")

    def create(self, instances: tuple[Instance, ...]) -> None:
        ids = self.profile_ids()
        for inst in instances:
            spec = self.group.model.profile(inst.profile)
            if spec is None or inst.profile not in ids:
                raise InventoryError(f"GPU {self.index} has no MIG profile {inst.profile}")
            placement = self.nvml.c_nvmlGpuInstancePlacement_t()
            placement.start, placement.size = inst.start, spec.memory_slices
            gi = self.call(f"create a {inst.profile} GPU instance at slice {inst.start}",
                           "nvmlDeviceCreateGpuInstanceWithPlacement", self.handle,
                           ids[inst.profile], ctypes.byref(placement))
            ci_profile = self._full_ci_profile(gi, spec.compute_slices)
            self.call(f"create the compute instance of the {inst.profile} at slice "
                      f"{inst.start}", "nvmlGpuInstanceCreateComputeInstance", gi, ci_profile)
            self.steps.append(f"created {inst.profile} at memory slice {inst.start}")

    def _full_ci_profile(self, gi: Any, slices: int) -> int:
        for index in range(self.nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = self.nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, index, self.nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            except self.nvml.NVMLError:
                continue
            if int(info.sliceCount) == slices:
                return int(info.id)
        raise InventoryError(f"GPU {self.index}: no compute-instance profile spans "
                             f"{slices} slices")

    def lay_out(self, state: _State) -> None:
        self.clear()
        self.set_mig(state.mig)
        self.create(state.instances)
        now = self.read()
        if now != state:
            raise InventoryError(f"GPU {self.index} shows {_describe(now)} after the change, "
                                 f"not {_describe(state)}")


def _check_one_profile(nvml: Any, plan: Plan, group: NodeGroup, node: str, index: int,
                       layout: Layout, deadline: float, clock: Callable[[], float],
                       round_layouts: dict[int, str]) -> None:
    """Slurm before 23.11 indexes one MIG profile per node: refuse a layout that would give
    Slurm a second one here (other Slurm-only GPUs as NVML shows them, or as the same round
    changes them (``round_layouts``, by the controller while the node is drained), the rest
    per plan)."""
    if not one_profile_per_node(plan.slurm.version) or not layout.mig:
        return
    profiles = set(layout.slices)
    for other in group.gpus:
        if other.index == index:
            continue
        if other.changeable and other.index in round_layouts:
            planned, _why = parse_layout(round_layouts[other.index], group.model)
            profiles.update(planned.slices if planned is not None else ())
        elif other.changeable:
            state = _Gpu(nvml, other.index, group, deadline, clock, []).read()
            profiles.update(i.profile for i in state.instances)
        else:
            profiles.update(s.profile for s in other.slices_of("slurm"))
    if len(profiles) > 1:
        raise ApplyError(f"Slurm {plan.slurm.version} with AutoDetect=off indexes one MIG "
                         f"profile per node; {layout.name} on GPU {index} would give node "
                         f"{node} {', '.join(sorted(profiles))}")


def _describe(state: _State) -> str:
    if not state.mig:
        return "MIG off (whole)"
    return ", ".join(f"{i.profile}@{i.start}" for i in state.instances) or "no MIG instances"


def _slurm_name(state: _State, planned: GpuPlan, recorded: Optional[str]) -> str:
    """The GPU's layout as Slurm has it: NVML's, and for a GPU with MIG off the MPS units
    NVML cannot show (``recorded`` by an earlier step, else the plan's)."""
    if state.mig:
        return state.name
    if recorded is not None and (recorded == "whole" or recorded.startswith("mps:")):
        return recorded
    return f"mps:{planned.mps}" if planned.mps and not planned.mig else "whole"


def apply_layout(nvml: Any, plan: Plan, node: str, index: int, layout_text: str,
                 timeout_s: float = 60.0, dry_run: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 round_layouts: Optional[dict[int, str]] = None,
                 recorded: Optional[str] = None) -> ApplyResult:
    """Lay GPU ``index`` of ``node`` out as ``layout_text`` (a layout of its group's menu);
    ``recorded``: the layout the state file holds for it (whole and mps:N are one to NVML).

    Raises ApplyError when refused, or when the change failed (the message says whether the old
    layout was restored, or what the GPU shows now).
    """
    group, planned, layout = _check_plan(plan, node, index, layout_text)
    starts = place_slices(group.model, layout.slices) if layout.mig else []
    assert starts is not None  # the menu parser placed it
    target = _State(layout.mig, tuple(sorted(
        Instance(p, s) for p, s in zip(layout.slices, starts))))
    steps: list[str] = []
    nvml_call(nvml, "initialise NVML", nvml.nvmlInit)
    try:
        deadline = clock() + timeout_s
        gpu = _Gpu(nvml, index, group, deadline, clock, steps)
        name = text(nvml_call(nvml, "read the GPU's name", nvml.nvmlDeviceGetName, gpu.handle))
        if not group.model.matches_nvml_name(name):
            raise ApplyError(f"GPU {index} of node {node} is a {name}, not the plan's "
                             f"{group.model.name}")
        pids = gpu.processes()
        if pids:
            raise ApplyError(f"GPU {index} of node {node} is in use (processes "
                             f"{', '.join(map(str, pids))}); it changes layout only when idle")
        old = gpu.read()
        if group.model.mode_change_needs_reset and old.mig != target.mig:
            raise ApplyError(
                f"GPU {index} of node {node}: {old.name} -> {layout.name} switches MIG "
                f"{'on' if target.mig else 'off'}, which {group.model.a_name} applies only "
                "after a GPU reset; gpushare does not reset GPUs, so "
                + ("--apply would refuse it" if dry_run else "it is refused")
                + "; on this model a relayout menu keeps one MIG mode")
        _check_one_profile(nvml, plan, group, node, index, layout, deadline, clock,
                           round_layouts or {})
        slurm_old = _slurm_name(old, planned, recorded)
        result = ApplyResult(node, index, slurm_old, layout.name,
                             old != target or slurm_old != layout.name, steps)
        if old == target and result.changed:  # whole <-> mps:N: the GPU itself stays
            steps.append(f"{'would change' if dry_run else 'changed'} only what Slurm is "
                         f"told (gres.conf, the node's Gres=): {slurm_old} -> {layout.name}; "
                         "NVML has nothing to change (MIG stays off)")
        if old == target or dry_run:
            if old != target:
                steps.append(f"would change {_describe(old)} to {_describe(target)}")
            return result
        try:
            gpu.lay_out(target)
        except (InventoryError, _Timeout) as err:
            cause = str(err)
            gpu.deadline = clock() + timeout_s  # the restore gets a time limit of its own
            try:
                gpu.lay_out(old)
            except (InventoryError, _Timeout) as again:
                try:
                    now = _describe(gpu.read())
                except (InventoryError, _Timeout):
                    now = "unreadable"
                raise ApplyError(f"GPU {index} of node {node}: changing to {layout.name} "
                                 f"failed ({cause}), and restoring {old.name} failed too "
                                 f"({again}); NVML shows: {now}. Keep the node drained.",
                                 unknown=True) from None
            raise ApplyError(f"GPU {index} of node {node}: changing to {layout.name} failed "
                             f"({cause}); restored the old layout {old.name}") from None
        return result
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _replanned_group(group: NodeGroup, node: str, index: int, layout: Layout,
                     inventory: Any) -> NodeGroup:
    """The node's group narrowed to this node, every Slurm-only MIG GPU as NVML shows it and
    GPU ``index`` as ``layout`` (so the plan's renderer writes what the node now holds)."""
    real = {g.nvml_index: g for g in inventory.gpus}
    gpus = []
    for gpu in group.gpus:
        if not gpu.changeable:
            gpus.append(gpu)
            continue
        seen = real.get(gpu.index)
        if gpu.index == index:
            mig, mps = layout.mig, layout.mps
        elif seen is None:
            gpus.append(gpu)
            continue
        else:  # NVML shows what an earlier step left; MPS units it cannot show: the plan's
            mig, mps = seen.mig_current, (0 if seen.mig_current or gpu.mig else gpu.mps)
        slices = tuple(MigSlice(dev.profile, "slurm", _start(group, dev), True, gpu.line)
                       for dev in (seen.mig_devices if seen is not None and mig else ()))
        gpus.append(replace(gpu, mig=mig, slices=slices, mps=mps,
                            shard=gpu.shard if not mig and not gpu.mig else 0))
    return replace(group, nodes=(node,), nodes_expr=node, gpus=tuple(gpus))


def _start(group: NodeGroup, dev: Any) -> int:
    spec = group.model.profile(dev.profile)
    size = spec.memory_slices if spec else 1
    total = group.model.memory_slices
    level_first = {total: 0, total // 2: 1, total // 4: 3, total // 8: 7}
    return (dev.gi_id - level_first.get(size, 0)) * size


def render_node_gres(plan: Plan, node: str, index: int, layout_text: str,
                     inventory: Any) -> str:
    """This node's gres.conf from the plan with GPU ``index`` in its new layout."""
    from gpushare.admin.render import render_gres_conf

    group, _gpu, layout = _check_plan(plan, node, index, layout_text)
    narrowed = _replanned_group(group, node, index, layout, inventory)
    return render_gres_conf(replace(plan, groups=(narrowed,), _by_node={}), {node: inventory},
                            node=node)


def write_atomically(path: str, content: str) -> None:
    """Replace ``path`` in one rename, so slurmd never reads half a gres.conf."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gres.conf.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
