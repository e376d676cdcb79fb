# SPDX-License-Identifier: GPL-2.0-or-later
"""Who owns a GPU or MIG slice on a node, from the ownership plan, compiled once per plan.

The plan names GPUs by index and slices by profile; NVML names them by UUID. A slice's
owner is known when every slice of that profile on that GPU has the same owner; where the
plan mixes owners for one profile on one GPU the answer is None (the plan cannot tell the
slices apart without placements NVML reports per GPU instance).

A verifying prolog needs only its node's few lines of the plan, but parsing the plan costs
PyYAML, dataclasses and the checks (about 35 ms of CPU per job). So the node's part is
compiled into ``<state_dir>/owners-<node>.json`` the first time and read from there
(microseconds) until the plan file changes (its size, mtime, ctime or inode).

A device ``gpushare tidal`` has lent is its borrower's while it is lent: the compiled part
also follows ``tidal-state.json`` beside the plan (absent: nothing lent), which must be
root's like the plan.
"""

import contextlib
import json
import os
from typing import Any, Callable, NamedTuple, Optional, Sequence

from gpushare.common import safefs

__all__ = ["GpuOwners", "OwnersError", "compile_node", "node_owners", "owner_lookup",
           "owner_of"]

_FORMAT = 1
TIDAL_STATE = "tidal-state.json"  # gpushare.admin.tidal.state.STATE_NAME

class OwnersError(RuntimeError):
    """The plan cannot be used; the message says which file and why."""


class GpuOwners(NamedTuple):
    """One planned GPU: its owner (slurm, kubernetes, mixed) and each MIG profile's owner
    (None where the plan gives one profile on this GPU to several owners)."""

    owner: str
    slices: dict[str, Optional[str]]


def compile_node(plan: Any, node: str) -> "Optional[list[GpuOwners]]":
    """The owners of ``node``'s GPUs by index; None when the plan does not list the node."""
    group = plan.group_of(node)
    if group is None:
        return None
    gpus = []
    for gpu in group.gpus:
        slices: dict[str, Optional[str]] = {}
        for profile in dict.fromkeys(s.profile for s in gpu.slices):
            owners = {s.owner for s in gpu.slices if s.profile == profile}
            slices[profile] = owners.pop() if len(owners) == 1 else None
        gpus.append(GpuOwners(gpu.owner, slices))
    return gpus


def owner_of(gpus: "Optional[Sequence[GpuOwners]]", index: int,
             profile: str = "") -> "Optional[str]":
    """Who owns GPU ``index`` (or its ``profile`` slices): "unplanned" when the plan omits
    it, None when the plan does not tell these slices apart."""
    if gpus is None or not 0 <= index < len(gpus):
        return "unplanned"
    planned = gpus[index]
    if not profile:
        return planned.owner
    return planned.slices.get(profile)


def owner_lookup(gpus: "Optional[Sequence[GpuOwners]]", inventory: Any
                 ) -> "Callable[[str], Optional[str]]":
    """``owner(uuid)`` for the node's GPUs and slices as NVML reports them."""
    owners: dict[str, Optional[str]] = {}
    for gpu in inventory.gpus:
        owners[gpu.uuid] = owner_of(gpus, gpu.nvml_index)
        for mig in gpu.mig_devices:
            owners[mig.uuid] = owner_of(gpus, gpu.nvml_index, mig.profile)
    return owners.get


def node_owners(plan_path: str, node: str, state_dir: str) -> "Optional[list[GpuOwners]]":
    """``node``'s part of the plan: from the compiled file when it matches the plan file,
    else parsed (and the compiled file replaced). OwnersError when the plan is unusable.

    The plan decides which devices Slurm may hand out, so it must be root's: owned by
    root and not writable by others, as every directory above it.
    """
    try:
        safefs.check_root_owned_file(plan_path)
        stamp = safefs.file_stamp(plan_path)
    except (OSError, safefs.UnsafePathError) as err:
        raise OwnersError(f"ownership plan {plan_path}: {err}") from None
    lent_path = os.path.join(os.path.dirname(plan_path), TIDAL_STATE)
    try:
        stamp = stamp + safefs.file_stamp(lent_path)
        safefs.check_root_owned_file(lent_path)
        lent = True
    except FileNotFoundError:
        lent = False
    except (OSError, safefs.UnsafePathError) as err:
        raise OwnersError(f"what gpushare tidal lent, {lent_path}: {err}") from None
    name = f"owners-{node}.json"
    try:
        dir_fd = safefs.open_root_dir(state_dir)
    except (OSError, safefs.UnsafePathError) as err:
        raise OwnersError(f"state directory {state_dir}: {err}") from None
    try:
        try:
            data = json.loads(safefs.read_small_file_at(dir_fd, name, 1 << 20) or b"null")
        except (OSError, ValueError, safefs.UnsafePathError):
            data = None
        if (isinstance(data, dict) and data.get("format") == _FORMAT
                and data.get("plan") == plan_path and data.get("stamp") == stamp
                and data.get("node") == node):
            gpus = data.get("gpus")
            return None if gpus is None else [GpuOwners(g[0], g[1]) for g in gpus]
        # Imported only here: PyYAML and the plan's checks are the slowest imports a
        # prolog could make, and only the first job after a plan change needs them.
        from gpushare.admin.plan import PlanError, load_plan

        try:
            plan = load_plan(plan_path)
        except PlanError as err:
            raise OwnersError(f"ownership plan {plan_path}: {err}") from None
        if lent:
            from gpushare.admin.relayout.state import StateError, with_lent

            try:
                plan = with_lent(plan, plan_path)
            except StateError as err:
                raise OwnersError(f"what gpushare tidal lent: {err}") from None
        gpus = compile_node(plan, node)
        compiled = {"format": _FORMAT, "plan": plan_path, "stamp": stamp, "node": node,
                    "gpus": None if gpus is None else [list(g) for g in gpus]}
        # Only a shortcut: when it cannot be written, the next job parses the plan again.
        with contextlib.suppress(OSError):
            safefs.write_file_atomic_at(dir_fd, name, json.dumps(compiled).encode())
        return gpus
    finally:
        os.close(dir_fd)
